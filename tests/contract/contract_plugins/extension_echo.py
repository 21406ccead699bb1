"""Proves `reame_request_extensions` and `reame_sequence_started`: a field the plugin claims
is accepted by the API and reaches every candidate's `seq.extensions` when it starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView

FIELD = "contract_tag"
started: list[tuple[str, int, Mapping[str, Any]]] = []


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {FIELD: "a label the contract tests follow through the engine"}


@hookimpl
def reame_sequence_started(seq: SequenceView) -> None:
    started.append((seq.request_id, seq.candidate, dict(seq.extensions)))
