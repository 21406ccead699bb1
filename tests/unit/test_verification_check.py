"""The server's check of whether verifying drafts is exact: rows of passes of every size a
draft is verified in against one-token steps, bit for bit, kept per model fingerprint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reame_core.backend import verification_check
from reame_core.backend.base import Batch
from reame_core.backend.fake import FakeBackend
from reame_core.backend.verification_check import (
    PASS_SIZES,
    SEQ,
    check_path,
    verification_exact,
)
from reame_core.runtime import determinism_note
from reame_core.settings import Settings


class DriftingBackend(FakeBackend):
    """A backend whose passes of `drift_from` rows or more give every row slightly other
    logits, as a kernel taken only for products of several rows would."""

    def __init__(self, drift_from: int) -> None:
        super().__init__()
        self.drift_from = drift_from

    def decode(self, batch: Batch) -> np.ndarray:
        logits = super().decode(batch)
        if sum(batch.want_logits) >= self.drift_from:
            return np.nextafter(logits, np.float32(np.inf))
        return logits


def test_a_backend_whose_rows_never_drift_is_exact_and_left_empty(tmp_path: Path) -> None:
    backend = FakeBackend()

    assert verification_exact(backend, tmp_path) is True
    assert backend.kv[SEQ] == []
    kept = verification_check.VerificationCheck.model_validate_json(
        check_path(tmp_path, backend.info.fingerprint).read_bytes()
    )
    assert kept.exact and kept.differing == ()


@pytest.mark.parametrize("drift_from", [2, 4, 5, 9])
def test_passes_from_the_size_a_kernel_changes_at_are_found(
    tmp_path: Path, drift_from: int
) -> None:
    backend = DriftingBackend(drift_from)

    assert verification_exact(backend, tmp_path) is False
    kept = verification_check.VerificationCheck.model_validate_json(
        check_path(tmp_path, backend.info.fingerprint).read_bytes()
    )
    assert kept.differing == tuple(size for size in PASS_SIZES if size >= drift_from)
    assert backend.kv[SEQ] == []


def test_the_answer_is_kept_and_not_measured_again(tmp_path: Path) -> None:
    backend = FakeBackend()
    verification_exact(backend, tmp_path)
    calls = backend.decode_calls

    assert verification_exact(backend, tmp_path) is True
    assert backend.decode_calls == calls
    other = FakeBackend(name="another model")  # another fingerprint: checked on its own
    verification_exact(other, tmp_path)
    assert other.decode_calls > 0


def test_an_unreadable_answer_is_measured_again(tmp_path: Path) -> None:
    backend = DriftingBackend(2)
    path = check_path(tmp_path, backend.info.fingerprint)
    path.parent.mkdir(parents=True)
    path.write_text('{"exact": tr')

    assert verification_exact(backend, tmp_path) is False
    assert backend.decode_calls > 0
    assert '"exact":false' in path.read_text()


def test_a_model_whose_sequences_cannot_be_cut_computes_its_context_again(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(recurrent=True)

    assert verification_exact(backend, tmp_path) is True
    assert backend.kv[SEQ] == []


def test_a_backend_too_small_for_the_check_is_not_checked(tmp_path: Path) -> None:
    backend = FakeBackend(n_batch=8)

    assert verification_exact(backend, tmp_path) is None
    assert backend.decode_calls == 0


def test_the_guarantees_say_what_the_check_found() -> None:
    backend = FakeBackend()
    settings = Settings()

    exact = determinism_note(backend, settings, True)
    drifting = determinism_note(backend, settings, False)
    assert exact.endswith(
        "speculative verification is exact too (checked for this model, build and CPU)"
    )
    assert "exact only up to near-ties for this model, build and CPU (checked)" in drifting
    unchecked = determinism_note(backend, settings)  # a fake has no llamafile kernels
    assert unchecked.endswith("speculative verification is exact too")
    assert determinism_note(backend, Settings(deterministic=False), True).startswith("fast mode")
