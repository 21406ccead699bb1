"""Helpers of the disk cache's tests (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path


def entry_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "v1").glob("*.kv"))


def temp_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "v1").glob(".*.tmp"))
