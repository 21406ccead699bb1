"""What one KV buffer with a region per sequence saves over per-sequence KV streams
(`LLAMA_KV_SEQ_REGIONS`, scripts/patches/llama-kv-seq-regions.patch).

With a KV stream per sequence llama.cpp cuts a decode into micro-batches of equal tokens per
sequence, each a pass over the weights: four sequences decoding one token each cost one pass,
but as soon as one of them verifies a draft (or appends a run of tokens its grammar forces)
the step costs two or more. With regions the step is one pass whatever each sequence feeds.

Each repetition runs two fresh processes, regions on and off, taking turns at going first
(Reame reads the user's setting once, as it loads). Each loads the model as `reame serve` loads it
on this host (slots, context and attention from the host plan), computes a prompt of a
different length in each of four slots, then times decode steps of each layout in `LAYOUTS`
(tokens fed per slot; every row's logits, as verification asks, except where a layout says
`certain`: there only the last row of the long run, as for tokens a grammar forces or a prompt
chunk), `TIMES` times each, taken back after each. Reported: the median milliseconds of
each layout on each side, the ratio off / on, the passes each side makes (as
`Backend.passes` reproduces llama.cpp's cut), and whether every process computed
bit-identical logits for every row of each layout's last timed step.

    .venv/bin/python benchmarks/kv_regions.py [--model PATH] [--reps 3] [--name kv_regions]
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any

PROMPTS = (620, 540, 700, 580)  # prompt tokens per slot
LAYOUTS: dict[str, tuple[tuple[int, ...], bool]] = {  # name: (tokens per slot, certain)
    "1,1,1,1": ((1, 1, 1, 1), False),
    "2,1,1,1": ((2, 1, 1, 1), False),
    "5,1,1,1": ((5, 1, 1, 1), False),
    "4,4,1,1": ((4, 4, 1, 1), False),
    "9,9,1,1": ((9, 9, 1, 1), False),
    "5,5,5,5": ((5, 5, 5, 5), False),
    "17,1,1,1 certain": ((17, 1, 1, 1), True),
    "0,0,0,128 prompt chunk": ((0, 0, 0, 128), True),  # the last region: the widest mask
}
TIMES = 5


def child(model: str, threads: int) -> dict[str, Any]:
    """One process's figures (regions as the environment sets them)."""
    import numpy as np

    from reame_core.backend.base import Batch
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(Settings(model=model, threads=threads, log_level="warning"))
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(100, 5000, n + 128)] for n in PROMPTS]
    chunk = backend.info.n_batch
    for seq_id, n in enumerate(PROMPTS):
        for start in range(0, n, chunk):
            batch = Batch()
            for position in range(start, min(n, start + chunk)):
                batch.add(prompts[seq_id][position], position, seq_id, False)
            backend.decode(batch)
    ms: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    digests: dict[str, str] = {}
    passes: dict[str, int] = {}
    for _ in range(TIMES):
        for name, (layout, certain) in LAYOUTS.items():
            batch = Batch()
            for seq_id, count in enumerate(layout):
                start = PROMPTS[seq_id]
                for offset in range(count):
                    logits = not certain or count == 1 or offset == count - 1
                    batch.add(prompts[seq_id][start + offset], start + offset, seq_id, logits)
            began = time.perf_counter()
            rows = backend.decode(batch)
            ms[name].append((time.perf_counter() - began) * 1000)
            digests[name] = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()[:16]
            passes[name] = len(backend.passes([(s, n) for s, n in enumerate(layout) if n]))
            for seq_id in range(len(layout)):
                backend.seq_rm(seq_id, PROMPTS[seq_id])
    regions = backend.regions
    backend.close()
    return {
        "regions": regions,
        "ms": {name: round(statistics.median(v), 2) for name, v in ms.items()},
        "passes": passes,
        "digests": digests,
    }


def main() -> None:
    from common import switched_benchmark

    from reame_core.backend.llama import KV_REGIONS_ENV

    measured = switched_benchmark(__file__, KV_REGIONS_ENV, child, 3, "kv_regions")
    if measured is None:
        return
    runs = measured.runs
    assert all(r["regions"] for r in runs["on"]) and not any(r["regions"] for r in runs["off"])

    layouts = []
    for name in LAYOUTS:
        on = statistics.median(r["ms"][name] for r in runs["on"])
        off = statistics.median(r["ms"][name] for r in runs["off"])
        layouts.append(
            {
                "layout": name,
                "ms_regions": round(on, 2),
                "ms_streams": round(off, 2),
                "passes_regions": runs["on"][0]["passes"][name],
                "passes_streams": runs["off"][0]["passes"][name],
                "streams_over_regions": round(off / on, 3),
            }
        )
        print(layouts[-1], flush=True)
    path = measured.write(
        {
            "prompt_tokens": list(PROMPTS),
            "times_per_process": TIMES,
            "logits_bit_identical": measured.logits_agree(),
            "layouts": layouts,
        }
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
