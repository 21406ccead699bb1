"""Quotes: the prompt's words an answer repeats, drafted across token boundaries.

An extraction copies names, dates, sums and titles out of its document, but seldom with the
document's tokens. SmolLM2 writes `"Officina` after a key as ` "` `Offic` `ina`, where the
document's ` Officina` is ` Offic` `ina`: the space belongs to the word's first token there
and not here. Prompt lookup matches tokens, so it finds such a value only from its third
token on, and a short value not at all. This source matches text: the longest end of the
answer's text that starts at a word and that the prompt holds, starting at a word there too
(at least `MIN_BYTES` inside a JSON value, `MIN_FREE_BYTES` elsewhere), and proposes the
prompt's text after it:

    answer so far  {"organization": "Offic
    prompt         From: Officina Verdi Srl, Via Roma 12, Bologna
    proposes       ina  Ver  di  S  rl  ",  "  contact  _  name  ":  "

- Inside a JSON string the match lies within the value's own text (not the `": "` before
  it, which an example in the prompt may hold), and the quote stops where the prompt's
  phrase does (punctuation, a line's end, a full stop before a space) and closes the
  string; inside a JSON number, likewise within its digits, up to its last digit; inside an
  object's key nothing is proposed (the schema's words, which an instruction may quote, are
  not the answer's).
- For a structured answer (Il Suggeritore's grammar, `constraint_of`) the draft is cut where
  the grammar refuses it (a `maxLength`), and a closed value goes on with the text the
  grammar forces after it (`", "contact_name": "`), so one verification covers a value's
  end and the next key. The grammar is only asked (`Constraint.allowed`): a guess never
  moves the sequence's own matcher.
- The draft is tokenized together with the answer's last tokens that the match covers, so
  that it is split as the model would write it on from there, `",` included; where that
  tokenization does not begin with those very tokens (the answer split its word otherwise),
  the prompt's text after the match is tokenized on its own.

These are drafts: the model verifies them, a wrong guess (a value that ends where the
document goes on) costs one verification and never changes the output, and the speculation
governor stops verifying this source (registered as a source of its own) where its guesses
do not pay. A deterministic source (q is one-hot).

Each sequence keeps its prompt's text and its output's text, extended as tokens are
committed; a proposal searches the prompt's text a few times (each search linear in the
prompt's length) and tokenizes some fifty bytes, once more where a value ends under a
grammar (the search is not repeated).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest, ModelInfo, SequenceView, Vocabulary
from reame_core.per_sequence import PerSequence
from reame_core.settings import Settings
from reame_suggeritore.constraint import Constraint
from reame_suggeritore.plugin import plugin as suggeritore

NAME = "suggeritore_quote"

MIN_BYTES = 3  # the shortest text matched in a JSON value: a word's beginning, like "Off"
# Outside JSON values, where prompt lookup's token matches copy most of what is copied, a
# few letters match too many places: a quote there is a phrase.
MIN_FREE_BYTES = 12
MAX_MATCH_BYTES = 64  # the longest end of the answer looked for in the prompt
CONTINUATION_BYTES = 64  # the prompt text tokenized after a match
OCCURRENCES_TRIED = 8  # occurrences of one text looked at for one that starts at a word
# Where a quoted phrase likely ends, for a JSON string's value: punctuation between phrases,
# or a full stop before a space or a line's end (not the one in "67.50").
VALUE_ENDS = re.compile(rb'["\n\t,;:()\[\]{}<>]|\.(?=\s|$)')
NUMBER_BYTES = b"0123456789.eE+-"
NUMBER_ENDS = re.compile(rb"[^0-9.eE+-]")


class QuoteSettings(BaseModel):
    """``[plugins.suggeritore_quote]`` (no options yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


def _at_word(text: bytes, start: int) -> bool:
    """Whether `text[start:]` starts a word: at the start of `text`, after a character that
    is not a letter or digit (a space, an em dash, a typographic quote), or with such a
    character itself; never inside a UTF-8 character."""
    if start == 0:
        return True
    if _CONTINUATION <= text[start] < _LEAD:
        return False
    return not _alnum(_character_before(text, start)) or not _alnum(_character_at(text, start))


_CONTINUATION, _LEAD = 0x80, 0xC0  # UTF-8: bytes 0x80-0xBF continue a character


def _character_at(text: bytes, start: int) -> bytes:
    end = start + 1
    while end < len(text) and end - start < 4 and _CONTINUATION <= text[end] < _LEAD:
        end += 1
    return text[start:end]


def _character_before(text: bytes, end: int) -> bytes:
    start = end - 1
    while start > 0 and end - start < 4 and _CONTINUATION <= text[start] < _LEAD:
        start -= 1
    return text[start:end]


def _alnum(character: bytes) -> bool:
    """Whether a character is a letter or digit; a broken one counts as a letter."""
    try:
        return character.decode().isalnum()
    except UnicodeDecodeError:
        return True


def longest_end_in(text: bytes, source: bytes, limit: int) -> int:
    """The length of the longest end of `text`, at most `limit` bytes, that `source` holds.
    (If an end of `text` occurs in `source`, so does every shorter end: a binary search.)"""
    low, high = 0, min(limit, len(text))
    while low < high:
        middle = (low + high + 1) // 2
        if text[len(text) - middle :] in source:
            low = middle
        else:
            high = middle - 1
    return low


def quoted_at(
    text: bytes, source: bytes, shortest: int = MIN_BYTES, longest: int = MAX_MATCH_BYTES
) -> tuple[int, int] | None:
    """Where `source` quotes the end of `text`: the length of the longest end of `text`
    (`shortest` to `longest` bytes) that starts at a word, and the latest place in `source`
    where it occurs starting at a word too, as (length, end of that occurrence); None if
    there is none."""
    found = longest_end_in(text, source, min(longest, MAX_MATCH_BYTES))
    for length in range(found, shortest - 1, -1):
        start = len(text) - length
        if not _at_word(text, start):
            continue
        quote = text[start:]
        at = source.rfind(quote)
        for _ in range(OCCURRENCES_TRIED):
            if at < 0:
                break
            if _at_word(source, at):
                return length, at + length
            at = source.rfind(quote, 0, at + length - 1)
    return None


class JsonPlace:
    """Where a text, read byte by byte as JSON, stands: inside a string or not, inside an
    object's key (the schema's words, which an instruction may quote, "organization (the
    company or shop)", where the answer goes on with `": "`: a quote there is a wrong guess),
    after a colon (a value). Nothing here checks that the text is JSON: in prose a quotation
    reads as a string's value, and is one for this source."""

    def __init__(self) -> None:
        self.state = 0  # 0 outside strings, 1 inside, 2 after a backslash inside
        self.brackets = bytearray()  # the open "{" and "[", innermost last
        self.last = 0  # the last of "{[,:" outside strings
        self.in_key = False
        self.read_bytes = 0
        self.opened = 0  # where the latest string's text starts, in bytes read

    def read(self, text: bytes) -> None:
        for byte in text:
            self.read_bytes += 1
            if self.state == 2:
                self.state = 1
            elif self.state == 1:
                if byte == 0x5C:  # backslash
                    self.state = 2
                elif byte in (0x22, 0x0A):  # a quote ends a string; so does a raw newline
                    self.state, self.in_key = 0, False
            elif byte == 0x22:
                on_object = bool(self.brackets) and self.brackets[-1] == 0x7B
                self.state, self.in_key = 1, on_object and self.last in (0x7B, 0x2C)
                self.opened = self.read_bytes
            elif byte in b"{[":
                self.brackets.append(byte)
                self.last = byte
            elif byte in b"}]":
                if self.brackets:
                    self.brackets.pop()
            elif byte in b",:":
                self.last = byte


@dataclass(frozen=True)
class Found:
    """Where the prompt quotes the end of an output: the output's text from the first token
    the match covers (`head`, `covered` tokens), the prompt's text after the match
    (`following`), whether a value's end `cut` it there (in a JSON string, `in_string`: it
    is to be closed), and whether the byte limit `clipped` it."""

    head: str
    covered: int
    following: bytes
    cut: bool
    clipped: bool
    in_string: bool


@dataclass(frozen=True)
class Quote:
    """A draft quoted from the prompt; `closes`: it ends with the quote that closes the JSON
    string it continues (the prompt's text ended the value there)."""

    tokens: tuple[int, ...]
    closes: bool = False


class Quotation:
    """One sequence: its prompt's text, and its output's tokens and text so far."""

    def __init__(self, vocab: Vocabulary, prompt: Sequence[int]) -> None:
        self.vocab = vocab
        self.prompt = b"".join(vocab.token_bytes(t) for t in prompt)
        self.tokens: list[int] = []
        self.text = bytearray()
        self.starts: list[int] = []  # where each output token's text starts in `text`
        self.json = JsonPlace()

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            piece = self.vocab.token_bytes(token)
            self.starts.append(len(self.text))
            self.tokens.append(token)
            self.text += piece
            self.json.read(piece)

    def propose(self, max_tokens: int, then: bytes = b"") -> Quote | None:
        """The prompt's text after the longest quotable end of the output (`find`), as a
        draft (`draft`)."""
        found = self.find()
        return None if found is None else self.draft(found, max_tokens, then)

    def find(self) -> Found | None:
        """Where the prompt quotes the end of the output, and what it goes on with: within a
        JSON string, up to where the prompt's text likely ends the value; within a JSON
        number, up to its end."""
        json = self.json
        if not self.tokens or json.in_key:
            return None
        # The output's end, one byte more than a match may take (whether it starts a word).
        window = bytes(self.text[-(MAX_MATCH_BYTES + 1) :])
        in_string = json.state != 0
        digits = len(window) - len(window.rstrip(NUMBER_BYTES))
        in_number = not in_string and digits > 0 and json.last == 0x3A and bool(json.brackets)
        if in_string:  # a value's own text, not the punctuation before it
            shortest, longest = MIN_BYTES, len(self.text) - json.opened
        elif in_number:
            shortest, longest = MIN_BYTES, digits
        else:
            shortest, longest = MIN_FREE_BYTES, MAX_MATCH_BYTES
        found = quoted_at(window, self.prompt, shortest, longest)
        if found is None:
            return None
        length, end = found
        following = self.prompt[end : end + CONTINUATION_BYTES]
        clipped = len(self.prompt) - end > CONTINUATION_BYTES
        ended = None
        if in_string:  # a string's value: it ends where the prompt's phrase does
            ended = VALUE_ENDS.search(following)
            if ended is not None:
                following = following[: ended.start()].rstrip()
        elif in_number:
            ended = NUMBER_ENDS.search(following)
            if ended is not None:
                following = following[: ended.start()]
        # The output's last tokens that hold the match: tokenized again with what follows,
        # they must come out as written, or the draft would not be split as the model
        # splits it.
        quote_start = len(self.text) - length
        covered = 1
        while covered < len(self.tokens) and self.starts[-covered] > quote_start:
            covered += 1
        try:
            head = bytes(self.text[self.starts[-covered] :]).decode("utf-8")
        except UnicodeDecodeError:
            return None
        return Found(head, covered, following, ended is not None, clipped, in_string)

    def draft(self, found: Found, max_tokens: int, then: bytes = b"") -> Quote | None:
        """`found` tokenized as the output goes on from there: a value that ends closed with
        its quote and followed by `then` (what a grammar forces after it: tokenized with the
        quote, as the model writes `",`)."""
        closes = found.cut and found.in_string
        following = found.following + (b'"' + then if closes else b"")
        tail = following.decode("utf-8", errors="ignore")  # a character cut at the end
        if max_tokens <= 0 or not tail:
            return None
        covered = found.covered
        tokens = self.vocab.tokenize(found.head + tail, add_special=False, parse_special=False)
        if tokens[:covered] == self.tokens[-covered:]:
            draft = tokens[covered:]
        else:  # the output split its word otherwise: the rest as it splits on its own
            draft = self.vocab.tokenize(tail, add_special=False, parse_special=False)
        if found.clipped and not found.cut:  # the byte limit may have cut the last word short
            draft = draft[:-1]
        if not draft:
            return None
        return Quote(tuple(draft[:max_tokens]), closes=closes and len(draft) <= max_tokens)


class QuoteDrafts:
    """The draft source: one `Quotation` per decoding sequence, caught up on what it
    committed since the last call, dropped when the sequence ends. `constraint_of` gives a
    structured answer's grammar (Il Suggeritore's): a draft there is cut where the grammar
    refuses it and, where it ends a value, goes on with the tokens the grammar then forces,
    so that one verification covers the value's end and the next key."""

    def __init__(self, constraint_of: Callable[[int], Constraint | None] | None = None) -> None:
        self._constraint_of = constraint_of
        self._vocab: Vocabulary | None = None
        self._quotations = PerSequence(self._new_quotation)

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        settings.plugin_section(NAME, QuoteSettings)
        self._vocab = model.vocab
        self._quotations.clear()

    @hookimpl
    def reame_describe(self) -> str:
        return "drafts the prompt's words an answer quotes, matched as text across token splits"

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        if self._vocab is None:
            return []
        proposals = []
        for request in requests:
            seq, limit = request.seq, request.max_tokens
            quotation = self._quotations.of(seq)
            found = quotation.find()
            quote = quotation.draft(found, limit) if found is not None else None
            if found is None or quote is None:
                continue
            tokens = quote.tokens
            constraint = self._constraint_of(seq.key) if self._constraint_of else None
            if constraint is not None:
                taken, forced = constraint.allowed(tokens, closes=quote.closes)
                tokens = tokens[:taken]
                if forced:
                    # Tokenized again with what the grammar forces after the value, as the
                    # model writes it; what the grammar allows of that is the draft.
                    longer = quotation.draft(found, limit, then=forced[:CONTINUATION_BYTES])
                    if longer is not None:
                        taken, _ = constraint.allowed(longer.tokens)
                        tokens = max(tokens, longer.tokens[:taken], key=len)
            if tokens:
                proposals.append(DraftProposal(seq, NAME, tokens))
        return proposals

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self._quotations.drop(seq)

    def _new_quotation(self, seq: SequenceView) -> Quotation:
        assert self._vocab is not None  # asked only once configured
        return Quotation(self._vocab, seq.prompt_tokens)


plugin = QuoteDrafts(suggeritore.constraint_of)
