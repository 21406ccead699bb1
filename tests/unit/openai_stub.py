"""A minimal OpenAI-compatible server, standing in for "another server" in the tests of
`reame bench --against`: it streams `max_tokens` text chunks for any completion, and a chat
completion's answer (`answer`, or `max_tokens` words) in word-sized deltas.

It is a real HTTP server on a free port (the standard library's), so the client code under
test talks to it exactly as it would to llama-server or vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubOpenAI:
    """`model`: the id /v1/models lists (None: that route answers 404). `usage`: send the
    final usage chunk when asked for it. `delay_s`: pause before each chunk. `answer`: a
    chat completion's text for its request body. `reply_headers`: sent with every answer.
    Every request body received is kept in `bodies`, with its headers in `headers` and the
    moment it arrived in `arrivals`."""

    def __init__(
        self,
        *,
        model: str | None = "stub-model",
        usage: bool = True,
        delay_s: float = 0.001,
        answer: Callable[[dict[str, Any]], str] | None = None,
        reply_headers: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        self.reply_headers = reply_headers or {}
        self.usage = usage
        self.delay_s = delay_s
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.arrivals: list[float] = []
        self._lock = threading.Lock()

    @contextmanager
    def serving(self) -> Iterator[str]:
        """Serve on 127.0.0.1 from a thread; yields the base URL with /v1, as users write it."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models" and stub.model is not None:
                    self._json({"object": "list", "data": [{"id": stub.model, "object": "model"}]})
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub._lock:
                    stub.bodies.append(body)
                    stub.headers.append(dict(self.headers))
                    stub.arrivals.append(time.perf_counter())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                for name, value in stub.reply_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.path == "/v1/chat/completions":
                    self._chat(body)
                    return
                for i in range(body["max_tokens"]):
                    time.sleep(stub.delay_s)
                    self._event({"choices": [{"index": 0, "text": f"w{i} "}]})
                if stub.usage and (body.get("stream_options") or {}).get("include_usage"):
                    self._event({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}})
                self.wfile.write(b"data: [DONE]\n\n")

            def _chat(self, body: dict[str, Any]) -> None:
                if stub.answer is not None:
                    text = stub.answer(body)
                else:
                    text = " ".join(f"w{i}" for i in range(body["max_tokens"]))
                words = text.split(" ")
                for i, word in enumerate(words):
                    time.sleep(stub.delay_s)
                    piece = word if i == len(words) - 1 else word + " "
                    self._event({"choices": [{"index": 0, "delta": {"content": piece}}]})
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if stub.usage and (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"completion_tokens": len(words), "prompt_tokens": 1}
                    self._event({"choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")

            def _event(self, data: dict[str, Any]) -> None:
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def _json(self, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
