"""The `suggeritore` plugin's hooks: structured output, and the grammar as a draft source.

Who does what, on which thread:

- `reame_configure` (the starting thread): the model's vocabulary becomes an llguidance
  tokenizer, once per model (`tokenizer`), and a `GrammarCache` over it;
- `reame_check_request` (the submitting thread): the request's fields become one grammar
  (`request_grammar`), compiled and checked (`grammars`): a bad one is a 400 naming its
  field before the request is queued;
- the engine thread: each constrained sequence gets a `Constraint` when it starts, kept by
  `seq.key` until it finishes; it masks the sequence's rows, follows its committed tokens,
  and proposes the tokens its grammar forces as drafts: certain where each is the only
  token its mask allows (the engine appends those without verifying them), verified like
  any other source's otherwise, and where it forces text but no token, that text as the
  tokenizer splits it, verified; when only forced tokens and the end remain, it gives them
  as the sequence's end (`reame_forced_end`), committed without computing their steps.

The `Suggeritore` instance owns the tokenizer, the cache and every sequence's constraint.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence

import llguidance
import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest, ModelInfo, SequenceView
from reame_core.request import GenerationRequest
from reame_core.settings import Settings
from reame_suggeritore import cli
from reame_suggeritore.constraint import Constraint
from reame_suggeritore.grammars import GrammarCache
from reame_suggeritore.request_grammar import FIELDS, Grammar, requested_grammar
from reame_suggeritore.tokenizer import build_tokenizer, end_of_sequence
from reame_suggeritore.tools import TOOL_FIELDS

log = structlog.get_logger(__name__)

NAME = "suggeritore"
REQUEST_FIELDS = {**FIELDS, **TOOL_FIELDS}


class SuggeritoreSettings(BaseModel):
    """Options of the `suggeritore` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


class Suggeritore:
    """See the module docstring. One instance serves one runtime at a time."""

    def __init__(self) -> None:
        self._model: ModelInfo | None = None
        self._grammars: GrammarCache | None = None
        self._constraints: dict[int, Constraint] = {}
        self.tokenizer_seconds = 0.0

    # ------------------------------------------------------------ command line

    @hookimpl
    def reame_add_request_options(self, parser: argparse.ArgumentParser) -> None:
        cli.add_request_options(parser)

    # ---------------------------------------------------------------- lifecycle

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        settings.plugin_section(NAME, SuggeritoreSettings)
        self._constraints.clear()
        if self._model is not None and self._model.fingerprint == model.fingerprint:
            self._model = model  # the same vocabulary: its tokenizer and grammars still hold
            return
        started = time.perf_counter()
        tokenizer = build_tokenizer(model)
        self.tokenizer_seconds = time.perf_counter() - started
        self._model = model
        self._grammars = GrammarCache(tokenizer)
        log.info(
            "grammar tokenizer ready",
            tokens=tokenizer.vocab_size,
            seconds=round(self.tokenizer_seconds, 3),
        )

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return REQUEST_FIELDS

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        tokenizer = self._grammars.tokenizer if self._grammars is not None else None
        grammar = requested_grammar(request, tokenizer)
        if grammar is None:
            return
        if request.params.ignore_eos:
            raise RequestError(
                f"'ignore_eos' cannot apply to a structured answer ('{grammar.field}'): it "
                "ends where its grammar does.",
                param="ignore_eos",
            )
        self._cache().check(grammar)

    @hookimpl
    def reame_sequence_started(self, seq: SequenceView) -> None:
        if self._model is None or self._grammars is None:
            return
        model, grammars = self._model, self._grammars
        grammar = _grammar_of(seq, grammars.tokenizer)
        if grammar is None:
            return
        try:
            matcher = grammars.matcher(grammar)  # compiled when the request was checked
        except RequestError as error:  # only if the check was skipped
            log.error("grammar cannot be used", request=seq.request_id, error=error.message)
            return
        self._constraints[seq.key] = Constraint(
            matcher,
            mask_bits=grammars.tokenizer.vocab_size,
            eos=end_of_sequence(model),
            eog=model.eog,
            request_id=seq.request_id,
        )

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self._constraints.pop(seq.key, None)

    def constraint_of(self, key: int) -> Constraint | None:
        """The grammar a decoding sequence (by `seq.key`) answers under, if any."""
        return self._constraints.get(key)

    # ----------------------------------------------------------- the sequences

    @hookimpl
    def reame_constrain_logits(
        self, seq: SequenceView, pending: Sequence[int], logits: np.ndarray
    ) -> None:
        constraint = self._constraints.get(seq.key)
        if constraint is not None:
            constraint.constrain(pending, logits)

    @hookimpl
    def reame_tokens_committed(self, seq: SequenceView, tokens: Sequence[int]) -> None:
        constraint = self._constraints.get(seq.key)
        if constraint is not None:
            constraint.commit(tokens)

    @hookimpl
    def reame_forced_end(self, seq: SequenceView) -> tuple[int, ...] | None:
        constraint = self._constraints.get(seq.key)
        return constraint.forced_end() if constraint is not None else None

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            constraint = self._constraints.get(request.seq.key)
            if constraint is None:
                continue
            tokens, alone = constraint.forced(request.max_tokens)
            if alone:
                proposals.append(DraftProposal(request.seq, NAME, tokens[:alone], certain=True))
            elif tokens:
                proposals.append(DraftProposal(request.seq, NAME, tokens))
            elif guess := self._forced_text_guess(constraint, request.max_tokens):
                proposals.append(DraftProposal(request.seq, NAME, guess))
        return proposals

    def _forced_text_guess(self, constraint: Constraint, limit: int) -> tuple[int, ...]:
        """Where the grammar forces text but no token, that text as the tokenizer splits it
        alone, as far as the grammar allows it: the model often writes it so."""
        text = constraint.forced_text().decode("utf-8", errors="ignore")
        if not text or self._model is None:
            return ()
        tokens = self._model.vocab.tokenize(text, add_special=False, parse_special=False)
        taken, _ = constraint.allowed(tokens[:limit])
        return tuple(tokens[:taken])

    # ---------------------------------------------------------------- reporting

    @hookimpl
    def reame_describe(self) -> str:
        return (
            "structured output (response_format, json_schema, grammar, regex), and the "
            "tokens a grammar forces proposed as drafts"
        )

    def _cache(self) -> GrammarCache:
        if self._grammars is None:
            raise RequestError("Structured output is not ready: no model is loaded yet.")
        return self._grammars


def _grammar_of(seq: SequenceView, tokenizer: llguidance.LLTokenizer) -> Grammar | None:
    """The grammar of the request `seq` answers, derived again from its fields (the same
    text as at its check, so the compiled grammar is found in the cache)."""
    request = GenerationRequest(
        seq.prompt_tokens,
        seq.params,
        extensions=seq.extensions,
        request_id=seq.request_id,
        tools=seq.tools,
    )
    try:
        return requested_grammar(request, tokenizer)
    except RequestError:  # refused at its check; a request that skipped it runs free
        return None


plugin = Suggeritore()
