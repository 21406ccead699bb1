"""Fake children for the build check, shared by its tests and the doctor's.

Each script reports steps the way the real child does (`probe_child.say`), then decodes,
dies by a signal, hangs or fails. `FakeChildren` stands in for `probe.child_command`, and
the `children` fixture installs it for code that starts its own children.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from reame_core.backend import probe
from reame_core.backend.probe import Launch

_REPORT = "from reame_core.backend.probe_child import say\n"
DECODES = _REPORT + textwrap.dedent("""
    say(stage="import")
    say(system_info="CPU : AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
    say(stage="load")
    say(buffers={"CPU_Mapped": 98.0, "CPU_REPACK": 27.0}, repacked={})
    say(stage="decode")
    say(stage="done", tokens=[11, 12, 13, 14])
""")
# Timing children (`--time-attention`) begin alike: on a build without the row-exact path
# they say so when asked with `--row-exact-only`, and end there.
_STOCK_BUILD = _REPORT + textwrap.dedent("""
    import sys, time
    say(stage="import")
    say(stage="load")
    say(stage="attention")
    if "--row-exact-only" in sys.argv:
        say(one_row_exact_flash_f16=False)
        raise SystemExit(0)
""")
# ... then time flash attention level with its absence, or 4x slower.
TIMES_LEVEL = _STOCK_BUILD + textwrap.dedent("""
    say(prefill_seconds={"flash_q8_0_keys": 1.0, "no_flash_f16": 1.0})
    say(one_row_exact_without_flash=True)
""")
TIMES_FLASH_SLOW = TIMES_LEVEL.replace('"flash_q8_0_keys": 1.0', '"flash_q8_0_keys": 4.0')
# ... and a row computed alone without flash attention differs from the row in a chunk.
TIMES_FLASH_SLOW_INEXACT = TIMES_FLASH_SLOW.replace("=True)", "=False)")
# ... then hang in the timing (a busy host).
HANGS_TIMING_ATTENTION = _STOCK_BUILD + "time.sleep(120)\n"
# The build has the row-exact path: f16 flash attention computes a lone row exactly (asked
# with `--row-exact-only`, the first question), and nothing is timed (the plan takes it).
ROW_EXACT = _REPORT + textwrap.dedent("""
    say(stage="import")
    say(stage="load")
    say(stage="attention")
    say(one_row_exact_flash_f16=True)
""")
# Hangs before answering anything, the row-exact question included.
HANGS_IN_ATTENTION = _REPORT + textwrap.dedent("""
    import time
    say(stage="import")
    say(stage="load")
    say(stage="attention")
    time.sleep(120)
""")
DIES_WITH_SIGILL_IN_DECODE = _REPORT + textwrap.dedent("""
    import os, signal
    say(stage="import")
    say(stage="load")
    say(buffers={"AMX": 95.0})
    say(stage="decode")
    os.kill(os.getpid(), signal.SIGILL)
""")
DIES_WITH_SIGBUS_IN_LOAD = _REPORT + textwrap.dedent("""
    import os, signal
    say(stage="import")
    say(stage="load")
    os.kill(os.getpid(), signal.SIGBUS)
""")
KILLED_IN_LOAD = _REPORT + textwrap.dedent("""
    import os, signal
    say(stage="import")
    say(stage="load")
    os.kill(os.getpid(), signal.SIGKILL)
""")
HANGS_IN_DECODE = _REPORT + textwrap.dedent("""
    import time
    say(stage="import")
    say(stage="load")
    say(stage="decode")
    time.sleep(120)
""")
FAILS_IN_DECODE = _REPORT + textwrap.dedent("""
    say(stage="import")
    say(stage="load")
    say(stage="decode")
    raise SystemExit("llama_decode returned -3")
""")


class FakeChildren:
    """Stands in for `probe.child_command`: one script for the default load, one for the
    load without extra buffer types; records every child started."""

    def __init__(
        self, default: str, without_extra_bufts: str | None = None, timing: str = TIMES_LEVEL
    ) -> None:
        self.scripts = {True: default, False: without_extra_bufts or default}
        self.timing_script = timing
        self.started: list[bool] = []
        self.timed: list[bool] = []  # the loads the attention timing was asked for

    def __call__(self, extra_bufts: bool) -> list[str]:
        self.started.append(extra_bufts)
        return [sys.executable, "-c", self.scripts[extra_bufts]]

    def timing(self, extra_bufts: bool) -> list[str]:
        """The timing child (asked first with `--row-exact-only` appended, then, where the
        build lacks that path, without it: two entries in `timed`)."""
        self.timed.append(extra_bufts)
        return [sys.executable, "-c", self.timing_script]

    def for_model(self, _model: Path, *, time_attention: bool = False) -> Launch:
        return self.timing if time_attention else self


InstallChildren = Callable[..., FakeChildren]


def install_children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> InstallChildren:
    """A function that installs fake children for the code that starts its own (runtime,
    CLI, doctor); the check then loads a model file of its own, not the embedded package's."""
    embedded = tmp_path / "embedded.gguf"
    embedded.write_bytes(b"GGUF")
    monkeypatch.setattr(probe, "probe_model", lambda _settings: embedded)

    def install(
        default: str, without_extra_bufts: str | None = None, timing: str = TIMES_LEVEL
    ) -> FakeChildren:
        fake = FakeChildren(default, without_extra_bufts, timing)
        monkeypatch.setattr(probe, "child_command", fake.for_model)
        return fake

    return install
