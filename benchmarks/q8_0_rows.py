"""What one product of Q8_0 weights with n rows costs through Reame's Q8_0 row groups and
through llamafile's kernel, which ggml gives every product of two rows or more
(scripts/patches/ggml-q8_0-row-groups.patch, `Q8_0_ROW_GROUPS_ENV`).

The product has the shape of SmolLM2's output layer (49,152 by 576 weights; random values,
which a product's time does not depend on), timed alone through ggml's CPU backend on
`--threads` threads, the weights in transparent huge pages (as Reame's build keeps a model's:
`HUGEPAGES_ENV`) and cold: before each timing a 64 MiB buffer is read, as a decode's other
layers push the weights out of the caches between two of its output products. Each
configuration runs in fresh processes (ggml reads the switch once per process), the two
taking turns `--rounds` times; the median of each process's medians. Each timing includes
the thread start of ggml's compute call, the same fixed cost both ways.

    .venv/bin/python benchmarks/q8_0_rows.py [--sizes 1 2 3 4 6 8 12 16 24 33] [--rounds 8]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from reame_core.backend.llama import Q8_0_ROW_GROUPS, Q8_0_ROW_GROUPS_ENV

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33)
VOCAB, EMBED = 49_152, 576  # SmolLM2-135M's output layer
FLUSH_BYTES = 64 << 20  # read before each timing: more than this host's last-level cache
GGML_TYPE_F32, GGML_TYPE_Q8_0 = 0, 8
Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
# Every product of 2 rows or more in the groups; "0": llamafile's kernel from 2 rows on.
CONFIGS = {"row-groups": str(1 << 30), "llamafile": "0"}


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]  # fmt: skip


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"))
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
    p = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = p, [_InitParams]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = p, [p, p, p]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = p, [p]
    base.ggml_build_forward_expand.restype, base.ggml_build_forward_expand.argtypes = None, [p, p]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = p, [p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [p]
    base.ggml_free.restype, base.ggml_free.argtypes = None, [p]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_cpu_init.restype, cpu.ggml_cpu_init.argtypes = None, []
    return base, cpu


def _array(base: ctypes.CDLL, tensor: int, dtype: np.dtype) -> np.ndarray:
    size = base.ggml_nbytes(tensor)
    raw = (ctypes.c_uint8 * size).from_address(base.ggml_get_data(tensor))
    return np.frombuffer(raw, dtype=dtype)


def product_ms(sizes: tuple[int, ...], reps: int, threads: int) -> dict[int, float]:
    """Median milliseconds of the product with n rows, cold, by n."""
    base, cpu = _ggml()
    cpu.ggml_cpu_init()
    rng = np.random.default_rng(0)
    flush = np.ones(FLUSH_BYTES, np.uint8)
    memory = mmap.mmap(-1, int(VOCAB * EMBED * 1.2) + (256 << 20))
    memory.madvise(mmap.MADV_HUGEPAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    ctx = base.ggml_init(_InitParams(len(memory), address, False))
    weights = base.ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, EMBED, VOCAB)
    blocks = _array(base, weights, Q8_0)
    blocks["d"] = rng.uniform(1e-3, 1e-2, len(blocks))
    blocks["qs"] = rng.integers(-127, 128, (len(blocks), 32))
    found = {}
    for n in sizes:
        rows = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, EMBED, n)
        _array(base, rows, np.dtype(np.float32))[:] = rng.standard_normal(EMBED * n)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, base.ggml_mul_mat(ctx, weights, rows))
        cpu.ggml_graph_compute_with_ctx(ctx, graph, threads)  # untimed: the first call's setup
        times = []
        for _ in range(reps):
            int(flush.sum(dtype=np.uint64))
            began = time.perf_counter()
            cpu.ggml_graph_compute_with_ctx(ctx, graph, threads)
            times.append(time.perf_counter() - began)
        found[n] = statistics.median(times) * 1000
    base.ggml_free(ctx)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=8, help="processes per configuration")
    parser.add_argument("--reps", type=int, default=21, help="timed products per size, each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="q8_0_rows", help="results file name (no extension)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = tuple(sorted(set(args.sizes) | {1}))
    if args.child:
        found = product_ms(sizes, args.reps, args.threads)
        print(json.dumps({"ms": [[n, ms] for n, ms in found.items()]}))
        return

    from common import measure, write_report

    flags = ["--sizes", *map(str, sizes), "--reps", str(args.reps), "--threads", str(args.threads)]
    samples: dict[str, dict[int, list[float]]] = {config: {} for config in CONFIGS}
    for round_ in range(args.rounds):
        order = list(CONFIGS) if round_ % 2 == 0 else list(reversed(CONFIGS))
        for config in order:
            env = {**os.environ, Q8_0_ROW_GROUPS_ENV: CONFIGS[config]}
            for n, ms in measure(__file__, *flags, env=env)["ms"]:
                samples[config].setdefault(n, []).append(ms)
    medians = {
        config: {n: round(statistics.median(v), 3) for n, v in by_n.items()}
        for config, by_n in samples.items()
    }
    groups, llamafile = medians["row-groups"], medians["llamafile"]
    report = {
        "product": f"Q8_0 {VOCAB} x {EMBED} (SmolLM2-135M's output layer) by n F32 rows, cold",
        "threads": args.threads,
        "rounds": args.rounds,
        "reps": args.reps,
        "reames_limit": Q8_0_ROW_GROUPS,
        "command": " ".join(["python", "benchmarks/q8_0_rows.py", *sys.argv[1:]]),
        "ms": medians,
        "one_row_multiple": {
            config: {n: round(ms / by_n[1], 2) for n, ms in by_n.items()}
            for config, by_n in medians.items()
        },
        "llamafile_over_row_groups": {n: round(llamafile[n] / groups[n], 3) for n in sizes},
    }
    print(json.dumps(report["llamafile_over_row_groups"]))
    print(write_report(args.name, report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
