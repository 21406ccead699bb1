"""What unpacking K-quant weights once for all the rows of a product saves on a CPU with AMX
(`GGML_AMX_WIDE_M`, scripts/patches/ggml-amx-wide-m.patch).

ggml's AMX kernel for K-quant weights (Q4_K, Q5_K, Q6_K, IQ4_XS: most matrices of a Q4_K_M
model) computes a product 32 rows at a time, and for every 32 rows it unpacks each block of
the weights into tiles again: a prompt chunk of 33 tokens costs about as much as one of 48.
With the switch, each block is unpacked once and multiplied with every 16 rows in turn.

Each repetition runs two fresh processes, the switch on and off, taking turns at going
first (ggml reads the switch once per process). Each loads the model as `reame serve` loads
it on this host, computes a prefix of `PREFIX` tokens, then prompt chunks of each size in
`SIZES` after it (logits of the last row, as a prompt chunk asks; taken back after each),
`TIMES` times, and reports the median milliseconds of each size and a digest of each
size's last-row logits. Reported: medians over the repetitions, the ratios off / on, and
whether every process computed bit-identical last rows.

    .venv/bin/python benchmarks/amx_wide_m.py [--model PATH] [--reps 3] [--name amx_wide_m]
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any

PREFIX = 256
SIZES = (1, 4, 12, 16, 32, 33, 48, 64, 65, 72, 96, 128, 256)
TIMES = 5


def child(model: str, threads: int) -> dict[str, Any]:
    """One process's figures (the switch as the environment sets it)."""
    import numpy as np

    from reame_core.backend.base import Batch
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(Settings(model=model, threads=threads, log_level="warning"))
    tokens = [int(t) for t in np.random.default_rng(7).integers(100, 5000, PREFIX + max(SIZES))]
    batch = Batch()
    for position in range(PREFIX):
        batch.add(tokens[position], position, 0, False)
    backend.decode(batch)
    ms: dict[int, list[float]] = {n: [] for n in SIZES}
    digests: dict[int, str] = {}
    for _ in range(TIMES):
        for n in SIZES:
            batch = Batch()
            for offset in range(n):
                batch.add(tokens[PREFIX + offset], PREFIX + offset, 0, offset == n - 1)
            began = time.perf_counter()
            rows = backend.decode(batch)
            ms[n].append((time.perf_counter() - began) * 1000)
            digests[n] = hashlib.sha256(np.ascontiguousarray(rows[-1]).tobytes()).hexdigest()[:16]
            backend.seq_rm(0, PREFIX)
    backend.close()
    return {
        "ms": {str(n): round(statistics.median(v), 2) for n, v in ms.items()},
        "digests": {str(n): d for n, d in digests.items()},
    }


def main() -> None:
    from common import switched_benchmark

    from reame_core.backend.probe_child import AMX_WIDE_M_ENV

    measured = switched_benchmark(__file__, AMX_WIDE_M_ENV, child, 3, "amx_wide_m")
    if measured is None:
        return
    runs = measured.runs

    sizes = []
    for n in map(str, SIZES):
        on = statistics.median(r["ms"][n] for r in runs["on"])
        off = statistics.median(r["ms"][n] for r in runs["off"])
        sizes.append(
            {
                "tokens": int(n),
                "ms_on": round(on, 2),
                "ms_off": round(off, 2),
                "tok_s_on": round(int(n) / on * 1000, 1),
                "tok_s_off": round(int(n) / off * 1000, 1),
                "off_over_on": round(off / on, 3),
            }
        )
        print(sizes[-1], flush=True)
    path = measured.write(
        {
            "prefix_tokens": PREFIX,
            "times_per_process": TIMES,
            "logits_bit_identical": measured.logits_agree(),
            "sizes": sizes,
        }
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
