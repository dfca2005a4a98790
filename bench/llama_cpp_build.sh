#!/usr/bin/env bash
# llama.cpp's peer tools (llama-bench, llama-perplexity, llama-quantize, llama-tokenize,
# llama-server),
# built once from the llama.cpp vendored in the source distribution of the PyPI package
# llama-cpp-python (pinned below) under ${TESSERA_CACHE:-$HOME/.cache/tessera}/llama.cpp.
#
# Sourced by the bench scripts:
#   source "$ROOT/bench/llama_cpp_build.sh"
#   llama_cpp_build || exit 1       # then "$LLAMA_CPP_BIN/llama-perplexity" ...
# or run on its own, which builds (if needed) and prints the directory of the binaries:
#   bench/llama_cpp_build.sh
# LLAMA_BUILD_JOBS (default 2) sets the build's parallelism; the build runs under `nice`.
# The first build takes about 15 minutes on 2 cores; later calls return at once.

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_CACHE=${TESSERA_CACHE:-$HOME/.cache/tessera}/llama.cpp
LLAMA_CPP_SDIST=$LLAMA_CPP_CACHE/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
LLAMA_CPP_SRC=$LLAMA_CPP_CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
LLAMA_CPP_BUILD=$LLAMA_CPP_CACHE/build-$LLAMA_CPP_PYTHON_VERSION
LLAMA_CPP_BIN=$LLAMA_CPP_BUILD/bin
LLAMA_CPP_LOG=$LLAMA_CPP_BUILD.log
LLAMA_CPP_TARGETS=(llama-bench llama-perplexity llama-quantize llama-tokenize llama-server)
LLAMA_CPP_CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
                       -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
                       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF
                       -DLLAMA_BUILD_TOOLS=ON)
# On a CPU with AMX, this llama.cpp's AMX kernels crash on quantized weights (Q4_0, Q4_1,
# Q8_0, K-quants: a segfault in ggml_backend_amx_mul_mat; upstream ggml-org/llama.cpp#20824),
# and --no-repack avoids it only by also turning off llama.cpp's fastest CPU path for those
# types. So there llama.cpp is built for every other feature this VM's CPU has (AVX-512 with
# VBMI, VNNI and BF16) and AMX off, in a build directory of its own: its best path that runs.
#
# LLAMA_CPP_ISA=avx2 builds the peer for AVX2 alone (AVX2, FMA, F16C, BMI2; no AVX-512, no
# AVX-VNNI, no AMX) in a build directory of its own: the peer of tessera with its kernels
# forced to the AVX2 path (TESSERA_ISA=AVX2), so that both sides of a comparison run the
# instructions an AVX2-only CPU (an AMD EPYC before Zen 4, most laptops) has.
# An explicit instruction set instead of GGML_NATIVE, in a build directory of its own
# ($1): AVX2, FMA, F16C, BMI2; AVX-512 (with VBMI, VNNI, BF16) and AVX-VNNI ON or OFF ($2);
# AMX off.
_llama_cpp_explicit_isa() {
  LLAMA_CPP_CMAKE_FLAGS=("${LLAMA_CPP_CMAKE_FLAGS[@]/-DGGML_NATIVE=ON/-DGGML_NATIVE=OFF}"
                         -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                         "-DGGML_AVX512=$2" "-DGGML_AVX512_VBMI=$2" "-DGGML_AVX512_VNNI=$2"
                         "-DGGML_AVX512_BF16=$2" "-DGGML_AVX_VNNI=$2"
                         -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  LLAMA_CPP_BUILD=$LLAMA_CPP_BUILD-$1
  LLAMA_CPP_BIN=$LLAMA_CPP_BUILD/bin
  LLAMA_CPP_LOG=$LLAMA_CPP_BUILD.log
}
if [ "${LLAMA_CPP_ISA:-native}" = avx2 ]; then
  _llama_cpp_explicit_isa avx2 OFF
elif [ "${LLAMA_CPP_ISA:-native}" != native ]; then
  echo "llama_cpp_build: error: LLAMA_CPP_ISA must be native or avx2, got '$LLAMA_CPP_ISA'" >&2
  return 1 2>/dev/null || exit 1
elif grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  _llama_cpp_explicit_isa noamx ON
fi

_llama_cpp_say() { echo "llama_cpp_build: $*" >&2; }
_llama_cpp_fail() { echo "llama_cpp_build: error: $*" >&2; return 1; }

# Fetches, unpacks, configures and builds whatever of LLAMA_CPP_TARGETS is missing (or all
# of them when the configure flags changed). Returns non-zero after saying why.
llama_cpp_build() {
  mkdir -p "$LLAMA_CPP_CACHE" || _llama_cpp_fail "cannot create $LLAMA_CPP_CACHE" || return 1
  if [ ! -f "$LLAMA_CPP_SDIST" ]; then
    local pip
    pip=$(command -v pip || command -v pip3) || _llama_cpp_fail "pip is needed to fetch llama-cpp-python" || return 1
    _llama_cpp_say "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (source distribution) ..."
    mkdir -p "$LLAMA_CPP_CACHE/sdist"
    "$pip" download --quiet --no-binary :all: --no-deps -d "$LLAMA_CPP_CACHE/sdist" \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 || _llama_cpp_fail "pip download of llama-cpp-python failed" || return 1
    [ -f "$LLAMA_CPP_SDIST" ] || _llama_cpp_fail "pip did not leave $LLAMA_CPP_SDIST" || return 1
  fi
  if [ ! -f "$LLAMA_CPP_SRC/CMakeLists.txt" ]; then
    _llama_cpp_say "unpacking $(basename "$LLAMA_CPP_SDIST") ..."
    mkdir -p "$LLAMA_CPP_CACHE/src"
    tar -xzf "$LLAMA_CPP_SDIST" -C "$LLAMA_CPP_CACHE/src" || _llama_cpp_fail "could not unpack $LLAMA_CPP_SDIST" || return 1
    [ -f "$LLAMA_CPP_SRC/CMakeLists.txt" ] || _llama_cpp_fail "$LLAMA_CPP_SDIST holds no vendor/llama.cpp" || return 1
  fi
  local stamp=$LLAMA_CPP_BUILD/tessera-cmake-flags missing=() t
  if [ "$(cat "$stamp" 2>/dev/null)" != "${LLAMA_CPP_CMAKE_FLAGS[*]}" ]; then
    missing=("${LLAMA_CPP_TARGETS[@]}")
  else
    for t in "${LLAMA_CPP_TARGETS[@]}"; do [ -x "$LLAMA_CPP_BIN/$t" ] || missing+=("$t"); done
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    local gen=()
    command -v ninja >/dev/null && [ ! -f "$LLAMA_CPP_BUILD/CMakeCache.txt" ] && gen=(-G Ninja)
    _llama_cpp_say "building ${missing[*]} (llama.cpp from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION; takes minutes; log: $LLAMA_CPP_LOG) ..."
    nice cmake -S "$LLAMA_CPP_SRC" -B "$LLAMA_CPP_BUILD" "${gen[@]}" "${LLAMA_CPP_CMAKE_FLAGS[@]}" >"$LLAMA_CPP_LOG" 2>&1 \
      || _llama_cpp_fail "configuring llama.cpp failed (see $LLAMA_CPP_LOG)" || return 1
    nice cmake --build "$LLAMA_CPP_BUILD" --target "${missing[@]}" -j "${LLAMA_BUILD_JOBS:-2}" >>"$LLAMA_CPP_LOG" 2>&1 \
      || _llama_cpp_fail "building ${missing[*]} failed (see $LLAMA_CPP_LOG)" || return 1
    echo "${LLAMA_CPP_CMAKE_FLAGS[*]}" >"$stamp"
  fi
  for t in "${LLAMA_CPP_TARGETS[@]}"; do
    [ -x "$LLAMA_CPP_BIN/$t" ] || _llama_cpp_fail "$LLAMA_CPP_BIN/$t was not built (see $LLAMA_CPP_LOG)" || return 1
  done
}

# Run directly: build, then print where the binaries are.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "llama_cpp_build: error: no arguments expected (see --help)" >&2; exit 1 ;;
  esac
  llama_cpp_build || exit 1
  echo "$LLAMA_CPP_BIN"
fi
