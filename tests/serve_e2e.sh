#!/usr/bin/env bash
# ctest ServeE2E: makes the test clients' Python environment (the official `openai`
# package from PyPI) and runs tests/serve_e2e.py against `tessera serve`. The environment
# lives outside the repository: $TESSERA_SERVE_VENV, default $HOME/.cache/tessera/serve-venv
# (like tools/reference's). When it cannot be made (no python3-venv, no network to PyPI),
# the test is skipped (exit 77) with the reason; curl is needed too.
set -uo pipefail
BIN="$1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${TESSERA_SERVE_VENV:-$HOME/.cache/tessera/serve-venv}"
skip() { echo "SKIPPED: $*"; exit 77; }
command -v curl >/dev/null || skip "curl is not installed"
if ! "$VENV/bin/python" -c 'import openai' 2>/dev/null; then
  echo "serve-e2e: creating $VENV with the openai package"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  "$VENV/bin/python" -m pip install --quiet openai >/dev/null 2>&1 || skip "pip could not install openai from PyPI"
fi
exec "$VENV/bin/python" "$HERE/serve_e2e.py" "$BIN"
