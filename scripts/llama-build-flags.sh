# Sourced by scripts/llama-wheel and scripts/llama-server: how llama.cpp is built on this
# host, so Reame's library and the llama-server it is measured against run the same kernels.
#
# Expects `here` (the scripts folder). Sets `cpu_flags`, `cmake_args` (a CMAKE_ARGS string)
# and `patches` (the patches to apply to the vendored llama.cpp, in order).
#
# Compiled for the host's own instruction set (-march=native: fast). Intel AMX gets special
# care: the vendored ggml's AMX path dies in the first decode (its tile configuration can be
# optimised away, and tile-data permission is asked on one thread only). On a CPU with AMX
# the source is patched (patches/ggml-amx-tile-config.patch) and the AMX path kept: it gave
# 4.1x the prompt rate on SmolLM2 and 1.4x on Qwen2.5-Coder-1.5B (docs/BENCHMARKS.md).
# Elsewhere, or with REAME_NO_AMX=1, AMX is left out of the build.
#
# On a CPU with AMX the source also gets patches/ggml-amx-row-kernels.patch: ggml sends a
# product of one row through its VNNI kernel and anything larger through AMX tiles, which
# cost as much for 2 rows as for 16 (verifying a draft of one token cost 1.4-1.5x a plain step
# on SmolLM2, 1.6x on Qwen2.5-Coder-1.5B). The patch lets products of up to GGML_AMX_VNNI_ROWS
# rows use the row kernels, B unpacked once for up to 4 rows (Q4_1) or 8 (Q4_K, Q6_K); every
# row is computed as a one-row product computes it. Reame sets the switch; llama-server keeps
# ggml's own choice.
#
# On a CPU with AMX the source also gets patches/ggml-amx-wide-m.patch: ggml's AMX kernel for
# K-quant weights (Q4_K, Q5_K, Q6_K, IQ4_XS) unpacks each block of the weights into tiles
# again for every 32 rows of a product, for a last block of one row as for a full one: a
# prompt chunk of 33 tokens cost about 1.6 times one of 32 (benchmarks/amx_wide_m.py). With
# GGML_AMX_WIDE_M=1 products of 33 to 128 rows whose last block is partial unpack each block
# once and multiply it with every 16 rows in turn; each row is computed with the same
# operations in the same order.
# Reame sets the switch; llama-server keeps ggml's kernel.
#
# On every host the source gets patches/ggml-fa-row-exact.patch: a flash attention path that
# computes every query row the same way whatever its batch and thread count, taken only when
# GGML_FA_ROW_EXACT=1 is set (Reame's deterministic configuration sets it; llama-server,
# built from the same source, keeps llama.cpp's own paths). docs/ARCHITECTURE.md,
# "Determinism", says why.
#
# On every host the source gets patches/llama-graph-cache.patch: llama.cpp reuses a decode's
# graph only when the decode before had the same shape, and builds and allocates a new one
# otherwise; drafts verified between plain steps change the shape at almost every decode.
# With LLAMA_GRAPH_CACHE=N the context keeps N more graphs of up to LLAMA_GRAPH_CACHE_TOKENS
# tokens, each in a scheduler of its own, and reuses any that fits (benchmarks/graph_cache.py).
#
# On every host the source gets patches/ggml-hugepages.patch: with GGML_HUGEPAGES=1, on Linux,
# ggml asks for transparent huge pages for its buffers of 2 MiB or more, where the kernel
# gives them only to memory that asks (benchmarks/hugepages.py: in 4 KiB pages a decode's
# speed depended on where the weights landed). Reame sets both switches; llama-server keeps
# llama.cpp's ways.
#
# On every host the source gets patches/llama-kv-seq-regions.patch: with
# LLAMA_KV_SEQ_REGIONS=1 a unified KV cache gives each sequence a region of its own, where its
# cells sit as in a stream of its own, so one decode can hold any number of tokens per
# sequence and a sequence's attention still does not depend on its neighbours (per-sequence
# streams cut a batch into micro-batches of equal tokens per sequence). Reame's
# deterministic configuration sets it; llama-server keeps llama.cpp's ways.
#
# On every host the source gets patches/ggml-q4_1-row-groups.patch: where no repacked or AMX
# kernel takes Q4_1 weights (an AVX2 CPU), ggml multiplies them with each row of a product in
# turn, unpacking every block of the weights again for each row: a pass of 8 tokens cost 5.2
# one-token passes on SmolLM2 on an AMD EPYC without AVX-512. With GGML_Q4_1_ROW_GROUPS=1
# the rows go in groups of up to 8, each block unpacked once for the group; each row is
# computed with the operations of a one-row product, in the same order. Reame sets the
# switch; llama-server keeps ggml's kernel.
#
# On every host the source gets patches/ggml-k-quant-row-groups.patch: where no AMX kernel
# takes K-quant weights (x86 with AVX2), ggml multiplies repacked Q4_K weights with 4 rows at
# a time and the rest one by one, and Q6_K weights (no repacked kernel on x86) one row after
# another up to 7 rows and in its tiled kernel from 8; the 4-row and tiled kernels give a row
# other logits than a one-row product, and a pass of 8 tokens of Qwen2.5-Coder-1.5B cost 7.0
# one-token passes where one of 6 cost 4.2. With GGML_K_QUANT_ROW_GROUPS=N products of 2 to
# N rows go to row groups: each block of the weights unpacked once for all the rows, each row
# computed as a one-row product computes it. Reame sets the switch (a deterministic server:
# every product); llama-server keeps ggml's kernels.
#
# On every host the source gets patches/ggml-q8_0-row-groups.patch: where no AMX kernel takes
# Q8_0 weights (x86 with AVX2; SmolLM2's output layer is Q8_0), ggml hands every product of
# two rows or more to llamafile's kernel, made for products of many rows: SmolLM2's output
# layer cost about twice as much for two rows as for one there (benchmarks/q8_0_rows.py). With
# GGML_Q8_0_ROW_GROUPS=N products of 2 to N rows go to row groups: each block of the weights
# loaded once for up to eight rows, each row computed as a one-row product computes it (as
# llamafile's kernel computes it too). Reame sets the switch; llama-server keeps ggml's
# kernels.
#
# On every host the source gets patches/ggml-row-groups-chunk.patch: ggml hands a product of
# two rows or more to its threads in chunks of 16 weight rows (of one row, in chunks of 64),
# and each chunk costs a step of the threads' shared counter and a call, which in the row
# groups above converts its src1 rows' scales again: a pass of two tokens of SmolLM2 cost
# 1.56 one-token passes. With GGML_ROW_GROUPS_CHUNK=N products of 2 to 12 rows that the row
# groups take go in chunks of N weight rows; which thread computes a row changes, not how.
# Reame sets the switch (64); llama-server keeps ggml's chunks.
#
# On every host the source gets patches/ggml-read-ahead.patch: a decode step multiplies the
# weights with one row, reading each weight once, in order, and doing little with each byte:
# it runs at the speed its cores get the weights from memory; so, nearly, does a pass of a
# few tokens (a draft verified). With GGML_READ_AHEAD=N products of one row and of a few
# ask for the weights N bytes ahead of where they read, and on CPUs with AVX-512 VNNI
# repacked Q4_K weights (with VBMI too; one row, and the rows the K-quant row groups take)
# and the row groups' Q6_K weights (a few rows) go through kernels with fewer operations
# per byte: every output is computed as ggml's one-row kernel computes it, bit for bit.
# Qwen2.5-Coder-1.5B then decoded 1.37-1.44x faster on an Intel Xeon without AMX, and its
# passes of a few tokens cost fewer one-token steps (docs/BENCHMARKS.md). Reame sets the
# switch; llama-server keeps ggml's ways.
#
# On every host the source gets patches/ggml-q5_0-row-groups.patch: Q5_0 weights (the layers
# of Qwen2.5-0.5B whose rows of 896 values no K-quant takes) go, like Q8_0's, to llamafile's
# kernel for every product of two rows or more, made for products of many rows: a pass of
# two tokens of Qwen2.5-Coder-0.5B cost 1.33-1.54 one-token passes on an Intel Xeon without
# AMX. With GGML_Q5_0_ROW_GROUPS=N products of 2 to N rows go to the Q8_0 row groups, each
# block unpacked once for up to eight rows, each row computed as ggml's one-row product
# computes it. Reame sets the switch; llama-server keeps ggml's kernels.

cpu_flags=$(grep -m1 -E '^(flags|Features)' "${REAME_CPUINFO:-/proc/cpuinfo}" || true)
cmake_args="-DGGML_NATIVE=ON"
patches=(
    "$here/patches/ggml-fa-row-exact.patch"
    "$here/patches/llama-graph-cache.patch"
    "$here/patches/ggml-hugepages.patch"
    "$here/patches/llama-kv-seq-regions.patch"
    "$here/patches/ggml-q4_1-row-groups.patch"
    "$here/patches/ggml-k-quant-row-groups.patch"
    "$here/patches/ggml-q8_0-row-groups.patch"
    "$here/patches/ggml-row-groups-chunk.patch"
    "$here/patches/ggml-read-ahead.patch"
    "$here/patches/ggml-q5_0-row-groups.patch"
)
if [[ $(uname -m) == x86_64 ]]; then
    if [[ " $cpu_flags " == *" amx_int8 "* && ${REAME_NO_AMX:-0} != 1 ]]; then
        patches+=(
            "$here/patches/ggml-amx-tile-config.patch"
            "$here/patches/ggml-amx-row-kernels.patch"
            "$here/patches/ggml-amx-wide-m.patch"
        )
    else
        # GCC honours -mno-amx-* after -march=native.
        no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        cmake_args+=" -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
    fi
fi
