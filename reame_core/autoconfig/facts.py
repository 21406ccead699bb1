"""What this host offers: CPU cores, memory, disk. Read only; deciding is `plan.py`'s job.

Containers matter on cheap hosts: a cgroup memory limit counts, not the machine's RAM, and
the CPUs this process may run on count, not the machine's.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_SYS_CPU = Path("/sys/devices/system/cpu")
_CGROUP = Path("/sys/fs/cgroup")
_HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class HostFacts:
    arch: str
    physical_cores: int
    logical_cpus: int
    memory_total: int
    memory_available: int
    disk_free: int
    disk_path: Path
    other_disks: Mapping[Path, int] = field(default_factory=dict)
    # The kernel's transparent huge pages: "always", "madvise" (only to memory that asks, as
    # llama.cpp's buffers do in Reame's build), "never", or "unknown" (not Linux).
    huge_pages: str = "unknown"

    def free_disk(self, path: Path | None) -> tuple[int, Path]:
        """Free bytes where `path` is (None: `disk_path`), and the path they were read at."""
        if path is None:
            return self.disk_free, self.disk_path
        return self.other_disks[path], path


def read_host_facts(disk_path: Path, other_paths: Iterable[Path] = ()) -> HostFacts:
    """The facts of the machine this process runs on; `disk_path` is where Reame keeps
    its caches, `other_paths` where plugins were told to keep their data (none of them
    need exist yet)."""
    allowed = _allowed_cpus()
    total, available = _memory()
    return HostFacts(
        arch=platform.machine() or "unknown",
        physical_cores=physical_cores(allowed, _thread_siblings(allowed)),
        logical_cpus=len(allowed),
        memory_total=total,
        memory_available=available,
        disk_free=free_disk_bytes(disk_path),
        disk_path=disk_path,
        other_disks={path: free_disk_bytes(path) for path in other_paths},
        huge_pages=transparent_huge_pages(),
    )


def transparent_huge_pages() -> str:
    """The kernel's transparent huge page mode, as sysfs marks it ("always [madvise] never"),
    or "unknown" where there is no such file."""
    try:
        text = _HUGE_PAGES.read_text()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unknown"


def physical_cores(allowed: Iterable[int], siblings: Mapping[int, str]) -> int:
    """Cores among the allowed CPUs, counting SMT siblings (hyper-threads) once:
    llama.cpp's decode gains nothing from a core's second thread.

    `siblings` maps a CPU to its thread-siblings list as sysfs writes it ("0,4" or "0-1");
    CPUs missing from it count as cores of their own (ARM boards, sysfs-less systems).
    """
    groups = {siblings.get(cpu, f"cpu{cpu}") for cpu in allowed}
    return max(1, len(groups))


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the file system that holds `path`, or would once it is created."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0


def _allowed_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _thread_siblings(cpus: Iterable[int]) -> dict[int, str]:
    siblings: dict[int, str] = {}
    for cpu in cpus:
        try:
            text = (_SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            continue
        siblings[cpu] = text.strip()
    return siblings


def _memory() -> tuple[int, int]:
    """(total, available) bytes, bounded by a cgroup v2 memory limit if there is one."""
    total, available = _meminfo()
    limit = _read_int(_CGROUP / "memory.max")
    if limit is not None and limit < total:
        used = _read_int(_CGROUP / "memory.current") or 0
        total = limit
        available = min(available, max(0, limit - used))
    return total, available


def _meminfo() -> tuple[int, int]:
    try:
        fields = {
            key: int(value.split()[0]) * 1024
            for key, _, value in (
                line.partition(":") for line in Path("/proc/meminfo").read_text().splitlines()
            )
            if value.strip()
        }
        return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"] // 2)
    except (OSError, KeyError, ValueError):
        # No /proc (macOS, BSD): total from sysconf; what is free is unknown, assume half.
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        total = pages * os.sysconf("SC_PAGE_SIZE") if pages > 0 else 4 << 30
        return total, total // 2


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        # "max" (no limit), no cgroup v2, or no permission.
        return None
