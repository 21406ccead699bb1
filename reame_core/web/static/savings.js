// What a piece of work cost and what was saved, as a bar read at a glance and one line of
// figures. Saved: prompt tokens reused in a slot or restored from disk instead of computed,
// and answer tokens that came from accepted drafts instead of one decode step each.

import { count, el, percent } from "./dom.js";

const PARTS = [
  ["reused", "reused in a slot"],
  ["restored", "restored from disk"],
  ["computed", "prompt computed"],
  ["accepted", "answer from accepted drafts"],
  ["decoded", "answer decoded token by token"],
];

export function bar(tokens) {
  const node = el("div", { class: "bar", role: "img", "aria-label": legend(tokens) });
  for (const [part, name] of PARTS) {
    if (!tokens[part]) continue;
    const segment = el("span", { class: `segment ${part}`, title: `${count(tokens[part])} ${name}` });
    segment.style.flexGrow = String(tokens[part]);
    node.append(segment);
  }
  return node;
}

const legend = (tokens) =>
  PARTS.filter(([part]) => tokens[part]).map(([part, name]) => `${count(tokens[part])} ${name}`).join(", ");

const sourceName = (source) => source.replaceAll("_", " ");

// The line under an answer, from the response's `timings` (and `conclave`, for best-of-N).
export function answerSavings(timings, conclave) {
  const restored = timings.restored_n ?? 0;
  const tokens = {
    reused: (timings.cached_n ?? 0) - restored,
    restored,
    computed: timings.prompt_n ?? 0,
    accepted: timings.draft_n_accepted ?? 0,
  };
  tokens.decoded = Math.max(0, (timings.predicted_n ?? 0) - tokens.accepted);
  const prompt = tokens.reused + tokens.restored + tokens.computed;
  const node = el("div", { class: "savings" });
  for (const [part, value] of Object.entries(tokens)) node.dataset[part] = String(value);
  node.dataset.cached = String(timings.cached_n ?? 0);

  const figures = [
    `Prompt ${count(prompt)} tokens: ${count(tokens.reused)} reused in a slot, ` +
      `${count(tokens.restored)} restored from disk, ${count(tokens.computed)} computed` +
      (tokens.computed ? ` (${Math.round(timings.prompt_ms)} ms)` : "") +
      ` — ${percent(prompt - tokens.computed, prompt)} saved.`,
    `Answer ${count(timings.predicted_n)} tokens` +
      (timings.predicted_per_second ? ` at ${timings.predicted_per_second.toFixed(1)} tok/s` : "") +
      ".",
  ];
  const drafts = Object.entries(timings.drafts ?? {});
  if (drafts.length) {
    const bySource = drafts.map(([source, d]) => `${sourceName(source)} ${d.accepted}/${d.proposed}`);
    figures.push(`Drafts accepted: ${bySource.join(", ")}.`);
  }
  node.append(bar(tokens), el("p", { class: "figures", text: figures.join(" ") }));
  if (conclave) node.append(tally(conclave));
  return node;
}

function tally(conclave) {
  const votes = Object.entries(conclave.tally ?? {}).map(([answer, n]) => `“${answer}” ${n}`);
  const skipped = [];
  if (conclave.stopped) skipped.push(`${conclave.stopped} stopped early`);
  if (conclave.not_started) skipped.push(`${conclave.not_started} not started`);
  const text =
    `Best of ${conclave.candidates}: ${votes.join(" · ") || "no answer read"}` +
    (skipped.length ? `; ${skipped.join(", ")} (about ${count(conclave.tokens_saved)} tokens saved)` : "") +
    ".";
  return el("p", { class: "tally", text });
}
