"""One sequence's grammar: what it allows next, what it forces, and where it stands.

The matcher follows the sequence's committed tokens (`commit`). To constrain a row that
comes after draft tokens still being verified (`pending`), it consumes them for the time
being and keeps them while the next row's pending extends them, so the k + 1 rows of a
k-token draft cost k consumptions, not k²; the next commit rolls them back first. A pending
token the grammar refuses leaves the later rows untouched: verification stops at the row
whose mask refused it, and never reads them.

Where the grammar is complete only end-of-generation tokens are allowed; where it may end,
all of the model's end-of-generation tokens are (llguidance knows one EOS token). Drafts
are the grammar's forced tokens (`compute_ff_tokens`): tokens, not text. Those whose mask
allows them alone are certain — sampling there could pick nothing else — and the engine
appends them unverified; any others are verified like any draft, so the output is exactly
what the model would have been allowed to pick. Where the grammar forces text but no token
(a token could run on past it), that text is offered for a guess (`forced_text`); where
nothing but forced tokens and then the end can follow, they are the sequence's forced end
(`forced_end`), which the engine commits without computing.

A grammar that fails mid-answer (a limit hit while the lexer grows) cannot go on: the
sequence is then only allowed to end, and that is logged. Nothing here raises, since it
runs on the engine thread where an exception would fail every request in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np
import structlog

from reame_suggeritore import bitmask

log = structlog.get_logger(__name__)


class Constraint:
    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        *,
        mask_bits: int,
        eos: int,
        eog: frozenset[int],
        request_id: str,
    ) -> None:
        self.matcher = matcher
        self.eos = eos
        self.eog = np.array(sorted(eog | {eos}), dtype=np.int64)
        self.request_id = request_id
        self._bitmask = np.zeros((mask_bits + 31) // 32, dtype=np.int32)
        self._pending: list[int] = []  # consumed for a row after drafts, not committed
        self._forced: list[int] | None = None  # forced after the committed tokens, once asked
        self.failed = False

    # ------------------------------------------------------------- committing

    def commit(self, tokens: Sequence[int]) -> None:
        """`tokens` follow the sequence for good."""
        self._settle()
        self._forced = None
        if not self.failed and not self.matcher.consume_tokens(list(tokens)):
            self._fail("a committed token does not follow the grammar")

    # ------------------------------------------------------------ constraining

    def constrain(self, pending: Sequence[int], logits: np.ndarray) -> None:
        """Edit `logits` (the row after the committed tokens and `pending`) in place."""
        if self.failed:
            bitmask.keep_only(logits, self.eog)
            return
        if not self._follow(pending):
            return  # verification stops at an earlier row: this one is never read
        matcher = self.matcher
        if matcher.is_error():  # a limit hit while following committed tokens
            self._fail(matcher.get_error())
            bitmask.keep_only(logits, self.eog)
            return
        if matcher.is_stopped():  # complete: it may only end
            bitmask.keep_only(logits, self.eog)
            return
        matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if matcher.is_error():
            self._fail(matcher.get_error())
            bitmask.keep_only(logits, self.eog)
            return
        bitmask.apply(logits, self._bitmask, self.eos, self.eog)

    def _follow(self, pending: Sequence[int]) -> bool:
        """Bring the matcher to the committed tokens plus `pending`; False if the grammar
        refuses one of them."""
        held = self._pending
        common = 0
        for mine, theirs in zip(held, pending, strict=False):
            if mine != theirs:
                break
            common += 1
        if common < len(held):
            self.matcher.rollback(len(held) - common)
            del held[common:]
        rest = list(pending[common:])
        if rest:
            taken = self.matcher.try_consume_tokens(rest)
            held.extend(rest[:taken])
            return taken == len(rest)
        return True

    def _settle(self) -> None:
        if self._pending:
            self.matcher.rollback(len(self._pending))
            self._pending.clear()

    # ---------------------------------------------------------------- drafting

    def forced(self, limit: int) -> tuple[tuple[int, ...], int]:
        """The tokens the grammar forces next (at most `limit`), as a draft, and how many of
        them lead it as the only token their place allows (checked mask by mask: those are
        certain, the rest are verified)."""
        self._settle()
        if self.failed or self.matcher.is_stopped():
            return (), 0
        tokens = tuple(self._forced_tokens()[:limit])
        matcher, alone = self.matcher, 0
        for token in tokens:
            matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
            alone_here = not matcher.is_error() and bitmask.only(self._bitmask, token)
            if alone_here and matcher.consume_token(token):
                alone += 1
                continue
            if matcher.is_error():
                # Where the grammar fails, it fails without drafts too, and an errored
                # matcher cannot be rolled back: the tokens before stand, then it may only end.
                self._fail(matcher.get_error())
                return tokens[:alone], alone
            break
        if alone:
            matcher.rollback(alone)
        return tokens, alone

    def forced_end(self) -> tuple[int, ...] | None:
        """The tokens the grammar forces from the committed ones to its end, if nothing but
        they can follow (each the only token its mask allows), and then only the end; ()
        if it must end now (complete, or failed); None if it may go on otherwise."""
        self._settle()
        matcher = self.matcher
        if self.failed or matcher.is_stopped():
            return ()
        tokens = self._forced_tokens()
        if not tokens or matcher.validate_tokens(tokens) < len(tokens):
            return None
        # Followed without masks (microseconds); masked only where they would end it.
        taken = matcher.try_consume_tokens(tokens)
        if matcher.is_error():  # a limit hit: the answer cannot go on anyway
            self._fail(matcher.get_error())
            return ()
        ends = taken == len(tokens) and matcher.is_stopped()
        matcher.rollback(taken)
        if not ends:
            return None
        forced, alone = self.forced(len(tokens))
        return forced if alone == len(tokens) else None

    def _forced_tokens(self) -> list[int]:
        # Asked after each commit (`forced_end`) and again for drafts (`forced`).
        if self._forced is None:
            self._forced = self.matcher.compute_ff_tokens()
        return self._forced

    def forced_text(self) -> bytes:
        """The text the grammar forces next where it forces no token: the token that
        starts it may run on into what follows (` "` or ` "Order` after a comma in an array
        of strings), so that text tokenized on its own is a guess, to be verified."""
        self._settle()
        if self.failed or self.matcher.is_stopped():
            return b""
        return self.matcher.compute_ff_bytes()

    def allowed(self, tokens: Sequence[int], closes: bool = False) -> tuple[int, bytes]:
        """How many leading `tokens` the grammar allows after the committed ones and, for a
        draft that `closes` a value and is allowed whole, the text the grammar then forces
        (the punctuation and key that follow the value). Another source's guess never
        touches the sequence's own matcher: a guess could take it over a limit the answer
        would not reach, so tokens are only validated, and followed on a copy."""
        self._settle()
        if self.failed or not tokens:
            return 0, b""
        taken = self.matcher.validate_tokens(list(tokens))
        if not closes or taken < len(tokens):
            return taken, b""
        guess = self.matcher.deep_copy()
        if not guess.consume_tokens(list(tokens)) or guess.is_stopped():
            return taken, b""
        return taken, guess.compute_ff_bytes()

    # ------------------------------------------------------------------ failing

    def _fail(self, reason: str) -> None:
        self.failed = True
        log.error(
            "grammar failed mid-answer; the answer ends here, incomplete",
            request=self.request_id,
            reason=" ".join(reason.split())[:300],
        )
