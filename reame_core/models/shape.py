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

# Bytes per element as llama.cpp stores them: q8_0 packs 32 values in 34 bytes.
KV_TYPE_BYTES: dict[KVType, float] = {"f16": 2.0, "q8_0": 34 / 32}


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
