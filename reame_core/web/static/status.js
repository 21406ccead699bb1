// The status view: GET /status rendered, and a chart of computed vs saved tokens over the
// time this page has been open (the server keeps no history; the page samples it).

import { count, el, percent, size, svg } from "./dom.js";
import { bar } from "./savings.js";

const SAMPLES = 60;

export class Status {
  constructor(page) {
    this.page = page;
    this.samples = []; // {computed, saved} per poll, since the previous one
    this.last = null;
  }

  update(report) {
    this.sample(report.tokens);
    this.renderTotals(report.tokens, report.requests);
    this.renderChart();
    this.renderNow(report.load, report.model);
    this.renderGovernor(report.speculation);
    this.renderPlugins(report.plugins);
    this.renderConfiguration(report);
  }

  sample(tokens) {
    const saved = tokens.reused + tokens.restored + tokens.accepted;
    const computed = tokens.computed + tokens.generated - tokens.accepted;
    if (this.last) {
      this.samples.push({ computed: computed - this.last.computed, saved: saved - this.last.saved });
      if (this.samples.length > SAMPLES) this.samples.shift();
    }
    this.last = { computed, saved };
  }

  renderTotals(tokens, requests) {
    const parts = {
      reused: tokens.reused,
      restored: tokens.restored,
      computed: tokens.computed,
      accepted: tokens.accepted,
      decoded: Math.max(0, tokens.generated - tokens.accepted),
    };
    const notComputed = tokens.reused + tokens.restored;
    const lines = [
      `${count(requests.finished)} requests answered.`,
      `Prompt tokens: ${count(tokens.prompt)} — ${count(tokens.reused)} reused in slots, ` +
        `${count(tokens.restored)} restored from disk, ${count(tokens.computed)} computed ` +
        `(${percent(notComputed, notComputed + tokens.computed)} not computed).`,
      `Answer tokens: ${count(tokens.generated)}, of which ${count(tokens.accepted)} came from ` +
        `accepted drafts (${count(tokens.drafted)} drafted).`,
    ];
    this.page.totals.replaceChildren(bar(parts), ...lines.map((text) => el("p", { text })));
  }

  renderChart() {
    const width = 600, height = 120;
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "timeline", role: "img" });
    const highest = Math.max(1, ...this.samples.map((s) => s.computed + s.saved));
    const step = width / SAMPLES;
    this.samples.forEach((sample, i) => {
      const x = (SAMPLES - this.samples.length + i) * step;
      const computed = (sample.computed / highest) * height;
      const saved = (sample.saved / highest) * height;
      chart.append(
        svg("rect", { x, y: height - computed, width: step - 1, height: computed, class: "computed" }),
        svg("rect", { x, y: height - computed - saved, width: step - 1, height: saved, class: "saved" }),
      );
    });
    chart.setAttribute("aria-label", "Tokens computed and saved in each interval");
    const key = el("p", { class: "hint" },
      el("span", { class: "swatch saved" }), " saved (reused, restored, accepted drafts)  ",
      el("span", { class: "swatch computed" }), ` computed; one column per poll, at most ${count(highest)} tokens`);
    this.page.chart.replaceChildren(chart, key);
  }

  renderNow(load, model) {
    this.page.now.textContent =
      `${load.slots_busy} of ${model.slots} slots busy · ${load.queued} waiting ` +
      `(queue limit ${load.max_queue}) · ${load.in_flight} requests in flight.`;
  }

  renderGovernor(report) {
    this.page.governorMode.textContent =
      `Mode ${report.mode}, at most ${report.draft_max} draft tokens per step. ` +
      "A source drafts only where its accepted tokens pay for their verification on this host.";
    const rows = report.sources.map((s) =>
      el("tr", { "data-source": s.source },
        el("td", { text: s.source.replaceAll("_", " ") }),
        el("td", { text: `${s.state}${s.enabled ? "" : " (off)"}` }),
        el("td", { text: String(s.k) }),
        el("td", { text: `${count(s.accepted)} of ${count(s.proposed)} (${percent(s.accepted, s.proposed)})` }),
        el("td", { text: s.expected_gain === null ? "–" : `${s.expected_gain}×` }),
        el("td", { text: s.reason ?? "" }),
      ),
    );
    this.page.governor.tBodies[0].replaceChildren(...rows);
  }

  renderPlugins(groups) {
    const blocks = Object.entries(groups).map(([group, counters]) =>
      el("div", { class: "plugin" },
        el("h3", { text: group }),
        el("dl", {}, ...Object.entries(counters).flatMap(([name, value]) => [
          el("dt", { text: name.replaceAll("_", " ") }),
          el("dd", { text: shown(name, value) }),
        ])),
      ),
    );
    this.page.plugins.replaceChildren(...(blocks.length ? blocks : [el("p", { text: "No plugin counts anything." })]));
  }

  renderConfiguration(report) {
    const { host, model } = report;
    this.page.host.textContent =
      `${model.name} (${model.architecture}), ${model.slots} slots of ${count(model.ctx_per_slot)} tokens, ` +
      `KV ${model.kv_type}. Host: ${host.arch}, ${host.physical_cores} physical cores ` +
      `(${host.logical_cpus} logical CPUs), ${size(host.memory_available)} of ${size(host.memory_total)} ` +
      `memory available, ${size(host.disk_free)} free in ${host.disk_path}.`;
    const rows = [...report.configuration, ...report.warnings.map((w) => ["warning", w])];
    this.page.configuration.tBodies[0].replaceChildren(
      ...rows.map(([setting, why]) => el("tr", {}, el("th", { text: setting }), el("td", { text: why }))),
    );
    const guarantees = report.guarantees;
    this.page.guarantees.textContent = `${guarantees[0].toUpperCase()}${guarantees.slice(1)}.`;
  }
}

function shown(name, value) {
  if (typeof value === "number" && name.endsWith("bytes")) return size(value);
  if (typeof value === "number") return count(Math.round(value * 100) / 100);
  return String(value);
}
