"""The measured code of `reame bench`'s workloads, run in this process on the fake backend:
each arm runs what it says (the baseline really is the baseline) and reports what it did.
No figure is asserted: on the fake backend speed means nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.bench.arms import run_trial
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import BY_NAME, Arm
from reame_core.errors import ModelLoadError


def fake_backend() -> FakeBackend:
    # Byte tokens: the handbook prompt needs a long context; best-of-5 needs 5 slots. A
    # decode costs time, as on a real host, so that the governor finds drafting pays.
    return FakeBackend(n_ctx_seq=8192, n_seq_max=5, step_cost_s=0.002)


def fresh_plugins() -> Callable[[str], object]:
    """A new instance of each plugin a workload asks for (skipped if not installed)."""
    classes = {
        "diskkv": ("reame_diskkv.plugin", "DiskPrefixCache"),
        "palimpsest": ("reame_palimpsest.plugin", "Palimpsest"),
        "conclave": ("reame_conclave.plugin", "Conclave"),
        "suggeritore": ("reame_suggeritore.plugin", "Suggeritore"),
    }

    def plugin(name: str) -> object:
        module, cls = classes[name]
        return getattr(pytest.importorskip(module), cls)()

    return plugin


def run(workload: str, arm: Arm, scratch: Path, rep: int = 0) -> Sample:
    size = BY_NAME[workload].quick
    trial = Trial(workload, arm, rep, size, "fake", str(scratch))
    return run_trial(trial, backend=fake_backend, plugin=fresh_plugins())


def test_the_raw_loop_generates_what_the_engine_generates(tmp_path: Path) -> None:
    engine, raw = run("decode", "A", tmp_path), run("decode", "B", tmp_path)
    assert engine.tokens == raw.tokens == BY_NAME["decode"].quick.tokens
    assert engine.outputs == raw.outputs
    assert engine.value > 0 and raw.value > 0


def test_streams_run_the_same_requests_at_once_and_one_after_another(tmp_path: Path) -> None:
    together, serial = run("streams", "A", tmp_path), run("streams", "B", tmp_path)
    size = BY_NAME["streams"].quick
    assert together.tokens == serial.tokens == size.requests * size.tokens
    assert together.outputs == serial.outputs


def test_prompt_lookup_drafts_only_in_the_feature_arm(tmp_path: Path) -> None:
    feature, baseline = run("lookup", "A", tmp_path), run("lookup", "B", tmp_path)
    assert baseline.detail["drafts_proposed"] == 0
    assert feature.detail["drafts_proposed"] > 0
    assert feature.outputs == baseline.outputs  # greedy: drafts never change the answer


def test_the_adversarial_workload_samples_and_only_the_feature_may_draft(tmp_path: Path) -> None:
    feature, baseline = run("adversarial", "A", tmp_path), run("adversarial", "B", tmp_path)
    assert baseline.detail["drafts_proposed"] == 0
    assert feature.outputs is None and baseline.outputs is None
    size = BY_NAME["adversarial"].quick
    assert feature.tokens == baseline.tokens == size.requests * size.tokens


def test_the_warm_process_restores_what_the_cold_one_left_on_disk(tmp_path: Path) -> None:
    cold = run("diskcache", "B", tmp_path)
    warm = run("diskcache", "A", tmp_path)
    assert cold.detail["restored_tokens"] == 0
    assert warm.detail["restored_tokens"] > 0
    assert warm.outputs == cold.outputs


def test_the_second_pass_drafts_from_the_archive_the_first_pass_filled(tmp_path: Path) -> None:
    first = run("palimpsest", "B", tmp_path)
    second = run("palimpsest", "A", tmp_path)
    assert first.detail["drafts_proposed"] == 0
    assert second.detail["drafts_accepted"] > 0
    assert second.outputs == first.outputs


def test_best_of_n_votes_and_the_baseline_answers_once(tmp_path: Path) -> None:
    best_of, single = run("conclave", "A", tmp_path), run("conclave", "B", tmp_path)
    assert len(best_of.detail["votes"]) == BY_NAME["conclave"].quick.requests
    assert "votes" not in single.detail
    assert best_of.tokens > single.tokens


def test_grammar_drafts_keep_the_constrained_answer(tmp_path: Path) -> None:
    feature, baseline = run("grammar", "A", tmp_path), run("grammar", "B", tmp_path)
    assert baseline.detail["drafts_proposed"] == 0
    assert feature.detail["drafts_accepted"] > 0
    assert feature.outputs == baseline.outputs


def test_only_the_feature_arm_drafts_with_the_draft_model_it_is_given(tmp_path: Path) -> None:
    baseline = run("draftmodel", "B", tmp_path)
    assert baseline.detail["drafts_proposed"] == 0
    size = BY_NAME["draftmodel"].quick
    missing = tmp_path / "draft.gguf"
    trial = Trial("draftmodel", "A", 0, size, "fake", str(tmp_path), draft=str(missing))
    with pytest.raises(ModelLoadError, match=r"draft\.gguf"):
        run_trial(trial, backend=fake_backend, plugin=fresh_plugins())


def test_the_feature_arm_refuses_to_run_without_a_draft_model(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no draft model"):
        run("draftmodel", "A", tmp_path)
