"""`EngineStats`: the engine's counters since start, read by metrics and benchmarks.

Only the engine thread writes them, each counter in the part that does what it counts:
the engine takes requests in (submitted), the scheduler admits and plans them (prompt,
reused and restored tokens; active sequences, waiting requests; waits for prefixes other
processes promised), the runner decodes (steps, seconds, batch tokens, filler rows,
errors) and the committer turns rows into tokens (prefill tokens and their seconds,
generated tokens, finished requests) or answers from a plugin's memory (recalled
requests). Other threads only read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    requests_submitted: int = 0
    requests_finished: int = 0
    recalled_requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    restored_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    batch_tokens: int = 0
    filler_rows: int = 0  # throwaway rows that joined sequences into fewer passes
    active_sequences: int = 0
    waiting_requests: int = 0
    decode_errors: int = 0
    prefill_seconds: float = 0.0  # decode calls computing prompt chunks
    prefix_waits: int = 0  # requests that waited for a prefix another process was computing
    prefix_wait_seconds: float = 0.0
