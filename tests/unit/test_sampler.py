"""TokenSampler: logits in, one token out, per candidate; and SamplingParams validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reame_core.engine.sampler import TokenSampler
from reame_core.errors import RequestError
from reame_core.request import SamplingParams

EOG = (4, 5)
# Softmax at temperature 1 gives exactly these probabilities.
PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS).astype(np.float32)


def sampler(history: tuple[int, ...] = (), seed: int | None = 0, **params: Any) -> TokenSampler:
    return TokenSampler(SamplingParams(**params), eog=EOG, history=history, seed=seed)


def logits(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# ------------------------------------------------------------------ greedy and bias


def test_greedy_picks_the_argmax() -> None:
    assert sampler().sample(logits(0.1, 2.0, -1.0, 0.5, 0.0, 0.0)) == 1


def test_logit_bias_changes_the_argmax() -> None:
    row = logits(0.1, 2.0, -1.0, 0.5, 0.0, 0.0)

    assert sampler(logit_bias={3: 5.0}).sample(row) == 3


def test_ignore_eos_masks_every_end_of_generation_token() -> None:
    row = logits(0.1, 0.2, 0.3, 0.0, 9.0, 8.0)

    adjusted = sampler(ignore_eos=True).adjust(row)

    assert adjusted[4] == -np.inf and adjusted[5] == -np.inf
    assert sampler(ignore_eos=True).sample(row) == 2
    assert sampler().sample(row) == 4


def test_greedy_ignoring_eos_equals_the_argmax_of_the_masked_row_ties_included() -> None:
    # Small integer logits make ties and EOG maxima common: the shortcut that skips the
    # masked copy must pick exactly what the masked row's argmax picks.
    rng = np.random.default_rng(3)
    for _ in range(500):
        row = rng.integers(0, 4, size=8).astype(np.float32)
        greedy = sampler(ignore_eos=True)

        assert greedy.sample(row) == int(np.argmax(greedy.adjust(row)))


def test_greedy_ignoring_eos_samples_the_row_without_changing_it() -> None:
    row = logits(0.1, 0.2, 0.3, 0.0, 9.0, 8.0)

    sampler(ignore_eos=True).sample(row)

    np.testing.assert_array_equal(row, logits(0.1, 0.2, 0.3, 0.0, 9.0, 8.0))


def test_adjust_leaves_the_input_row_untouched() -> None:
    row = logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0)

    sampler(history=(1, 2), repeat_penalty=2.0, logit_bias={0: 1.0}).adjust(row)

    np.testing.assert_array_equal(row, logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0))


# ------------------------------------------------------------------------ penalties


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    row = logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0)

    adjusted = sampler(history=(1, 1, 2), repeat_penalty=2.0).adjust(row)

    np.testing.assert_allclose(adjusted, [1.0, 1.0, -2.0, 0.5, 0.0, 0.0])


def test_presence_penalty_subtracts_once_per_seen_token() -> None:
    row = logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0)

    adjusted = sampler(history=(1, 1, 2), presence_penalty=0.5).adjust(row)

    np.testing.assert_allclose(adjusted, [1.0, 1.5, -1.5, 0.5, 0.0, 0.0])


def test_frequency_penalty_subtracts_per_occurrence() -> None:
    row = logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0)

    adjusted = sampler(history=(1, 1, 2), frequency_penalty=0.25).adjust(row)

    np.testing.assert_allclose(adjusted, [1.0, 1.5, -1.25, 0.5, 0.0, 0.0])


def test_penalties_only_count_the_last_penalty_last_n_tokens() -> None:
    row = logits(1.0, 2.0, -1.0, 0.5, 0.0, 0.0)

    adjusted = sampler(history=(1, 1, 2, 3), penalty_last_n=2, frequency_penalty=1.0).adjust(row)

    np.testing.assert_allclose(adjusted, [1.0, 2.0, -2.0, -0.5, 0.0, 0.0])


def test_adjust_with_pending_equals_adjust_after_accepting_them() -> None:
    params: dict[str, Any] = {
        "repeat_penalty": 1.3,
        "presence_penalty": 0.4,
        "frequency_penalty": 0.2,
        "penalty_last_n": 4,
    }
    row = np.random.default_rng(1).standard_normal(6).astype(np.float32)
    speculating = sampler(history=(0, 1, 2), **params)
    committed = sampler(history=(0, 1, 2), **params)
    for token in (3, 3, 1):
        committed.accept(token)

    np.testing.assert_array_equal(speculating.adjust(row, (3, 3, 1)), committed.adjust(row))
    assert speculating.history == [0, 1, 2]


# ------------------------------------------------------------------------- sampling


def test_temperature_scales_logits_before_softmax() -> None:
    probs = sampler(temperature=2.0).probabilities(LOGITS)

    expected = np.sqrt(PROBS) / np.sqrt(PROBS).sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-6)


def test_top_k_of_one_equals_greedy() -> None:
    rows = np.random.default_rng(2).standard_normal((20, 50)).astype(np.float32)
    top_1 = sampler(temperature=1.5, top_k=1, seed=3)

    assert [top_1.sample(row) for row in rows] == [sampler().sample(row) for row in rows]


def test_top_k_keeps_the_k_most_likely_tokens() -> None:
    probs = sampler(temperature=1.0, top_k=2).probabilities(LOGITS)

    np.testing.assert_allclose(probs, [0.625, 0.375, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.4, [0.5]), (0.75, [0.5, 0.3]), (0.85, [0.5, 0.3, 0.15]), (0.99, [0.5, 0.3, 0.15, 0.05])],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p: float, kept: list[float]) -> None:
    probs = sampler(temperature=1.0, top_p=top_p).probabilities(LOGITS)

    expected = np.zeros(4)
    expected[: len(kept)] = np.array(kept) / sum(kept)
    np.testing.assert_allclose(probs, expected, rtol=1e-6)


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    probs = sampler(temperature=1.0, min_p=0.2).probabilities(LOGITS)

    np.testing.assert_allclose(probs, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], rtol=1e-6)


def test_draws_follow_the_distribution() -> None:
    draws = sampler(temperature=1.0, seed=4)
    counts = np.bincount([draws.draw(PROBS) for _ in range(4000)], minlength=4)

    np.testing.assert_allclose(counts / 4000, PROBS, atol=0.03)


def test_draw_never_picks_a_token_of_zero_probability() -> None:
    draws = sampler(temperature=1.0, seed=5)
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])

    assert {draws.draw(probs) for _ in range(500)} == {1, 3}


def test_same_seed_draws_the_same_tokens() -> None:
    uniform = np.full(50, 1 / 50)
    first = sampler(temperature=1.0, seed=11)
    second = sampler(temperature=1.0, seed=11)

    assert [first.draw(uniform) for _ in range(40)] == [second.draw(uniform) for _ in range(40)]


def test_different_seeds_draw_different_tokens() -> None:
    uniform = np.full(50, 1 / 50)
    first = sampler(temperature=1.0, seed=11)
    second = sampler(temperature=1.0, seed=12)

    assert [first.draw(uniform) for _ in range(40)] != [second.draw(uniform) for _ in range(40)]


def test_fork_keeps_the_history_but_draws_from_its_own_seed() -> None:
    uniform = np.full(50, 1 / 50)
    parent = sampler(history=(1, 2, 3), seed=1, temperature=1.0, repeat_penalty=1.5)
    parent.draw(uniform)
    twin = parent.fork(seed=7)
    fresh = sampler(history=(1, 2, 3), seed=7, temperature=1.0, repeat_penalty=1.5)

    assert twin.history == [1, 2, 3]
    assert [twin.draw(uniform) for _ in range(20)] == [fresh.draw(uniform) for _ in range(20)]


def test_fork_history_is_independent_of_the_parent() -> None:
    parent = sampler(history=(1, 2, 3), repeat_penalty=1.5)
    twin = parent.fork(seed=7)

    twin.accept(0)

    assert parent.history == [1, 2, 3]
    assert twin.history == [1, 2, 3, 0]


# ------------------------------------------------------------------------ logprobs


def test_logprobs_of_all_tokens_sum_to_one() -> None:
    row = np.random.default_rng(6).standard_normal(30).astype(np.float32) * 4

    total = sum(np.exp(sampler().logprob(row, token, top=0).logprob) for token in range(30))

    assert total == pytest.approx(1.0, abs=1e-9)


def test_logprob_alternatives_are_the_most_likely_tokens_best_first() -> None:
    result = sampler().logprob(LOGITS, 2, top=3)

    assert result.token == 2
    assert result.logprob == pytest.approx(np.log(0.15), abs=1e-6)
    assert [token for token, _ in result.top] == [0, 1, 2]
    np.testing.assert_allclose([lp for _, lp in result.top], np.log([0.5, 0.3, 0.15]), atol=1e-6)


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -0.1),
        ("temperature", 5.5),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.1),
        ("min_p", 1.0),
        ("repeat_penalty", 0.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("penalty_last_n", -1),
        ("logprobs", 21),
        ("stop", ("",)),
        ("stop", tuple("abcdefghijklmnopq")),
    ],
)
def test_invalid_sampling_params_raise_request_error_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(RequestError) as raised:
        SamplingParams(**{field: value})

    assert raised.value.param == field
    assert field in raised.value.message


# ------------------------------------------------------------ extreme but valid values


def test_a_temperature_near_zero_samples_as_greedy() -> None:
    row = logits(0.1, 2.0, -1.0, 0.5, 0.0, 0.0)
    probs = sampler(temperature=5e-324).distribution(row)
    assert not np.isnan(probs).any()
    assert sampler(temperature=5e-324).sample(row) == 1


def test_a_repeat_penalty_near_zero_makes_the_repeated_tokens_certain() -> None:
    # Dividing a positive logit by 5e-324 overflows to inf: the repeated tokens win.
    row = logits(0.1, 2.0, -1.0, 0.5, 0.0, 0.0)
    chosen = sampler(history=(0, 3), repeat_penalty=5e-324, temperature=1.0, seed=3)
    probs = chosen.distribution(row)
    assert not np.isnan(probs).any()
    assert probs[[0, 3]].sum() == pytest.approx(1.0)
    assert chosen.sample(row) in (0, 3)
