#!/usr/bin/env bash
# Builds the llama.cpp that llama-cpp-python 0.3.36 vendors with ggml's AMX path, patched so
# that it runs (scripts/patches/ggml-amx-tile-config.patch: the tile configuration in static
# storage, and tile-data permission asked on every thread that uses tiles), as a bare library
# with llama-bench. Prints the library directory, for build_choices.py --lib or
# LLAMA_CPP_LIB_PATH. --stock builds it unpatched. scripts/llama-wheel makes the wheel Reame
# installs on an AMX host from the same patch.
#
#   benchmarks/amx_build.sh [--stock] [WORKDIR]
set -euo pipefail
patch=true variant=patched
if [[ ${1:-} == --stock ]]; then patch=false variant=stock; shift; fi
here=$(cd "$(dirname "$0")" && pwd)
# Each variant has a source tree of its own: a stock build never picks up an earlier patch.
work=${1:-/tmp/reame-amx-build}/$variant
mkdir -p "$work" && cd "$work"
if [[ ! -d llama_cpp_python-0.3.36 ]]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 >&2
    tar xzf llama_cpp_python-0.3.36.tar.gz
fi
src=llama_cpp_python-0.3.36/vendor/llama.cpp
if $patch && ! grep -q amx_tile_config "$src/ggml/src/ggml-cpu/amx/mmq.cpp"; then
    patch -d "$src" -p1 < "$here/../scripts/patches/ggml-amx-tile-config.patch" >&2
fi
cmake -S "$src" -B build -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build -j "$(nproc)" --target llama llama-bench >&2
echo "$work/build/bin"
