"""Proves the lifecycle hooks arrive in order: `reame_configure` once before any request,
`reame_sequence_started` and `reame_generation_finished` once per candidate (with its
finish reason and final text), `reame_shutdown` once at the end."""

from __future__ import annotations

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, SequenceView
from reame_core.settings import Settings

events: list[tuple[str, ...]] = []


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    events.append(("configure", model.name))


@hookimpl
def reame_sequence_started(seq: SequenceView) -> None:
    events.append(("started", seq.request_id, str(seq.candidate)))


@hookimpl
def reame_generation_finished(seq: SequenceView, finish_reason: str, text: str) -> None:
    events.append(("finished", seq.request_id, str(seq.candidate), finish_reason, text))


@hookimpl
def reame_shutdown() -> None:
    events.append(("shutdown",))
