"""Compiled grammars: each distinct grammar compiled once, checked before its request is queued.

Compiling a grammar against the model's tokenizer (building its lexer, which for a JSON
schema means every key and pattern) costs from a millisecond to a good part of a second;
matching a copy of a compiled one costs microseconds. Extraction workloads send the same
schema again and again, so compiled grammars are kept by their text, the most recently
used ones, and each sequence matches a copy of its grammar's.

The first compilation happens in `reame_check_request`, on the submitting thread, under
`LIMITS`: a grammar that is invalid, too big or too complex (a deeply nested schema, a
regex whose automaton explodes) fails there, fast, as a `RequestError` naming its field,
and never reaches the engine thread. The first mask is computed there too, since a lexer
is built lazily and its first step is where a hard regex shows its cost.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance

from reame_core.errors import RequestError
from reame_suggeritore.request_grammar import Grammar

# Bounds on the work a grammar may ask for; past them, it is refused (at check) or its
# sequence ends (mid-answer, see `Constraint`). llguidance's own defaults allow a single
# mask step about 15 ms and the lexer some 250,000 states (hundreds of MB); a cheap CPU host
# serving other streams from the same thread cannot wait that long.
LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=1_000_000,  # about 20 ms to build the first automata
    step_lexer_fuel=100_000,  # about 7 ms for one token's mask, at worst
    step_max_items=20_000,  # about 1 ms of Earley items per mask
    max_lexer_states=50_000,
    max_grammar_size=200_000,
    verbose_errors=False,
)
CACHED_GRAMMARS = 32
MAX_ERROR_CHARS = 400


class GrammarCache:
    """The compiled grammars of one model's tokenizer, safe to use from any thread."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, size: int = CACHED_GRAMMARS) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses)

    def check(self, grammar: Grammar) -> None:
        """Compile `grammar` (once); a `RequestError` naming its field if it cannot be used."""
        self._prototype(grammar)

    def matcher(self, grammar: Grammar) -> llguidance.LLMatcher:
        """A matcher at the start of `grammar`, for one sequence."""
        return self._prototype(grammar).deep_copy()

    def _prototype(self, grammar: Grammar) -> llguidance.LLMatcher:
        with self._lock:
            prototype = self._compiled.get(grammar.text)
            if prototype is not None:
                self._compiled.move_to_end(grammar.text)
                return prototype
        prototype = self._compile(grammar)  # outside the lock: other requests go on
        with self._lock:
            self._compiled[grammar.text] = prototype
            self.compiled += 1
            while len(self._compiled) > self.size:
                self._compiled.popitem(last=False)
        return prototype

    def _compile(self, grammar: Grammar) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self.tokenizer, grammar.text, log_level=0, limits=LIMITS)
        if not matcher.is_error():
            matcher.compute_bitmask()  # builds the first lexer states; may hit the limits
        if matcher.is_error():
            raise RequestError(
                f"'{grammar.field}' cannot be used: {_short(matcher.get_error())}",
                param=grammar.field,
            )
        if matcher.is_stopped() and not matcher.is_accepting():
            raise RequestError(f"'{grammar.field}' matches no text.", param=grammar.field)
        return matcher


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"
