"""One candidate of one request, as it moves through the engine: the state it holds.

A `Candidate` knows its prompt, what it has generated, how far its prompt is in the KV
and the token it will feed next. It does not touch the backend: the engine does.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reame_core.engine.sampler import TokenSampler
from reame_core.engine.slots import Slot
from reame_core.engine.textstream import TextStream
from reame_core.hooktypes import CandidatePlan
from reame_core.request import (
    CandidateResult,
    Event,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)
from reame_core.tools import ToolUse

_keys = itertools.count()


class Phase(enum.Enum):
    # Candidates after the first: the slot is theirs; the prompt's KV is copied into it
    # from candidate 0 once that one has computed it.
    AWAITING_CLONE = "awaiting_clone"
    # A prompt whose beginning another request's prompt, being computed in another slot,
    # shares: it waits for those chunks and copies them rather than computing them twice.
    AWAITING_PREFIX = "awaiting_prefix"
    # A prompt whose beginning another process is computing and has promised to store
    # (`reame_prefix_pending`): it waits for the stored state and restores it.
    AWAITING_STORE = "awaiting_store"
    PREFILL = "prefill"
    DECODING = "decoding"
    FINISHED = "finished"


class Candidate:
    def __init__(
        self,
        group: RequestGroup,
        candidate: int,
        slot: Slot,
        sampler: TokenSampler,
    ) -> None:
        self.group = group
        self.key = next(_keys)  # never reused, unlike id(): plugins keep state under it
        self.candidate = candidate
        self.slot = slot
        self.sampler = sampler
        self.phase = Phase.PREFILL if candidate == 0 else Phase.AWAITING_CLONE
        self.output: list[int] = []
        self.next_token = -1
        self.text = TextStream(group.request.params.stop)
        self.finish_reason: FinishReason | None = None
        self.cumulative_logprob = 0.0
        self.held: list[TokenEvent] = []  # output not streamed yet (a plan's hold_back)
        self.prefill_passed = 0  # steps in a row its prompt got no chunk (Scheduler)
        # In AWAITING_PREFIX: the candidate computing the shared beginning, and its length.
        self.leader: Candidate | None = None
        self.leader_prefix = 0
        # In AWAITING_STORE: when it stops waiting and computes the prefix itself.
        self.prefix_due = 0.0

    # --------------------------------------------------------- SequenceView

    @property
    def request_id(self) -> str:
        return self.group.request.request_id

    @property
    def prompt_tokens(self) -> Sequence[int]:
        return self.group.request.prompt_tokens

    @property
    def output_tokens(self) -> Sequence[int]:
        return self.output

    @property
    def params(self) -> SamplingParams:
        return self.group.request.params

    @property
    def extensions(self) -> Mapping[str, Any]:
        return self.group.request.extensions

    @property
    def tools(self) -> ToolUse | None:
        return self.group.request.tools

    # -------------------------------------------------------------- state

    @property
    def seq_id(self) -> int:
        return self.slot.seq_id

    @property
    def n_kv(self) -> int:
        """Tokens of this sequence already in the KV (the next position to decode)."""
        return len(self.slot.tokens)

    @property
    def prompt_remaining(self) -> int:
        return len(self.prompt_tokens) - self.n_kv

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    def result(self, choice: int | None = None) -> CandidateResult:
        """What is returned for this candidate, numbered `choice` if not its own number."""
        number = self.candidate if choice is None else choice
        return CandidateResult(
            number, self.text.text, tuple(self.output), self.finish_reason or "stop"
        )

    def __repr__(self) -> str:
        phase = self.phase.value
        return f"<Candidate {self.request_id}/{self.candidate} seq={self.seq_id} {phase}>"


@dataclass
class RequestGroup:
    """A request in the engine: its candidates, its event sink and its accounting.

    `plan` is what a selecting plugin asked for (`reame_plan_candidates`), None for a
    request that runs its own n candidates, streamed. `selection_due`: under a plan that
    selects each step, a candidate committed tokens or finished in this step, so selection
    is asked once the step's decodes are over.

    A plan that starts some candidates later keeps what they need: the prompt's KV
    (`prompt_state`, a snapshot), its last logits row, a sampler to fork, and how many a
    selection asked to start (`to_start`) that wait for a slot.
    """

    request: GenerationRequest
    emit: Callable[[Event], None]
    plan: CandidatePlan | None = None
    sequences: list[Candidate] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    store_points: list[int] = field(default_factory=list)
    prefill_started: float = 0.0
    prefill_done: float = 0.0
    cancelled: bool = False
    stop_others: bool = False
    selection_due: bool = False
    passed_by: int = 0  # later requests admitted while it waited for slots (or to start more)
    seed: int = 0
    sampler: TokenSampler | None = None  # candidate 0's, unused: later ones fork it
    prompt_state: bytes | None = None
    prompt_row: np.ndarray | None = None
    to_start: int = 0
    answer_key: str | None = None  # set when its answer may be remembered (engine.recall)

    @property
    def width(self) -> int:
        """How many candidates run at a time: the plan's, or the request's n."""
        return self.request.n if self.plan is None else self.plan.width

    @property
    def unstarted(self) -> int:
        """The plan's candidates that have not started (nor been asked to)."""
        total = self.request.n if self.plan is None else self.plan.candidates
        return total - len(self.sequences) - self.to_start

    @property
    def running(self) -> int:
        return sum(not seq.finished for seq in self.sequences)

    @property
    def held_back(self) -> bool:
        return self.plan is not None and self.plan.hold_back

    @property
    def keeps_logprobs(self) -> bool:
        """Candidates sum their tokens' log-probabilities: for the caller or for selection."""
        return self.request.params.logprobs is not None or self.plan is not None

    @property
    def done(self) -> bool:
        return not self.to_start and all(seq.finished for seq in self.sequences)
