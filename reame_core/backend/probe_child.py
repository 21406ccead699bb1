"""The build check's child process: load a model with llama.cpp and decode a few tokens.

Run as ``python -m reame_core.backend.probe_child MODEL [--no-extra-bufts]`` by
`reame_core.backend.probe`, never in Reame's own process: llama.cpp may kill this one with
SIGILL, SIGBUS or SIGSEGV, or hang in it, and finding that out is its whole job. So it
reports each step on stdout as it reaches it (one JSON object a line after `MARK`, flushed),
and the parent knows how far it got however it ends. It imports nothing of Reame's beyond
this module and stays small: the first start on a new build or CPU waits for it.

With ``--time-attention --row-exact-only`` (once the build is known to decode) it checks
instead whether flash attention with f16 keys computes a lone row as it computes it inside a
chunk (the row-exact path of Reame's build). With ``--time-attention`` alone (only where
that path is missing; run with the OpenMP settings the server itself runs with) it times a
prompt in both deterministic attention configurations of a stock build, and checks whether
without flash attention a lone row is computed as inside a chunk.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

MARK = "reame-probe "
# The switch of the row-exact flash attention path that Reame's llama.cpp build is patched
# with (scripts/patches/ggml-fa-row-exact.patch): with it, f16 keys and values compute every
# query row the same way whatever its batch. ggml reads it once, at the first attention it
# computes, so it is set before any model runs, in this child as in Reame's own process.
ROW_EXACT_ENV = "GGML_FA_ROW_EXACT"
# The switch of the row kernels that Reame's build gives ggml's AMX matrix products
# (scripts/patches/ggml-amx-row-kernels.patch): a product of up to this many rows computes
# each row as a product of one row does, instead of in AMX tiles that cost as much for two
# rows as for sixteen. Draft verification and batched decoding are products of a few rows.
# Read once per process; builds without AMX, or without the patch, ignore it.
AMX_ROWS_ENV = "GGML_AMX_VNNI_ROWS"
AMX_ROWS = 12  # measured: 12-row products cost the same either way on SmolLM2 and Qwen 1.5B
AMX_WIDE_M_ENV = "GGML_AMX_WIDE_M"  # K-quant products: weights unpacked once for all rows
# At least two threads, so that ggml's worker threads run kernels too (the AMX crash happens
# in them, not in the calling thread); no more, so the check costs the same on any host.
THREADS = 2
PROMPT = "The capital of France is Paris. The capital of Italy is"
# Greedy tokens: the prompt's decode gives the first (matrix-matrix kernels), one-token
# decodes the rest (matrix-vector kernels).
GENERATED = 4
# With --time-attention alone (without `ROW_EXACT_ONLY`), a prompt is timed in each
# deterministic attention configuration instead: flash attention with keys in q8_0, and
# without it, keys and values f16 (names in llama_cpp). Timed best of `ROUNDS`, the
# configurations alternating.
ATTENTION = {
    "flash_q8_0_keys": ("LLAMA_FLASH_ATTN_TYPE_ENABLED", "GGML_TYPE_Q8_0"),
    "no_flash_f16": ("LLAMA_FLASH_ATTN_TYPE_DISABLED", "GGML_TYPE_F16"),
}
# Checked for a lone row only (`ROW_EXACT_ONLY`): flash attention with f16 keys is exact on
# builds with the row-exact path, and then the plan takes it without timing anything.
FLASH_F16 = ("LLAMA_FLASH_ATTN_TYPE_ENABLED", "GGML_TYPE_F16")
ROW_EXACT_ONLY = "--row-exact-only"
ROW_EXACT_FACT = "one_row_exact_flash_f16"  # its answer, as reported
PREFILL = 256
CHUNK = 128  # Settings.prefill_chunk's default
ROUNDS = 2
# The one-row check's context: without flash attention, a lone row's products against 256
# cached cells or more took another path than the same row's in a chunk on the Intel host;
# with f16 flash attention a lone row against 512 cells or more splits the cache between
# the threads, unless the row-exact path is on.
ONE_ROW_CONTEXT = 600

# "load_tensors:   CPU_REPACK model buffer size =    27.00 MiB"
_BUFFER = re.compile(r"(\S+) model buffer size\s*=\s*([0-9.]+) MiB")
# "repack: repack tensor blk.0.attn_q.weight with q4_0_8x8" (debug level)
_REPACK = re.compile(r"repack tensor \S+ with (\S+)")


def say(**facts: Any) -> None:
    """Tell the parent a step or a fact, at once (the next instruction may kill us)."""
    sys.stdout.write(MARK + json.dumps(facts) + "\n")
    sys.stdout.flush()


class LoadLog:
    """llama.cpp's log lines, kept to read which buffer types the weights went to.

    llama.cpp keeps a raw pointer to the callback, so this object must outlive the model.
    Warnings and errors also go to stderr, where the parent reads why a load failed.
    """

    def __init__(self) -> None:
        import llama_cpp

        self.text: list[str] = []
        self.callback = llama_cpp.llama_log_callback(self._receive)

    def _receive(self, level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
        line = (text or b"").decode("utf-8", "replace")
        self.text.append(line)
        if level in (3, 4):  # ggml's warn and error levels
            sys.stderr.write(line)

    def buffers(self) -> dict[str, float]:
        """MiB of weights per buffer type (CPU_Mapped, CPU_REPACK, AMX, ...)."""
        sizes: dict[str, float] = {}
        for name, mib in _BUFFER.findall("".join(self.text)):
            sizes[name] = sizes.get(name, 0.0) + float(mib)
        return sizes

    def repacked(self) -> dict[str, int]:
        """Tensors per repacked layout (q4_0_8x8, ...), when llama.cpp logs them."""
        return dict(Counter(_REPACK.findall("".join(self.text))))


def _no_core_dumps() -> None:
    # A crash here is an expected answer, not something to keep a core file of.
    try:
        import resource
    except ImportError:  # not on this platform
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))


def _context(llama_cpp: Any, model: Any, attention: tuple[str, str], n_ctx: int) -> Any:
    """A one-sequence context of `n_ctx` cells with this attention (flash attention type and
    key type, named as in llama_cpp), taking prompts in chunks of `CHUNK` as the engine
    does."""
    flash, type_k = attention
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = CHUNK
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = THREADS
    params.kv_unified = False
    params.flash_attn_type = getattr(llama_cpp, flash)
    params.type_k = getattr(llama_cpp, type_k)
    params.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit(f"llama.cpp could not create a context for {attention}")
    return ctx


def _prefill_seconds(llama_cpp: Any, model: Any, prompt: list[int]) -> dict[str, float]:
    """Seconds to compute a prompt of `PREFILL` tokens in chunks of `CHUNK`, as the engine
    does, in each deterministic attention configuration (`ATTENTION`): which one computes
    prompts faster depends on the CPU (docs/BENCHMARKS.md, "What determinism costs")."""

    tokens = (prompt * (PREFILL // len(prompt) + 1))[:PREFILL]
    seconds: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name in ATTENTION:
            ctx = _context(llama_cpp, model, ATTENTION[name], PREFILL)
            started = time.perf_counter()
            for start in range(0, PREFILL, CHUNK):
                chunk = (llama_cpp.llama_token * CHUNK)(*tokens[start : start + CHUNK])
                if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(chunk, CHUNK)):
                    raise SystemExit(f"llama_decode failed for {name}")
            took = time.perf_counter() - started
            seconds[name] = min(took, seconds.get(name, took))
            llama_cpp.llama_free(ctx)
    return seconds


def _one_row_exact(
    llama_cpp: Any, model: Any, prompt: list[int], attention: tuple[str, str]
) -> bool:
    """Whether, with this attention, a prompt's last row computed alone (as a decode step
    computes it) gets the logits it gets inside a chunk: the deterministic configuration
    needs that. Without flash attention, on some CPUs the one-row path takes other kernels;
    with f16 flash attention, only a build with the row-exact path passes."""
    import numpy as np

    tokens = (prompt * (ONE_ROW_CONTEXT // len(prompt) + 1))[:ONE_ROW_CONTEXT]
    whole = [CHUNK] * (len(tokens) // CHUNK) + [len(tokens) % CHUNK]
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rows = []
    for cuts in (whole, [*whole[:-1], whole[-1] - 1, 1]):
        ctx = _context(llama_cpp, model, attention, 2 * ONE_ROW_CONTEXT)
        start = 0
        for size in cuts:  # llama_batch_get_one: logits for the last token only
            chunk = (llama_cpp.llama_token * size)(*tokens[start : start + size])
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(chunk, size)):
                raise SystemExit(f"llama_decode failed with attention {attention}")
            start += size
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        rows.append(logits.copy())
        llama_cpp.llama_free(ctx)
    return bool(np.array_equal(rows[0], rows[1]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reame_core.backend.probe_child")
    parser.add_argument("model", help="GGUF file to load")
    parser.add_argument(
        "--no-extra-bufts",
        dest="extra_bufts",
        action="store_false",
        help="load with use_extra_bufts=False (no CPU_REPACK or AMX weight buffers)",
    )
    parser.add_argument(
        "--time-attention",
        action="store_true",
        help="instead of decoding, time a prompt in each deterministic attention configuration",
    )
    parser.add_argument(
        ROW_EXACT_ONLY,
        action="store_true",
        help="with --time-attention: only check for the row-exact attention path",
    )
    args = parser.parse_args(argv)
    _no_core_dumps()
    os.environ.setdefault(ROW_EXACT_ENV, "1")

    say(stage="import")
    import llama_cpp
    import numpy as np

    log = LoadLog()
    llama_cpp.llama_log_set(log.callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    say(system_info=bytes(llama_cpp.llama_print_system_info()).decode(errors="replace"))

    say(stage="load")
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = args.extra_bufts
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), model_params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = 256
    ctx_params.n_batch = 64
    ctx_params.n_ubatch = 64
    ctx_params.n_seq_max = 1
    ctx_params.n_threads = THREADS
    ctx_params.n_threads_batch = THREADS
    ctx_params.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, ctx_params)
    if not ctx:
        raise SystemExit(f"llama.cpp could not create a context for {args.model}")
    say(buffers=log.buffers(), repacked=log.repacked())

    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = PROMPT.encode()
    prompt = (llama_cpp.llama_token * (len(text) + 8))()
    n_prompt = llama_cpp.llama_tokenize(vocab, text, len(text), prompt, len(prompt), True, False)
    if n_prompt <= 1:
        raise SystemExit(f"llama.cpp tokenized the check's prompt into {n_prompt} tokens")
    if args.time_attention:
        llama_cpp.llama_free(ctx)
        say(stage="attention")
        tokens = list(prompt[:n_prompt])
        if args.row_exact_only:
            say(**{ROW_EXACT_FACT: _one_row_exact(llama_cpp, model, tokens, FLASH_F16)})
        else:
            say(prefill_seconds=_prefill_seconds(llama_cpp, model, tokens))
            plain = ATTENTION["no_flash_f16"]
            say(one_row_exact_without_flash=_one_row_exact(llama_cpp, model, tokens, plain))
        llama_cpp.llama_model_free(model)
        return 0

    say(stage="decode")
    batch, generated = llama_cpp.llama_batch_get_one(prompt, n_prompt), []
    for _ in range(GENERATED):
        status = llama_cpp.llama_decode(ctx, batch)
        if status != 0:
            raise SystemExit(f"llama_decode returned {status}")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        if not np.isfinite(logits).all():
            raise SystemExit("llama_decode gave logits that are not finite numbers")
        token = int(np.argmax(logits))
        generated.append(token)
        single = (llama_cpp.llama_token * 1)(token)
        batch = llama_cpp.llama_batch_get_one(single, 1)
    say(stage="done", tokens=generated)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
