"""Answers fixed by their request alone.

In the deterministic configuration a sequence's tokens depend on nothing but its own
request: not on its batch neighbours, not on which cache its prefix came from. A request
that samples greedily, or with its own seed, therefore gets the same answer every time it
runs, and a plugin that remembers answers (hooks `reame_remember_answer` and
`reame_recall_answer`) may return the earlier one instead of computing it again: a retried
request, a nightly re-run of yesterday's batch. The engine asks only for requests that
qualify (`recallable`), under a key that names everything the answer depends on
(`answer_key`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from array import array
from collections.abc import Mapping, Set
from typing import Any

from reame_core.hooktypes import CandidatePlan, ModelInfo
from reame_core.request import GenerationRequest


def recallable(request: GenerationRequest, plan: CandidatePlan | None) -> bool:
    """Whether the request alone fixes its answer: one choice and no candidate plan (a
    selection may run candidates in waves), greedy or seeded sampling, and no logprobs
    asked (those are not remembered)."""
    params = request.params
    return (
        request.n == 1
        and plan is None
        and params.logprobs is None
        and (params.greedy or params.fixed_seed is not None)
    )


def answer_key(request: GenerationRequest, model: ModelInfo) -> str | None:
    """A name for everything the answer depends on: the model and its configuration
    (`ModelInfo.fingerprint`), the prompt's tokens, the sampling parameters, the plugins'
    request fields and the tools offered. None if a field has no stable description."""
    try:
        described = json.dumps(
            [
                model.fingerprint,
                len(request.prompt_tokens),
                _plain(request.params),
                _plain(request.extensions),
                _plain(request.tools),
            ],
            sort_keys=True,
            separators=(",", ":"),
        )
        tokens = array("q", request.prompt_tokens)  # the prompt as bytes: 20x faster than JSON
    except (TypeError, ValueError, OverflowError):
        return None
    digest = hashlib.sha256(described.encode())
    digest.update(tokens.tobytes())
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    """JSON-ready form of the request's parts; TypeError for what has none (an object whose
    only description would be its address)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"no stable description for {type(value).__name__}")
