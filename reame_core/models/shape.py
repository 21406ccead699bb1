"""The few architecture facts that size a model's memory: weights, KV cache, compute buffers.

Host auto-configuration plans from a `ModelShape`. It comes from the GGUF header of a file
on disk (`reame_core.backend.llama.read_model_shape`) or, before a download, from the
registry card, so `reame config qwen2.5-7b` can tell whether the model fits this host
before fetching 4.7 GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KVType = Literal["f16", "q8_0"]
# How a process holds the model's weights: read into its own memory (ggml's buffers, in huge
# pages where the host gives them to memory that asks) or mapped from the file (pages the
# kernel reads in and may drop, shared by every process that maps the file).
Weights = Literal["read", "mapped"]

# Bytes per element as llama.cpp stores them: q8_0 packs 32 values in 34 bytes.
KV_TYPE_BYTES: dict[KVType, float] = {"f16": 2.0, "q8_0": 34 / 32}


def stable_attention(
    flash_attn: bool, type_k: KVType, type_v: KVType, row_exact: bool = False
) -> bool:
    """Whether attention computes a query row the same way whatever else is in its batch and
    however many threads run it.

    ggml's CPU flash attention has three paths: a tiled one for chunks of 64 rows or more,
    one that splits the cache among the threads for a lone row against 512 cells or more,
    and a one-row path that walks the whole cache in order. The first two serve only f16
    keys with f16 values; with keys in q8_0 (or K and V of different types) every row takes
    the one-row path, whose result depends on neither (benchmarks/attention_paths.py).
    `row_exact`: the build has the row-exact path (scripts/patches/ggml-fa-row-exact.patch,
    switched on by `ROW_EXACT_ENV`) and the build check found it exact: every f16 row then
    takes the tiled kernel's arithmetic. Without flash attention the result depends on
    neither either, given the chunk grid."""
    return not flash_attn or row_exact or type_k != "f16" or type_v != "f16"


def default_kv_types(
    deterministic: bool, flash_attn: bool, row_exact: bool = False
) -> tuple[KVType, KVType]:
    """f16 keys and values; keys in q8_0 where that keeps attention stable."""
    keys: KVType = "q8_0" if deterministic and flash_attn and not row_exact else "f16"
    return keys, "f16"


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model file. `file_bytes` is what llama.cpp maps into memory."""

    file_bytes: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int

    def kv_bytes_per_token(self, type_k: KVType, type_v: KVType) -> float:
        """KV cache bytes one token occupies in one sequence, across all layers."""
        per_layer = self.n_head_kv * (
            self.head_dim_k * KV_TYPE_BYTES[type_k] + self.head_dim_v * KV_TYPE_BYTES[type_v]
        )
        return self.n_layer * per_layer

    def compute_buffer_bytes(self, n_batch: int, ctx_per_slot: int) -> int:
        """An upper estimate of llama.cpp's compute buffer for one decode call.

        Its largest tensors are the output logits (n_batch x n_vocab floats) and, without
        flash attention, the attention scores of one KV stream (n_batch x n_head x ctx).
        """
        return 4 * n_batch * (self.n_vocab + self.n_head * ctx_per_slot)
