"""Which deterministic attention computes a model faster on this CPU: timed once, then kept.

Reame's deterministic configuration has two attention paths that give a row the same logits
whatever its batch: flash attention with q8_0 keys, and no flash attention with f16 keys
and values. Which one is faster depends on the CPU and on the model. On the Intel Xeon with
AMX, SmolLM2-135M computed prompts 2.4x as fast without flash attention, where
Qwen2.5-Coder-1.5B computed them 1.1x as fast and decoded eight streams at 0.76x
(docs/BENCHMARKS.md, "What determinism costs"). So on a build without the row-exact path
(a stock llama.cpp) every model is timed: the build check times the model it loads (its
verdict's `timing`), and any other model is timed by the same child (`probe_child
--time-attention`) the first time it runs on this build and CPU. That timing is kept beside
the verdict, under the model file's name and size. The same child checks that without flash
attention a lone row gets the logits it gets inside a chunk: on that Xeon it did not (from
256 cached cells on), and the plan then keeps flash attention. Where the build check found
the row-exact path, the plan takes it for every model and no model is timed.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from reame_core.backend import probe
from reame_core.backend.probe import (
    BuildVerdict,
    Launch,
    ProbeAttempt,
    attention_facts,
    run_attempt,
    verdicts_dir,
    write_atomically,
)
from reame_core.backend.probe_child import ROW_EXACT_FACT

log = structlog.get_logger(__name__)

# Loading a 7B model and timing four prompts on two slow cores takes minutes, not seconds.
TIMEOUT = 600.0


class AttentionTiming(BaseModel):
    """The timing child's run for one model on one build and CPU."""

    model_config = ConfigDict(frozen=True)

    model: str
    attempt: ProbeAttempt
    timed_at: float


def timing_path(cache_dir: Path, verdict: BuildVerdict, model: Path) -> Path:
    identity = f"{model.name}\n{model.stat().st_size}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return verdicts_dir(cache_dir) / f"{verdict.key}-attention-{digest}.json"


def cached_timing(cache_dir: Path, verdict: BuildVerdict, model: Path) -> ProbeAttempt | None:
    """The timing of `model` on the verdict's build and CPU, if it was taken (never runs a
    child: for `reame config`)."""
    if _same_file(model, Path(verdict.model)):
        return verdict.timing
    try:
        path = timing_path(cache_dir, verdict, model)
        return AttentionTiming.model_validate_json(path.read_bytes()).attempt
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as error:
        log.warning("unreadable attention timing, timing again", model=model.name, error=error)
        return None


def time_attention(
    cache_dir: Path,
    verdict: BuildVerdict,
    model: Path,
    *,
    launch: Launch | None = None,
    timeout: float = TIMEOUT,
) -> ProbeAttempt | None:
    """The timing of `model`: the kept one, or one taken now (and kept once it finished;
    one that did not is taken again at the next start)."""
    known = cached_timing(cache_dir, verdict, model)
    if known is not None or not verdict.runs:
        return known
    if verdict.attention.row_exact_flash:
        return verdict.timing  # a path of the build: the plan takes it for any model
    if verdict.timing is None or ROW_EXACT_FACT not in verdict.timing.facts:
        return None  # the check's row-exact question went unanswered: asked at the next start
    log.info("timing attention for this model (once per model, build and CPU)", model=model.name)
    launch = launch or probe.child_command(model, time_attention=True)
    load = verdict.use_extra_bufts
    attempt = run_attempt(launch(load), extra_bufts=load, timeout=timeout, passive=False)
    if attention_facts(attempt).prompt_gain_without_flash is not None:
        timing = AttentionTiming(model=str(model), attempt=attempt, timed_at=time.time())
        write_atomically(timing_path(cache_dir, verdict, model), timing.model_dump_json(indent=1))
    else:
        log.warning("attention timing did not finish", model=model.name, outcome=attempt.outcome)
    return attempt


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
