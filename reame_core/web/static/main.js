// The page's wiring: elements, tabs, the API key dialog, and the status poll.

import { APIError, AuthError, call, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { Status } from "./status.js";

const POLL_MS = 3000;
const $ = (id) => document.getElementById(id);

const page = {
  messages: $("messages"), prompt: $("prompt"), system: $("system"),
  temperature: $("temperature"), maxTokens: $("max-tokens"),
  schema: $("schema"), schemaOption: $("schema-option"),
  bestOf: $("best-of"), bestOfOption: $("best-of-option"),
  totals: $("totals"), chart: $("chart"), now: $("now"),
  governor: $("governor"), governorMode: $("governor-mode"), plugins: $("plugins"),
  host: $("host"), configuration: $("configuration"), guarantees: $("guarantees"),
  showNotice(text, from = "chat") {
    $("notice").textContent = text;
    $("notice").dataset.from = from;
    $("notice").hidden = !text;
  },
  busy(running) {
    $("send").hidden = running;
    $("stop").hidden = !running;
  },
};

// ------------------------------------------------------------------ the API key

let keyAsked = null; // one dialog at a time, however many calls wait for it

function askForKey(error) {
  keyAsked ??= new Promise((resolve) => {
    $("key-message").textContent = error.hadKey
      ? "The server refused this API key (401 Unauthorized). Check it and enter it again."
      : "This server asks for an API key.";
    $("key").value = "";
    $("key-form").onsubmit = (event) => {
      event.preventDefault();
      setApiKey($("key").value.trim());
      $("key-dialog").close();
      keyAsked = null;
      resolve();
    };
    $("key-dialog").showModal();
  });
  return keyAsked;
}

// Every call waits for the key: the dialog does not close without one.
$("key-dialog").addEventListener("cancel", (event) => event.preventDefault());

// Run an API call; on a 401, ask for a key and try again.
async function withKey(request) {
  for (;;) {
    try {
      return await request();
    } catch (error) {
      if (!(error instanceof AuthError)) throw error;
      await askForKey(error);
    }
  }
}

// ------------------------------------------------------------------ chat and tabs

const chat = new Chat(page, withKey);
const status = new Status(page);

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = page.prompt.value;
  if (!text.trim() || chat.running) return;
  page.prompt.value = "";
  chat.send(text);
});
page.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => chat.stop());
$("new-conversation").addEventListener("click", () => chat.reset());
page.bestOf.addEventListener("input", () => { $("best-of-shown").value = page.bestOf.value; });

function show(view) {
  for (const name of ["chat", "status"]) {
    $(name).hidden = name !== view;
    $(`show-${name}`).setAttribute("aria-pressed", String(name === view));
  }
}
$("show-chat").addEventListener("click", () => show("chat"));
$("show-status").addEventListener("click", () => show("status"));

// ------------------------------------------------------------------ status poll

async function poll() {
  try {
    const report = await (await withKey(() => call("/status"))).json();
    $("model").textContent = report.model.name;
    $("load").textContent = `${report.load.slots_busy}/${report.model.slots} slots busy`;
    page.schemaOption.hidden = !report.request_fields.includes("response_format");
    page.bestOfOption.hidden = !report.request_fields.includes("best_of");
    status.update(report);
    if ($("notice").dataset.from === "status") page.showNotice("", "status");
  } catch (error) {
    const loading = error instanceof APIError && error.status === 503;
    page.showNotice(loading ? error.message : `Status: ${error.message}`, "status");
  }
  setTimeout(poll, POLL_MS);
}
poll();
