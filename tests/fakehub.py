"""A local imitation of the Hugging Face Hub's file endpoints, for download tests.

It answers what huggingface_hub 2.x asks, the way the hub answers for LFS files (every GGUF):

- ``HEAD|GET {hub}/{repo}/resolve/{revision}/{file}``: 302 to the CDN, carrying the file's
  metadata in ``X-Repo-Commit``, ``X-Linked-Etag`` (the content's sha256), ``X-Linked-Size``
  and ``ETag``; 404 with ``X-Error-Code: RepoNotFound`` or ``EntryNotFound`` otherwise.
- ``HEAD|GET {cdn}/blobs/{sha256}``: the bytes, honouring ``Range: bytes=N-`` (206 and
  ``Content-Range``), as the resumed transfer asks, named by ``Content-Disposition``.
- ``GET {hub}/api/models/{repo}/tree/{revision}``: the repository's file list.

The CDN is a second server, a different origin, as the real CDN is: huggingface_hub then
stops following redirects at the hub's 302 and reads the metadata from it.

Faults on demand: `cut_transfers` ends the next transfers after some bytes (the connection
closes short of its Content-Length), `corrupt` serves one byte changed. Every request is
logged, so tests can count what crossed the wire.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Served:
    """One logged request: what was asked and how many body bytes went back."""

    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int
    body_bytes: int


@dataclass(frozen=True)
class HubFile:
    repo: str
    name: str
    source: Path | bytes
    sha256: str
    size: int

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with self.source.open("rb") as handle:
            handle.seek(start)
            return handle.read(end - start)


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str], HubFile] = {}
        self.log: list[Served] = []
        self.corrupt = False
        self._cuts: list[int] = []
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        self.endpoint = f"http://127.0.0.1:{self._hub.server_port}"
        self.cdn = f"http://127.0.0.1:{self._cdn.server_port}"
        self._threads = [
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
            for server in (self._hub, self._cdn)
        ]
        for thread in self._threads:
            thread.start()

    def add(self, repo: str, name: str, content: bytes | Path) -> HubFile:
        digest = hashlib.sha256()
        if isinstance(content, bytes):
            digest.update(content)
            size = len(content)
        else:
            with content.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
            size = content.stat().st_size
        served = HubFile(repo, name, content, digest.hexdigest(), size)
        self.files[(repo, name)] = served
        return served

    def cut_transfers(self, after_bytes: int, times: int = 1) -> None:
        """End each of the next `times` transfers after `after_bytes` bytes of body."""
        self._cuts.extend([after_bytes] * times)

    def transfers(self) -> list[Served]:
        """The requests that carried file bytes."""
        return [s for s in self.log if s.method == "GET" and s.path.startswith("/blobs/")]

    def close(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def _blob(self, sha256: str) -> HubFile | None:
        return next((f for f in self.files.values() if f.sha256 == sha256), None)

    def _next_cut(self) -> int | None:
        with self._lock:
            return self._cuts.pop(0) if self._cuts else None

    def _record(self, served: Served) -> None:
        with self._lock:
            self.log.append(served)


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<revision>[^/]+)$")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _handler(hub: FakeHub, *, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def log_message(self, format: str, *args: object) -> None:
            return  # keep test output quiet

        def _serve(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if cdn:
                status, sent = self._blob(path, body)
            elif match := _RESOLVE.match(path):
                status, sent = self._resolve(match["repo"], match["file"]), 0
            elif match := _TREE.match(path):
                status, sent = self._tree(match["repo"], body)
            else:
                status, sent = self._status(404), 0
            hub._record(
                Served(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                    status,
                    sent,
                )
            )

        def _status(self, status: int, headers: dict[str, str] | None = None) -> int:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if status >= 300:
                self.send_header("Content-Length", "0")
            self.end_headers()
            return status

        def _resolve(self, repo: str, name: str) -> int:
            if not any(key[0] == repo for key in hub.files):
                return self._status(404, {"X-Error-Code": "RepoNotFound"})
            served = hub.files.get((repo, name))
            if served is None:
                return self._status(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
            return self._status(
                302,
                {
                    "Location": f"{hub.cdn}/blobs/{served.sha256}",
                    "X-Repo-Commit": COMMIT,
                    "ETag": f'"{hashlib.sha1(served.sha256.encode()).hexdigest()}"',
                    "X-Linked-Etag": f'"{served.sha256}"',
                    "X-Linked-Size": str(served.size),
                },
            )

        def _tree(self, repo: str, body: bool) -> tuple[int, int]:
            entries = [
                {
                    "type": "file",
                    "path": served.name,
                    "size": served.size,
                    "oid": hashlib.sha1(served.sha256.encode()).hexdigest(),
                    "lfs": {"oid": served.sha256, "size": served.size, "pointerSize": 134},
                }
                for (file_repo, _), served in hub.files.items()
                if file_repo == repo
            ]
            if not entries:
                return self._status(404, {"X-Error-Code": "RepoNotFound"}), 0
            data = json.dumps(entries).encode()
            self._status(
                200, {"Content-Type": "application/json", "Content-Length": str(len(data))}
            )
            if body:
                self.wfile.write(data)
            return 200, len(data) if body else 0

        def _blob(self, path: str, body: bool) -> tuple[int, int]:
            served = hub._blob(path.removeprefix("/blobs/"))
            if served is None:
                return self._status(404), 0
            start, end = 0, served.size
            status = 200
            requested = _RANGE.fullmatch(self.headers.get("Range") or "")
            if requested:
                start = int(requested[1])
                end = int(requested[2]) + 1 if requested[2] else served.size
                status = 206
            headers = {
                "Content-Length": str(end - start),
                "Accept-Ranges": "bytes",
                # As the real CDN names the file: huggingface_hub labels its progress bar so.
                "Content-Disposition": f'inline; filename="{served.name}";',
            }
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{served.size}"
            self._status(status, headers)
            if not body:
                return status, 0
            cut = hub._next_cut()
            stop = min(end, start + cut) if cut is not None else end
            sent = 0
            for offset in range(start, stop, CHUNK):
                data = served.read(offset, min(stop, offset + CHUNK))
                if hub.corrupt and offset == start:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                self.wfile.write(data)
                sent += len(data)
            if stop < end:
                # Close short of Content-Length: the client sees a broken transfer.
                self.wfile.flush()
                self.close_connection = True
            return status, sent

    return Handler
