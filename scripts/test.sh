#!/usr/bin/env bash
# Sets up (deps, default model, build) and runs the whole test suite with ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
ctest --test-dir build --output-on-failure -j2 "$@"
