"""`Backend` over llama.cpp's C API (llama-cpp-python's ctypes bindings, not its `Llama` class).

One model, one context with `n_seq_max` sequence slots. In the deterministic configuration
each sequence gets its own region of one KV buffer (or, where regions cannot be exact, its
own KV stream) and attention takes one path for every query row
(`models.shape.stable_attention`): that makes a sequence's logits independent of its batch
neighbours, of the thread count and of whether its prefix was restored or copied (see
docs/ARCHITECTURE.md, "Determinism").
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np
import structlog

from reame_core.backend.base import (
    Batch,
    DecodeError,
    equal_split_passes,
    simple_split_passes,
)
from reame_core.backend.probe import llama_library_dir
from reame_core.backend.probe_child import AMX_ROWS, AMX_ROWS_ENV, AMX_WIDE_M_ENV, ROW_EXACT_ENV
from reame_core.environment import variable_set
from reame_core.errors import ModelLoadError
from reame_core.hooktypes import FimTokens, ModelInfo
from reame_core.models.shape import KVType, ModelShape, Weights, default_kv_types

log = structlog.get_logger(__name__)

# ggml log levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
_LEVELS = {3: "warning", 4: "error"}


def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at load time; only its warnings and errors reach our log.
    name = _LEVELS.get(level)
    if name and text:
        getattr(log, name)("llama.cpp", message=text.decode("utf-8", "replace").rstrip())


# llama.cpp keeps a raw pointer to the callback: this module-level reference keeps it alive.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_route_llama_log)
llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def system_info() -> str:
    return bytes(llama_cpp.llama_print_system_info()).decode()


@functools.cache
def k_quant_row_groups() -> int:
    """The most rows of a product this process's build takes in K-quant row groups
    (`K_QUANT_ROW_GROUPS_ENV`, read by ggml once, at the first product or here: so only once
    `LlamaBackend` has set it): 0 where they are off or the build has none. They compute some
    products otherwise than ggml's kernels, so a model's fingerprint names them."""
    directory = llama_library_dir()
    for path in sorted(directory.glob("libggml-cpu*")) if directory else ():
        library = ctypes.CDLL(str(path))
        # The kernels exist only where the build has them (x86 with AVX2); the switch's
        # reader everywhere.
        if hasattr(library, "ggml_gemm_q6_K_q8_K_rows"):
            library.ggml_k_quant_row_groups_max.restype = ctypes.c_int
            return int(library.ggml_k_quant_row_groups_max())
    return 0


def build_has_llamafile() -> bool:
    """Whether the build has llamafile's matrix kernels, which take products of two rows or
    more for some weight types (whether a row then depends on its pass is measured per
    model: `backend.pass_check`)."""
    return "LLAMAFILE = 1" in system_info()


# A GGUF without a trained context length is old or odd; llama.cpp itself then uses 4096.
_UNKNOWN_TRAINED_CTX = 4096
# ggml's repacked quantized kernels multiply four rows of a micro-batch at a time and the rest
# one by one (repack.cpp); 16 covers that and kernels with groups of eight or sixteen.
CHUNK_GRID = 16
T = TypeVar("T")

# llama.cpp's buffers of 2 MiB or more in transparent huge pages (scripts/patches/
# ggml-hugepages.patch), where the kernel gives them only to memory that asks: in 4 KiB pages
# a decode's speed depended on where its weights landed. Read once, at the first buffer.
HUGEPAGES_ENV = "GGML_HUGEPAGES"

# Products of Q4_1 weights with several rows (drafts verified, sequences decoded together,
# prompt chunks) where no repacked or AMX kernel takes them, as on an AVX2 CPU: each block of
# the weights unpacked once for up to eight rows (scripts/patches/ggml-q4_1-row-groups.patch);
# every row bit-identical to a one-row product. Read once per process.
Q4_1_ROW_GROUPS_ENV = "GGML_Q4_1_ROW_GROUPS"

# Products of 2 to N rows with K-quant weights where no AMX kernel takes them (repacked Q4_K,
# Q6_K; x86 with AVX2): each block of the weights unpacked once for many rows, every row
# bit-identical to a one-row product, where ggml's 4-row and tiled kernels give rows other
# logits, depending on how many rows their pass holds (scripts/patches/
# ggml-k-quant-row-groups.patch). Deterministic: every product (`K_QUANT_ROW_GROUPS_EVERY`),
# so that a row's logits never depend on its pass, prompt chunks of any length included
# (their cost against ggml's kernels: docs/BENCHMARKS.md, "K-quant row groups on every
# product"); fast: up to a draft of `Settings.draft_max`'s default verified with the token
# after it, where they are faster than ggml's. Read once per process.
K_QUANT_ROW_GROUPS_ENV = "GGML_K_QUANT_ROW_GROUPS"
K_QUANT_ROW_GROUPS = 33
K_QUANT_ROW_GROUPS_EVERY = 1 << 30

# Products of 2 to N rows with Q8_0 weights (x86 with AVX2; SmolLM2's output layer, a Q8_0
# model's every layer), which ggml hands to llamafile's kernel from two rows on, made for
# products of many rows: each block of the weights loaded once for up to eight rows, every
# row bit-identical to a one-row product, as llamafile's rows are (scripts/patches/
# ggml-q8_0-row-groups.patch). N: the largest pass measured whole, 6-15% cheaper from 2 to 8
# rows (docs/BENCHMARKS.md, "Q8_0 row groups"): up to eight sequences decoded together,
# drafts of up to seven tokens verified. Read once per process.
Q8_0_ROW_GROUPS_ENV = "GGML_Q8_0_ROW_GROUPS"
Q8_0_ROW_GROUPS = 8

# The same for Q5_0 weights (the layers of Qwen2.5-0.5B whose rows of 896 values no K-quant
# takes), in the same row groups (scripts/patches/ggml-q5_0-row-groups.patch); every row
# bit-identical to a one-row product. Read once per process.
Q5_0_ROW_GROUPS_ENV = "GGML_Q5_0_ROW_GROUPS"
Q5_0_ROW_GROUPS = 8

# Products of 2 to 12 rows that the row groups above take (Q4_1, Q8_0, Q5_0, Q6_K) handed to the
# threads in chunks of this many weight rows, as products of one row are, not ggml's 16: each
# chunk costs a step of the threads' shared counter and a call that converts its src1 rows'
# scales again (scripts/patches/ggml-row-groups-chunk.patch). Which thread computes a row
# changes, not how. Read once per process.
ROW_GROUPS_CHUNK_ENV = "GGML_ROW_GROUPS_CHUNK"
ROW_GROUPS_CHUNK = 64

# Products of one row (decode steps) and of a few (drafts verified) ask for the weights this
# many bytes ahead of where they read, and on CPUs with AVX-512 VNNI take repacked Q4_K
# weights (with VBMI too) and the row groups' Q6_K weights through kernels with fewer
# operations per byte (scripts/patches/ggml-read-ahead.patch): they run at the speed their
# cores get the weights. Every output bit-identical. Read once per process.
READ_AHEAD_ENV = "GGML_READ_AHEAD"
READ_AHEAD = 4096

# Graphs llama.cpp keeps besides the last decode's (scripts/patches/llama-graph-cache.patch):
# it reuses a decode's graph only when the decode before had the same shape, and a draft
# verified between plain steps changes the shape at almost every step. With the switch it
# keeps this many more graphs of up to `GRAPH_CACHE_TOKENS` tokens, each in a scheduler of
# its own, and reuses any that fits (up to a draft of `Settings.draft_max`'s default verified
# with the token after it). Read at each context's creation; builds without the patch
# ignore it.
GRAPH_CACHE_ENV = "LLAMA_GRAPH_CACHE"
GRAPH_CACHE = 8
GRAPH_CACHE_TOKENS_ENV = "LLAMA_GRAPH_CACHE_TOKENS"
GRAPH_CACHE_TOKENS = 33

# One KV buffer with a region for each sequence (scripts/patches/llama-kv-seq-regions.patch):
# a sequence's cells sit in its region as they would in a KV stream of its own, so with the
# row-exact attention path its logits still do not depend on its neighbours, and a decode
# need not give every sequence as many tokens: llama.cpp cuts a batch over per-sequence
# streams into micro-batches of equal tokens per sequence, each a pass over the weights.
# llama.cpp reads the switch as it makes a context, so each backend sets it to its own choice
# while it makes its context (under `_CONTEXT_LOCK`); what the environment holds as this
# module loads says whether regions are wanted at all ("0": keep streams). Builds without the
# patch do not export `llama_kv_seq_regions_supported` and keep per-sequence streams.
KV_REGIONS_ENV = "LLAMA_KV_SEQ_REGIONS"
_REGIONS_WANTED = os.environ.get(KV_REGIONS_ENV, "1")
_CONTEXT_LOCK = threading.Lock()

# Up to this many tokens, setting the llama_batch's items one by one is cheaper than
# building arrays and copying them (decode steps, short drafts).
_FEW = 32
_GGML_TYPES: dict[KVType, int] = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}


def _row_exact_on(type_k: KVType, type_v: KVType) -> bool:
    """Whether flash attention with these types takes the row-exact path (in a build that
    has it): f16 keys and values, the switch on."""
    return type_k == type_v == "f16" and _switch_on(os.environ.get(ROW_EXACT_ENV, ""))


def _switch_on(value: str) -> bool:
    """A build switch's value as llama.cpp and ggml read it (`atoi`, non-zero): on."""
    value = value.strip()
    return value.isdigit() and int(value) != 0


def _regions_supported() -> bool:
    """Whether this llama.cpp build has sequence regions (`KV_REGIONS_ENV`)."""
    return hasattr(llama_cpp.llama_cpp._lib, "llama_kv_seq_regions_supported")


@contextmanager
def _header_only(path: str | Path) -> Iterator[Any]:
    """The model's vocabulary and metadata, without its weights (llama.cpp `vocab_only`)."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(f"llama.cpp could not read {path} (not a GGUF model?)")
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


def read_model_shape(path: Path) -> ModelShape:
    """The sizes host auto-configuration needs, from the GGUF metadata alone.

    A model that stores per-layer head counts (an array, which the metadata strings skip)
    is sized as if every head had its own KV: an overestimate, never an underestimate.
    """
    with _header_only(path) as model:
        arch = _meta(model, "general.architecture") or ""

        def number(key: str) -> int | None:
            value = _meta(model, f"{arch}.{key}")
            return int(value) if value is not None and value.isdigit() else None

        n_embd, n_layer = number("embedding_length"), number("block_count")
        if not n_embd or not n_layer:
            raise ModelLoadError(f"{path} lacks the {arch} sizes llama.cpp needs")
        n_head = number("attention.head_count") or max(1, n_embd // 128)
        head_dim = n_embd // n_head
        return ModelShape(
            file_bytes=path.stat().st_size,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=number("attention.head_count_kv") or n_head,
            head_dim_k=number("attention.key_length") or head_dim,
            head_dim_v=number("attention.value_length") or head_dim,
            n_vocab=llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)),
            n_ctx_train=number("context_length") or _UNKNOWN_TRAINED_CTX,
        )


def _meta(model: Any, key: str) -> str | None:
    """A GGUF metadata value as text, or None if the file has no such key."""
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace")


class LlamaVocabulary:
    """The model's vocabulary through llama.cpp's ``const llama_vocab *``: `llama_tokenize`
    and `llama_token_to_piece` only read it (each call keeps its state on its own stack, and
    llama-server tokenizes on its HTTP threads the same way), and ctypes releases the GIL
    while they run. So any thread may tokenize while the engine thread decodes. It lives as
    long as the model: the backend closes it before freeing the model."""

    def __init__(self, vocab: Any) -> None:
        self._vocab = vocab
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self._pieces: dict[tuple[int, bool], bytes] = {}  # filled lazily; races only repeat work
        self._all: list[bytes] | None = None
        self._all_lock = threading.Lock()
        self._control: frozenset[int] | None = None

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def _live(self) -> Any:
        if self._vocab is None:
            raise ModelLoadError("The model was closed; its vocabulary is gone.")
        return self._vocab

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        vocab = self._live()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                vocab, data, len(data), buf, capacity, add_special, parse_special
            )
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            vocab = self._live()
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:n]
            self._pieces[key] = piece
        return piece

    def pieces(self) -> Sequence[bytes]:
        with self._all_lock:
            if self._all is None:
                self._all = [self.token_bytes(t, special=True) for t in range(self._n_vocab)]
            return self._all

    def control_tokens(self) -> frozenset[int]:
        if self._control is None:
            vocab = self._live()
            pieces = self.pieces()
            control = set()
            for token in range(self._n_vocab):
                attr = llama_cpp.llama_vocab_get_attr(vocab, token)
                piece = pieces[token]
                tag = piece.startswith(b"<") and piece.endswith(b">")
                if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
                    attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and tag
                ):
                    control.add(token)
            self._control = frozenset(control)
        return self._control

    def close(self) -> None:
        self._vocab = None

    def __repr__(self) -> str:
        return f"<LlamaVocabulary {self._n_vocab} tokens>"


def file_digest(path: Path) -> str:
    """Identity of a model file: size plus hashes of its head and tail (cheap on 5 GB)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        if size > 2 << 20:
            handle.seek(-(1 << 20), os.SEEK_END)
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()


def _on_a_thread_of_its_own(call: Callable[..., T], *args: Any, free: Callable[[T], Any]) -> T:
    """`call(*args)` on a thread that ends with it, its exception raised here; interrupted
    while waiting, the call is let finish and what it made is given to `free`.

    Loading a model runs OpenMP parallel loops (ggml's AMX path repacks the weights in
    them), and the thread that runs one keeps a team of OpenMP workers for as long as it
    lives. With more threads under OpenMP than the process has cores, libgomp spins only
    ~100 times at a barrier before it sleeps, so every decode on another thread (the
    engine's) then waits on futexes at each of its barriers: SmolLM2 decoded at 29 tok/s
    instead of 172 on the 2-vCPU Intel Xeon with AMX when the model was loaded on the
    thread that went on to wait for the engine. A thread that ends takes its team with it.
    """
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call(*args))
        except BaseException as error:  # raised again on the caller's thread
            errors.append(error)

    thread = threading.Thread(target=run, name="reame-llama-load")
    thread.start()
    try:
        thread.join()
    except BaseException:  # Ctrl-C while waiting: a C call cannot be stopped midway
        thread.join()
        if results and results[0]:
            free(results[0])
        raise
    if errors:
        raise errors[0]
    return results[0]


class LlamaBackend:
    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx_seq: int = 4096,
        n_seq_max: int = 4,
        n_batch: int = 512,
        n_threads: int = 2,
        deterministic: bool = True,
        flash_attn: bool = True,
        type_k: KVType | None = None,
        type_v: KVType | None = None,
        name: str | None = None,
        use_extra_bufts: bool = True,
        weights: Weights = "mapped",
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"Model file not found: {self.path}")
        # Products of a few rows (drafts verified, sequences decoded together) through the
        # AMX build's row kernels: bit-identical rows, faster than AMX tiles. Before the
        # first product, as ggml reads it once; GGML_AMX_VNNI_ROWS=1 keeps ggml's choice.
        os.environ.setdefault(AMX_ROWS_ENV, str(AMX_ROWS))
        # Products of many rows (prompt chunks) with K-quant weights unpack each block of the
        # weights once for all rows, not once per 32 (bit-identical rows).
        os.environ.setdefault(AMX_WIDE_M_ENV, "1")
        os.environ.setdefault(HUGEPAGES_ENV, "1")
        os.environ.setdefault(Q4_1_ROW_GROUPS_ENV, "1")
        os.environ.setdefault(
            K_QUANT_ROW_GROUPS_ENV,
            str(K_QUANT_ROW_GROUPS_EVERY if deterministic else K_QUANT_ROW_GROUPS),
        )
        os.environ.setdefault(Q8_0_ROW_GROUPS_ENV, str(Q8_0_ROW_GROUPS))
        os.environ.setdefault(Q5_0_ROW_GROUPS_ENV, str(Q5_0_ROW_GROUPS))
        os.environ.setdefault(ROW_GROUPS_CHUNK_ENV, str(ROW_GROUPS_CHUNK))
        os.environ.setdefault(READ_AHEAD_ENV, str(READ_AHEAD))
        model_params = llama_cpp.llama_model_default_params()
        # False keeps weights out of CPU_REPACK and AMX buffers: the build check's fallback
        # where the default load crashes (reame_core/backend/probe.py).
        model_params.use_extra_bufts = use_extra_bufts
        # Read: the weights land in ggml's buffers, which ask for huge pages (HUGEPAGES_ENV);
        # a mapped file's pages are 4 KiB, and a decode reads every weight.
        model_params.load_mode = (
            llama_cpp.LLAMA_LOAD_MODE_NONE if weights == "read" else llama_cpp.LLAMA_LOAD_MODE_AUTO
        )
        self._model = _on_a_thread_of_its_own(
            llama_cpp.llama_model_load_from_file,
            str(self.path).encode(),
            model_params,
            free=llama_cpp.llama_model_free,
        )
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path} (not a GGUF model?)")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.vocab = LlamaVocabulary(self._vocab)
        n_ctx_seq = min(n_ctx_seq, llama_cpp.llama_model_n_ctx_train(self._model))

        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx_seq * n_seq_max
        ctx_params.n_batch = n_batch
        ctx_params.n_ubatch = n_batch
        ctx_params.n_seq_max = n_seq_max
        ctx_params.n_threads = n_threads
        ctx_params.n_threads_batch = n_threads
        ctx_params.no_perf = True
        default_k, default_v = default_kv_types(deterministic, flash_attn)
        type_k, type_v = type_k or default_k, type_v or default_v
        ctx_params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        if type_v != "f16" and not flash_attn:
            # llama.cpp refuses the context otherwise; say why instead of "could not create".
            raise ModelLoadError(f"A {type_v} V cache needs flash attention, which is off.")
        ctx_params.type_k = _GGML_TYPES[type_k]
        ctx_params.type_v = _GGML_TYPES[type_v]
        if deterministic and flash_attn and type_k == type_v == "f16":
            # The row-exact path (scripts/patches/ggml-fa-row-exact.patch) for this process:
            # ggml reads the switch once, at the first attention it computes, so it is set
            # before this model runs, and a process serves one configuration. A build
            # without the patch ignores it; the build check then finds f16 flash attention
            # inexact and the plan keeps q8_0 keys. GGML_FA_ROW_EXACT=0 turns it off.
            os.environ.setdefault(ROW_EXACT_ENV, "1")
        # Regions keep attention exact on the row-exact path only: its tiles of cells start
        # on multiples of 64 from cell 0, as regions do. Not with a sliding window, whose
        # cache reuses a sequence's old cells, nor for recurrent states, which llama.cpp
        # always cuts into micro-batches of equal tokens.
        self.regions = (
            deterministic
            and n_seq_max > 1
            and flash_attn
            and _row_exact_on(type_k, type_v)
            and llama_cpp.llama_model_n_swa(self._model) == 0
            and not llama_cpp.llama_model_is_recurrent(self._model)
            and not llama_cpp.llama_model_is_hybrid(self._model)
            and n_ctx_seq % 256 == 0  # regions are a multiple of 256 cells
            and _regions_supported()
            and _switch_on(_REGIONS_WANTED)
        )
        ctx_params.kv_unified = self.regions or not deterministic
        os.environ.setdefault(GRAPH_CACHE_ENV, str(GRAPH_CACHE))
        os.environ.setdefault(GRAPH_CACHE_TOKENS_ENV, str(GRAPH_CACHE_TOKENS))
        try:
            with _CONTEXT_LOCK, variable_set(KV_REGIONS_ENV, "1" if self.regions else "0"):
                self._ctx = _on_a_thread_of_its_own(
                    llama_cpp.llama_init_from_model,
                    self._model,
                    ctx_params,
                    free=llama_cpp.llama_free,
                )
        except BaseException:
            llama_cpp.llama_model_free(self._model)
            raise
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        for i in range(n_batch):
            self._batch.n_seq_id[i] = 1
        self._n_vocab = self.vocab.n_vocab
        self._logit_views: dict[tuple[int, int], np.ndarray] = {}
        self.deterministic = deterministic
        self.flash_attn = flash_attn
        self._info = self._describe(
            name or self.path.stem,
            # llama.cpp reports a unified buffer whole; a region holds what a stream would
            n_ctx_seq=n_ctx_seq if self.regions else llama_cpp.llama_n_ctx_seq(self._ctx),
            n_seq_max=n_seq_max,
            n_batch=n_batch,
            settings_key=f"unified={not deterministic}/fa={flash_attn}/seqs={n_seq_max}"
            + ("/regions" if self.regions else "")
            # The row-exact path computes f16 attention along other paths than ggml's own.
            + ("/rows=exact" if flash_attn and _row_exact_on(type_k, type_v) else "")
            # Other weight buffers compute with other kernels: not the same KV bytes.
            + ("" if use_extra_bufts else "/no-extra-bufts"),
            kv_type=type_k if type_k == type_v else f"{type_k}/{type_v}",
            n_threads=n_threads,
            use_extra_bufts=use_extra_bufts,
            weights=weights,
        )

    # ------------------------------------------------------------------ facts

    def _describe(
        self,
        name: str,
        *,
        n_ctx_seq: int,
        n_seq_max: int,
        n_batch: int,
        settings_key: str,
        kv_type: str,
        n_threads: int,
        use_extra_bufts: bool,
        weights: Weights,
    ) -> ModelInfo:
        vocab = self._vocab

        def token_or_none(token: int) -> int | None:
            return token if token >= 0 else None

        fim_ids = (
            llama_cpp.llama_vocab_fim_pre(vocab),
            llama_cpp.llama_vocab_fim_suf(vocab),
            llama_cpp.llama_vocab_fim_mid(vocab),
        )
        template = llama_cpp.llama_model_chat_template(self._model, None)
        architecture = _meta(self._model, "general.architecture") or "unknown"
        trim_safe = not (
            llama_cpp.llama_model_n_swa(self._model) > 0
            or llama_cpp.llama_model_is_recurrent(self._model)
            or llama_cpp.llama_model_is_hybrid(self._model)
        )
        eog = frozenset(t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        # The build takes part: another llama.cpp version or CPU kernel set may lay out or
        # compute the KV otherwise, and a restored state must equal a cold prefill's.
        build = f"llama.cpp={llama_cpp.__version__}/{system_info()}"
        # So does the chunk grid: it decides how a restored state's tokens were computed.
        parts = [file_digest(self.path), architecture, f"kv={kv_type}", settings_key, build]
        parts.append(f"grid={CHUNK_GRID}")
        # And Reame's K-quant row groups, where on: they compute products of a few rows
        # otherwise than the build without them (a restored state would not be a cold one).
        if rows := k_quant_row_groups():
            parts.append(f"k-quant-rows={'all' if rows >= K_QUANT_ROW_GROUPS_EVERY else rows}")
        fingerprint = hashlib.sha256("/".join([*parts, "state-v1"]).encode()).hexdigest()[:32]
        extra: dict[str, Any] = {
            "n_params": llama_cpp.llama_model_n_params(self._model),
            "size_bytes": llama_cpp.llama_model_size(self._model),
            "n_swa": llama_cpp.llama_model_n_swa(self._model),
            "llamafile": build_has_llamafile(),
            "use_extra_bufts": use_extra_bufts,
            "flash_attn": self.flash_attn,
            "weights": weights,
        }
        return ModelInfo(
            name=name,
            path=str(self.path),
            fingerprint=fingerprint,
            architecture=architecture,
            n_vocab=self._n_vocab,
            n_ctx_seq=n_ctx_seq,
            n_seq_max=n_seq_max,
            n_batch=n_batch,
            bos=token_or_none(llama_cpp.llama_vocab_bos(vocab)),
            eos=token_or_none(llama_cpp.llama_vocab_eos(vocab)),
            eog=eog,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            fim=FimTokens(*fim_ids) if all(t >= 0 for t in fim_ids) else None,
            chat_template=template.decode("utf-8") if template else None,
            prefix_trim_safe=trim_safe,
            vocab=self.vocab,
            kv_type=kv_type,
            n_threads=n_threads,
            extra=extra,
            chunk_grid=CHUNK_GRID,
        )

    @property
    def info(self) -> ModelInfo:
        return self._info

    # ------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.vocab.token_bytes(token, special=special)

    # ------------------------------------------------------------------ decode

    def decode(self, batch: Batch) -> np.ndarray:
        n = len(batch)
        if not 0 < n <= self._info.n_batch:
            # llama.cpp aborts the process on an oversized batch; never hand it one.
            raise DecodeError(f"batch of {n} tokens exceeds n_batch {self._info.n_batch}")
        b = self._batch
        if n <= _FEW:
            token, pos, want, seq_id = b.token, b.pos, b.logits, b.seq_id
            for i in range(n):
                token[i] = batch.tokens[i]
                pos[i] = batch.positions[i]
                want[i] = batch.want_logits[i]
                seq_id[i][0] = batch.seq_ids[i]
        else:
            tokens = array("i", batch.tokens)
            positions = array("i", batch.positions)
            flags = array("b", batch.want_logits)
            ctypes.memmove(b.token, tokens.buffer_info()[0], 4 * n)
            ctypes.memmove(b.pos, positions.buffer_info()[0], 4 * n)
            ctypes.memmove(b.logits, flags.buffer_info()[0], n)
            seq_id = b.seq_id
            for i, seq in enumerate(batch.seq_ids):
                seq_id[i][0] = seq
        b.n_tokens = n
        status = llama_cpp.llama_decode(self._ctx, b)
        if status != 0:
            raise DecodeError(f"llama_decode returned {status}")
        n_out = batch.n_outputs
        if n_out == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        return self._logits_view(n_out)

    def _logits_view(self, n_out: int) -> np.ndarray:
        # Wrapping the pointer costs ~40 us, a visible share of a 7 ms decode step; the
        # buffer moves only when llama.cpp grows it, so keep one view per address and size.
        pointer = llama_cpp.llama_get_logits(self._ctx)
        key = (ctypes.cast(pointer, ctypes.c_void_p).value or 0, n_out)
        view = self._logit_views.get(key)
        if view is None:
            if len(self._logit_views) > 64:
                self._logit_views.clear()
            view = np.ctypeslib.as_array(pointer, shape=(n_out, self._n_vocab))
            self._logit_views[key] = view
        return view

    # ------------------------------------------------------------------ memory

    def passes(self, layout: Sequence[tuple[int, int]]) -> list[int]:
        n_batch = self._info.n_batch
        if self.deterministic and self._info.n_seq_max > 1 and not self.regions:
            return equal_split_passes(layout, n_batch)  # one KV stream per sequence
        return simple_split_passes(sum(n for _seq, n in layout), n_batch)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int) -> None:
        if self.deterministic and self._info.n_seq_max > 1:
            # A region per sequence: llama.cpp's copy would share `src`'s cells, outside
            # `dst`'s region. One KV stream per sequence: llama.cpp copies a stream's buffer
            # only at the start of the next decode, after recording the cells at once. A
            # state restored into `dst` before then (a stored prefix after a resident one)
            # was overwritten by the copy, and one written into `src` was copied instead:
            # the prompt's KV then held another text's, and greedy answers changed with what
            # ran before. A state round trip copies now.
            if llama_cpp.llama_memory_seq_pos_max(self._memory, src) < 0:  # nothing to copy
                llama_cpp.llama_memory_seq_rm(self._memory, dst, -1, -1)
                return
            state = self.get_seq_state(src)
            if not self.set_seq_state(dst, state):
                raise DecodeError(f"llama.cpp refused to copy sequence {src} to {dst}")
            return
        llama_cpp.llama_memory_seq_rm(self._memory, dst, -1, -1)
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, -1, -1)

    def get_seq_state(self, seq_id: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, seq_id)
        return bytes(memoryview(buf)[:written])

    def set_seq_state(self, seq_id: int, state: bytes) -> bool:
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        read = llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(state), seq_id)
        if read == 0:
            llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            return False
        return True

    def set_threads(self, n_threads: int) -> None:
        llama_cpp.llama_set_n_threads(self._ctx, n_threads, n_threads)

    def close(self) -> None:
        if self._ctx:
            self.vocab.close()
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            llama_cpp.llama_model_free(self._model)
            self._ctx = None
            self._model = None
