"""Host auto-configuration: decisions from fake host facts, and the reasons given for them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reame_core.autoconfig import facts as facts_module
from reame_core.autoconfig.facts import HostFacts, physical_cores, read_host_facts
from reame_core.autoconfig.plan import (
    GIB,
    MIB,
    READ_WEIGHTS_MAX,
    RUNTIME_RESERVE,
    AttentionFacts,
    Choice,
    HostPlan,
    plan_host,
)
from reame_core.hooktypes import DiskNeed
from reame_core.models.registry import CARDS
from reame_core.models.shape import ModelShape
from reame_core.settings import Settings

SMOLLM2 = CARDS["smollm2-135m"].shape
QWEN_05B = CARDS["qwen2.5-0.5b"].shape
QWEN_15B = CARDS["qwen2.5-1.5b"].shape
QWEN_7B = CARDS["qwen2.5-7b"].shape
TINYLLAMA = CARDS["tinyllama-1.1b"].shape


def host(
    cores: int = 2,
    logical: int | None = None,
    total_gb: float = 4,
    free_gb: float = 3,
    disk_gb: float = 50,
    arch: str = "x86_64",
) -> HostFacts:
    return HostFacts(
        arch=arch,
        physical_cores=cores,
        logical_cpus=logical or cores,
        memory_total=int(total_gb * GIB),
        memory_available=int(free_gb * GIB),
        disk_free=int(disk_gb * GIB),
        disk_path=Path("/var/cache/reame"),
    )


ARM_1GB = host(cores=2, total_gb=1, free_gb=1, disk_gb=20, arch="aarch64")
SERVER_16 = host(cores=16, logical=32, total_gb=64, free_gb=60, disk_gb=500)


def plan(facts: HostFacts, shape: ModelShape, **settings: Any) -> HostPlan:
    return plan_host(Settings(**settings), facts, shape)


def kv_bytes(result: HostPlan, shape: ModelShape) -> float:
    per_token = shape.kv_bytes_per_token(result.kv_type_k.value, result.kv_type_v.value)
    return result.ctx.value * result.parallel.value * per_token


def test_threads_are_the_physical_cores_not_the_logical_cpus() -> None:
    result = plan(SERVER_16, QWEN_15B)

    assert result.threads.value == 16
    assert "16 physical cores" in result.threads.why
    assert "32 logical CPUs" in result.threads.why


def test_smt_siblings_count_as_one_core() -> None:
    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}

    assert physical_cores({0, 1, 2, 3}, siblings) == 2
    assert physical_cores({0, 2}, siblings) == 1
    assert physical_cores({0, 1, 2}, {}) == 3  # no topology (ARM boards): one core each


def test_the_explanation_says_why_in_one_line_per_value() -> None:
    lines = dict(plan(host(cores=2), SMOLLM2).explain())

    assert (
        lines["threads"] == "2: 2 physical cores; fewer while other processes keep the cores busy"
    )
    assert set(lines) >= {"ctx", "parallel", "batch", "kv_type", "flash_attn", "memory"}


def test_a_roomy_server_gets_q8_0_keys_f16_values_the_full_context_and_many_slots() -> None:
    result = plan(SERVER_16, QWEN_15B)

    assert result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("q8_0", "f16")
    assert "one path" in result.kv_type_k.why
    assert result.ctx.value == 4096
    assert result.parallel.value == 16
    assert result.batch.value == 512
    assert result.warnings == ()


def test_two_slots_per_thread_on_a_small_box() -> None:
    assert plan(host(cores=2, free_gb=8), QWEN_15B).parallel.value == 4


def test_a_2_core_arm_box_with_1_gb_runs_the_0_5b_model_within_its_memory() -> None:
    result = plan(ARM_1GB, QWEN_05B)

    assert result.threads.value == 2
    assert result.batch.value == 128  # 512-token logits over 152k tokens would not fit
    compute = QWEN_05B.compute_buffer_bytes(result.batch.value, result.ctx.value)
    used = QWEN_05B.file_bytes + compute + RUNTIME_RESERVE + kv_bytes(result, QWEN_05B)
    assert used <= ARM_1GB.memory_available
    assert result.warnings == ()


def test_fast_settings_on_a_roomy_server_keep_f16_keys_and_values() -> None:
    result = plan(SERVER_16, QWEN_15B, deterministic=False)

    assert result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("f16", "f16")


def test_tight_memory_quantizes_the_values_too_when_deterministic() -> None:
    result = plan(host(free_gb=1.9), QWEN_15B)

    assert result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("q8_0", "q8_0")
    assert "memory is tight" in result.kv_type_v.why


def test_deterministic_with_f16_kv_set_turns_flash_attention_off() -> None:
    result = plan(SERVER_16, QWEN_15B, kv_type="f16")

    assert not result.flash_attn.value
    assert "thread count" in result.flash_attn.why
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("f16", "f16")


def test_tight_memory_quantizes_keys_and_values_when_flash_attention_is_on() -> None:
    result = plan(host(free_gb=1.9), QWEN_15B, deterministic=False)

    assert result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("q8_0", "q8_0")


def test_slots_shrink_before_the_context_does() -> None:
    result = plan(host(free_gb=1.9), QWEN_15B)

    assert result.ctx.value == 4096
    assert 1 <= result.parallel.value < 4
    assert "target 4" in result.parallel.why


def test_the_context_shrinks_when_not_even_one_slot_fits() -> None:
    result = plan(host(free_gb=1.71), QWEN_15B)

    assert result.parallel.value == 1
    assert 512 <= result.ctx.value < 4096
    assert result.ctx.value % 256 == 0
    room = host(free_gb=1.71).memory_available - QWEN_15B.file_bytes - RUNTIME_RESERVE
    assert kv_bytes(result, QWEN_15B) <= room


def test_a_model_larger_than_memory_is_warned_about() -> None:
    result = plan(ARM_1GB, QWEN_7B)

    assert result.parallel.value == 1
    assert result.ctx.value == 512
    assert any("does not fit" in warning for warning in result.warnings)


def test_the_context_never_exceeds_what_the_model_was_trained_on() -> None:
    result = plan(SERVER_16, TINYLLAMA)

    assert result.ctx.value == 2048
    assert "trained on (2048)" in result.ctx.why


def test_explicit_settings_win_and_are_marked_as_set() -> None:
    result = plan(ARM_1GB, QWEN_05B, threads=1, ctx=1024, parallel=2, batch=64, kv_type="f16")

    assert (result.threads.value, result.ctx.value, result.parallel.value) == (1, 1024, 2)
    assert (result.batch.value, result.kv_type_k.value) == (64, "f16")
    lines = dict(result.explain())
    assert lines["threads"].startswith("1 (set)")
    assert lines["kv_type"].startswith("f16 (set)")


def test_an_explicit_context_leaves_the_slot_count_to_memory() -> None:
    result = plan(host(free_gb=2.5), QWEN_15B, ctx=8192)

    assert result.ctx.value == 8192
    assert result.parallel.explicit is False
    assert kv_bytes(result, QWEN_15B) <= 2.5 * GIB - QWEN_15B.file_bytes


def test_explicit_slots_leave_the_context_to_memory() -> None:
    result = plan(host(free_gb=2.5), QWEN_15B, parallel=16)

    assert result.parallel.value == 16
    assert result.ctx.value < 4096


def test_an_explicit_q8_0_kv_quantizes_keys_and_values_when_deterministic() -> None:
    result = plan(SERVER_16, QWEN_15B, kv_type="q8_0")

    assert result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("q8_0", "q8_0")


CACHE = DiskNeed("cache", "cached things", share=0.25, cap=10 * GIB)
ARCHIVE = DiskNeed("archive", "archived things", share=0.05, cap=1 * GIB, setting="size")


def test_a_plan_without_disk_needs_has_no_budget_lines() -> None:
    result = plan(SERVER_16, SMOLLM2)

    assert result.disk_budgets == ()
    assert not any("budget" in label for label, _ in result.explain())
    assert result.plugin_defaults() == {}


def test_each_disk_need_gets_its_share_of_the_free_disk_up_to_its_cap() -> None:
    small = plan_host(Settings(), host(disk_gb=8), SMOLLM2, [CACHE, ARCHIVE])
    large = plan_host(Settings(), SERVER_16, SMOLLM2, [CACHE, ARCHIVE])

    assert [b.bytes.value for b in small.disk_budgets] == [
        2 * GIB,
        int(8 * GIB * 0.05) // MIB * MIB,
    ]
    assert [b.bytes.value for b in large.disk_budgets] == [10 * GIB, 1 * GIB]
    assert large.plugin_defaults() == {"cache": {"budget": 10 * GIB}, "archive": {"size": 1 * GIB}}
    lines = dict(large.explain())
    assert "/var/cache/reame" in lines["cache budget"]
    assert "cached things" in lines["cache budget"]
    assert lines["archive budget"].startswith("1.0 GiB: 5% of the 500.0 GiB free")


def test_disk_needs_get_nothing_on_a_nearly_full_disk() -> None:
    result = plan_host(Settings(), host(disk_gb=0.5), SMOLLM2, [CACHE, ARCHIVE])

    assert [budget.bytes.value for budget in result.disk_budgets] == [0, 0]
    assert "no room for cached things" in dict(result.explain())["cache budget"]


def test_an_explicit_disk_budget_wins() -> None:
    settings = Settings(plugins={"cache": {"budget": "123MiB"}, "archive": {"budget": 1}})
    result = plan_host(settings, SERVER_16, SMOLLM2, [CACHE, ARCHIVE])
    cache, archive = result.disk_budgets

    assert cache.bytes == Choice(123 * MIB, "set in [plugins.cache]", explicit=True)
    assert not archive.bytes.explicit  # its setting is `size`, not `budget`
    assert result.plugin_defaults()["cache"] == {"budget": 123 * MIB}
    assert "123 MiB (set): set in [plugins.cache]" in dict(result.explain())["cache budget"]


@pytest.mark.parametrize(
    "facts",
    [ARM_1GB, host(cores=4, total_gb=8, free_gb=6), SERVER_16],
    ids=["arm-2core-1gb", "4core-8gb", "server-16core-64gb"],
)
@pytest.mark.parametrize("alias", sorted(CARDS))
def test_every_model_gets_a_plan_that_fits_or_a_warning(facts: HostFacts, alias: str) -> None:
    shape = CARDS[alias].shape
    result = plan(facts, shape)

    compute = shape.compute_buffer_bytes(result.batch.value, result.ctx.value)
    used = shape.file_bytes + compute + RUNTIME_RESERVE + kv_bytes(result, shape)
    assert used <= facts.memory_available or result.warnings
    assert 1 <= result.parallel.value <= 16
    assert 512 <= result.ctx.value <= shape.n_ctx_train


def test_more_free_memory_never_means_a_smaller_configuration() -> None:
    smaller = plan(host(free_gb=1.8), QWEN_15B)
    larger = plan(replace(host(free_gb=1.8), memory_available=int(2.4 * GIB)), QWEN_15B)

    assert larger.ctx.value * larger.parallel.value >= smaller.ctx.value * smaller.parallel.value


def test_this_machines_facts_are_consistent(tmp_path: Path) -> None:
    facts = read_host_facts(tmp_path / "not-created-yet")

    assert 1 <= facts.physical_cores <= facts.logical_cpus
    assert 0 < facts.memory_available <= facts.memory_total
    assert facts.disk_free > 0


def test_a_cgroup_memory_limit_bounds_the_memory_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "memory.max").write_text(f"{512 * MIB}\n")
    (tmp_path / "memory.current").write_text(f"{100 * MIB}\n")
    monkeypatch.setattr(facts_module, "_CGROUP", tmp_path)

    facts = read_host_facts(tmp_path)

    assert facts.memory_total == 512 * MIB
    assert facts.memory_available <= 412 * MIB


@pytest.mark.parametrize(
    ("sysfs", "mode"),
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("", "unknown"),
    ],
)
def test_the_huge_page_mode_is_read_from_sysfs(
    sysfs: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(sysfs)
    monkeypatch.setattr(facts_module, "_HUGE_PAGES", setting)

    assert facts_module.transparent_huge_pages() == mode


def test_a_host_without_the_huge_page_setting_reads_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(facts_module, "_HUGE_PAGES", tmp_path / "absent")

    assert facts_module.transparent_huge_pages() == "unknown"


def test_the_plan_says_whether_buffers_get_huge_pages_and_warns_where_none() -> None:
    asks = plan(replace(host(), huge_pages="madvise"), SMOLLM2)
    off = plan(replace(host(), huge_pages="never"), SMOLLM2)
    unknown = plan(host(), SMOLLM2)

    assert "huge pages: to memory that asks" in asks.memory
    assert not any("huge pages" in warning for warning in asks.warnings)
    assert "huge pages: never" in off.memory
    assert any("transparent huge pages are off" in warning for warning in off.warnings)
    assert "huge pages" not in unknown.memory and not unknown.warnings


def test_weights_are_read_into_huge_pages_where_the_host_gives_them_and_memory_allows() -> None:
    for mode in ("madvise", "always"):
        result = plan(replace(host(), huge_pages=mode), SMOLLM2)
        assert result.weights == Choice("read", result.weights.why)
        assert "2 MiB pages" in result.weights.why
        assert dict(result.explain())["weights"].startswith("read: ")


def test_weights_stay_mapped_without_huge_pages_or_room() -> None:
    never = plan(replace(host(), huge_pages="never"), SMOLLM2)
    unknown = plan(host(), SMOLLM2)
    too_big = plan(replace(host(free_gb=2), huge_pages="madvise"), QWEN_7B)

    assert never.weights.value == unknown.weights.value == "mapped"
    assert "huge pages: never" in never.weights.why
    assert "share them" in unknown.weights.why
    assert too_big.weights.value == "mapped"
    assert "do not fit" in too_big.weights.why


def test_weights_stay_mapped_where_the_kv_cache_set_does_not_fit_beside_them() -> None:
    result = plan(replace(host(free_gb=1), huge_pages="madvise"), SMOLLM2, parallel=64, ctx=8192)

    assert any("expect swapping" in warning for warning in result.warnings)
    assert result.weights.value == "mapped"
    assert "KV cache do not fit" in result.weights.why


def test_a_model_over_the_read_limit_stays_mapped_however_much_memory() -> None:
    assert QWEN_15B.file_bytes > READ_WEIGHTS_MAX >= SMOLLM2.file_bytes
    large = plan(replace(SERVER_16, huge_pages="madvise"), QWEN_15B)
    small = plan(replace(SERVER_16, huge_pages="madvise"), SMOLLM2)

    assert large.weights.value == "mapped"
    assert "512 MiB" in large.weights.why
    assert small.weights.value == "read"


def test_weights_set_in_the_settings_win() -> None:
    tight = plan(replace(host(free_gb=2), huge_pages="madvise"), QWEN_7B, weights="read")
    roomy = plan(replace(host(), huge_pages="madvise"), SMOLLM2, weights="mapped")

    assert tight.weights == Choice("read", "set in the settings", explicit=True)
    assert roomy.weights.value == "mapped" and roomy.weights.explicit
    assert dict(roomy.explain())["weights"] == "mapped (set): set in the settings"


FASTER_AND_EXACT = AttentionFacts(prompt_gain_without_flash=4.4, exact_without_flash=True)


def test_a_cpu_that_computes_prompts_much_faster_without_flash_attention_runs_without() -> None:
    result = plan_host(Settings(), SERVER_16, QWEN_15B, attention=FASTER_AND_EXACT)

    assert not result.flash_attn.value
    assert "4.4x as fast without it" in result.flash_attn.why
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("f16", "f16")


def test_flash_attention_stays_on_where_the_check_timed_both_alike_or_not_at_all() -> None:
    for gain in (None, 0.8, 1.02, 1.4):
        result = plan_host(Settings(), SERVER_16, QWEN_15B, attention=AttentionFacts(gain, True))
        assert result.flash_attn.value, gain
        assert result.kv_type_k.value == "q8_0"
        assert (gain is None) is ("as fast without it" not in result.flash_attn.why)


def test_flash_attention_stays_on_where_the_path_without_it_is_not_exact() -> None:
    result = plan_host(Settings(), SERVER_16, QWEN_15B, attention=AttentionFacts(4.4, False))

    assert result.flash_attn.value
    assert "differs from the same row in a chunk" in result.flash_attn.why
    assert result.kv_type_k.value == "q8_0"


def test_the_attention_timing_overrules_neither_the_settings_nor_fast_mode() -> None:
    for settings in (Settings(kv_type="q8_0"), Settings(deterministic=False)):
        result = plan_host(settings, SERVER_16, QWEN_15B, attention=FASTER_AND_EXACT)
        assert result.flash_attn.value


ROW_EXACT = AttentionFacts(prompt_gain_without_flash=4.4, exact_without_flash=True,
                           row_exact_flash=True)  # fmt: skip


def test_a_build_with_the_row_exact_path_runs_flash_attention_with_f16_keys() -> None:
    """Even where prompts ran faster without flash attention: that timing was against q8_0
    keys, and the row-exact path computes prompts with the tiled kernel."""
    result = plan_host(Settings(), SERVER_16, QWEN_15B, attention=ROW_EXACT)

    assert result.flash_attn.value
    assert "row-exact" in result.flash_attn.why
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("f16", "f16")


def test_the_row_exact_path_yields_to_q8_0_keys_set_in_the_settings_and_to_tight_memory() -> None:
    result = plan_host(Settings(kv_type="q8_0"), SERVER_16, QWEN_15B, attention=ROW_EXACT)
    assert result.flash_attn.value and result.kv_type_k.value == "q8_0"

    tight = plan_host(Settings(), host(free_gb=1.9), QWEN_15B, attention=ROW_EXACT)
    assert tight.flash_attn.value
    assert (tight.kv_type_k.value, tight.kv_type_v.value) == ("q8_0", "q8_0")


def test_f16_set_in_the_settings_keeps_flash_attention_where_rows_are_exact() -> None:
    result = plan_host(Settings(kv_type="f16"), SERVER_16, QWEN_15B, attention=ROW_EXACT)
    assert result.flash_attn.value and result.kv_type_k.value == "f16"

    stock = plan_host(Settings(kv_type="f16"), SERVER_16, QWEN_15B, attention=FASTER_AND_EXACT)
    assert not stock.flash_attn.value


def test_without_flash_attention_tight_memory_quantizes_the_keys_alone() -> None:
    result = plan_host(Settings(), host(free_gb=1.9), QWEN_15B, attention=FASTER_AND_EXACT)

    assert not result.flash_attn.value
    assert (result.kv_type_k.value, result.kv_type_v.value) == ("q8_0", "f16")
