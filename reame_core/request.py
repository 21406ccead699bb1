"""What a caller asks the engine for, and what the engine sends back.

These are plain values shared by the CLI, the HTTP API, the engine and plugins. They hold
no behaviour beyond validation; the engine owns everything that happens to a request.

Every limit a request must meet is checked in one place, here: a sampling value's range
when `SamplingParams` is built, an empty prompt or n < 1 when `GenerationRequest` is, and
what depends on the model (token ids, context room, slots) in `check_request`, which
`Engine.check` runs before the plugins' own checks. Callers never repeat these checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from reame_core.errors import ContextOverflowError, RequestError

if TYPE_CHECKING:
    from reame_core.hooktypes import ModelInfo
    from reame_core.tools import ToolUse

FinishReason = Literal["stop", "length", "abandoned", "cancelled", "error"]
"""Why a candidate ended. "stop" (end of generation or a stop string) and "length" (max_tokens
or the context) are complete generations; "abandoned" is a candidate that candidate selection
stopped before it finished (`Selection.stop_others`), its text cut short; "cancelled" and
"error" end the whole request."""

_request_ids = itertools.count(1)

# Bounds on what a request may ask of the sampler, where OpenAI's own are too tight for a
# local server's uses but some bound must hold: each costs the engine thread work at every
# step of every sequence sharing the batch.
MAX_STOPS = 16
"""Stop strings per request (OpenAI takes 4)."""
MAX_STOP_CHARS = 256
"""Characters per stop string. Output that could begin a stop string is held back, and each
step compares the held text's ends with every stop's beginnings: the cost grows with the
square of a stop's length. Real stop strings are markers ("\n\n", "</answer>", "```")."""
MAX_LOGIT_BIAS = 2048
"""Entries of a logit bias. OpenAI takes 300; allowing exactly the digits of a large
vocabulary already takes over a thousand."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. Defaults are greedy decoding."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    speculate: Literal["auto", "on", "off"] | None = None  # None: the server's setting

    def __post_init__(self) -> None:
        # The one place these ranges are checked (OpenAI's, where the API has the field).
        checks: list[tuple[str, bool, str]] = [
            ("max_tokens", self.max_tokens >= 1, "must be at least 1"),
            ("temperature", 0.0 <= self.temperature <= 2.0, "must be in [0, 2]"),
            ("top_k", self.top_k >= 0, "must be 0 (off) or positive"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("min_p", 0.0 <= self.min_p < 1.0, "must be in [0, 1)"),
            ("repeat_penalty", 0.0 < self.repeat_penalty <= 10.0, "must be in (0, 10]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("penalty_last_n", self.penalty_last_n >= 0, "must be 0 or positive"),
            (
                "logit_bias",
                len(self.logit_bias) <= MAX_LOGIT_BIAS
                and all(-100.0 <= bias <= 100.0 for bias in self.logit_bias.values()),
                f"maps at most {MAX_LOGIT_BIAS} token ids to values in [-100, 100]",
            ),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "must be in [0, 20]"),
            (
                "stop",
                len(self.stop) <= MAX_STOPS
                and all(0 < len(stop) <= MAX_STOP_CHARS for stop in self.stop),
                f"holds at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters",
            ),
        ]
        for name, ok, message in checks:
            if not ok:
                raise RequestError(f"'{name}' {message}.", param=name)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def fixed_seed(self) -> int | None:
        """The caller's seed, if sampling follows it (llama.cpp's convention: none, or a
        negative one, means a random seed)."""
        return self.seed if self.seed is not None and self.seed >= 0 else None

    @property
    def penalized(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass
class GenerationRequest:
    """One generation job: a tokenized prompt, how to sample, and how many candidates.

    `n` candidates share one prefill; their KV is cloned, and candidate i samples with seed
    `seed + i`. A `session_id` keeps the conversation's KV pinned in its slot between
    turns. `extensions` carries fields that plugins registered through
    `reame_request_extensions` (e.g. a grammar); `tools` the functions a chat offers the
    model (a plugin that claims ``tools`` constrains the calls to them). The engine passes
    both through untouched. `unset` names the sampling fields its caller left at their
    defaults, which a plugin's `CandidatePlan` may choose instead (best-of-N's temperature).
    """

    prompt_tokens: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    extensions: Mapping[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_request_ids)}")
    tools: ToolUse | None = None
    unset: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            raise RequestError("The prompt is empty.", param="prompt")
        if self.n < 1:
            raise RequestError("'n' must be at least 1.", param="n")


def check_request(
    request: GenerationRequest, model: ModelInfo, *, prompt_param: str = "prompt"
) -> None:
    """The limits that depend on the model: token ids, the context per sequence, the slots.

    `prompt_param` is the field errors about the prompt name (``messages`` for a chat).
    """
    n_prompt = len(request.prompt_tokens)
    if any(not 0 <= token < model.n_vocab for token in request.prompt_tokens):
        raise RequestError(f"Token ids must be in [0, {model.n_vocab}).", param=prompt_param)
    if any(not 0 <= token < model.n_vocab for token in request.params.logit_bias):
        raise RequestError(
            f"logit_bias keys must be token ids in [0, {model.n_vocab}).", param="logit_bias"
        )
    if n_prompt >= model.n_ctx_seq:
        raise ContextOverflowError(
            f"The prompt has {n_prompt} tokens; this model's context per sequence is "
            f"{model.n_ctx_seq}.",
            param=prompt_param,
        )
    if n_prompt + request.params.max_tokens > model.n_ctx_seq:
        raise ContextOverflowError(
            f"This model's context per sequence is {model.n_ctx_seq} tokens; the prompt "
            f"has {n_prompt} and max_tokens asks for {request.params.max_tokens}.",
            param=prompt_param,
        )
    if request.n > model.n_seq_max:
        raise RequestError(
            f"'n' is {request.n} but the server runs {model.n_seq_max} sequence slots.",
            param="n",
        )


def context_room(n_prompt: int, model: ModelInfo) -> int:
    """The tokens a prompt of `n_prompt` leaves for the answer: the default max_tokens when
    the caller names none. At least 1, so that a prompt which fills the context is refused
    by `check_request`, which says so."""
    return max(1, model.n_ctx_seq - n_prompt)


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """New output of one candidate: the tokens accepted this step and the text they completed.

    `text` may be empty while bytes of a UTF-8 character or a possible stop string are held back.
    """

    candidate: int
    tokens: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Usage:
    """Token accounting of one request. `cached_tokens` were reused instead of computed:
    `restored_tokens` of them came from a stored state (a prefix cache plugin), the rest
    from KV already resident in a slot."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    restored_tokens: int = 0
    completion_tokens: int = 0
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    draft_proposed: dict[str, int] = field(default_factory=dict)
    draft_accepted: dict[str, int] = field(default_factory=dict)
    recalled_tokens: int = 0  # of completion_tokens, sent from a plugin's memory

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class CandidateResult:
    candidate: int
    text: str
    tokens: tuple[int, ...]
    finish_reason: FinishReason


@dataclass(frozen=True)
class FinishEvent:
    """The request is over. `candidates` are those selected to return, in order; `report`
    is what the selecting plugin tells the caller about its choice (response fields)."""

    candidates: tuple[CandidateResult, ...]
    usage: Usage
    error: str | None = None
    report: Mapping[str, Any] = field(default_factory=dict)


Event = TokenEvent | FinishEvent
