"""Logging setup: readable console lines by default, JSON lines for servers.

API keys are never logged. Prompts and outputs are logged only when `log_prompts` is set
(`reame serve --log-prompts`: one ``exchange`` line per request); code that would log them
checks `prompts_allowed()` first.
"""

from __future__ import annotations

import logging
import sys

import structlog

_state = {"prompts": False}


def configure_logging(*, json: bool = False, level: str = "info", prompts: bool = False) -> None:
    _state["prompts"] = prompts
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso" if json else "%H:%M:%S"),
            structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # Resolve sys.stderr at each call: it may be replaced (test capture, daemonizing).
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    return structlog.PrintLogger(file=sys.stderr)


def prompts_allowed() -> bool:
    return _state["prompts"]
