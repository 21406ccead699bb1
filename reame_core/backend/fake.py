"""A deterministic toy language model with llama.cpp's shape, for tests and benchmarks.

Tokens 0-255 are bytes, so UTF-8 characters split across tokens exactly as they do with a
real byte-level tokenizer; a few control tokens follow. The logits of a position are a
pure function of the last `context` tokens held in that sequence's KV, so a bug that
leaves the wrong tokens in the KV (a bad rollback, a wrong copy) changes the output.
Each decode can cost scripted time, to model hosts where speculation pays or not.
"""

from __future__ import annotations

import hashlib
import struct
import time
from array import array
from collections.abc import Sequence

import numpy as np

from reame_core.backend.base import Batch, DecodeError, equal_split, equal_split_passes
from reame_core.hooktypes import FimTokens, ModelInfo

BOS, EOS, FIM_PRE, FIM_SUF, FIM_MID, IM_START, IM_END = range(256, 263)
SPECIALS = {
    "<s>": BOS,
    "</s>": EOS,
    "<fim_prefix>": FIM_PRE,
    "<fim_suffix>": FIM_SUF,
    "<fim_middle>": FIM_MID,
    "<|im_start|>": IM_START,
    "<|im_end|>": IM_END,
}
N_VOCAB = 272
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Greedy text stays readable: the favoured next token is a lowercase letter or a space.
_FAVOURED = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8).astype(np.int64)
_STATE_MAGIC = b"FAKEKV1\0"


class FakeVocabulary:
    """Bytes 0-255 as tokens 0-255, then the control tokens of `SPECIALS`: read-only, like
    llama.cpp's vocabulary, so any thread may use it."""

    @property
    def n_vocab(self) -> int:
        return N_VOCAB

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        tokens = [BOS] if add_special else []
        rest = text
        while rest:
            if parse_special:
                hit = next((s for s in SPECIALS if rest.startswith(s)), None)
                if hit is not None:
                    tokens.append(SPECIALS[hit])
                    rest = rest[len(hit) :]
                    continue
                cut = min((i for s in SPECIALS if (i := rest.find(s)) > 0), default=len(rest))
            else:
                cut = len(rest)
            tokens.extend(rest[:cut].encode("utf-8"))
            rest = rest[cut:]
        return tokens

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if 0 <= token < 256:
            return bytes([token])
        if special:
            name = next((s for s, t in SPECIALS.items() if t == token), "")
            return name.encode()
        return b""

    def pieces(self) -> Sequence[bytes]:
        return [self.token_bytes(token, special=True) for token in range(N_VOCAB)]

    def control_tokens(self) -> frozenset[int]:
        return frozenset(SPECIALS.values())


class FakeBackend:
    """See the module docstring. `eos_every`: roughly one context in N ends greedily.

    A decode costs `step_cost_s` per pass over the weights (cut as llama.cpp cuts a batch
    with per-sequence KV) plus `token_cost_s` per token, plus `multi_token_cost_s` per pass
    whose sequences carry several tokens each: llama.cpp computes one-token sequences along
    a faster kernel path (on a 2-core EPYC a 2-token pass costs 2.3 one-token passes).
    `recurrent` models a recurrent or hybrid state: llama.cpp refuses to remove part of such
    a sequence, tail included. `vocab` replaces the tokenizer (a test's recording one)."""

    def __init__(
        self,
        *,
        n_ctx_seq: int = 2048,
        n_seq_max: int = 4,
        n_batch: int = 512,
        context: int = 3,
        eos_every: int = 0,
        step_cost_s: float = 0.0,
        token_cost_s: float = 0.0,
        multi_token_cost_s: float = 0.0,
        prefix_trim_safe: bool = True,
        recurrent: bool = False,
        n_threads: int = 1,
        chunk_grid: int = 1,
        name: str = "fake",
        vocab: FakeVocabulary | None = None,
    ) -> None:
        self.context = context
        self.recurrent = recurrent
        self.eos_every = eos_every
        self.step_cost_s = step_cost_s
        self.token_cost_s = token_cost_s
        self.multi_token_cost_s = multi_token_cost_s
        self.kv: dict[int, list[int]] = {seq: [] for seq in range(n_seq_max)}
        self.decode_calls = 0
        self.decoded_tokens = 0
        self.batch_sizes: list[int] = []
        self.pass_counts: list[int] = []  # passes over the weights, per decode call
        self.threads = n_threads
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        fingerprint = hashlib.sha256(
            f"{name}/{context}/{eos_every}/{n_ctx_seq}".encode()
        ).hexdigest()[:16]
        self._info = ModelInfo(
            name=name,
            path=f"<{name}>",
            fingerprint=fingerprint,
            architecture="fake",
            n_vocab=N_VOCAB,
            n_ctx_seq=n_ctx_seq,
            n_seq_max=n_seq_max,
            n_batch=n_batch,
            bos=BOS,
            eos=EOS,
            eog=frozenset({EOS, IM_END}),
            add_bos=True,
            fim=FimTokens(FIM_PRE, FIM_SUF, FIM_MID),
            chat_template=CHATML_TEMPLATE,
            prefix_trim_safe=prefix_trim_safe and not recurrent,
            vocab=vocab or FakeVocabulary(),
            kv_type="tokens",
            n_threads=n_threads,
            chunk_grid=chunk_grid,
        )

    @property
    def info(self) -> ModelInfo:
        return self._info

    # ------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self._info.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self._info.vocab.token_bytes(token, special=special)

    # ------------------------------------------------------------------ decode

    def logits_after(self, tokens: Sequence[int]) -> np.ndarray:
        """The model's prediction after `tokens` (a pure function of the last few)."""
        key = tuple(tokens[-self.context :])
        row = self._rows.get(key)
        if row is None:
            digest = hashlib.blake2b(array("i", key).tobytes(), digest_size=8).digest()
            seed = struct.unpack("<Q", digest)[0]
            rng = np.random.default_rng(seed)
            row = rng.standard_normal(N_VOCAB).astype(np.float32)
            row[256:] = -8.0
            row[int(_FAVOURED[seed % len(_FAVOURED)])] += 6.0
            row[int(_FAVOURED[(seed >> 8) % len(_FAVOURED)])] += 5.0
            if self.eos_every and seed % self.eos_every == 0:
                row[EOS] = 20.0
            self._rows[key] = row
        return row

    def decode(self, batch: Batch) -> np.ndarray:
        if not 0 < len(batch) <= self._info.n_batch:
            raise AssertionError(f"batch of {len(batch)} tokens (n_batch {self._info.n_batch})")
        self.decode_calls += 1
        self.decoded_tokens += len(batch)
        self.batch_sizes.append(len(batch))
        rows = []
        for token, pos, seq, want in zip(
            batch.tokens, batch.positions, batch.seq_ids, batch.want_logits, strict=True
        ):
            cells = self.kv[seq]
            if pos != len(cells):
                raise DecodeError(f"seq {seq}: position {pos} but KV holds {len(cells)} tokens")
            if pos >= self._info.n_ctx_seq:
                raise DecodeError(f"seq {seq}: context full")
            cells.append(token)
            if want:
                rows.append(self.logits_after(cells))
        passes = equal_split(_layout(batch), self._info.n_batch)
        self.pass_counts.append(len(passes))
        multi = sum(1 for per_seq, _ in passes if per_seq > 1)
        cost = (
            self.step_cost_s * len(passes)
            + self.token_cost_s * len(batch)
            + self.multi_token_cost_s * multi
        )
        if cost > 0:
            time.sleep(cost)
        if not rows:
            return np.empty((0, N_VOCAB), dtype=np.float32)
        return np.stack(rows)

    def passes(self, layout: Sequence[tuple[int, int]]) -> list[int]:
        return equal_split_passes(layout, self._info.n_batch)

    # ------------------------------------------------------------------ memory

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        cells = self.kv[seq_id]
        start = max(p0, 0)
        if self.recurrent and start > 0:
            return False
        if p1 < 0 or p1 >= len(cells):
            del cells[start:]
            return True
        if not self._info.prefix_trim_safe and start > 0:
            return False
        del cells[start:p1]
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        self.kv[dst] = list(self.kv[src])

    def get_seq_state(self, seq_id: int) -> bytes:
        return _STATE_MAGIC + array("i", self.kv[seq_id]).tobytes()

    def set_seq_state(self, seq_id: int, state: bytes) -> bool:
        if not state.startswith(_STATE_MAGIC):
            return False
        body = state[len(_STATE_MAGIC) :]
        if len(body) % 4:
            return False
        self.kv[seq_id] = list(array("i", body))
        return True

    def set_threads(self, n_threads: int) -> None:
        self.threads = n_threads

    def close(self) -> None:
        self.kv.clear()


def _layout(batch: Batch) -> list[tuple[int, int]]:
    """(seq_id, tokens) runs of a batch, in batch order."""
    layout: list[tuple[int, int]] = []
    for seq_id in batch.seq_ids:
        if layout and layout[-1][0] == seq_id:
            layout[-1] = (seq_id, layout[-1][1] + 1)
        else:
            layout.append((seq_id, 1))
    return layout
