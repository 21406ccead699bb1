"""Copying a sequence's KV to another slot takes effect at once, in the deterministic
configuration too (one KV stream per sequence).

llama.cpp copies a stream's buffer across streams only at the start of the next decode,
while it records the copied cells at once. The scheduler copies a resident prefix from a
busy slot and then restores a stored prefix into the same slot when it is longer: say the
busy slot is still computing the shared system prompt, 256 of its 512 tokens done, and the
disk cache holds all 512. The late copy overwrote the restored KV with the busy slot's
buffer, whose cells past 256 held no part of that prompt yet, so the request decoded from
a broken prompt, depending on what arrived when.
"""

from __future__ import annotations

import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.llama import LlamaBackend

pytestmark = pytest.mark.model

OTHER = "The annual general meeting of the Greenway Cycling Club takes place on 21 November."
PROMPT = "Invoice 4471 from Castello Trading: twelve kettles, 240 EUR, due on 3 March 2025."


def _tokens(backend: LlamaBackend, text: str, count: int) -> list[int]:
    tokens = backend.vocab.tokenize(text, add_special=False, parse_special=False)
    assert len(tokens) >= count
    return tokens[:count]


def _prefill(backend: LlamaBackend, seq_id: int, tokens: list[int], start: int) -> np.ndarray:
    """Decode `tokens[start:]` as one chunk of `seq_id`; the last token's logits."""
    batch = Batch()
    for position in range(start, len(tokens)):
        batch.add(tokens[position], position, seq_id, position == len(tokens) - 1)
    return np.array(backend.decode(batch)[-1], copy=True)


def _empty(backend: LlamaBackend) -> None:
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)


def test_a_state_restored_after_a_copy_is_the_one_decoded(backend: LlamaBackend) -> None:
    prompt, other = _tokens(backend, PROMPT, 20), _tokens(backend, OTHER, 16)
    _empty(backend)
    _prefill(backend, 0, prompt[:16], 0)
    cold = _prefill(backend, 0, prompt, 16)
    backend.seq_rm(0, 16)
    stored = backend.get_seq_state(0)  # the prompt's first 16 tokens, as a disk entry
    _empty(backend)
    _prefill(backend, 1, other, 0)  # a resident slot sharing no more than the start
    backend.seq_cp(1, 2)
    backend.seq_rm(2, 8)
    assert backend.set_seq_state(2, stored)  # a longer stored prefix restored over it
    assert np.array_equal(_prefill(backend, 2, prompt, 16), cold)
    _empty(backend)


def test_a_copy_holds_the_source_as_it_was_when_copied(backend: LlamaBackend) -> None:
    prompt, other = _tokens(backend, PROMPT, 20), _tokens(backend, OTHER, 16)
    _empty(backend)
    _prefill(backend, 0, prompt[:16], 0)
    cold = _prefill(backend, 0, prompt, 16)
    _empty(backend)
    _prefill(backend, 3, other, 0)
    stored = backend.get_seq_state(3)
    _prefill(backend, 1, prompt[:16], 0)
    backend.seq_cp(1, 2)  # then another request takes the source slot and restores into it
    assert backend.set_seq_state(1, stored)
    assert np.array_equal(_prefill(backend, 2, prompt, 16), cold)
    _empty(backend)
