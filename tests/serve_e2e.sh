#!/usr/bin/env bash
# ctest ServeE2E: runs tests/serve_e2e.py against `tessera serve` with the official `openai`
# package from PyPI, in the test clients' Python environment (tests/serve_venv.sh; skipped,
# exit 77, with the reason when it cannot be made); curl is needed too.
set -uo pipefail
BIN="$1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/serve_venv.sh"
command -v curl >/dev/null || skip "curl is not installed"
serve_venv openai -- openai
exec "$VENV/bin/python" "$HERE/serve_e2e.py" "$BIN"
