#!/usr/bin/env bash
# ThreadSanitizer over the code that runs threads: the cpu thread pool, the kernels' parallel
# paths (matmul, batched and AMX GEMVs, attention), batched decode and `tessera serve` (its
# scheduler, the HTTP server, the OpenAI API tests; ServeE2E drives a running server with real
# clients). Builds build-tsan (RelWithDebInfo at -O1, as the ASan build) and runs those tests;
# exits non-zero on any report (halt_on_error). CI (.ci/run) runs it after the other suites.
# The TSan build's tessera_tests holds only those tests (CMakeLists.txt: TESSERA_SANITIZE_THREAD).
#   tools/tsan.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DTESSERA_SANITIZE_THREAD=ON >/dev/null
cmake --build build-tsan -j2 --target tessera tessera_tests
echo "tsan: build done in $(( $(date +%s) - start )) s"
# second_deadlock_stack: both stacks of a lock-order report. Every test of that tessera_tests
# and ServeE2E (the server driven by real clients); not the layer, install, crash-safety and
# page checks (ReportPageE2E is a whole deploy and a browser: 5 minutes under TSan for threads
# that the kernel and batched-decode tests already run).
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  ctest --test-dir build-tsan --output-on-failure -j2 -E '^(LayerCheck|InstallRelocatable|ChatPageE2E|ReportPageE2E|DeployCrashSafety)' "$@"
echo "tsan: done in $(( $(date +%s) - start )) s"
