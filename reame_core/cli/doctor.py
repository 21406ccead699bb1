"""`reame doctor`: the llama.cpp build, this CPU, and whether the two run together.

Prints the build's features (llama.cpp's system info: instruction sets, LLAMAFILE, OpenMP,
REPACK, AMX), the CPU's model and the flags llama.cpp's kernels care about, the build
check's verdict (cached or made just now), and which buffer types the model weights went to
(CPU_REPACK, AMX, CPU_Mapped), read from llama.cpp's load log. Everything that touches
llama.cpp happens in the build check's child processes, never in this one, so the doctor
answers even where the build crashes.
"""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path
from typing import TextIO

from reame_core.autoconfig.plan import flash_attn_choice
from reame_core.backend import probe
from reame_core.backend.probe import BuildVerdict, ProbeAttempt
from reame_core.backend.probe_child import PREFILL
from reame_core.models import ModelStore, parse_model_name
from reame_core.settings import Settings

# CPU flags that decide which of llama.cpp's kernels can run (x86-64, then ARM).
FLAGS_OF_INTEREST = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2",
)  # fmt: skip
# The build features that change speed or results the most.
NOTABLE_FEATURES = ("AVX2", "AVX512", "AMX_INT8", "LLAMAFILE", "OPENMP", "REPACK")


def doctor_command(settings: Settings, out: TextIO, *, recheck: bool = False) -> int:
    """Print the report; 0 when the build runs here (even by falling back), else 1."""
    verdict = probe.check_build(
        settings.cache_path, probe.ProbeSubject.here(), probe.probe_model(settings), recheck=recheck
    )
    lines = [*_build_lines(verdict), *_cpu_lines(), *_verdict_lines(verdict)]
    lines += _attention_lines(verdict, settings)
    lines += _weights_lines(verdict, settings)
    out.write("\n".join(lines) + "\n")
    return 0 if verdict.runs else 1


def build_features(system_info: str) -> dict[str, str]:
    """``"CPU : AVX = 1 | LLAMAFILE = 1 | ..."`` as {"AVX": "1", "LLAMAFILE": "1", ...}."""
    return dict(re.findall(r"([A-Za-z0-9_]+) = ([^|\s]+)", system_info))


def _row(label: str, text: str) -> str:
    return f"{label:<10}{text}"


def _build_lines(verdict: BuildVerdict) -> list[str]:
    lines = [
        _row(
            "llama.cpp",
            f"llama-cpp-python {probe.llama_cpp_version() or 'not installed'}, "
            f"libraries in {probe.llama_library_dir()}",
        )
    ]
    system_info = verdict.fact("system_info")
    if system_info is None:
        return [*lines, _row("", "features unknown: llama.cpp died before it could say")]
    features = build_features(system_info)
    enabled = [name for name, value in features.items() if value != "0"]
    lines.append(_row("features", " ".join(enabled) or system_info.strip()))
    notable = ", ".join(
        f"{name} {'yes' if features.get(name, '0') != '0' else 'no'}" for name in NOTABLE_FEATURES
    )
    lines.append(_row("", notable))
    return lines


def _cpu_lines() -> list[str]:
    fields = probe.read_cpuinfo()
    flags = probe.cpu_flags(fields)
    present = [flag for flag in FLAGS_OF_INTEREST if flag in flags]
    amx = "has AMX" if "amx_tile" in flags else "no AMX"
    return [
        _row("cpu", f"{probe.cpu_model_name(fields)} ({platform.machine()}, {platform.system()} "
                    f"{platform.release()}), {amx}"),
        _row("", "flags: " + (" ".join(present) or "none of interest")),
    ]  # fmt: skip


def _verdict_lines(verdict: BuildVerdict) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(verdict.checked_at))
    origin = f"cached, checked {when}" if verdict.cached else "checked just now"
    if not verdict.settled:
        origin += " (not cached: a hang, an error or a kill may not happen again)"
    lines = [_row("check", f"{origin}, with {Path(verdict.model).name}")]
    for attempt in verdict.attempts:
        lines.append(_row("", f"{_load_name(attempt)}: {attempt.describe()}"))
    if verdict.fell_back:
        lines.append(_row("", f"Reame loads without extra buffer types: {probe.FALLBACK_COST}"))
        lines += [_row("", f"to get them back: {command}") for command in probe.rebuild_commands()]
    elif not verdict.runs:
        lines += ["", "reame: " + probe.cannot_run_message(verdict)]
    return lines


def _attention_lines(verdict: BuildVerdict, settings: Settings) -> list[str]:
    """Whether the build has the row-exact attention path (then the host plan takes it for
    every model), else the check's timing of the two deterministic attention configurations
    with its model and which one the host plan takes for that model with these settings
    (every other model is timed the first time it runs: `attention_timing`)."""
    attention = verdict.attention
    choice = "on" if flash_attn_choice(settings, attention).value else "off"
    if attention.row_exact_flash:
        return [
            _row("attention", f"row-exact flash attention (f16 keys): found; flash attention "
                              f"{choice}, for every model (nothing to time)"),
        ]  # fmt: skip
    if verdict.timing is None:
        return []
    if attention.prompt_gain_without_flash is None:
        return [_row("attention", f"not finished: {verdict.timing.describe()}; asked again "
                                  "at the next start")]  # fmt: skip
    seconds = verdict.timing.facts["prefill_seconds"]
    flash, plain = seconds["flash_q8_0_keys"], seconds["no_flash_f16"]
    lone_row = "exact" if attention.exact_without_flash else "not exact"
    return [
        _row("attention", f"a {PREFILL}-token prompt: {flash:.2f} s with flash attention and "
                          f"q8_0 keys, {plain:.2f} s without (a lone row "
                          f"{lone_row} without it); flash attention {choice} for "
                          f"{Path(verdict.model).name} (each model is timed on its first run)"),
        _row("", "row-exact flash attention (f16 keys): not found (a stock llama.cpp build)"),
    ]  # fmt: skip


def _load_name(attempt: ProbeAttempt) -> str:
    return "default load" if attempt.extra_bufts else "use_extra_bufts=False"


def _weights_lines(verdict: BuildVerdict, settings: Settings) -> list[str]:
    checked = next((a for a in reversed(verdict.attempts) if "buffers" in a.facts), None)
    lines = []
    if checked is not None:
        lines.append(_row("weights", f"{Path(verdict.model).name}: {_buffers(checked)}"))
    if not verdict.runs:
        return lines
    # The configured model, if it is another file on this machine: its weight types may
    # take other kernels. Checked in a child too, the way Reame would load it.
    path = ModelStore.in_cache_dir(settings.cache_path).locate(parse_model_name(settings.model))
    if path is None or path == Path(verdict.model):
        return lines
    attempt = probe.run_attempt(
        probe.child_command(path)(verdict.use_extra_bufts),
        extra_bufts=verdict.use_extra_bufts,
        timeout=probe.TIMEOUT,
    )
    if "buffers" in attempt.facts:
        lines.append(_row("", f"{path.name}: {_buffers(attempt)}"))
    if not attempt.ok:
        lines.append(_row("", f"{path.name}: {attempt.describe()}"))
    return lines


def _buffers(attempt: ProbeAttempt) -> str:
    sizes: dict[str, float] = attempt.facts.get("buffers") or {}
    text = ", ".join(f"{name} {mib:.1f} MiB" for name, mib in sizes.items()) or "none reported"
    repacked: dict[str, int] = attempt.facts.get("repacked") or {}
    if repacked:
        text += "; repacked as " + ", ".join(f"{k} ({n} tensors)" for k, n in repacked.items())
    return text
