"""The benchmarks' cache directory for one measurement (benchmarks/common.py): empty of
everything a measurement could reuse, sharing only the user's build checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from reame_core.backend.probe import verdicts_dir
from reame_core.settings import Settings

COMMON = Path(__file__).resolve().parents[2] / "benchmarks" / "common.py"


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_common", COMMON)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_measurement_starts_with_an_empty_cache_that_shares_only_the_build_checks() -> None:
    checks = verdicts_dir(Settings().cache_path)

    with _common().empty_cache_dir() as cache:
        assert [entry.name for entry in cache.iterdir()] == ["build-checks"]
        (verdicts_dir(cache) / "verdict.json").write_text("{}")
        (cache / "kv").mkdir()

    assert (checks / "verdict.json").read_text() == "{}"  # a check taken there is kept
    assert not cache.exists()  # and nothing else is
