#!/usr/bin/env bash
# Sets up (deps, default model, tokenizer files, tessera), builds the tests, and runs the whole test suite with ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
echo "test: building the tests and tools"
cmake --build build -j2
ctest --test-dir build --output-on-failure -j2 "$@"
