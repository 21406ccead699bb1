"""Where two paths may part ways: only at a near-tie of the plain path, and not too often.

Where verifying drafts is exact for the model on this build and CPU (the server's own check,
`verification_is_exact`), drafted outputs must equal the plain path's token for token. On
builds and configurations that do not guarantee bit-exact logits along another path (DESIGN
"Determinism"), a greedy output may leave the plain path's. It may do so only where the
plain path's best token led the token the other path emitted by less than the logits drift
between the paths, and only as often as the drift makes such flips.

`benchmarks/logit_drift.py` measured that drift on the AMD EPYC host (AVX-512 build,
benchmarks/results/logit_drift.json; SmolLM2-135M, 8 prompts x 48 tokens teacher-forced on
the plain path's tokens, the gap between the plain best token and each of its top-5 rivals):

    verifying drafts (steps of 1 + 4 or 1 + 8 tokens, deterministic configuration)
        Q4_1: gap drift median 0.17, p99 0.51, max 0.59; best token differs at 8 of 384
        Q8_0: gap drift median 0.19, p99 0.47, max 0.61; best token differs at 3 of 384
    eight sequences in one batch (unified KV, flash attention on)
        no drift at all: logits identical to one sequence alone, at 384 of 384 positions

On the Intel Xeon with AMX (its patched AMX build) the same measurement found no drift at
all on any of these pairs with flash attention on (logit_drift_intel_amx.json); with it off
(`--flash-attn off`, the host plan's choice there: logit_drift_intel_amx_fa_off.json),
verifying drafts drifted as on the AMD host:

        Q4_1: gap drift median 0.18, p99 0.60, max 0.67; best token differs at 5 of 384
        Q8_0: gap drift median 0.17, p99 0.50, max 0.60; best token differs at 9 of 384

The bounds below are the larger of the two hosts'. A divergence needs a plain-path gap below
the largest drift seen, 0.67; `GAP_BOUND` adds a third for other prompts. The cap on how
many sequences may diverge is the count that, at the measured per-token flip rate, is
exceeded with probability below 0.5%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reame_core.backend.base import Backend
from reame_core.backend.pass_check import PassCheck, check_passes
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.request import Event, FinishEvent, GenerationRequest, TokenEvent, TokenLogprob

GAP_BOUND = 0.9
TOP = 5  # alternatives the plain run records per token
VERIFY_FLIP_RATE_Q4_1 = 8 / 384
VERIFY_FLIP_RATE_Q8_0 = 9 / 384
BATCH_FLIP_RATE = 1 / 384  # none measured: assume at most one in the positions measured
FALSE_ALARM = 0.005


@dataclass(frozen=True)
class PlainRun:
    """The plain path's tokens, with the model's top alternatives at each of them."""

    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Divergence:
    position: int
    plain_token: int
    other_token: int
    gap: float  # plain path: logit of its token minus the other path's token's
    runner_up: bool  # the other path's token was the plain path's second best


def with_logprobs(
    engine: Engine, request: GenerationRequest
) -> tuple[FinishEvent, tuple[TokenLogprob, ...]]:
    """Generate: the request's end and the log-probabilities of its tokens, as streamed."""
    logprobs: list[TokenLogprob] = []

    def collect(event: Event) -> None:
        if isinstance(event, TokenEvent):
            logprobs.extend(event.logprobs)

    return engine.generate(request, collect), tuple(logprobs)


def plain_run(engine: Engine, request: GenerationRequest) -> PlainRun:
    """Generate along the plain path (speculation off), recording top-5 log-probabilities.
    Log-probabilities differ from logits by one constant per row: gaps are logit gaps."""
    assert request.params.logprobs == TOP, "ask the plain run for the top alternatives"
    finished, logprobs = with_logprobs(engine, request)
    tokens = finished.candidates[0].tokens
    assert len(logprobs) == len(tokens)
    return PlainRun(tokens, logprobs)


def first_divergence(plain: PlainRun, other: Sequence[int]) -> Divergence | None:
    split = common_prefix(plain.tokens, other)
    if split >= min(len(plain.tokens), len(other)):
        assert len(plain.tokens) == len(other), "one path stopped early without diverging"
        return None
    chosen = plain.logprobs[split]
    assert chosen.token == plain.tokens[split]
    rivals = [(token, logprob) for token, logprob in chosen.top if token != chosen.token]
    emitted = other[split]
    found = [logprob for token, logprob in rivals if token == emitted]
    assert found, (
        f"at token {split} the other path emitted {emitted}, not among the plain path's "
        f"top {TOP} ({chosen.top}): not a near-tie"
    )
    runner_up = bool(rivals) and rivals[0][0] == emitted
    return Divergence(split, chosen.token, emitted, chosen.logprob - found[0], runner_up)


def diverging_cap(sequences: int, tokens: int, flip_rate: float) -> int:
    """The most sequences of `tokens` tokens that may diverge: the smallest count that a
    binomial model of independent flips at `flip_rate` per token exceeds with probability
    below `FALSE_ALARM`."""
    p = 1.0 - (1.0 - flip_rate) ** tokens
    tail = 1.0
    for cap in range(sequences + 1):
        tail -= math.comb(sequences, cap) * p**cap * (1.0 - p) ** (sequences - cap)
        if tail < FALSE_ALARM:
            return cap
    return sequences


def checked_passes(backend: Backend, directory: Path) -> PassCheck:
    """Whether a row's logits depend on its pass for `backend`'s model here, as the server
    checks it at start (reame_core/backend/pass_check.py); the backend's sequences are
    emptied first, as the check needs, and left empty."""
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)
    check = check_passes(backend, directory)
    assert check is not None, "the test's backend is too small for the check"
    return check


def verification_is_exact(backend: Backend, directory: Path) -> bool:
    """Whether verifying drafts is exact for `backend`'s model here (`checked_passes`)."""
    return checked_passes(backend, directory).exact


def assert_near_ties(
    plains: Sequence[PlainRun], others: Sequence[Sequence[int]], flip_rate: float, *, exact: bool
) -> list[Divergence]:
    """Every other path equals its plain path: token for token where the paths are `exact`
    (as `verification_is_exact` finds verifying drafts for the model here); otherwise up to
    a first divergence, if any, where the plain path's gap to the emitted token is below
    `GAP_BOUND`, and no more sequences diverge than `diverging_cap` allows. Returns the
    divergences, for the test's output."""
    if exact:
        assert [list(other) for other in others] == [list(plain.tokens) for plain in plains]
        return []
    divergences = [
        d
        for plain, other in zip(plains, others, strict=True)
        if (d := first_divergence(plain, other)) is not None
    ]
    for d in divergences:
        assert d.gap < GAP_BOUND, f"diverged where the plain path was sure: {d}"
    tokens = max(len(plain.tokens) for plain in plains)
    cap = diverging_cap(len(plains), tokens, flip_rate)
    assert len(divergences) <= cap, (
        f"{len(divergences)} of {len(plains)} sequences diverged, more than the {cap} the "
        f"measured flip rate allows: {divergences}"
    )
    print(f"{len(divergences)} of {len(plains)} diverged (cap {cap}): {divergences}")
    return divergences


def assert_text_follows_or_parts_at_a_near_tie(plain: dict[str, Any], other_text: str) -> None:
    """For a served chat answer: `plain` is the plain path's response (asked with
    `logprobs` and `top_logprobs`), `other_text` another path's answer to the same request.
    They are equal, or the other parts from the plain path where its next text is one of
    the plain path's top alternatives, trailing the plain choice by less than `GAP_BOUND`."""
    choice = plain["choices"][0]
    if other_text == choice["message"]["content"]:
        return
    before = ""
    for item in choice["logprobs"]["content"]:
        if other_text.startswith(before + item["token"]):
            before += item["token"]
            continue
        rest = other_text[len(before) :]
        rivals = [
            alt["logprob"]
            for alt in item["top_logprobs"]
            if alt["token"] and alt["token"] != item["token"] and rest.startswith(alt["token"])
        ]
        assert rivals, (
            f"parted after {before!r} with {rest[:24]!r}, none of the plain path's top "
            f"alternatives there: {item['top_logprobs']}"
        )
        gap = item["logprob"] - max(rivals)
        assert gap < GAP_BOUND, f"parted after {before!r} where the plain choice led by {gap:.2f}"
        return
    raise AssertionError(f"{other_text!r} runs on past the plain answer {before!r}")
