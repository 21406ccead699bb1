// Calls to Reame's HTTP API, with the bearer key this tab was given (sessionStorage only).

const KEY = "reame-api-key";

export class AuthError extends Error {
  constructor(hadKey) {
    super(hadKey ? "The server refused this API key." : "The server asks for an API key.");
    this.hadKey = hadKey;
  }
}

export class APIError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const apiKey = () => sessionStorage.getItem(KEY);
export const setApiKey = (key) => sessionStorage.setItem(KEY, key);

export async function call(path, { body, signal, headers = {} } = {}) {
  const init = { method: body === undefined ? "GET" : "POST", signal, headers: { ...headers } };
  const key = apiKey();
  if (key) init.headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) throw new AuthError(Boolean(key));
  if (!response.ok) {
    let error = {};
    try { error = (await response.json()).error ?? {}; } catch { /* not JSON */ }
    throw new APIError(response.status, error.message ?? `${response.status} ${response.statusText}`, error.code);
  }
  return response;
}

// The JSON payloads of a Server-Sent Events stream, until [DONE].
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}
