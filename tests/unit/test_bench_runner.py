"""`reame bench`'s harness: the alternation of A and B, the statistics of a row, skip
reasons (a plugin missing, a model without a draft model). Measurements here are plain
functions returning chosen figures, so every number a row shows can be checked exactly."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from reame_core.bench.pairs import draft_for
from reame_core.bench.runner import alternation, run_workload, trial_measure
from reame_core.bench.stats import paired_speedups, speedup
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import BY_NAME, WORKLOADS, Arm, Size, Workload
from reame_core.plugins import PluginRecord

RATE = BY_NAME["lookup"]  # tok/s, higher is better
TIME = BY_NAME["diskcache"]  # seconds, lower is better, B first


def test_arms_alternate_between_repetitions() -> None:
    assert alternation(4) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B"),
                              (3, "B"), (3, "A")]  # fmt: skip


def test_a_workload_that_reads_what_its_baseline_left_runs_the_baseline_first() -> None:
    assert alternation(3, baseline_first=True) == [
        (0, "B"), (0, "A"), (1, "B"), (1, "A"), (2, "B"), (2, "A")
    ]  # fmt: skip


def test_speedup_of_a_rate_is_feature_over_baseline() -> None:
    assert speedup(150.0, 100.0, higher_is_better=True) == pytest.approx(1.5)


def test_speedup_of_a_time_is_baseline_over_feature() -> None:
    assert speedup(0.5, 2.0, higher_is_better=False) == pytest.approx(4.0)


def test_speedup_scales_for_a_baseline_that_does_one_of_n() -> None:
    # best-of-5 in 2 s against one answer in 1 s: 5 answers would have taken 5 s.
    assert speedup(2.0, 1.0, higher_is_better=False, scale=5) == pytest.approx(2.5)


def test_paired_speedups_need_one_baseline_per_feature_sample() -> None:
    with pytest.raises(ValueError, match="3 feature samples but 2"):
        paired_speedups([1, 2, 3], [1, 2], higher_is_better=True)


class Scripted:
    """A `Measure` with chosen figures per (arm, rep); records the calls it gets."""

    def __init__(self, figures: dict[tuple[Arm, int], float], outputs: str | None = "x") -> None:
        self.figures = figures
        self.outputs = outputs
        self.calls: list[tuple[str, Arm, int, str]] = []

    def __call__(self, workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        self.calls.append((workload.name, arm, rep, scratch))
        assert os.path.isdir(scratch)
        return Sample(self.figures[arm, rep], 10, 1.0, self.outputs, {"rep": rep, "arm": arm})


def test_the_ratio_is_the_median_of_paired_ratios_not_a_ratio_of_medians() -> None:
    # The host slows down in rep 1: each rep's pair still says 2x.
    figures = {("A", 0): 200.0, ("B", 0): 100.0, ("A", 1): 20.0, ("B", 1): 10.0,
               ("A", 2): 100.0, ("B", 2): 50.0}  # fmt: skip
    row = run_workload(RATE, 3, Scripted(figures))
    assert row.ratio == pytest.approx(2.0)
    assert row.ratio_by_rep == pytest.approx((2.0, 2.0, 2.0))
    assert row.feature_value == 100.0
    assert row.baseline_value == 50.0
    assert row.reps == 3
    assert row.paid is True


def test_a_row_keeps_the_baseline_figure_and_its_unit() -> None:
    figures = {("A", 0): 0.25, ("B", 0): 2.0}
    row = run_workload(TIME, 1, Scripted(figures))
    assert (row.baseline_value, row.unit, row.ratio) == (2.0, "s", pytest.approx(8.0))


def test_a_row_keeps_both_arms_accounts_of_the_last_repetition() -> None:
    figures = {("A", 0): 2.0, ("B", 0): 1.0, ("A", 1): 2.0, ("B", 1): 1.0}
    row = run_workload(RATE, 2, Scripted(figures))
    assert row.detail == {"rep": 1, "arm": "A"}
    assert row.baseline_detail == {"rep": 1, "arm": "B"}


def test_a_feature_that_did_not_pay_is_kept_and_marked() -> None:
    figures = {("A", 0): 90.0, ("B", 0): 100.0}
    row = run_workload(RATE, 1, Scripted(figures))
    assert row.ratio == pytest.approx(0.9)
    assert row.paid is False
    assert row.verdict.startswith("did not pay")


def test_a_workload_with_a_lower_goal_pays_below_one() -> None:
    figures = {("A", 0): 98.0, ("B", 0): 100.0}
    row = run_workload(BY_NAME["adversarial"], 1, Scripted(figures))
    assert row.goal < 0.98
    assert row.paid is True


def test_the_arms_of_one_repetition_share_a_scratch_directory_no_other_sees() -> None:
    figures = {(arm, rep): 1.0 for arm in ("A", "B") for rep in range(2)}
    measure = Scripted(figures)  # type: ignore[arg-type]
    run_workload(TIME, 2, measure)
    by_rep = {rep: {scratch for _, _, r, scratch in measure.calls if r == rep} for rep in (0, 1)}
    assert len(by_rep[0]) == len(by_rep[1]) == 1
    assert by_rep[0] != by_rep[1]
    assert not any(Path(s).exists() for s in by_rep[0] | by_rep[1])  # removed afterwards


def test_same_tokens_counts_the_repetitions_whose_greedy_outputs_agree() -> None:
    class Diverging(Scripted):
        def __call__(self, workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
            sample = super().__call__(workload, arm, rep, scratch)
            return replace(sample, outputs="b" if (arm, rep) == ("A", 1) else "a")

    figures = {(arm, rep): 1.0 for arm in ("A", "B") for rep in range(3)}
    row = run_workload(RATE, 3, Diverging(figures))  # type: ignore[arg-type]
    assert row.identical == "2 of 3"


def test_sampled_outputs_are_not_compared() -> None:
    figures = {("A", 0): 1.0, ("B", 0): 1.0}
    row = run_workload(BY_NAME["adversarial"], 1, Scripted(figures, outputs=None))
    assert row.identical is None


def test_a_failing_trial_ends_its_row_with_the_reason() -> None:
    def broken(workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        raise RuntimeError("decode B: llama_decode returned -3")

    row = run_workload(RATE, 2, broken)
    assert row.ratio is None
    assert row.failed == "decode B: llama_decode returned -3"
    assert row.verdict == "failed: decode B: llama_decode returned -3"


def test_the_progress_callback_is_told_each_trial_in_order() -> None:
    seen: list[tuple[str, Arm, int]] = []
    figures = {(arm, rep): 1.0 for arm in ("A", "B") for rep in range(2)}
    run_workload(RATE, 2, Scripted(figures), on_trial=lambda w, a, r: seen.append((w.name, a, r)))  # type: ignore[arg-type]
    assert seen == [("lookup", "A", 0), ("lookup", "B", 0), ("lookup", "B", 1), ("lookup", "A", 1)]


def _record(name: str, enabled: bool = True, error: str = "") -> PluginRecord:
    return PluginRecord(name, f"reame-{name}", "0.1.0", enabled, False, error=error)


def test_a_workload_whose_plugin_is_missing_is_skipped_with_a_reason() -> None:
    reason = BY_NAME["conclave"].skip_reason({})
    assert reason == "plugin conclave is not installed (pip install reame-conclave)"


def test_a_workload_whose_plugin_is_disabled_is_skipped_with_a_reason() -> None:
    reason = BY_NAME["palimpsest"].skip_reason({"palimpsest": _record("palimpsest", False)})
    assert reason == "plugin palimpsest is disabled"


def test_a_workload_with_its_plugins_enabled_runs() -> None:
    assert BY_NAME["grammar"].skip_reason({"suggeritore": _record("suggeritore")}) is None
    assert BY_NAME["decode"].skip_reason({}) is None


CODER = Path("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
CODER_DRAFT = Path("/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def test_a_model_with_a_fetched_draft_model_gets_its_file() -> None:
    located: list[str] = []

    def locate(alias: str) -> Path:
        located.append(alias)
        return CODER_DRAFT

    assert draft_for("qwen2.5-coder-1.5b", CODER, locate) == (str(CODER_DRAFT), None)
    assert located == ["qwen2.5-coder-0.5b"]


def test_a_model_given_as_a_file_is_known_by_its_files_name() -> None:
    assert draft_for(str(CODER), CODER, lambda alias: CODER_DRAFT) == (str(CODER_DRAFT), None)


def test_a_model_without_a_draft_pair_skips_the_draft_workload_and_says_which_has_one() -> None:
    draft, reason = draft_for("smollm2-135m", Path("/m/SmolLM2.gguf"), lambda alias: CODER_DRAFT)
    assert draft is None
    assert reason == (
        "smollm2-135m has no same-vocabulary draft model "
        "(qwen2.5-coder-1.5b has one, qwen2.5-coder-0.5b)"
    )
    assert BY_NAME["draftmodel"].skip_reason({}, no_draft_model=reason) == reason


def test_a_draft_model_not_fetched_skips_the_draft_workload_with_the_command_to_fetch_it() -> None:
    draft, reason = draft_for("qwen2.5-coder-1.5b", CODER, lambda alias: None)
    assert draft is None
    assert reason == (
        "its draft model qwen2.5-coder-0.5b is not on this machine (reame pull qwen2.5-coder-0.5b)"
    )


def test_only_the_draft_workload_needs_a_draft_model() -> None:
    for workload in WORKLOADS:
        if workload.name != "draftmodel" and not workload.plugins:
            assert workload.skip_reason({}, no_draft_model="none here") is None
    assert BY_NAME["draftmodel"].skip_reason({}) is None


def test_the_draft_model_is_given_to_the_trials_that_need_it_only() -> None:
    trials: list[Trial] = []

    def run(trial: Trial) -> Sample:
        trials.append(trial)
        return Sample(1.0, 1, 1.0)

    measure = trial_measure(run, model="/m.gguf", quick=True, threads=None, draft="/d.gguf")
    measure(BY_NAME["draftmodel"], "A", 0, "/tmp/x")
    measure(BY_NAME["lookup"], "A", 0, "/tmp/x")
    assert [t.draft for t in trials] == ["/d.gguf", None]


def test_every_workload_has_a_measured_arm_and_quick_is_no_larger_than_full() -> None:
    from reame_core.bench.arms import ARMS

    assert set(ARMS) == {w.name for w in WORKLOADS}
    for workload in WORKLOADS:
        quick, full = workload.quick, workload.full
        assert quick.requests * quick.tokens <= full.requests * full.tokens, workload.name


def test_a_trial_crosses_the_process_boundary_unchanged() -> None:
    trial = Trial("draftmodel", "B", 2, Size(1, 8, shared_rules=32), "/m.gguf", "/tmp/x", 2, "/d")
    assert Trial.from_json(trial.to_json()) == trial
    sample = Sample(1.5, 8, 2.0, "abc", {"restored_tokens": 12})
    assert Sample.from_json(sample.to_json()) == sample
