"""The server's check of whether a row's logits depend on the pass computing it: one-token
steps against passes of every size a draft is verified in, then against prompt chunks
ending at the same tokens, bit for bit; kept per model fingerprint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reame_core.backend.base import Batch, DecodeError
from reame_core.backend.fake import FakeBackend
from reame_core.backend.pass_check import (
    CHUNK_SIZES,
    SEQ,
    STEP_SIZES,
    TOKENS,
    PassCheck,
    check_passes,
    check_path,
)
from reame_core.runtime import determinism_note, draft_max
from reame_core.settings import Settings


class DriftingBackend(FakeBackend):
    """A backend whose passes of `drift_from` rows or more give every row slightly other
    logits, as a kernel taken only for products of several rows would."""

    def __init__(self, drift_from: int, *, recurrent: bool = False) -> None:
        super().__init__(recurrent=recurrent)
        self.drift_from = drift_from

    def decode(self, batch: Batch) -> np.ndarray:
        logits = super().decode(batch)
        if len(batch) >= self.drift_from:
            return np.nextafter(logits, np.float32(np.inf))
        return logits


def kept(directory: Path, backend: FakeBackend) -> PassCheck:
    return PassCheck.model_validate_json(
        check_path(directory, backend.info.fingerprint).read_bytes()
    )


def test_a_backend_whose_rows_never_drift_is_exact_and_left_empty(tmp_path: Path) -> None:
    backend = FakeBackend()

    check = check_passes(backend, tmp_path)

    assert check is not None and check.exact and check.differing == ()
    assert kept(tmp_path, backend) == check
    assert backend.kv[SEQ] == []


@pytest.mark.parametrize(
    ("drift_from", "differing"),
    [
        # verification steps from the size a kernel changes at (chunks then not tried)
        (2, (2, 4, 8, 17, 33)),
        (4, (4, 8, 17, 33)),
        (5, (8, 17, 33)),
        (9, (17, 33)),
        (30, (33,)),
        # prompt chunks, where every step agrees
        (34, (48, 100, 146)),
        (64, (100, 146)),
        (146, (146,)),
    ],
)
def test_passes_from_the_size_a_kernel_changes_at_are_found(
    tmp_path: Path, drift_from: int, differing: tuple[int, ...]
) -> None:
    backend = DriftingBackend(drift_from)

    check = check_passes(backend, tmp_path)

    assert check is not None and not check.exact
    assert check.differing == differing
    assert backend.kv[SEQ] == []


def test_rows_that_are_not_numbers_are_not_taken_for_exact(tmp_path: Path) -> None:
    class Broken(FakeBackend):
        def decode(self, batch: Batch) -> np.ndarray:
            return np.full_like(super().decode(batch), np.nan)

    backend = Broken()

    check = check_passes(backend, tmp_path)

    assert check is not None and not check.exact


def test_a_failing_decode_leaves_the_answer_unknown_and_the_sequence_empty(
    tmp_path: Path,
) -> None:
    class Failing(FakeBackend):
        def decode(self, batch: Batch) -> np.ndarray:
            if len(batch) == 4:
                raise DecodeError("no room")
            return super().decode(batch)

    backend = Failing()

    assert check_passes(backend, tmp_path) is None
    assert backend.kv[SEQ] == []
    assert not check_path(tmp_path, backend.info.fingerprint).exists()


def test_the_answer_is_kept_and_not_measured_again(tmp_path: Path) -> None:
    backend = FakeBackend()
    check_passes(backend, tmp_path)
    calls = backend.decode_calls

    assert check_passes(backend, tmp_path) == kept(tmp_path, backend)
    assert backend.decode_calls == calls
    other = FakeBackend(name="another model")  # another fingerprint: checked on its own
    check_passes(other, tmp_path)
    assert other.decode_calls > 0


def test_an_unreadable_answer_is_measured_again(tmp_path: Path) -> None:
    backend = DriftingBackend(2)
    path = check_path(tmp_path, backend.info.fingerprint)
    path.parent.mkdir(parents=True)
    path.write_text('{"exact": tr')

    check = check_passes(backend, tmp_path)

    assert check is not None and not check.exact
    assert backend.decode_calls > 0
    assert kept(tmp_path, backend) == check


@pytest.mark.parametrize("drift_from", [2, 64, 1000])
def test_a_model_whose_sequences_cannot_be_cut_is_checked_by_computing_again(
    tmp_path: Path, drift_from: int
) -> None:
    backend = DriftingBackend(drift_from, recurrent=True)

    check = check_passes(backend, tmp_path)

    assert check is not None and check.exact == (drift_from > max(CHUNK_SIZES))
    assert backend.kv[SEQ] == []


def test_a_backend_too_small_for_the_check_is_not_checked_but_reads_a_kept_answer(
    tmp_path: Path,
) -> None:
    small = FakeBackend(n_batch=64)

    assert check_passes(small, tmp_path) is None
    assert small.decode_calls == 0
    check_passes(FakeBackend(), tmp_path)  # the same model with a larger batch
    assert check_passes(small, tmp_path) == kept(tmp_path, small)
    assert small.decode_calls == 0


def test_steps_are_exact_where_only_prompt_chunks_differ() -> None:
    assert passes(True).steps_exact
    assert PassCheck(exact=False, differing=CHUNK_SIZES, checked_at=0.0).steps_exact
    assert not PassCheck(exact=False, differing=(STEP_SIZES[-1],), checked_at=0.0).steps_exact
    assert not PassCheck(exact=False, differing=(1,), checked_at=0.0).steps_exact  # not numbers


@pytest.mark.parametrize(
    ("differing", "exact_steps", "draft_cap"),
    [
        ((), TOKENS, None),  # every path exact: no cap needed
        (CHUNK_SIZES, TOKENS, TOKENS - 1),  # every step exact: drafts as long as steps checked
        ((TOKENS,), 17, 16),  # passes of a long draft differ: drafts kept to the exact ones
        ((8, 17, TOKENS), 4, None),  # too short to be worth keeping to: near-ties instead
        ((1,), 1, None),  # rows that are not numbers: nothing exact
    ],
)
def test_drafts_are_capped_to_the_passes_found_exact_where_that_leaves_long_drafts(
    differing: tuple[int, ...], exact_steps: int, draft_cap: int | None
) -> None:
    check = PassCheck(exact=not differing, differing=differing, checked_at=0.0)

    assert check.exact_steps == exact_steps
    assert check.draft_cap == draft_cap
    assert draft_max(Settings(draft_max=64), check) == (64 if draft_cap is None else draft_cap)
    assert draft_max(Settings(draft_max=8), check) == 8


def passes(exact: bool) -> PassCheck:
    return PassCheck(exact=exact, differing=() if exact else (4,), checked_at=0.0)


def test_the_guarantees_say_what_the_check_found() -> None:
    settings = Settings()

    exact = determinism_note(settings, passes(True))
    assert "do not depend on the pass computing it (checked for this model, build and CPU)" in exact
    assert "generated tokens are reused as computed" in exact
    assert exact.endswith("speculative verification is exact too")
    drifting = determinism_note(settings, passes(False))
    assert "reused only once recomputed as a prompt chunk" in drifting
    assert drifting.endswith("exact only up to near-ties (checked for this model, build and CPU)")
    steps_only = determinism_note(
        settings, PassCheck(exact=False, differing=CHUNK_SIZES[1:], checked_at=0.0)
    )
    assert "reused only once recomputed as a prompt chunk" in steps_only
    longest = f"exact in passes of up to {TOKENS} tokens, a draft of at most {TOKENS - 1} "
    assert longest in steps_only
    capped = determinism_note(settings, PassCheck(exact=False, differing=(TOKENS,), checked_at=0.0))
    assert "verification is exact in passes of up to 17 tokens, a draft of at most 16 " in capped
    assert "verified (checked for this model, build and CPU); larger passes" in capped
    assert capped.endswith("may differ at near-ties")
    unchecked = determinism_note(settings)
    assert unchecked.endswith("exact at least up to near-ties (not checked for this model)")
    assert determinism_note(Settings(deterministic=False)).startswith("fast mode")
