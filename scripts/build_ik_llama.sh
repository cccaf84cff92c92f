#!/usr/bin/env bash
# Builds ik_llama.cpp's llama-bench (and llama-quantize) from a source tree into a cache folder, for
# scripts/bench_ik.py. A benchmark peer only: never a dependency of modelyard, never committed.
#
#   scripts/build_ik_llama.sh SRC_DIR [CACHE_DIR] [--native]
#
# SRC_DIR is a checkout or export of https://github.com/ikawrakow/ik_llama.cpp. The build lands in
# CACHE_DIR (default ~/.cache/modelyard/peers/ik_llama) under a folder named by the tree's content
# hash, so a second run on the same source is a no-op; the last line printed is the bin folder.
#
# Flags: not -march=native by default, the instruction sets spelled out instead, as /work/llama's
# mainline build does (that one must keep ggml's AMX code off: it faults on quantized prompts on
# this host). ik_llama.cpp has no AMX code, but spelling the flags out keeps the two builds alike.
# ik's AVX-512 kernels ("fancy SIMD") need F, BW, DQ, VL and VNNI defined at compile time; its
# GGML_AVX512 option adds only F and BW, so DQ and VL are added by hand (VBMI too, which its Q8
# kernels use). On a CPU without AVX-512, pass --native.
set -euo pipefail

src=${1:?usage: build_ik_llama.sh SRC_DIR [CACHE_DIR] [--native]}
cache=${2:-$HOME/.cache/modelyard/peers/ik_llama}
native=0
for a in "$@"; do [[ $a == --native ]] && native=1; done
[[ $cache == --native ]] && cache=$HOME/.cache/modelyard/peers/ik_llama
[[ -f $src/ggml/src/iqk/iqk_config.h ]] || { echo "not an ik_llama.cpp tree: $src" >&2; exit 2; }

# Content hash of the sources that make the binary, plus the flags: the cache key.
key=$( (cd "$src" && find ggml src common examples/llama-bench include CMakeLists.txt cmake \
          -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.h' -o -name '*.txt' -o -name '*.cmake' \) \
          -print0 | sort -z | xargs -0 sha256sum; echo "native=$native") | sha256sum | cut -c1-12)
out=$cache/$key
if [[ -x $out/bin/llama-bench ]]; then echo "$out/bin"; exit 0; fi
mkdir -p "$out"

if (( native )); then
  flags=(-DGGML_NATIVE=ON)
else
  flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
         -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON
         -DGGML_AVXVNNI=ON
         "-DCMAKE_C_FLAGS=-mavx512dq -mavx512vl" "-DCMAKE_CXX_FLAGS=-mavx512dq -mavx512vl")
fi
# CPU only; no network code in the tools.
nice -n 10 cmake -S "$src" -B "$out/build" "${flags[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log" >&2; exit 1; }
nice -n 10 cmake --build "$out/build" -j "${JOBS:-2}" --target llama-bench llama-quantize \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }
mkdir -p "$out/bin"
# Shared libraries (if the build made any) sit beside the tools; RPATH points into build/.
cp "$out"/build/bin/llama-bench "$out"/build/bin/llama-quantize "$out/bin/"
echo "$out/bin"
