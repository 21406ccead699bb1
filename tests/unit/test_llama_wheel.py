"""scripts/llama-wheel's cache key: one build per CPU; every host gets the row-exact flash
attention, kept-graphs, huge-pages, KV-regions and row-group patches, AMX hosts the AMX
patches too; scripts/llama-server builds llama.cpp the same way (llama-build-flags.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SCRIPT = SCRIPTS / "llama-wheel"
AVX512 = "flags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw avx512_vnni"
AMX = AVX512 + " amx_bf16 amx_tile amx_int8"


def wheel_key(tmp_path: Path, flags: str, **env: str) -> str:
    cpuinfo = tmp_path / "cpuinfo"  # read by each call before the next one writes it
    cpuinfo.write_text(f"processor\t: 0\n{flags}\n")
    done = subprocess.run(
        [str(SCRIPT), "--key", sys.executable],
        env={**os.environ, "REAME_CPUINFO": str(cpuinfo), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(autouse=True)
def _x86_only() -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the AMX choice is made on x86-64 only")


def test_another_cpu_gets_a_build_of_its_own(tmp_path: Path) -> None:
    assert wheel_key(tmp_path, AVX512) != wheel_key(tmp_path, AVX512 + " avx512_fp16")


def test_an_amx_host_gets_the_patched_build_unless_told_not_to(tmp_path: Path) -> None:
    patched = wheel_key(tmp_path, AMX)
    without = wheel_key(tmp_path, AMX, REAME_NO_AMX="1")
    assert patched != without
    assert len(patched) == len(without) == 16


def test_the_amx_switch_changes_nothing_on_a_host_without_amx(tmp_path: Path) -> None:
    assert wheel_key(tmp_path, AVX512) == wheel_key(tmp_path, AVX512, REAME_NO_AMX="1")


def test_the_key_is_stable(tmp_path: Path) -> None:
    assert wheel_key(tmp_path, AMX) == wheel_key(tmp_path, AMX)


def build_flags(tmp_path: Path, flags: str, **env: str) -> tuple[str, list[str]]:
    """(cmake_args, patches) as llama-build-flags.sh decides them for this CPU."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\n{flags}\n")
    done = subprocess.run(
        ["bash", "-c", f'here={SCRIPTS}; source "$here/llama-build-flags.sh"; '
         'printf "%s\\n" "$cmake_args" "${patches[@]}"'],
        env={**os.environ, "REAME_CPUINFO": str(cpuinfo), **env},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    cmake_args, *patches = done.stdout.rstrip("\n").split("\n")
    return cmake_args, patches


EVERY_HOST = [
    "ggml-fa-row-exact.patch",
    "llama-graph-cache.patch",
    "ggml-hugepages.patch",
    "llama-kv-seq-regions.patch",
    "ggml-q4_1-row-groups.patch",
    "ggml-k-quant-row-groups.patch",
    "ggml-q8_0-row-groups.patch",
    "ggml-row-groups-chunk.patch",  # on top of the three row groups'
    "ggml-read-ahead.patch",  # on top of the row groups' and their chunks'
    "ggml-q5_0-row-groups.patch",  # on top of the Q8_0 row groups' read-ahead
]


def test_an_amx_host_builds_with_the_patches_and_amx_left_in(tmp_path: Path) -> None:
    cmake_args, patches = build_flags(tmp_path, AMX)
    assert [Path(p).name for p in patches] == [
        *EVERY_HOST,
        "ggml-amx-tile-config.patch",
        "ggml-amx-row-kernels.patch",  # applies on top of the tile configuration's
        "ggml-amx-wide-m.patch",  # and on top of the row kernels'
    ]
    assert all(Path(p).is_file() for p in patches)
    assert "-mno-amx" not in cmake_args


def test_elsewhere_amx_is_left_out_and_only_the_every_host_patches_applied(
    tmp_path: Path,
) -> None:
    for flags, env in ((AVX512, {}), (AMX, {"REAME_NO_AMX": "1"})):
        cmake_args, patches = build_flags(tmp_path, flags, **env)
        assert [Path(p).name for p in patches] == EVERY_HOST
        assert "-mno-amx-int8" in cmake_args


def test_llama_server_and_the_wheel_share_the_build_flags() -> None:
    for script in ("llama-wheel", "llama-server"):
        assert 'source "$here/llama-build-flags.sh"' in (SCRIPTS / script).read_text()
