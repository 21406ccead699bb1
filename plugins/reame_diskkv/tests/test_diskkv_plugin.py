"""The plugin as installed: discovery, settings and their defaults, the command line, the
HTTP API's report of restored tokens, and a core that runs unchanged without it."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from diskkv_testing import SYSTEM, entry_files
from litestar.testing import TestClient
from pydantic import ValidationError

from reame_core.autoconfig.facts import HostFacts
from reame_core.autoconfig.plan import plan_host
from reame_core.backend.fake import FakeBackend
from reame_core.cli import main as cli_main
from reame_core.engine.engine import Engine
from reame_core.hooktypes import DiskNeed
from reame_core.models.registry import CARDS
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings
from reame_diskkv.entry_format import Codec
from reame_diskkv.plugin import DiskPrefixCache
from reame_diskkv.settings import BUDGET_CAP, DiskKVSettings, default_budget
from reame_diskkv.store import DiskStore, Snapshot

PREFIX_HOOKS = ("reame_prefix_lookup", "reame_prefix_store_points", "reame_prefix_store")


def test_diskkv_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["diskkv"]
    assert record.enabled
    assert record.distribution == "reame-diskkv"
    assert set(PREFIX_HOOKS) <= set(record.hooks)


def test_core_runs_unchanged_with_diskkv_disabled(tmp_path: Path) -> None:
    host = PluginHost(["diskkv"])
    settings = Settings(plugins={"diskkv": {"dir": str(tmp_path / "kv")}})
    host.hook.reame_configure(settings=settings, model=FakeBackend().info, hook=host.hook)
    engine = Engine(FakeBackend(), host).start()
    prompt = FakeBackend().tokenize(SYSTEM, add_special=True, parse_special=False)

    finished = engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=8)))
    engine.stop()

    assert not any(host.has_implementations(hook) for hook in PREFIX_HOOKS)
    assert finished.error is None and len(finished.candidates[0].tokens) == 8
    assert not (tmp_path / "kv").exists()


def test_diskkv_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"diskkv": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info, hook=host.hook)


# ------------------------------------------------------------------ settings


def test_cache_lives_under_the_xdg_cache_directory_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert DiskKVSettings().directory() == tmp_path / "reame" / "kv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert DiskKVSettings().directory() == Path.home() / ".cache" / "reame" / "kv"


def test_default_budget_is_a_quarter_of_the_disk_the_cache_may_use(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    held = 1 << 30

    assert default_budget(tmp_path, held) == min(BUDGET_CAP, (free + held) // 4)
    assert DiskKVSettings(budget="512MiB").budget_bytes(held) == 512 << 20


def facts(cache_disk_gb: float, kv_disk_gb: float, needs: list[DiskNeed]) -> HostFacts:
    """A host whose cache directory has `cache_disk_gb` free and the KV's `kv_disk_gb`."""
    other = {need.directory: int(kv_disk_gb * (1 << 30)) for need in needs if need.directory}
    gib = 1 << 30
    return HostFacts("x86_64", 2, 2, 4 * gib, 3 * gib, int(cache_disk_gb * gib), Path("/d"), other)


def diskkv_needs(settings: Settings) -> list[DiskNeed]:
    return [need for need in PluginHost().disk_needs(settings) if need.section == "diskkv"]


@pytest.mark.parametrize(("disk_gb", "budget"), [(8, 2 << 30), (500, BUDGET_CAP), (0.5, 0)])
def test_the_host_plan_grants_diskkv_a_quarter_of_the_free_disk_up_to_its_cap(
    disk_gb: float, budget: int
) -> None:
    needs = diskkv_needs(Settings())
    plan = plan_host(Settings(), facts(disk_gb, disk_gb, needs), CARDS["smollm2-135m"].shape, needs)

    assert plan.plugin_defaults() == {"diskkv": {"budget": budget}}


def test_the_budget_comes_from_the_disk_the_cache_directory_is_on() -> None:
    args = cli_main.build_parser(PluginHost()).parse_args(["serve", "--kv-cache-dir", "/srv/kv"])
    settings = cli_main.settings_from(args, model=None)
    needs = diskkv_needs(settings)
    host = facts(cache_disk_gb=500, kv_disk_gb=8, needs=needs)

    plan = plan_host(settings, host, CARDS["smollm2-135m"].shape, needs)

    assert [need.directory for need in needs] == [Path("/srv/kv")]
    assert plan.plugin_defaults() == {"diskkv": {"budget": 2 << 30}}


def test_reame_config_shows_the_diskkv_budget_and_the_flag_that_sets_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main.main(["config"]) == 0
    auto = capsys.readouterr().out
    assert cli_main.main(["config", "--kv-cache-budget", "2GiB"]) == 0
    explicit = capsys.readouterr().out
    assert cli_main.main(["config", "--disable-plugin", "diskkv"]) == 0
    disabled = capsys.readouterr().out

    assert "diskkv budget" in auto and "(set)" not in auto
    # Columns align to the longest name, which another plugin's budget line may be.
    assert re.search(r"diskkv budget +2\.0 GiB \(set\): set in \[plugins\.diskkv\]", explicit)
    assert "diskkv" not in disabled


def test_flags_set_the_cache_directory_and_budget() -> None:
    args = cli_main.build_parser(PluginHost()).parse_args(
        ["serve", "--kv-cache-dir", "/srv/kv", "--kv-cache-budget", "2GB"]
    )

    section = cli_main.settings_from(args, model=None).plugin_section("diskkv", DiskKVSettings)

    assert section.directory() == Path("/srv/kv")
    assert section.budget_bytes(held=0) == 2_000_000_000


# ------------------------------------------------------------------ commands


def fill(cache_dir: Path, models: dict[str, int]) -> None:
    store = DiskStore(cache_dir)
    for model, count in models.items():
        for i in range(count):
            tokens = tuple(range(i, i + 100))
            state = bytes(range(256)) * 40
            snapshot = Snapshot(f"fp-{model}", model, tokens, state, Codec.ZSTD)
            store.write(snapshot, max_size=1 << 30)
    store.close()


def test_cache_stats_shows_what_each_model_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path, {"smollm2-135m": 2, "gemma-3-270m": 1})

    assert cli_main.main(["cache", "stats", "--kv-cache-dir", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    assert "3 entries" in out
    assert "smollm2-135m" in out and "gemma-3-270m" in out


def test_cache_clear_deletes_every_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path, {"smollm2-135m": 2})

    assert cli_main.main(["cache", "clear", "--kv-cache-dir", str(tmp_path)]) == 0

    assert "Deleted 2 entries" in capsys.readouterr().out
    assert entry_files(tmp_path) == []


def test_cache_stats_on_a_missing_cache_says_there_is_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main(["cache", "stats", "--kv-cache-dir", str(tmp_path / "none")]) == 0

    assert "No disk prefix cache" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()


# ------------------------------------------------------------------ HTTP


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start the HTTP API over a fake model with a fresh diskkv plugin on one directory."""
    with contextlib.ExitStack() as stack:

        def start() -> tuple[TestClient[Any], DiskPrefixCache]:
            cache = DiskPrefixCache()
            host = PluginHost(discover=False)
            host.register(cache, "diskkv")
            settings = Settings(plugins={"diskkv": {"dir": str(tmp_path / "kv")}})
            server = ServerState(settings)
            client = stack.enter_context(TestClient(create_app(server)))
            server.runtime = start_runtime(settings, backend=FakeBackend(), plugins=host)
            stack.callback(server.runtime.close)
            return client, cache

        yield start


def test_api_reports_tokens_restored_from_disk_and_metrics_count_the_hit(serve: Any) -> None:
    body = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which berth is free?"},
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    first, first_cache = serve()
    cold = first.post("/v1/chat/completions", json=body).json()
    assert first_cache.flush()
    second, _ = serve()

    warm = second.post("/v1/chat/completions", json=body).json()
    metrics = second.get("/metrics").text

    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert cold["timings"]["restored_n"] == 0
    restored = warm["timings"]["restored_n"]
    assert restored == warm["usage"]["prompt_tokens_details"]["cached_tokens"] > len(SYSTEM)
    assert "reame_diskkv_hits 1.0" in metrics
