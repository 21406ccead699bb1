"""The facts every report names: the CPU, its cores, the RAM, the model file and its
quantization, Reame's and llama.cpp's versions, and the date.

Figures from these machines drift by 2x between hosts; a row without them cannot be compared
with anything.
"""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from reame_core import __version__
from reame_core.autoconfig.facts import read_host_facts
from reame_core.models.names import quant_of

GIB = 1 << 30


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name, from /proc/cpuinfo (or `cpuinfo` given), else what
    `platform` knows."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def host_facts(cache_dir: Path) -> dict[str, Any]:
    facts = read_host_facts(cache_dir)
    return {
        "cpu": cpu_model(),
        "logical_cpus": facts.logical_cpus,
        "physical_cores": facts.physical_cores,
        "ram_gib": round(facts.memory_total / GIB, 1),
        "arch": facts.arch,
        "os": f"{platform.system()} {platform.release()}",
    }


def model_facts(name: str, path: Path, quant: str | None = None) -> dict[str, Any]:
    """The model as a reader must know it: the name asked for, the file, its quantization."""
    return {
        "name": name,
        "file": path.name,
        "quant": quant or quant_of(path.name),
        "bytes": path.stat().st_size if path.exists() else None,
    }


def versions() -> dict[str, Any]:
    def version(distribution: str) -> str | None:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    return {
        "reame": __version__,
        "llama_cpp_python": version("llama-cpp-python"),
        "python": platform.python_version(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def describe_host(host: dict[str, Any]) -> str:
    return (
        f"{host['cpu']}, {host['logical_cpus']} CPUs ({host['physical_cores']} cores), "
        f"{host['ram_gib']} GiB RAM"
    )
