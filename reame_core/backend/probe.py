"""The build check: can the installed llama.cpp decode on this CPU? Found out once, safely.

A llama.cpp build can die in its first decode without a word: SIGILL when it was compiled
for instructions this CPU lacks (a native wheel built on another host), or on ggml's AMX path
on Intel Xeons that have AMX. So before Reame loads a model, a child process (`probe_child`)
loads the embedded model (without its package: the model about to run) and decodes a few
tokens. If the default load dies or hangs, a second child tries without llama.cpp's extra
weight buffer types (`use_extra_bufts=False`: no AMX, but no CPU_REPACK either); Reame then
loads that way, or, when nothing works, stops with one message that says what happened and
how to fix it.

Once the build decodes, another child checks whether flash attention with f16 keys
computes a lone row exactly (the row-exact path Reame's build is patched with); the host
plan takes that path where it is. Only where it is not, one more times a short prompt in
both deterministic attention configurations of a stock build (flash attention with q8_0
keys, and without it), whose speeds differ from CPU to CPU, with OpenMP set as the server
runs it, and the plan takes the faster (`attention_facts`).

The verdict is cached in Reame's cache dir, keyed by the llama.cpp library files and the CPU
(model, flags, kernel), so the check runs once per build and CPU. Verdicts that may depend
on the moment (a hang, an error) are not cached. The model is not part of the key: the check
asks whether the build's kernels run here at all. This module must never load llama.cpp
into the calling process: whether that is safe is what it finds out.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reame_core.autoconfig.plan import UNTIMED, AttentionFacts
from reame_core.backend.probe_child import MARK, ROW_EXACT_FACT, ROW_EXACT_ONLY
from reame_core.errors import BuildCannotRunError, ModelLoadError
from reame_core.settings import Settings

log = structlog.get_logger(__name__)

# Bump when the child's check changes, so that verdicts of the old check are made anew.
CHECK_VERSION = 4
# A healthy check takes under a second; a busy neighbour on the cores may stretch it tenfold.
TIMEOUT = 30.0
PROBE_MODEL = "smollm2-135m"  # embedded in a package: no download, 98 MB, fast to load
# What loading without extra buffer types gives up, for the warning and `reame doctor`.
FALLBACK_COST = (
    "no CPU_REPACK buffers: Q4_0, Q4_K and IQ4_NL weights are not repacked for this CPU's "
    "vector units, so prompt processing is slower"
)

Outcome = Literal["ok", "signal", "hung", "failed"]
Launch = Callable[[bool], Sequence[str]]  # use_extra_bufts -> the child's command line

_STAGES = {
    None: "before it started",
    "import": "while loading its library",
    "load": "while loading the model",
    "decode": "in its first decode",
    "attention": "while checking or timing attention",
    "done": "after its decode, while shutting down",
}
# name -> (what it is, what it usually means here)
_SIGNALS = {
    "SIGILL": (
        "illegal instruction",
        "this build uses CPU instructions this CPU lacks, or its AMX path",
    ),
    "SIGBUS": ("bus error", "a memory access the CPU or the file mapping refused"),
    "SIGSEGV": ("segmentation fault", "a crash inside llama.cpp"),
    "SIGFPE": ("arithmetic fault", "a crash inside llama.cpp"),
    "SIGABRT": ("abort", "llama.cpp stopped on a failed check of its own"),
    "SIGKILL": ("killed", "by the kernel's out-of-memory killer, or by another process"),
    "SIGTERM": ("terminated", "by another process"),
}
# The signals a build's own code dies of; the others come from outside and may not recur.
_CRASHES = frozenset({"SIGILL", "SIGBUS", "SIGSEGV", "SIGFPE", "SIGABRT"})


class ProbeAttempt(BaseModel):
    """How one child ended: decoded (`ok`), killed by a signal, stopped after hanging, or
    exited with an error. `facts` is what it reported before that (system info, buffers)."""

    model_config = ConfigDict(frozen=True)

    extra_bufts: bool
    outcome: Outcome
    stage: str | None = None  # the last step the child announced
    signal: str | None = None  # "SIGILL", when killed by a signal
    error: str = ""  # the end of its stderr, when it failed
    seconds: float
    facts: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def describe(self) -> str:
        """One sentence: what llama.cpp did in this attempt, and where."""
        where = _STAGES.get(self.stage, f"at step {self.stage!r}")
        if self.outcome == "ok":
            return f"llama.cpp loaded the model and decoded ({self.seconds:.1f} s)"
        if self.outcome == "hung":
            return f"llama.cpp hung {where} (stopped after {self.seconds:.0f} s)"
        if self.outcome == "failed":
            return f"llama.cpp failed {where}: {self.error or 'no message'}"
        name = self.signal or "a signal"
        what, cause = _SIGNALS.get(name, ("signal", "a crash inside llama.cpp"))
        text = f"llama.cpp died with {name} ({what}) {where}: {cause}"
        if "AMX" in self.facts.get("buffers", {}):
            text += " (its weights were in the AMX buffer)"
        return text


class BuildVerdict(BaseModel):
    """Every attempt of one check, and what follows: whether and how Reame loads models."""

    model_config = ConfigDict(frozen=True)

    key: str
    build: str
    cpu: str
    model: str  # the file the check loaded
    attempts: tuple[ProbeAttempt, ...]
    timing: ProbeAttempt | None = None  # the attention timing, once the build decodes
    checked_at: float
    cached: bool = Field(default=False, exclude=True)  # read from the cache, not checked just now

    @property
    def runs(self) -> bool:
        return any(attempt.ok for attempt in self.attempts)

    @property
    def use_extra_bufts(self) -> bool:
        """How to load models: False once only the load without extra buffers decoded."""
        return next((attempt.extra_bufts for attempt in self.attempts if attempt.ok), True)

    @property
    def attention(self) -> AttentionFacts:
        """The timing's facts, for the model the check loaded."""
        return attention_facts(self.timing)

    @property
    def fell_back(self) -> bool:
        return self.runs and not self.use_extra_bufts

    @property
    def settled(self) -> bool:
        """Decoded or crashed: facts of the build and CPU, worth caching. A hang, an error or
        a kill from outside may come from the moment (a busy host, a missing file, memory),
        so those are checked again."""
        decided = all(attempt.ok or attempt.signal in _CRASHES for attempt in self.attempts)
        # A timing that did not finish is taken again at the next start, like a hang; the
        # row-exact path, once found, needs none.
        attention = self.attention
        timed = attention.row_exact_flash or attention.prompt_gain_without_flash is not None
        return decided and (not self.runs or timed)

    def fact(self, name: str) -> Any:
        """A fact a child reported (the last attempt's that has it)."""
        for attempt in reversed(self.attempts):
            if name in attempt.facts:
                return attempt.facts[name]
        return None

    def summary(self) -> str:
        """What happened, in a sentence or two."""
        first = self.attempts[0]
        if first.ok:
            return f"runs on this CPU ({first.describe()})"
        text = first.describe()
        for attempt in self.attempts[1:]:
            if attempt.ok:
                text += (
                    "; loading without extra buffer types (use_extra_bufts=False) decodes, "
                    "and Reame loads models that way"
                )
            elif (attempt.outcome, attempt.signal, attempt.stage) == (
                first.outcome,
                first.signal,
                first.stage,
            ):
                text += (
                    ". Loading without extra buffer types (use_extra_bufts=False) ended the "
                    "same way"
                )
            else:
                text += (
                    ". Loading without extra buffer types (use_extra_bufts=False): "
                    + attempt.describe()
                )
        return text


def attention_facts(timing: ProbeAttempt | None) -> AttentionFacts:
    """What a timing child reported: how many times faster it computed a prompt without
    flash attention than with it (which is faster depends on the CPU and the model; None
    when it did not time both), and whether without it, and with f16 flash attention, a
    prompt's last row computed alone equalled the same row computed in a chunk."""
    if timing is None:
        return UNTIMED
    seconds = timing.facts.get("prefill_seconds") or {}
    flash, plain = seconds.get("flash_q8_0_keys"), seconds.get("no_flash_f16")
    return AttentionFacts(
        prompt_gain_without_flash=float(flash) / float(plain) if flash and plain else None,
        exact_without_flash=bool(timing.facts.get("one_row_exact_without_flash")),
        row_exact_flash=bool(timing.facts.get(ROW_EXACT_FACT)),
    )


@dataclass(frozen=True)
class ProbeSubject:
    """What a verdict is about: the llama.cpp build and the CPU. Its key names the cache file."""

    build: str
    cpu: str

    @classmethod
    def here(cls) -> ProbeSubject:
        return cls(llama_build_identity(), cpu_identity())

    @property
    def key(self) -> str:
        text = f"check-v{CHECK_VERSION}\n{self.build}\n{self.cpu}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]


# ------------------------------------------------------------------ identities


def llama_cpp_version() -> str | None:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def llama_library_dir() -> Path | None:
    """Where llama-cpp-python loads its shared libraries from, found without loading them."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")  # llama-cpp-python honours it too
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def llama_build_identity() -> str:
    """The installed build: the package version and each shared library's size and times.

    File metadata rather than a hash: a reinstall writes new files (new ctime) and a
    rebuild with other flags changes sizes, and stat costs nothing where hashing a large
    library at every start would not.
    """
    lines = [f"llama-cpp-python {llama_cpp_version() or 'not installed'}"]
    directory = llama_library_dir()
    if directory is None or not directory.is_dir():
        return "\n".join([*lines, f"no library folder ({directory})"])
    lines.append(str(directory))
    for path in sorted(directory.iterdir()):
        if path.is_file() and (".so" in path.name or path.suffix in (".dylib", ".dll")):
            stat = path.stat()
            lines.append(f"{path.name} {stat.st_size} {stat.st_mtime_ns} {stat.st_ctime_ns}")
    return "\n".join(lines)


def read_cpuinfo() -> dict[str, str]:
    """The first processor's entries in /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model_name(fields: dict[str, str] | None = None) -> str:
    fields = read_cpuinfo() if fields is None else fields
    return fields.get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags(fields: dict[str, str] | None = None) -> frozenset[str]:
    """The CPU's feature flags (x86 `flags`, ARM `Features`)."""
    fields = read_cpuinfo() if fields is None else fields
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def cpu_identity() -> str:
    """The CPU as llama.cpp meets it: model, feature flags, and the kernel, which decides
    whether a process may use some of them (AMX tiles must be granted per process)."""
    fields = read_cpuinfo()
    lines = [platform.machine(), platform.release(), cpu_model_name(fields)]
    for name in ("CPU implementer", "CPU part"):  # ARM cores name themselves here
        if name in fields:
            lines.append(f"{name}: {fields[name]}")
    lines.append(" ".join(sorted(cpu_flags(fields))))
    return "\n".join(lines)


# ------------------------------------------------------------------ the child


def child_command(model: Path, *, time_attention: bool = False) -> Launch:
    """The real child: ``python -m reame_core.backend.probe_child MODEL``; with
    `time_attention`, the one that times the attention configurations."""

    def command(extra_bufts: bool) -> list[str]:
        flags = [] if extra_bufts else ["--no-extra-bufts"]
        if time_attention:
            flags.append("--time-attention")
        return [sys.executable, "-m", "reame_core.backend.probe_child", str(model), *flags]

    return command


def _child_environment(passive: bool) -> dict[str, str]:
    env = dict(os.environ)
    # The child runs this very copy of Reame, wherever it was imported from.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # Idle OpenMP threads sleep instead of spinning: a busy neighbour on the cores then
    # slows the check down a little rather than a hundredfold. Not for a timing, which must
    # see the kernels as the server runs them.
    if passive:
        env.setdefault("OMP_WAIT_POLICY", "passive")
    return env


def run_attempt(
    command: Sequence[str], *, extra_bufts: bool, timeout: float, passive: bool = True
) -> ProbeAttempt:
    """Run one child to its end (or stop it at `timeout`) and say how it ended."""
    started = time.monotonic()
    child = subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_environment(passive),
        encoding="utf-8",
        errors="replace",
    )
    try:
        out, err = child.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        hung = True
    seconds = time.monotonic() - started
    facts = _reports(out)
    stage = facts.pop("stage", None)
    fields: dict[str, Any] = {"extra_bufts": extra_bufts, "stage": stage, "seconds": seconds}
    if hung:
        return ProbeAttempt(outcome="hung", facts=facts, **fields)
    code = child.returncode
    if code < 0:
        return ProbeAttempt(outcome="signal", signal=_signal_name(-code), facts=facts, **fields)
    if code == 0 and stage in ("done", "attention"):
        return ProbeAttempt(outcome="ok", facts=facts, **fields)
    error = _last_lines(err) or f"exit status {code}"
    return ProbeAttempt(outcome="failed", error=error, facts=facts, **fields)


def attention_attempt(timing: Launch, *, extra_bufts: bool, timeout: float) -> ProbeAttempt:
    """What the build check learns of attention: first whether the build has the row-exact
    path (checked with OpenMP's threads sleeping when idle, so that a busy neighbour slows
    the check down rather than stalls it; the plan then takes that path and nothing needs
    timing), and only where it does not, a timing with OpenMP as the server runs it."""
    check = [*timing(extra_bufts), ROW_EXACT_ONLY]
    found = run_attempt(check, extra_bufts=extra_bufts, timeout=timeout)
    if found.outcome != "ok" or attention_facts(found).row_exact_flash:
        return found
    timed = run_attempt(
        timing(extra_bufts), extra_bufts=extra_bufts, timeout=timeout, passive=False
    )
    return timed.model_copy(update={"facts": {**found.facts, **timed.facts}})


def _reports(out: str) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith(MARK):
            try:
                report = json.loads(line[len(MARK) :])
            except json.JSONDecodeError:
                continue
            if isinstance(report, dict):
                facts.update(report)
    return facts


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_lines(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


# ------------------------------------------------------------------ the verdict


def verdicts_dir(cache_dir: Path) -> Path:
    return cache_dir / "build-checks"


def verdict_path(cache_dir: Path, subject: ProbeSubject) -> Path:
    return verdicts_dir(cache_dir) / f"{subject.key}.json"


def read_verdict(cache_dir: Path, subject: ProbeSubject) -> BuildVerdict | None:
    """The cached verdict for this build and CPU, if any (an unreadable file is none)."""
    path = verdict_path(cache_dir, subject)
    try:
        verdict = BuildVerdict.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as error:
        log.warning("unreadable build check verdict, checking again", path=str(path), error=error)
        return None
    return verdict.model_copy(update={"cached": True})


def write_atomically(path: Path, text: str) -> None:
    # Two Reame processes may check at once: each writes a whole file and renames it in.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_build(
    cache_dir: Path,
    subject: ProbeSubject,
    model: Path,
    *,
    launch: Launch | None = None,
    timing: Launch | None = None,
    timeout: float = TIMEOUT,
    recheck: bool = False,
) -> BuildVerdict:
    """The cached verdict for `subject`, or a fresh check with `model` (cached if settled).

    The default load goes first; only when it dies or hangs does a second child try
    without extra buffer types. An error is not a crash: the other load would not help.
    """
    if not recheck:
        cached = read_verdict(cache_dir, subject)
        if cached is not None:
            return cached
    log.info("checking that llama.cpp runs on this CPU (once per build and CPU)")
    launch = launch or child_command(model)
    attempts = [run_attempt(launch(True), extra_bufts=True, timeout=timeout)]
    if attempts[0].outcome in ("signal", "hung"):
        attempts.append(run_attempt(launch(False), extra_bufts=False, timeout=timeout))
    verdict = BuildVerdict(
        key=subject.key,
        build=subject.build,
        cpu=subject.cpu,
        model=str(model),
        attempts=tuple(attempts),
        checked_at=time.time(),
    )
    if verdict.runs:  # time attention the way models will load
        timing = timing or child_command(model, time_attention=True)
        timed = attention_attempt(timing, extra_bufts=verdict.use_extra_bufts, timeout=timeout)
        verdict = verdict.model_copy(update={"timing": timed})
    if verdict.settled:
        write_atomically(verdict_path(cache_dir, subject), verdict.model_dump_json(indent=1))
    return verdict


def probe_model(settings: Settings) -> Path:
    """The embedded model if its package is installed, else the model Reame is about to run."""
    from reame_core.models import ModelStore, parse_model_name
    from reame_core.models.names import EmbeddedModel
    from reame_core.models.store import embedded_path

    ref = parse_model_name(PROBE_MODEL)
    if isinstance(ref, EmbeddedModel):
        try:
            return embedded_path(ref)
        except ModelLoadError:
            pass
    store = ModelStore.in_cache_dir(settings.cache_path)
    return store.resolve(settings.model, record_use=False).path


def ensure_build_runs(
    settings: Settings, *, recheck: bool = False, timeout: float = TIMEOUT
) -> BuildVerdict:
    """The verdict Reame starts by: logged, with a warning when it falls back to loading
    without extra buffer types; `BuildCannotRunError` (one message, with the fix) when the
    build cannot decode here at all."""
    verdict = check_build(
        settings.cache_path,
        ProbeSubject.here(),
        probe_model(settings),
        timeout=timeout,
        recheck=recheck,
    )
    if not verdict.runs:
        raise BuildCannotRunError(cannot_run_message(verdict))
    if verdict.fell_back:
        log.warning(
            "llama.cpp's default load crashes on this CPU; loading without extra buffer types",
            problem=verdict.attempts[0].describe(),
            cost=FALLBACK_COST,
            fix="make reinstall-llama (`reame doctor` also prints the pip command)",
        )
    else:
        log.info("llama.cpp runs on this CPU", cached=verdict.cached, key=verdict.key)
    return verdict


def rebuild_commands() -> list[str]:
    """The commands that rebuild llama-cpp-python for this CPU, without AMX on x86-64."""
    cmake = "-DGGML_NATIVE=ON"
    if platform.machine().lower() in ("x86_64", "amd64"):
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        cmake += f" -DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'"
    version = llama_cpp_version() or "0.3.36"
    pip = (
        f'CMAKE_ARGS="{cmake}" {shlex.quote(sys.executable)} -m pip install '
        f"--force-reinstall --no-cache-dir llama-cpp-python=={version}"
    )
    return ["make reinstall-llama", pip]


def cannot_run_message(verdict: BuildVerdict) -> str:
    make, pip = rebuild_commands()
    return (
        f"the installed llama.cpp build cannot run on this CPU ({cpu_model_name()}). "
        f"{verdict.summary()}.\n"
        "Rebuild llama-cpp-python for this CPU, then start again:\n"
        f"  {make}    (in Reame's source folder)\n"
        f"  {pip}"
    )
