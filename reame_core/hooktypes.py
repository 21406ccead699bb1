"""The values that cross the plugin boundary.

Hook implementations receive and return these; they never receive the backend or the
engine itself, so a plugin cannot reach around the engine thread that owns the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from reame_core.request import FinishReason, SamplingParams
    from reame_core.tools import ToolUse


# The group of `reame_collect_stats` whose counters are a store's disk faults by kind.
DISK_FAULTS = "disk_faults"


@dataclass(frozen=True)
class DiskNeed:
    """A plugin's ask for disk space, which the host plan turns into a budget.

    The plan gives the plugin `share` of the free disk where its data goes (`directory`;
    None: where Reame keeps its files), at most `cap` bytes, as the default of the `setting`
    key of its ``[plugins.<section>]`` table; a value set there wins. `purpose` names what
    the bytes hold ("the KV of shared prompt prefixes"), for `reame config`.
    """

    section: str
    purpose: str
    share: float
    cap: int
    setting: str = "budget"
    directory: Path | None = None


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


class Vocabulary(Protocol):
    """The model's tokenizer and token table: read-only, and safe to call from any thread.

    It is not the decoding context (which only the engine thread touches): llama.cpp
    tokenizes through a ``const llama_vocab *``, keeping each call's state on its own stack,
    so the HTTP server tokenizes prompts on its own threads while the engine decodes, and a
    plugin (a grammar engine) reads token bytes without reaching into the backend.
    """

    @property
    def n_vocab(self) -> int: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids; `add_special` adds BOS where the model wants it,
        `parse_special` turns control-token text (e.g. ``<|im_start|>``) into its id."""
        ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token. A token may hold part of a UTF-8 character; join
        bytes before decoding. Control tokens render as b"" unless `special`."""
        ...

    def pieces(self) -> Sequence[bytes]:
        """Every token's bytes, indexed by token id, control tokens as written."""
        ...

    def control_tokens(self) -> frozenset[int]:
        """The tokens that are markup rather than text: llama.cpp's control tokens, and
        user-defined tokens written as a tag (``<tool_call>``), which chat templates use the
        same way. A grammar engine keeps them apart from the text tokens that spell the
        same characters."""
        ...


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model that callers and plugins may rely on.

    `fingerprint` changes whenever the bytes of a sequence's KV state would: file identity,
    architecture, KV type, the context parameters that shape the state (sequence slots, KV
    layout, flash attention) and the llama.cpp build. A cache keyed on it never serves one
    model's state to another.
    `prefix_trim_safe` is False for sliding-window, recurrent and hybrid models: their
    state cannot be cut back to a shorter prefix, only continued from its full length.
    `vocab` tokenizes and detokenizes for this model from any thread.
    `chunk_grid`: prompt chunks start at multiples of it, and where reuse must be exact only
    prefixes of such a length are reused. llama.cpp's CPU matrix kernels compute a
    micro-batch's rows four at a time and the leftover rows one at a time along another
    path, so a prompt token's KV is the same in every run only if it sits at the same place
    in its group of four whichever chunk computed it. The engine drops the grid where the
    server's pass check found a row's logits the same whatever pass computes it.
    """

    name: str
    path: str
    fingerprint: str
    architecture: str
    n_vocab: int
    n_ctx_seq: int
    n_seq_max: int
    n_batch: int
    bos: int | None
    eos: int | None
    eog: frozenset[int]
    add_bos: bool
    fim: FimTokens | None
    chat_template: str | None
    prefix_trim_safe: bool
    vocab: Vocabulary = field(repr=False, compare=False)
    kv_type: str = "f16"
    n_threads: int = 1  # CPU threads the context computes with
    chunk_grid: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)


class SequenceView(Protocol):
    """A read-only look at one decoding sequence (one candidate of one request).

    `key` identifies the sequence for as long as the engine runs and is never reused: the
    key a plugin keeps state under (a mirror, an index) until `reame_generation_finished`.
    """

    @property
    def key(self) -> int: ...
    @property
    def request_id(self) -> str: ...
    @property
    def candidate(self) -> int: ...
    @property
    def prompt_tokens(self) -> Sequence[int]: ...
    @property
    def output_tokens(self) -> Sequence[int]: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def extensions(self) -> Mapping[str, Any]: ...
    @property
    def tools(self) -> ToolUse | None:
        """The functions the request offers the model (`GenerationRequest.tools`)."""
        ...


class TargetSampler(Protocol):
    """How the target model picks one candidate's next token, as draft verification needs it.

    Rows are raw logits; the sampler applies the request's adjustments (logit bias, penalties
    as if `pending` tokens were committed, temperature and cuts). Draws use the candidate's
    own random stream, so verification consumes it exactly as plain decoding would.
    """

    @property
    def greedy(self) -> bool: ...

    def distribution(self, logits: np.ndarray, pending: Sequence[int] = ()) -> np.ndarray:
        """The probability of every token at this position (one-hot at the argmax if greedy)."""
        ...

    def sample(self, logits: np.ndarray, pending: Sequence[int] = ()) -> int:
        """The token plain decoding would pick here: the argmax, or one draw."""
        ...

    def draw(self, probs: np.ndarray) -> int:
        """One token from a distribution over the vocabulary."""
        ...

    def uniform(self) -> float:
        """One uniform number in [0, 1)."""
        ...


@dataclass(frozen=True)
class DraftRequest:
    """The engine asks for at most `max_tokens` drafts continuing `seq`."""

    seq: SequenceView
    max_tokens: int


@dataclass(frozen=True)
class DraftProposal:
    """Tokens a draft source guesses will follow `seq`, to be verified in one batch (or,
    `certain`, appended as they are).

    `probs` is None for deterministic sources (n-gram, grammar, archive: q is one-hot);
    a sampling draft model passes the distribution each token was drawn from, one row
    per token, so speculative sampling can keep the target's distribution exact.

    `certain`: each token is the only one the sequence's own constraints
    (`reame_constrain_logits`) admit at its place, so sampling there could pick nothing
    else, greedy or not. The engine then appends the tokens without verifying them: the
    model computes their KV in the step, and logits only for the row after the last one
    (the row that picks the next token), unless the request keeps logprobs (it asks for
    them, or plans several candidates): then they are verified. A source that says so of a
    token its constraint does not force changes the output.

    `kind`: which of the source's kinds of draft this is, for a source whose drafts differ
    in how often they come true in a way it can tell (the archive: the length of the match
    behind the draft). The governor learns acceptance per source and per kind, so one kind's
    misses do not price another's drafts; "" (the default) is judged with the source alone.
    Keep the kinds few: each must earn its own evidence.
    """

    seq: SequenceView
    source: str
    tokens: tuple[int, ...]
    probs: np.ndarray | None = None
    certain: bool = False
    kind: str = ""


@dataclass(frozen=True)
class DraftCost:
    """What a draft source's propose call costs, as the source measured it before its first
    call: `seconds` for a call that caught up on `caught_up` tokens of one sequence and
    drafted `drafted` tokens for it (a draft model times a few of its decodes at start)."""

    seconds: float
    drafted: int
    caught_up: int = 1


@dataclass(frozen=True)
class Verification:
    """Outcome of checking a draft against the target: the first `accepted` draft tokens
    were right, and `tokens` (accepted drafts plus one token sampled from the target)
    are appended to the sequence."""

    accepted: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class PrefixHit:
    """A stored KV state whose first `n_tokens` tokens equal the prompt's first ones.

    `state_tokens` are all the tokens the state holds, when it holds more than those
    `n_tokens` (a snapshot of a longer prompt); None means exactly ``prompt[:n_tokens]``.
    The engine cuts a longer state back to `n_tokens`, which only models with
    `ModelInfo.prefix_trim_safe` allow.
    """

    n_tokens: int
    state: bytes
    source: str
    state_tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RecalledAnswer:
    """An answer a request got before, as it was returned: its tokens, its text (stop
    strings already cut) and why it ended ("stop" or "length")."""

    tokens: tuple[int, ...]
    text: str
    finish_reason: FinishReason


@dataclass(frozen=True)
class CandidatePlan:
    """How to run one request's candidates, when a selecting plugin wants other than `n`
    candidates, each streamed as it goes (see ``reame_plan_candidates``).

    `candidates` may run (at least the request's `n`; candidate i samples with seed + i),
    and the final selection returns at most `n` of them. With `at_once`, only that many
    start at admission and at most that many run at a time: the others start when a
    selection asks for them (``Selection.start``), with the prompt's KV restored from a
    snapshot taken when it was computed, so the prompt is computed once however late they
    start. With `select_each_step`, candidate selection is asked (``final=False``) after
    every step in which a candidate committed tokens, not only when one finishes. With
    `hold_back`, no token is streamed before the final selection; then each chosen
    candidate's whole output is sent as one event, numbered by its place in the selection
    (choice 0, 1, ...), so callers only ever see what was chosen. `temperature` replaces
    the request's when its caller did not set one.
    """

    candidates: int
    select_each_step: bool = False
    hold_back: bool = False
    at_once: int | None = None
    temperature: float | None = None

    @property
    def width(self) -> int:
        """How many candidates run at a time."""
        return self.candidates if self.at_once is None else min(self.at_once, self.candidates)


@dataclass(frozen=True)
class CandidateView:
    """One candidate of a request with several, as seen by candidate selection.

    `cumulative_logprob` sums the model's log-probabilities of the candidate's tokens; it is
    kept for requests that ask for logprobs or have a `CandidatePlan`, and is 0.0 otherwise.
    """

    candidate: int
    tokens: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None
    cumulative_logprob: float


@dataclass(frozen=True)
class Selection:
    """Which candidates to return, in order; `stop_others` ends the unfinished candidates
    not chosen now, with finish reason "abandoned". `start` asks for that many more of the
    plan's candidates (those beyond its `at_once`), started as slots free up. A final
    selection's `report` is returned to the caller: each key becomes a field of the
    response (``{"conclave": {...}}``)."""

    chosen: tuple[int, ...] = ()
    stop_others: bool = False
    start: int = 0
    report: Mapping[str, Any] = field(default_factory=dict)


AnswerExtractor = Callable[[str, "str | None"], "str | None"]
"""Reads a candidate's answer from its text (hook ``reame_answer_extractors``): given the
text and the request's argument for the extractor, the normalised answer or None."""
