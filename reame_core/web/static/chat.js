// The chat: one conversation, sent turn by turn with its session id so the server keeps
// its KV between turns. Messages are shown with textContent only.

import { APIError, call, events } from "./api.js";
import { el } from "./dom.js";
import { answerSavings } from "./savings.js";

function newSessionId() {
  // crypto.randomUUID needs a secure context; a page on a LAN address is not one.
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export class Chat {
  constructor(page, withKey) {
    this.page = page; // the elements, by id
    this.withKey = withKey; // runs an API call, asking for the key when it is needed
    this.messages = [];
    this.session = newSessionId();
    this.running = null; // the AbortController of the answer being streamed
  }

  reset() {
    this.running?.abort();
    this.messages = [];
    this.session = newSessionId();
    this.page.messages.replaceChildren();
  }

  stop() {
    this.running?.abort();
  }

  // The request body for the conversation so far plus `text`; an Error names a bad option.
  body(text) {
    const { system, temperature, maxTokens, schema, bestOf } = this.page;
    const messages = [...this.messages, { role: "user", content: text }];
    if (system.value.trim()) messages.unshift({ role: "system", content: system.value });
    const body = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number(temperature.value),
      max_tokens: Number(maxTokens.value),
    };
    if (!this.page.schemaOption.hidden && schema.value.trim()) {
      let parsed;
      try {
        parsed = JSON.parse(schema.value);
      } catch (error) {
        throw new Error(`The JSON schema is not valid JSON: ${error.message}`);
      }
      body.response_format = { type: "json_schema", json_schema: { name: "answer", schema: parsed } };
    }
    if (!this.page.bestOfOption.hidden && Number(bestOf.value) > 1) body.best_of = Number(bestOf.value);
    return body;
  }

  async send(text) {
    let body;
    try {
      body = this.body(text);
    } catch (error) {
      this.page.showNotice(error.message);
      return;
    }
    this.page.showNotice("");
    const messages = this.messages; // this conversation's, even if a new one starts meanwhile
    messages.push({ role: "user", content: text });
    this.add("user", text);
    const answer = this.add("assistant", "");
    answer.item.classList.add("streaming");
    const running = (this.running = new AbortController());
    this.page.busy(true);
    let reply = "";
    let timings = null;
    let conclave = null;
    let failure = null;
    try {
      const response = await this.withKey(() =>
        call("/v1/chat/completions", {
          body,
          signal: running.signal,
          headers: { "X-Session-ID": this.session },
        }),
      );
      for await (const chunk of events(response)) {
        if (chunk.error) throw new APIError(500, chunk.error.message);
        for (const choice of chunk.choices ?? []) {
          const piece = choice.delta?.content;
          if (piece) {
            reply += piece;
            answer.text.textContent = reply;
            this.follow();
          }
        }
        timings = chunk.timings ?? timings;
        conclave = chunk.conclave ?? conclave;
      }
    } catch (error) {
      failure = running.signal.aborted ? "Stopped: the server has freed its slot." : error.message;
    } finally {
      this.running = null;
      this.page.busy(false);
      answer.item.classList.remove("streaming");
    }
    if (reply) {
      messages.push({ role: "assistant", content: reply });
    } else if (messages.at(-1)?.content === text) {
      // Nothing came back: the turn is not part of the conversation; the text goes back.
      messages.pop();
      if (!running.signal.aborted) this.page.prompt.value = text;
    }
    if (timings) answer.item.append(answerSavings(timings, conclave));
    if (failure) answer.item.append(el("p", { class: "failure", text: failure }));
    this.follow();
  }

  add(role, text) {
    const body = el("div", { class: "text", text });
    const item = el("li", { class: `message ${role}` }, el("span", { class: "role", text: role }), body);
    this.page.messages.append(item);
    this.follow();
    return { item, text: body };
  }

  follow() {
    this.page.messages.lastElementChild?.scrollIntoView({ block: "end" });
  }
}
