"""The bitmask applied to a row agrees with llguidance's own numpy application."""

from __future__ import annotations

import llguidance.numpy
import numpy as np
import pytest

from reame_suggeritore import bitmask

N_VOCAB = 1000
EOS, EOG = 990, np.array([990, 995, 999])


def mask_allowing(tokens: list[int]) -> np.ndarray:
    mask = np.zeros((N_VOCAB + 31) // 32, dtype=np.int32)
    for token in tokens:
        mask.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))
    return mask


@pytest.mark.parametrize(
    "allowed",
    [
        [0, 31, 32, 63, 500],  # few words: the sparse path
        list(range(1, N_VOCAB, 3)),  # many words: the dense path (EOS not among them)
        [7],
        [],
    ],
)
def test_only_the_allowed_tokens_keep_their_logits(allowed: list[int]) -> None:
    row = np.random.default_rng(1).standard_normal(N_VOCAB).astype(np.float32)
    mask = mask_allowing(allowed)
    expected = row.copy()
    llguidance.numpy.apply_token_bitmask_inplace(expected, mask)

    bitmask.apply(row, mask, EOS, EOG)

    np.testing.assert_array_equal(row, expected)


@pytest.mark.parametrize("allowed", [[5, EOS], [*range(1, N_VOCAB, 3), EOS]])
def test_where_eos_is_allowed_every_end_of_generation_token_is(allowed: list[int]) -> None:
    row = np.zeros(N_VOCAB, dtype=np.float32)

    bitmask.apply(row, mask_allowing(allowed), EOS, EOG)

    assert np.isfinite(row[EOG]).all()
    assert np.flatnonzero(np.isfinite(row)).tolist() == sorted({*allowed, *EOG.tolist()})


def test_only_is_true_for_a_mask_of_that_one_token() -> None:
    mask = np.zeros(4, dtype=np.int32)
    mask[1] = np.int32(-(2**31))  # token 63: the sign bit of its word
    assert bitmask.only(mask, 63)
    assert not bitmask.only(mask, 62)
    mask[3] = 1  # and token 96
    assert not bitmask.only(mask, 63)
    assert not bitmask.only(np.zeros(4, dtype=np.int32), 5)
    assert not bitmask.only(mask, 500)  # beyond the mask
