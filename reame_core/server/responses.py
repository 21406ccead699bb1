"""OpenAI's response bodies (usage, timings, logprobs), built from the engine's results.

Pure functions from engine values to JSON-ready dicts, so they are tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reame_core.request import TokenLogprob, Usage

TokenText = Callable[[int], bytes]


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def timings_body(usage: Usage) -> dict[str, Any]:
    """What the server computed and what it saved, as llama-server names it (+ cached_n,
    and restored_n: the part of cached_n restored from a stored state rather than found
    resident in a slot; recalled_n: output tokens sent from memory, not computed)."""
    computed = usage.computed_prompt_tokens
    predicted = usage.completion_tokens - usage.recalled_tokens
    body: dict[str, Any] = {
        "prompt_n": computed,
        "prompt_ms": round(usage.prompt_ms, 3),
        "cached_n": usage.cached_tokens,
        "restored_n": usage.restored_tokens,
        "predicted_n": predicted,
        "predicted_ms": round(usage.predicted_ms, 3),
        "prompt_per_second": _rate(computed, usage.prompt_ms),
        "predicted_per_second": _rate(predicted, usage.predicted_ms),
    }
    if usage.recalled_tokens:
        body["recalled_n"] = usage.recalled_tokens
    if usage.draft_proposed:
        body["draft_n"] = sum(usage.draft_proposed.values())
        body["draft_n_accepted"] = sum(usage.draft_accepted.values())
        body["drafts"] = {
            source: {"proposed": proposed, "accepted": usage.draft_accepted.get(source, 0)}
            for source, proposed in usage.draft_proposed.items()
        }
    return body


def _rate(tokens: int, ms: float) -> float | None:
    return round(tokens * 1000.0 / ms, 2) if ms > 0 else None


def merge_usage(usages: Sequence[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total.prompt_tokens += usage.prompt_tokens
        total.cached_tokens += usage.cached_tokens
        total.restored_tokens += usage.restored_tokens
        total.completion_tokens += usage.completion_tokens
        total.recalled_tokens += usage.recalled_tokens
        total.prompt_ms += usage.prompt_ms
        total.predicted_ms = max(total.predicted_ms, usage.predicted_ms)
        for source, count in usage.draft_proposed.items():
            total.draft_proposed[source] = total.draft_proposed.get(source, 0) + count
        for source, count in usage.draft_accepted.items():
            total.draft_accepted[source] = total.draft_accepted.get(source, 0) + count
    return total


def _token_string(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def chat_logprobs(items: Sequence[TokenLogprob], token_bytes: TokenText) -> dict[str, Any]:
    content = []
    for item in items:
        data = token_bytes(item.token)
        content.append(
            {
                "token": _token_string(data),
                "logprob": item.logprob,
                "bytes": list(data),
                "top_logprobs": [
                    {
                        "token": _token_string(token_bytes(token)),
                        "logprob": logprob,
                        "bytes": list(token_bytes(token)),
                    }
                    for token, logprob in item.top
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    items: Sequence[TokenLogprob], token_bytes: TokenText, offset: int = 0
) -> dict[str, Any]:
    tokens, token_logprobs, top, offsets = [], [], [], []
    seen = b""
    for item in items:
        data = token_bytes(item.token)
        # Offsets count characters of the completion text; a token holding part of a
        # character starts where that character does.
        offsets.append(offset + len(seen.decode("utf-8", errors="ignore")))
        seen += data
        tokens.append(_token_string(data))
        token_logprobs.append(item.logprob)
        top.append({_token_string(token_bytes(t)): lp for t, lp in item.top})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def reports(per_request: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What selecting plugins reported (`FinishEvent.report`), as response fields: a
    request's own, or, for a call of several prompts, each field as a list in prompt order."""
    if len(per_request) == 1:
        return dict(per_request[0])
    keys = {key for report in per_request for key in report}
    return {key: [report.get(key) for report in per_request] for key in sorted(keys)}
