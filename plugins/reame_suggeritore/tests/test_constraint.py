"""One sequence's constraint on its own: pending drafts, forced tokens and text, completion,
failure."""

from __future__ import annotations

from types import SimpleNamespace

import llguidance
import numpy as np
import structlog

from reame_core.backend.fake import EOS, IM_END, N_VOCAB, FakeBackend
from reame_core.hooktypes import DraftRequest
from reame_core.settings import Settings
from reame_suggeritore.constraint import Constraint
from reame_suggeritore.grammars import GrammarCache
from reame_suggeritore.plugin import Suggeritore
from reame_suggeritore.request_grammar import Grammar
from reame_suggeritore.tokenizer import build_tokenizer


def constraint(regex: str) -> Constraint:
    tokenizer = build_tokenizer(FakeBackend().info)
    grammar = Grammar("regex", llguidance.LLMatcher.grammar_from_regex(regex))
    return Constraint(
        GrammarCache(tokenizer).matcher(grammar),
        mask_bits=tokenizer.vocab_size,
        eos=EOS,
        eog=frozenset({EOS, IM_END}),
        request_id="req-test",
    )


def widen(c: Constraint) -> None:
    """Make `c`'s masks also allow token 0: no forced token is alone in its mask then."""
    real = c.matcher

    class Wider:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def unsafe_compute_mask_ptr(self, address: int, size: int) -> None:
            real.unsafe_compute_mask_ptr(address, size)
            c._bitmask[0] |= 1

    c.matcher = Wider()  # type: ignore[assignment]


def allowed(c: Constraint, pending: tuple[int, ...] = ()) -> set[int]:
    row = np.zeros(N_VOCAB, dtype=np.float32)
    c.constrain(pending, row)
    return {int(t) for t in np.flatnonzero(np.isfinite(row))}


def test_rows_after_pending_drafts_are_constrained_as_if_committed() -> None:
    c = constraint("ab[cd]")

    assert allowed(c) == {ord("a")}
    assert allowed(c, (ord("a"),)) == {ord("b")}
    assert allowed(c, (ord("a"), ord("b"))) == {ord("c"), ord("d")}
    assert allowed(c) == {ord("a")}  # the pending tokens were rolled back


def test_a_refused_pending_token_leaves_the_row_alone() -> None:
    c = constraint("ab")

    assert allowed(c, (ord("x"),)) == set(range(N_VOCAB))
    c.commit([ord("a")])
    assert allowed(c) == {ord("b")}


def test_a_complete_answer_may_only_end_on_any_end_of_generation_token() -> None:
    c = constraint("ab")
    c.commit([ord("a"), ord("b")])

    assert allowed(c) == {EOS, IM_END}
    assert c.forced(8) == ((), 0)


def test_forced_tokens_are_the_grammars_only_way_on() -> None:
    c = constraint("hello (world|there)")

    tokens, alone = c.forced(16)
    assert bytes(tokens) == b"hello " and alone == len(tokens)  # each its mask's only token
    assert c.forced(3) == (tuple(b"hel"), 3)
    assert allowed(c) == {ord("h")}  # checking them left the matcher where it was


def test_a_forced_token_its_mask_does_not_allow_alone_is_not_certain() -> None:
    c = constraint("ab")
    widen(c)
    assert c.forced(8) == (tuple(b"ab"), 0)
    assert allowed(c) == {0, ord("a")}


def test_a_token_that_breaks_the_grammar_ends_the_answer_and_is_logged() -> None:
    c = constraint("ab")

    with structlog.testing.capture_logs() as logs:
        c.commit([ord("z")])

    assert c.failed
    assert allowed(c) == {EOS, IM_END}
    assert logs[0]["request"] == "req-test"


def test_a_grammar_failing_inside_a_forced_run_keeps_the_tokens_before_then_only_ends() -> None:
    c = constraint("abcd")
    real = c.matcher
    masks = 0

    class FailsAtTheThird:
        """The matcher, but it errs computing the third mask."""

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def unsafe_compute_mask_ptr(self, address: int, size: int) -> None:
            nonlocal masks
            masks += 1
            real.unsafe_compute_mask_ptr(address, size)

        def is_error(self) -> bool:
            return masks >= 3

        def get_error(self) -> str:
            return "lexer limit"

    c.matcher = FailsAtTheThird()  # type: ignore[assignment]
    with structlog.testing.capture_logs():
        assert c.forced(8) == (tuple(b"ab"), 2)
    assert c.failed
    assert allowed(c, tuple(b"ab")) == {EOS, IM_END}


def test_the_forced_end_is_the_rest_when_nothing_else_can_follow() -> None:
    c = constraint("ab")

    assert c.forced_end() == tuple(b"ab")
    assert allowed(c) == {ord("a")}  # looking left the matcher where it was
    c.commit(list(b"ab"))
    assert c.forced_end() == ()  # complete: it must end now


def test_no_forced_end_before_the_forced_text_reaches_the_end() -> None:
    c = constraint("(yes|no)! Done.")

    assert c.forced_end() is None  # a choice comes first
    c.commit([ord("y")])
    # llguidance forces "es! Done" and holds the last token back until the text before it
    # is committed: the end is not forced yet.
    assert c.forced(16) == (tuple(b"es! Done"), 8)
    assert c.forced_end() is None
    assert allowed(c) == {ord("e")}


def test_no_forced_end_while_the_grammar_may_go_on_after_the_forced_text() -> None:
    c = constraint("ab[cd]")

    assert c.forced(8) == (tuple(b"ab"), 2)
    assert c.forced_end() is None
    assert allowed(c) == {ord("a")}


def test_no_forced_end_where_a_mask_allows_more_than_the_forced_token() -> None:
    c = constraint("ab")
    widen(c)
    assert c.forced_end() is None


def test_a_failed_grammar_must_end_now() -> None:
    c = constraint("ab")
    with structlog.testing.capture_logs():
        c.commit([ord("z")])

    assert c.forced_end() == ()


def test_forced_text_is_what_the_grammar_forces_next_as_bytes() -> None:
    c = constraint("ab[cd]")

    assert c.forced_text() == b"ab"
    c.commit(list(b"ab"))
    assert c.forced_text() == b""
    c.commit([ord("c")])
    assert c.forced_text() == b""  # complete


def test_forced_text_without_a_forced_token_is_proposed_as_a_guess_to_verify() -> None:
    backend = FakeBackend()
    plugin = Suggeritore()
    plugin.reame_configure(settings=Settings(), model=backend.info)
    c = constraint("ab[cd]")
    real = c.matcher

    class RunsOn:
        """The matcher, as where a token could run on past the forced text: no token
        is forced, the text still is."""

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def compute_ff_tokens(self) -> list[int]:
            return []

    c.matcher = RunsOn()  # type: ignore[assignment]
    seq = SimpleNamespace(key=7)
    plugin._constraints[7] = c

    (proposal,) = plugin.reame_propose_drafts([DraftRequest(seq, 8)])  # type: ignore[arg-type]

    assert proposal.tokens == tuple(b"ab") and not proposal.certain
    assert plugin.reame_propose_drafts([DraftRequest(seq, 1)])[0].tokens == (ord("a"),)
    assert allowed(c) == {ord("a")}
