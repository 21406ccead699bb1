"""`reame serve`: the Litestar application and its startup.

Once the llama.cpp build is known to run on this CPU (the build check, cached after the
first start), the HTTP server comes up and loads the model in the background: /health
answers 503 until the engine is ready, then 200. Bearer auth guards every route but /health
and the web page's files (`reame_core.web.page`: they hold no data; the calls they make do).
SIGTERM drains: no new connections, the requests in flight finish, then the engine stops.
"""

from __future__ import annotations

import functools
import hmac
import threading
from typing import Any

import structlog
import uvicorn
from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig

from reame_core import __version__
from reame_core.backend.probe import ensure_build_runs
from reame_core.runtime import Runtime, start_runtime
from reame_core.server.errors import EXCEPTION_HANDLERS
from reame_core.server.metrics import ServerMetrics
from reame_core.server.routes import CompletionsController, health, metrics, speculation
from reame_core.server.service import ServerState
from reame_core.server.status import status
from reame_core.settings import Settings
from reame_core.web import page

log = structlog.get_logger(__name__)
OPEN_PATHS = frozenset({"/health", *page.PATHS})


def bearer_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    server: ServerState = connection.app.state.server
    if not server.api_keys or connection.url.path in OPEN_PATHS:
        return
    header = connection.headers.get("authorization", "")
    scheme, _space, token = header.partition(" ")
    given = token.strip().encode()
    # Compare against every key without stopping early, in constant time per key.
    valid = False
    for key in server.api_keys:
        valid |= hmac.compare_digest(given, key.encode())
    if scheme.lower() != "bearer" or not valid:
        raise NotAuthorizedException()


def create_app(server: ServerState) -> Litestar:
    server.metrics = ServerMetrics(server)
    settings = server.settings
    cors = CORSConfig(allow_origins=settings.cors_origins) if settings.cors_origins else None

    # Async on purpose: Litestar runs a sync hook in a worker thread, once per message
    # sent, which would cost a thread hand-off for every streamed chunk.
    async def count_response(message: Any, scope: Any) -> None:
        if message["type"] == "http.response.start" and server.metrics is not None:
            # Unmatched paths share one label: clients must not mint new series at will.
            route = scope.get("path_template") or "unmatched"
            server.metrics.requests.labels(route=route, status=str(message["status"])).inc()

    def shutdown() -> None:
        if server.runtime is not None:
            server.runtime.close()

    web = page.ROUTES if settings.web else []
    app = Litestar(
        route_handlers=[CompletionsController, health, metrics, speculation, status, *web],
        state=State({"server": server}),
        guards=[bearer_guard],
        exception_handlers=EXCEPTION_HANDLERS,
        cors_config=cors,
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Reame", version=__version__, path="/schema"),
        before_send=[count_response],
        on_shutdown=[shutdown],
        debug=False,
    )
    return app


def load_in_background(
    server: ServerState, runtime_factory: Any = start_runtime
) -> threading.Thread:
    def load() -> None:
        try:
            runtime: Runtime = runtime_factory(server.settings)
        except Exception as error:
            log.error("model failed to load", error=str(error))
            server.load_error = str(error)
            return
        server.runtime = runtime

    thread = threading.Thread(target=load, name="reame-loader", daemon=True)
    thread.start()
    return thread


def serve(settings: Settings) -> int:
    # Before anything else: a key file that holds no key stops Reame (`SettingsError`)
    # rather than leaving the API open.
    server = ServerState(settings, api_keys=settings.all_api_keys())
    # Before the port opens: a llama.cpp build that cannot run on this CPU stops Reame with
    # one message instead of a server that never turns healthy (cached after the first start).
    build = ensure_build_runs(settings)
    app = create_app(server)
    load_in_background(server, functools.partial(start_runtime, build=build))
    log.info(
        "serving",
        url=f"http://{settings.host}:{settings.port}",
        auth="bearer" if server.api_keys else "off",
        web_page="on" if settings.web else "off",
    )
    # On SIGTERM or Ctrl-C uvicorn stops accepting connections, lets the requests in flight
    # finish (streams to their [DONE]) for up to `drain_seconds`, cuts the rest, and only
    # then runs the shutdown that stops the engine. A second Ctrl-C skips the drain and
    # that shutdown: the engine is stopped here instead, so that plugins still write out
    # what they hold (the archive's last generations, queued prefix snapshots).
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=settings.drain_seconds,
        )
    finally:
        if server.runtime is not None:
            server.runtime.close()
    return 0
