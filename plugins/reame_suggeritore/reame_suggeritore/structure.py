"""Structure drafts: what free text is likely to repeat where it repeats its own shape.

No grammar forces these tokens; the text's own structure makes them likely. A numbered list
goes on with the next number, a bulleted list with the same bullet at the same indentation,
a markdown table row with its pipes, and the next object of a JSON array with the keys of
the one before. Each guess copies the tokens the model itself produced for the previous
sibling (its marker, separator and indentation, or its keys), so the draft is tokenized the
way the model writes it; only the next number is tokenized anew.

    after "\\n" that ends "3. **Foo**: bar"     proposes "4" "." " **"
    after "\\n" that ends "  - apple"           proposes "  -" (the same bullet, indented alike)
    after the last pipe of "| 1 | 2 |" once the row has as many pipes as the row before
                                               proposes "\\n" "|" " "
    after `}, {"` in `[{"name": "a", "age": 3}, {"`   proposes `name` `":` ` "`
    after `",` of that second object's first value     proposes ` "` `age` `":` ` `

These are drafts: the model verifies them, so a wrong guess costs one verification and never
changes the output, and the speculation governor stops verifying this source (registered as
a source of its own) where its guesses do not pay. A deterministic source (q is one-hot).

Proposing runs on the engine thread between two decode steps, so each sequence's shape is
kept incrementally as tokens are committed (a few dictionary look-ups a token); a proposal
reads at most the previous sibling's first tokens. Nothing here parses JSON or markdown: a
brace inside prose or a pipe inside a cell only makes a guess wrong.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest, ModelInfo, SequenceView, Vocabulary
from reame_core.per_sequence import PerSequence
from reame_core.settings import Settings

NAME = "suggeritore_structure"

BULLETS = (b"-", b"*", b"+", "•".encode())
NUMBER_ENDS = (b".", b")")
STRUCTURE = b"{}[],:"
WHITESPACE = b" \t"
SIBLING_GAP = 16  # most tokens between an object's close and its sibling's open ("},\n  {")
KEY_RUN_MAX = 64  # most template tokens read for one key


class StructureSettings(BaseModel):
    """``[plugins.suggeritore_structure]`` (no options yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------ token kinds


@dataclass(frozen=True)
class TokenKind:
    """What a token means for the shape of a text, computed once per token id.

    `opener`: the token ends a line (a newline, then only spaces or tabs), so a new line
    starts after it; `indent` is what follows its last newline. `breaks` is True for a token
    with a newline followed by text (a line starts inside it). `content`, `pipes`: whether
    the part before its last newline holds a letter, digit or non-ASCII byte, and how many
    "|" it holds. `digits`: the token is a number, maybe after spaces.
    """

    text: bytes
    opener: bool
    indent: bytes
    breaks: bool
    content: bool
    pipes: int
    digits: bool
    whitespace: bool


def token_kind(text: bytes) -> TokenKind:
    newline = text.rfind(b"\n")
    tail = text[newline + 1 :] if newline >= 0 else b""
    opener = newline >= 0 and tail.strip(WHITESPACE) == b""
    line = text[:newline] if newline >= 0 else text
    stripped = text.strip(WHITESPACE)
    return TokenKind(
        text=text,
        opener=opener,
        indent=tail if opener else b"",
        breaks=newline >= 0 and not opener,
        content=any(byte >= 0x80 or chr(byte).isalnum() for byte in line),
        pipes=line.count(b"|"),
        digits=bool(stripped) and stripped.isdigit() and newline < 0,
        whitespace=bool(text) and text.strip(WHITESPACE) == b"",
    )


@dataclass(frozen=True)
class JsonStep:
    """A token read as JSON from a lexer state (0 outside strings, 1 inside, 2 after a
    backslash inside): the state after it, its change of bracket depth, the lowest depth it
    reached (relative, <= 0), and its last structural character outside strings (0: none)."""

    state: int
    delta: int
    low: int
    last: int


def json_step(text: bytes, state: int) -> JsonStep:
    depth = low = last = 0
    for byte in text:
        if state == 2:
            state = 1
        elif state == 1:
            if byte == 0x5C:  # backslash
                state = 2
            elif byte in (0x22, 0x0A):  # a quote ends a string; so does a raw newline
                state = 0
        elif byte == 0x22:
            state = 1
        elif byte in STRUCTURE:
            last = byte
            if byte in b"{[":
                depth += 1
            elif byte in b"}]":
                depth -= 1
                low = min(low, depth)
    return JsonStep(state, depth, low, last)


class TokenKinds:
    """Kinds and JSON steps of the model's tokens, computed on first use (a vocabulary has
    up to 150,000 tokens, a text uses a few hundred of them). Control tokens read as empty."""

    def __init__(self, vocab: Vocabulary) -> None:
        self._vocab = vocab
        self._kinds: dict[int, TokenKind] = {}
        self._steps: dict[tuple[int, int], JsonStep] = {}
        self._numbers: dict[bytes, tuple[int, ...]] = {}

    def kind(self, token: int) -> TokenKind:
        kind = self._kinds.get(token)
        if kind is None:
            kind = self._kinds[token] = token_kind(self._vocab.token_bytes(token))
        return kind

    def step(self, token: int, state: int) -> JsonStep:
        step = self._steps.get((token, state))
        if step is None:
            step = self._steps[token, state] = json_step(self.kind(token).text, state)
        return step

    def number(self, text: bytes) -> tuple[int, ...]:
        tokens = self._numbers.get(text)
        if tokens is None:
            decoded = text.decode("ascii")
            tokens = tuple(self._vocab.tokenize(decoded, add_special=False, parse_special=False))
            self._numbers[text] = tokens
        return tokens


# ------------------------------------------------------------------ a sequence's shape


@dataclass(frozen=True)
class Line:
    """A finished line: tokens ``[start, end)``, then the opener token at `end` that ended
    it; `opener` is the token that started it (-1: none), `pipes` the "|" it holds."""

    start: int
    end: int
    opener: int
    pipes: int
    content: bool


@dataclass
class ObjectCursor:
    """An open JSON object with an earlier sibling: where that sibling's tokens end, and
    from where its next key is to be found."""

    template_end: int
    pointer: int


class Shape:
    """The shape of one sequence's text so far (prompt and output), kept token by token:
    its lines, the latest line that followed each kind of line opener, and the JSON objects
    open and closed at each depth."""

    def __init__(self, kinds: TokenKinds) -> None:
        self.kinds = kinds
        self.tokens: list[int] = []
        # lines
        self.line_start = 0
        self.line_opener = -1
        self.line_pipes = 0
        self.line_content = False
        self.previous: Line | None = None  # the line just finished
        self.written: Line | None = None  # the latest line with content
        self.after: dict[int, Line] = {}  # opener token -> latest line with content after it
        # JSON
        self.states = bytearray()  # lexer state before each token
        self.depths = array("i")  # bracket depth before each token
        self.state = 0
        self.depth = 0
        self.opened: dict[int, int] = {}  # depth -> first token of the latest object there
        self.closed: dict[int, int] = {}  # depth -> token that closed the latest object there
        self.cursors: dict[int, ObjectCursor] = {}
        self.event: str = ""  # what the last token did: "line", "row", "object", "comma"

    # ------------------------------------------------------------- reading

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._read(token)

    def _read(self, token: int) -> None:
        position = len(self.tokens)
        self.tokens.append(token)
        kind = self.kinds.kind(token)
        self.event = ""
        self._read_json(token, position)
        self.line_pipes += kind.pipes
        self.line_content = self.line_content or kind.content
        if kind.opener:
            self._end_line(position, token)
            self.event = self.event or "line"
        elif kind.breaks:  # a line starts inside this token, with text: no marker to copy
            self._end_line(position, -1)
            self.line_start, self.line_content = position, True
        elif kind.pipes and not self.event and self._is_row(self.line_start, position + 1):
            self.event = "row"

    def _end_line(self, position: int, opener: int) -> None:
        line = Line(self.line_start, position, self.line_opener, self.line_pipes, self.line_content)
        self.previous = line
        if line.content:
            self.after[line.opener] = self.written = line
        self.line_start, self.line_opener = position + 1, opener
        self.line_pipes, self.line_content = 0, False

    def _read_json(self, token: int, position: int) -> None:
        before = self.depth
        self.states.append(self.state)
        self.depths.append(before)
        step = self.kinds.step(token, self.state)
        self.state = step.state
        self.depth = max(0, before + step.delta)
        for depth in range(max(1, before + step.low + 1), before + 1):
            self.closed[depth] = position  # objects (and arrays) closed here
            self.cursors.pop(depth, None)
        if step.last == 0x7B:  # "{": an object opens; its keys follow this token
            depth = self.depth
            previous = self.opened.get(depth)
            closed = self.closed.get(depth, -1)
            self.opened[depth] = position + 1
            if previous is not None and closed >= previous and self._gap(closed, position):
                self.cursors[depth] = ObjectCursor(closed, previous)
                self.event = "object"
        elif step.last == 0x2C:  # ",": the next key follows, if the sibling had one more
            cursor = self.cursors.get(self.depth)
            if cursor is not None and self._next_key(cursor):
                self.event = "comma"

    def _gap(self, closed: int, opened: int) -> bool:
        """Whether only punctuation and whitespace lie between an object's close and the
        next object's open: they are siblings in one array."""
        if opened - closed > SIBLING_GAP:
            return False
        kind = self.kinds.kind
        return not any(
            kind(t).content or b":" in kind(t).text for t in self.tokens[closed + 1 : opened]
        )

    # ------------------------------------------------------------- proposing

    def propose(self, max_tokens: int) -> tuple[int, ...]:
        event = self.event
        if event == "object" or event == "comma":
            cursor = self.cursors.get(self.depth)
            return self._key_run(cursor, max_tokens) if cursor is not None else ()
        if event == "line":
            return self._line_prefix(self.tokens[-1], self.written, max_tokens)
        if event == "row":
            return self._row_end(max_tokens)
        return ()

    def _line_prefix(self, opener: int, written: Line | None, limit: int) -> tuple[int, ...]:
        """The start of the line after `opener`: the marker of the latest line that followed
        the same opener, or else of the latest line written (`written`) if it started at
        the same indentation (the first item after a blank line, a header row)."""
        same = self.after.get(opener)
        draft = self._marker(same, limit) if same is not None else ()
        if not draft and written is not None and written is not same:
            indent = self.kinds.kind(opener).indent
            started = self.kinds.kind(written.opener).indent if written.opener >= 0 else b""
            if indent == started:
                draft = self._marker(written, limit)
        return draft

    def _marker(self, line: Line, limit: int) -> tuple[int, ...]:
        """A list item's or table row's marker as `line` wrote it, numbered one on: leading
        whitespace, then a bullet, a pipe or a number with its "." or ")", then whatever
        punctuation followed up to the item's text ("4" "." " **")."""
        kind, tokens = self.kinds.kind, self.tokens
        draft: list[int] = []
        at, end = line.start, line.end
        while at < end and kind(tokens[at]).whitespace:
            draft.append(tokens[at])
            at += 1
        if at >= end:
            return ()
        first = kind(tokens[at])
        marker = first.text.strip(WHITESPACE)
        if first.digits:
            digits = at
            while at < end and kind(tokens[at]).digits:
                at += 1
            if at >= end or not kind(tokens[at]).text.startswith(NUMBER_ENDS):
                return ()
            if kind(tokens[at]).content or (at + 1 < end and kind(tokens[at + 1]).digits):
                return ()  # a decimal ("1.5 litres"), not an item number
            written = b"".join(kind(t).text for t in tokens[digits:at])
            number = str(int(written.strip(WHITESPACE)) + 1).encode()
            draft += self.kinds.number(written[: len(written) - len(written.lstrip())] + number)
        elif marker in BULLETS or (marker.startswith(b"|") and not first.content):
            draft.append(tokens[at])
            at += 1
        else:
            return ()
        while at < end and len(draft) < limit:
            follow = kind(tokens[at])
            if follow.content or follow.breaks:
                break
            draft.append(tokens[at])
            at += 1
        return tuple(draft[:limit])

    def _is_row(self, start: int, end: int) -> bool:
        for token in self.tokens[start:end]:
            kind = self.kinds.kind(token)
            if not kind.whitespace:
                return kind.text.lstrip(WHITESPACE).startswith(b"|")
        return False

    def _row_end(self, limit: int) -> tuple[int, ...]:
        """The end of a table row once it has as many pipes as the row before: the newline
        that ended that row, then the next row's marker."""
        previous = self.previous
        if previous is None or previous.pipes != self.line_pipes:
            return ()
        newline = self.tokens[previous.end]
        if self.kinds.kind(newline).pipes or not self._is_row(previous.start, previous.end):
            return ()
        here = Line(self.line_start, len(self.tokens), self.line_opener, self.line_pipes, True)
        return (newline, *self._line_prefix(newline, here, limit - 1))[:limit]

    def _next_key(self, cursor: ObjectCursor) -> bool:
        """Move `cursor` past its template's next comma at this depth; False if none."""
        depth = self.depth
        for at in range(cursor.pointer, min(cursor.template_end, cursor.pointer + KEY_RUN_MAX)):
            step = self.kinds.step(self.tokens[at], self.states[at])
            if step.last == 0x2C and self.depths[at] + step.delta == depth:
                cursor.pointer = at + 1
                return True
        cursor.pointer = cursor.template_end
        return False

    def _key_run(self, cursor: ObjectCursor, limit: int) -> tuple[int, ...]:
        """The template's tokens from the cursor through the next key and its colon, and the
        spaces or opening quote after it, up to the value's first letter or digit."""
        depth, tokens = self.depth, self.tokens
        draft: list[int] = []
        colon = False
        for at in range(cursor.pointer, min(cursor.template_end, cursor.pointer + KEY_RUN_MAX)):
            if len(draft) >= limit:
                return tuple(draft)
            token = tokens[at]
            step = self.kinds.step(token, self.states[at])
            if colon and (step.last or self.kinds.kind(token).content):
                break
            if self.depths[at] + step.low < depth:
                break  # the sibling ended
            draft.append(token)
            colon = colon or (step.last == 0x3A and self.depths[at] + step.delta == depth)
        return tuple(draft) if colon else ()


# ------------------------------------------------------------------ the plugin


class StructureDrafts:
    """The draft source: one `Shape` per decoding sequence, caught up on what it committed
    since the last call, dropped when the sequence ends."""

    def __init__(self) -> None:
        self._kinds: TokenKinds | None = None
        self._shapes = PerSequence(self._new_shape)

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        settings.plugin_section(NAME, StructureSettings)
        self._kinds = TokenKinds(model.vocab)
        self._shapes.clear()

    @hookimpl
    def reame_describe(self) -> str:
        return (
            "drafts the structure free text repeats: next list number, bullets and "
            "indentation, table pipes, the keys of the previous JSON object"
        )

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        if self._kinds is None:
            return []
        proposals = []
        for request in requests:
            tokens = self._shapes.of(request.seq).propose(request.max_tokens)
            if tokens:
                proposals.append(DraftProposal(request.seq, NAME, tokens))
        return proposals

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self._shapes.drop(seq)

    def _new_shape(self, seq: SequenceView) -> Shape:
        assert self._kinds is not None  # asked only once configured
        shape = Shape(self._kinds)
        shape.extend(seq.prompt_tokens)
        return shape


plugin = StructureDrafts()
