"""Turning one row of logits into the next token, per request.

A `TokenSampler` owns one candidate's random stream and its penalty history, so a seeded
request draws the same tokens whatever else shares the batch. The pipeline, in order:
logit bias, EOG masking (ignore_eos), repetition/presence/frequency penalties over the
last `penalty_last_n` tokens, then (when sampling) temperature, top-k, top-p, min-p.
Greedy decoding takes the argmax after the first three steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import numpy as np

from reame_core.request import SamplingParams, TokenLogprob

_TOP_P_CANDIDATES = 512


class TokenSampler:
    def __init__(
        self,
        params: SamplingParams,
        *,
        eog: Collection[int],
        history: Sequence[int] = (),
        seed: int | None = None,
    ) -> None:
        self.params = params
        self._eog: np.ndarray | None = (
            np.fromiter(eog, dtype=np.int64) if params.ignore_eos else None
        )
        self._bias_ids: np.ndarray | None = None
        self._bias_values: np.ndarray | None = None
        if params.logit_bias:
            self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
            self._bias_values = np.fromiter(params.logit_bias.values(), dtype=np.float32)
        window = params.penalty_last_n if params.penalized else 0
        self._window = window
        self.history: list[int] = list(history[-window:]) if window else []
        self.rng = np.random.default_rng(seed)
        self._plain = self._bias_ids is None and self._eog is None and not window
        # Greedy with at most EOG masking: the argmax of the model's own row stands unless
        # it is an EOG token, so most steps need no masked copy of the row.
        self._greedy_eog_only = params.greedy and self._bias_ids is None and not window
        self._eog_ids = frozenset(eog) if params.ignore_eos else frozenset()

    def fork(self, seed: int | None) -> TokenSampler:
        """A sampler with the same history for a sibling candidate, with its own seed."""
        twin = TokenSampler.__new__(TokenSampler)
        twin.__dict__.update(self.__dict__)
        twin.history = list(self.history)
        twin.rng = np.random.default_rng(seed)
        return twin

    # ------------------------------------------------------------------ logits

    def adjust(self, logits: np.ndarray, pending: Sequence[int] = ()) -> np.ndarray:
        """Bias, EOG mask and penalties, as if `pending` tokens were already accepted.

        Returns `logits` itself when there is nothing to adjust, otherwise a copy.
        """
        if self._plain:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        if self._bias_ids is not None and self._bias_values is not None:
            out[self._bias_ids] += self._bias_values
        if self._eog is not None:
            out[self._eog] = -np.inf
        if self._window:
            recent = (self.history + list(pending))[-self._window :]
            self._penalize(out, recent)
        return out

    def _penalize(self, logits: np.ndarray, recent: Sequence[int]) -> None:
        if not recent:
            return
        counts = Counter(recent)
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        freq = np.fromiter(counts.values(), dtype=np.float32)
        p = self.params
        values = logits[ids]
        if p.repeat_penalty != 1.0:
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # near 0: inf
                values = np.where(values > 0, values / p.repeat_penalty, values * p.repeat_penalty)
        values = values - freq * p.frequency_penalty - p.presence_penalty
        logits[ids] = values

    def probabilities(self, adjusted: np.ndarray) -> np.ndarray:
        """The sampling distribution over the whole vocabulary (zeros outside the cut)."""
        p = self.params
        if p.greedy:
            probs = np.zeros(adjusted.shape[0], dtype=np.float64)
            probs[int(np.argmax(adjusted))] = 1.0
            return probs
        top = float(adjusted.max())
        if top == np.inf:  # a repeat penalty near 0 makes some tokens certain: those only
            certain: np.ndarray = (adjusted == top).astype(np.float64)
            certain /= certain.sum()
            return certain
        # Shifted before scaling, so that a temperature near 0 makes the distribution
        # near greedy rather than overflowing to inf - inf = NaN.
        with np.errstate(over="ignore"):  # to -inf: probability 0, as meant
            scaled = (adjusted.astype(np.float64) - top) / p.temperature
        keep: np.ndarray | None = None
        if p.top_k > 0 and p.top_k < scaled.shape[0]:
            keep = np.argpartition(scaled, -p.top_k)[-p.top_k :]
        if p.top_p < 1.0:
            keep = _top_p(scaled, p.top_p, keep)
        if keep is not None:
            masked = np.full_like(scaled, -np.inf)
            masked[keep] = scaled[keep]
            scaled = masked
        scaled -= scaled.max()
        probs = np.exp(scaled)
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
            probs /= probs.sum()
        return probs

    # ------------------------------------------- choosing (a `TargetSampler`)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def distribution(self, logits: np.ndarray, pending: Sequence[int] = ()) -> np.ndarray:
        """The sampling distribution of a raw row, as if `pending` tokens were accepted."""
        return self.probabilities(self.adjust(logits, pending))

    def sample(self, logits: np.ndarray, pending: Sequence[int] = ()) -> int:
        if self._greedy_eog_only:
            token = int(logits.argmax())
            if token not in self._eog_ids:
                return token  # what the masked copy's argmax would be: nothing before it ties
        adjusted = self.adjust(logits, pending)
        if self.params.greedy:
            return int(np.argmax(adjusted))
        return self.draw(self.probabilities(adjusted))

    def draw(self, probs: np.ndarray) -> int:
        """One token from a distribution, with this candidate's random stream."""
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, self.uniform() * cumulative[-1], "right"))
        return min(index, int(probs.shape[0]) - 1)

    def uniform(self) -> float:
        """The next number of this candidate's random stream, uniform in [0, 1)."""
        return float(self.rng.random())

    def accept(self, token: int) -> None:
        """Record a committed token (only committed ones: drafts never touch the history)."""
        if self._window:
            self.history.append(token)
            if len(self.history) > 4 * self._window:
                del self.history[: -self._window]

    def logprob(self, logits: np.ndarray, token: int, top: int) -> TokenLogprob:
        """Log-probability of `token` under the distribution `logits` define."""
        shifted = logits.astype(np.float64) - float(np.max(logits))
        log_z = float(np.log(np.exp(shifted).sum()))
        alternatives: tuple[tuple[int, float], ...] = ()
        if top > 0:
            best = np.argpartition(shifted, -top)[-top:]
            best = best[np.argsort(-shifted[best])]
            alternatives = tuple((int(t), float(shifted[t] - log_z)) for t in best)
        return TokenLogprob(token, float(shifted[token] - log_z), alternatives)


def _top_p(scaled: np.ndarray, top_p: float, keep: np.ndarray | None) -> np.ndarray:
    """Smallest set of most likely tokens whose probability reaches `top_p`."""
    candidates = keep
    if candidates is None:
        n = min(_TOP_P_CANDIDATES, scaled.shape[0])
        candidates = np.argpartition(scaled, -n)[-n:]
    order = candidates[np.argsort(-scaled[candidates])]
    log_z = np.log(np.exp(scaled - scaled.max()).sum()) + scaled.max()
    probs = np.exp(scaled[order] - log_z)
    cumulative = np.cumsum(probs)
    if keep is None and cumulative[-1] < top_p and order.shape[0] < scaled.shape[0]:
        # The top few hundred tokens do not reach top_p: fall back to a full sort.
        return _top_p(scaled, top_p, np.arange(scaled.shape[0]))
    if keep is not None:
        cumulative = cumulative / cumulative[-1]
    cut = int(np.searchsorted(cumulative, top_p, "left")) + 1
    return order[:cut]
