"""Host auto-configuration: from host facts, a model's shape and the settings, every engine
value Reame runs with, each with the reason it was chosen.

Explicit settings (flag, REAME_* environment, config file) always win; auto values fill the
rest. The priorities, in order: the model must fit in memory; each sequence slot gets the
context a request needs (4096 tokens, or what the model was trained on if less); then as
many slots as the cores can use (two per thread); the KV cache is quantized to q8_0 only
when that is what makes the target fit.

A plugin that keeps data on disk declares how much it wants (hook `reame_disk_need`); the
plan turns each need into a budget from the free disk and offers it as the default of the
plugin's setting. The plan names no plugin itself.

Flash attention is on. In the deterministic configuration it needs a path whose results
depend on neither the batch nor the thread count (`stable_attention`). Where the build check
found the row-exact path (Reame's patched build), keys and values are f16 and every row
takes the tiled kernel. Elsewhere the keys are cached as q8_0, which keeps ggml's flash
attention on its one-row path, or flash attention is off where the build check timed
prompts much faster that way and found it exact. The values are f16, q8_0 when memory is
tight.

The weights are read into memory, where ggml's buffers ask for huge pages, when the model is
at most `READ_WEIGHTS_MAX`, fits with its buffers and KV cache, and the host gives huge pages
to memory that asks; otherwise they stay mapped from the file, llama.cpp's default, whose
pages every process mapping the file shares and the kernel may page.

Pure functions of their inputs: tests feed fake facts and check the decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import ByteSize, TypeAdapter

from reame_core.autoconfig.facts import HostFacts
from reame_core.hooktypes import DiskNeed
from reame_core.models.shape import (
    KVType,
    ModelShape,
    Weights,
    default_kv_types,
    stable_attention,
)
from reame_core.settings import Settings

T = TypeVar("T")

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
TARGET_CTX = 4096
TARGET_BATCH, SMALL_BATCH = 512, 128
# A batch's logits buffer may take at most this share of available memory.
BATCH_MEMORY_SHARE = 0.25
MIN_CTX = 512
CTX_STEP = 256
SLOTS_PER_THREAD = 2
MAX_AUTO_SLOTS = 16
# Python, the HTTP server, llama.cpp's own small buffers, the KV states of sessions whose
# slots were taken (at most engine.slots.SPILL_BYTES) and the rest of the system.
RUNTIME_RESERVE = 256 * MIB
# Below this much free disk, no plugin gets a disk budget: models and logs need the room.
MIN_DISK_FOR_CACHES = 1 * GIB
# Flash attention stays on (keys in q8_0) unless the build check computed a prompt at least
# this many times as fast without it: level on most CPUs, 4x on an Intel Xeon with AMX
# (docs/BENCHMARKS.md, "What determinism costs"); the margin keeps a noisy timing from
# switching it.
FLASH_OFF_GAIN = 1.5
# Weights read into memory (in huge pages) decode faster than mapped from the file, but each
# process holds its own copy, where mapped pages are shared by every process that maps the
# file and paged by the kernel. The largest model the plan reads, a policy between the two
# models measured (docs/BENCHMARKS.md, "Weights read into memory"): SmolLM2's 94 MiB took
# one-token steps 1.044x faster read, the 1 GiB Qwen2.5-Coder-1.5B (its Q4_K weights
# repacked into buffers either way, on x86) 1.023x.
READ_WEIGHTS_MAX = 512 * MIB


@dataclass(frozen=True)
class Choice(Generic[T]):
    """A value Reame runs with and why; `explicit` when the settings named it."""

    value: T
    why: str
    explicit: bool = False


@dataclass(frozen=True)
class DiskBudget:
    """The bytes a plugin's `DiskNeed` gets on this host."""

    need: DiskNeed
    bytes: Choice[int]


@dataclass(frozen=True)
class HostPlan:
    threads: Choice[int]
    ctx: Choice[int]
    parallel: Choice[int]
    batch: Choice[int]
    kv_type_k: Choice[KVType]
    kv_type_v: Choice[KVType]
    flash_attn: Choice[bool]
    weights: Choice[Weights]
    memory: str
    disk_budgets: tuple[DiskBudget, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    def explain(self) -> list[tuple[str, str]]:
        """(setting, "value: why") for every decision, in the order they were made."""

        def line(choice: Choice[Any], shown: str) -> str:
            return f"{shown}{' (set)' if choice.explicit else ''}: {choice.why}"

        return [
            ("threads", line(self.threads, str(self.threads.value))),
            ("ctx", line(self.ctx, str(self.ctx.value))),
            ("parallel", line(self.parallel, str(self.parallel.value))),
            ("batch", line(self.batch, str(self.batch.value))),
            ("kv_type", line(self.kv_type_k, _kv_label(self))),
            ("flash_attn", line(self.flash_attn, "on" if self.flash_attn.value else "off")),
            ("weights", line(self.weights, self.weights.value)),
            ("memory", self.memory),
            *(
                (f"{budget.need.section} budget", line(budget.bytes, size(budget.bytes.value)))
                for budget in self.disk_budgets
            ),
        ]

    def plugin_defaults(self) -> dict[str, dict[str, Any]]:
        """Defaults this plan offers to plugin settings sections (explicit values win)."""
        return {
            budget.need.section: {budget.need.setting: budget.bytes.value}
            for budget in self.disk_budgets
        }


@dataclass(frozen=True)
class AttentionFacts:
    """What the build check measured of this model's attention on this host (read from its
    timing by `probe.attention_facts`).

    `prompt_gain_without_flash`: how many times as fast a prompt ran without flash attention
    (keys and values f16) as with it (keys q8_0), both deterministic; None: not timed.
    `exact_without_flash`: whether, without it, a row computed alone got the logits the same
    row gets inside a chunk (unknown: not).
    `row_exact_flash`: whether, with it and f16 keys and values, it did (only a build with the
    row-exact path does: scripts/patches/ggml-fa-row-exact.patch; unknown: not)."""

    prompt_gain_without_flash: float | None = None
    exact_without_flash: bool = False
    row_exact_flash: bool = False


UNTIMED = AttentionFacts()


def plan_host(
    settings: Settings,
    facts: HostFacts,
    shape: ModelShape,
    disk_needs: Sequence[DiskNeed] = (),
    attention: AttentionFacts = UNTIMED,
) -> HostPlan:
    """Every engine value for this model on this host: the settings' where they are set,
    decided from the facts where not. `disk_needs` are the enabled plugins' asks for disk
    (hook `reame_disk_need`); each gets a budget. `attention` is what the build check timed
    of the model's attention (`UNTIMED`: flash attention stays on)."""
    threads = _threads(settings, facts)
    flash_attn = flash_attn_choice(settings, attention)
    warnings: list[str] = []

    ctx_target = settings.ctx or min(TARGET_CTX, shape.n_ctx_train)
    slots_target = settings.parallel or min(
        MAX_AUTO_SLOTS, max(2, SLOTS_PER_THREAD * threads.value)
    )
    batch = _batch(settings, facts, shape, ctx_target)
    compute = shape.compute_buffer_bytes(batch.value, ctx_target)
    room = facts.memory_available - shape.file_bytes - compute - RUNTIME_RESERVE
    if facts.memory_available < shape.file_bytes + RUNTIME_RESERVE:
        warnings.append(
            f"the model ({size(shape.file_bytes)}) does not fit in the "
            f"{size(facts.memory_available)} of memory available: it will be read from disk "
            "as it runs, very slowly; pick a smaller model"
        )

    kv_k, kv_v = _kv_types(
        settings, flash_attn.value, attention, shape, room, ctx_target * slots_target
    )
    per_token = shape.kv_bytes_per_token(kv_k.value, kv_v.value)
    ctx, parallel = _ctx_and_slots(settings, shape, room, per_token, ctx_target, slots_target)
    kv_bytes = int(ctx.value * parallel.value * per_token)
    if kv_bytes > max(room, 0):
        warnings.append(
            f"{parallel.value} slots x {ctx.value} tokens need {size(kv_bytes)} of KV cache but "
            f"only {size(max(room, 0))} is left after the model: expect swapping"
        )
    memory = (
        f"{size(facts.memory_available)} available of {size(facts.memory_total)}: model "
        f"{size(shape.file_bytes)}, KV cache {size(kv_bytes)}, compute buffers about "
        f"{size(compute)}, {size(RUNTIME_RESERVE)} kept for the rest"
        f"{_HUGE_PAGES_NOTE.get(facts.huge_pages, '')}"
    )
    if facts.huge_pages == "never":
        warnings.append(
            "transparent huge pages are off on this host (never): llama.cpp's buffers sit in "
            "4 KiB pages, which decoded a 1.5B model up to 1.19x slower (docs/BENCHMARKS.md); "
            "as root, `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` lets them "
            "ask for huge pages"
        )
    return HostPlan(
        threads=threads,
        ctx=ctx,
        parallel=parallel,
        batch=batch,
        kv_type_k=kv_k,
        kv_type_v=kv_v,
        flash_attn=flash_attn,
        weights=_weights(settings, facts, shape, room - kv_bytes),
        memory=memory,
        disk_budgets=tuple(
            DiskBudget(need, _disk_budget(settings, facts, need)) for need in disk_needs
        ),
        warnings=tuple(warnings),
    )


_HUGE_PAGES_NOTE = {  # transparent huge pages, as the memory line names them
    "always": "; huge pages: always",
    "madvise": "; huge pages: to memory that asks (Reame's llama.cpp build asks for its buffers)",
    "never": "; huge pages: never (switched off on this host)",
}


def _threads(settings: Settings, facts: HostFacts) -> Choice[int]:
    # The engine's CpuShare lowers the count while other processes keep the cores busy.
    adapts = "; fewer while other processes keep the cores busy" if settings.adapt_threads else ""
    if settings.threads:
        return Choice(settings.threads, "set in the settings" + adapts, explicit=True)
    cores = facts.physical_cores
    why = f"{cores} physical core{'s' if cores != 1 else ''}"
    if facts.logical_cpus > cores:
        why += f" ({facts.logical_cpus} logical CPUs: SMT siblings add nothing to decoding)"
    return Choice(cores, why + (adapts if cores > 1 else ""))


def _batch(settings: Settings, facts: HostFacts, shape: ModelShape, ctx: int) -> Choice[int]:
    if settings.batch:
        return Choice(settings.batch, "set in the settings", explicit=True)
    full = shape.compute_buffer_bytes(TARGET_BATCH, ctx)
    if full <= facts.memory_available * BATCH_MEMORY_SHARE:
        return Choice(TARGET_BATCH, f"tokens per decode call; its buffers take {size(full)}")
    return Choice(
        SMALL_BATCH,
        f"memory is tight: {TARGET_BATCH}-token calls would need {size(full)} of buffers "
        "(mostly logits over the whole vocabulary); long prompts take more calls",
    )


def flash_attn_choice(settings: Settings, attention: AttentionFacts = UNTIMED) -> Choice[bool]:
    """Flash attention on or off, and why: off only where the build lacks the row-exact path
    and the build check found prompts at least `FLASH_OFF_GAIN` times as fast without it
    and a lone row exact there."""
    if not settings.deterministic:
        return Choice(True, "--no-deterministic selects llama.cpp's fastest settings")
    kv_type = settings.kv_type
    if attention.row_exact_flash and kv_type in (None, "f16"):
        return Choice(
            True,
            "this build's row-exact path computes every row with the tiled kernel, keys and "
            "values f16 (found by the build check): deterministic, and the fastest here",
        )
    if kv_type is not None and not stable_attention(True, kv_type, kv_type):
        return Choice(
            False,
            "deterministic configuration with f16 keys and values set: flash attention would "
            "then compute rows along paths that depend on the batch and the thread count",
        )
    prompt_gain_without = attention.prompt_gain_without_flash
    faster = kv_type is None and (prompt_gain_without or 0.0) >= FLASH_OFF_GAIN
    if faster and not attention.exact_without_flash:
        return Choice(
            True,
            f"this CPU computed a prompt {prompt_gain_without:.1f}x as fast without it, but "
            "there a row computed alone then differs from the same row in a chunk (timed "
            "for this model): q8_0 keys keep every row on one path (deterministic)",
        )
    if faster:
        return Choice(
            False,
            f"this CPU computed a prompt {prompt_gain_without:.1f}x as fast without it "
            "(timed for this model); keys and values f16, deterministic too",
        )
    why = "with q8_0 keys it computes every row along one path (deterministic)"
    if kv_type is None and prompt_gain_without is not None:
        why += f"; this CPU computed a prompt {prompt_gain_without:.2f}x as fast without it"
    return Choice(True, why)


def _weights(settings: Settings, facts: HostFacts, shape: ModelShape, room: int) -> Choice[Weights]:
    """Read or mapped; `room`: the memory left after the model, its buffers and KV cache."""
    if settings.weights is not None:
        return Choice(settings.weights, "set in the settings", explicit=True)
    if room < 0:
        return Choice(
            "mapped",
            "the model, its buffers and KV cache do not fit in the memory available: mapped "
            "from the file, the kernel reads in and drops its pages as memory allows",
        )
    if facts.huge_pages not in ("always", "madvise"):
        return Choice(
            "mapped",
            f"huge pages: {facts.huge_pages} on this host, so weights read into memory would "
            "sit in 4 KiB pages as mapped ones do; mapped, processes on this host share them",
        )
    if shape.file_bytes > READ_WEIGHTS_MAX:
        return Choice(
            "mapped",
            f"a model over {size(READ_WEIGHTS_MAX)}: mapped, the processes that map it share "
            "its pages and the kernel may page them (read, Qwen2.5-Coder-1.5B's steps ran only "
            "1.023x faster)",
        )
    return Choice(
        "read",
        "read into memory in 2 MiB pages: from a mapped file's 4 KiB pages SmolLM2's "
        "one-token steps ran 1.044x slower",
    )


def _kv_types(
    settings: Settings,
    flash_attn: bool,
    attention: AttentionFacts,
    shape: ModelShape,
    room: int,
    tokens: int,
) -> tuple[Choice[KVType], Choice[KVType]]:
    values_note = "values stay f16: a quantized V cache needs flash attention, off here"
    if settings.kv_type is not None:
        keys: Choice[KVType] = Choice(settings.kv_type, "set in the settings", explicit=True)
        if settings.kv_type != "f16" and not flash_attn:
            return keys, Choice("f16", values_note)
        return keys, Choice(settings.kv_type, "set in the settings", explicit=True)
    keys_type, values_type = default_kv_types(
        settings.deterministic, flash_attn, attention.row_exact_flash
    )
    keys_note = ""
    if keys_type != values_type:
        keys_note = "; q8_0 keys keep flash attention on one path (deterministic)"
    need = int(tokens * shape.kv_bytes_per_token(keys_type, values_type))
    if need <= room:
        why = f"{size(need)} of KV fits in the {size(room)} left after the model"
        return Choice(keys_type, why + keys_note), Choice(values_type, why)
    why = (
        f"memory is tight: {keys_type} keys and {values_type} values would need {size(need)}, "
        f"{size(max(room, 0))} is left after the model"
    )
    if flash_attn:
        return Choice("q8_0", why + keys_note), Choice("q8_0", why)
    return Choice("q8_0", f"{why}; {values_note}"), Choice("f16", values_note)


def _ctx_and_slots(
    settings: Settings,
    shape: ModelShape,
    room: int,
    per_token: float,
    ctx_target: int,
    slots_target: int,
) -> tuple[Choice[int], Choice[int]]:
    set_note = "set in the settings"
    left = f"the {size(max(room, 0))} left after the model"
    if settings.ctx and settings.parallel:
        return Choice(settings.ctx, set_note, True), Choice(settings.parallel, set_note, True)
    if settings.ctx:
        slots = _clamp(int(room // (settings.ctx * per_token)), 1, slots_target)
        return Choice(settings.ctx, set_note, True), Choice(
            slots, _slots_why(slots, slots_target, settings.ctx, left)
        )
    if settings.parallel:
        ctx = _fit_ctx(room / settings.parallel, per_token, ctx_target)
        return Choice(ctx, _ctx_why(ctx, ctx_target, shape, left)), Choice(
            settings.parallel, set_note, True
        )
    slots = int(room // (ctx_target * per_token))
    if slots >= 1:
        slots = min(slots, slots_target)
        return Choice(ctx_target, _ctx_why(ctx_target, ctx_target, shape, left)), Choice(
            slots, _slots_why(slots, slots_target, ctx_target, left)
        )
    # Not even one slot at the target: one slot, with the context memory allows.
    ctx = _fit_ctx(room, per_token, ctx_target)
    return Choice(ctx, _ctx_why(ctx, ctx_target, shape, left)), Choice(
        1, f"memory allows one slot only ({left})"
    )


def _fit_ctx(room: float, per_token: float, ctx_target: int) -> int:
    fitting = int(room // per_token) // CTX_STEP * CTX_STEP
    return _clamp(fitting, MIN_CTX, ctx_target)


def _ctx_why(ctx: int, ctx_target: int, shape: ModelShape, left: str) -> str:
    if ctx == ctx_target:
        if ctx_target < TARGET_CTX:
            return f"tokens per slot: all the model was trained on ({shape.n_ctx_train})"
        return f"tokens per slot (the model was trained on {shape.n_ctx_train})"
    if ctx == MIN_CTX:
        return f"tokens per slot: the least Reame runs with; {left} holds less"
    return f"tokens per slot: what {left} holds"


def _slots_why(slots: int, target: int, ctx: int, left: str) -> str:
    if slots == target:
        return (
            f"{SLOTS_PER_THREAD} per thread (batched decoding shares each weight read), "
            f"and their KV at {ctx} tokens fits in {left}"
        )
    return f"what {left} holds at {ctx} tokens per slot (target {target})"


def _disk_budget(settings: Settings, facts: HostFacts, need: DiskNeed) -> Choice[int]:
    explicit = settings.plugins.get(need.section, {}).get(need.setting)
    if explicit is not None:
        given = int(TypeAdapter(ByteSize).validate_python(explicit))
        return Choice(given, f"set in [plugins.{need.section}]", explicit=True)
    free, where = facts.free_disk(need.directory)
    if free < MIN_DISK_FOR_CACHES:
        return Choice(0, f"only {size(free)} free in {where}: no room for {need.purpose}")
    budget = min(int(free * need.share), need.cap) // MIB * MIB
    return Choice(
        budget,
        f"{need.share:.0%} of the {size(free)} free in {where}, at most "
        f"{size(need.cap)}, for {need.purpose}",
    )


def _kv_label(plan: HostPlan) -> str:
    k, v = plan.kv_type_k.value, plan.kv_type_v.value
    return k if k == v else f"{k} keys, {v} values"


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def size(n_bytes: float) -> str:
    """Bytes for people: 448 MiB, 4.4 GiB."""
    if n_bytes >= GIB:
        return f"{n_bytes / GIB:.1f} GiB"
    if n_bytes >= MIB:
        return f"{n_bytes / MIB:.0f} MiB"
    return f"{n_bytes / KIB:.0f} KiB"
