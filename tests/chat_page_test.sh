#!/usr/bin/env bash
# ctest ChatPageE2E: runs tests/chat_page_test.py (the chat page at / in headless Chromium,
# driven by selenium) in the test clients' Python environment that serve_e2e.sh makes
# ($TESSERA_SERVE_VENV, default $HOME/.cache/tessera/serve-venv), adding selenium from PyPI
# to it. Skipped (exit 77) with the reason when Chromium or chromedriver is missing (Debian:
# chromium chromium-driver, which scripts/install_deps.sh installs) or the environment cannot
# be made.
set -uo pipefail
BIN="$1"
shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${TESSERA_SERVE_VENV:-$HOME/.cache/tessera/serve-venv}"
skip() { echo "SKIPPED: $*"; exit 77; }
command -v chromedriver >/dev/null || skip "chromedriver is not installed (apt install chromium chromium-driver)"
if ! "$VENV/bin/python" -c 'import openai, selenium' 2>/dev/null; then
  echo "chat-page-e2e: installing openai and selenium into $VENV"
  mkdir -p "$(dirname "$VENV")"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  "$VENV/bin/python" -m pip install --quiet openai selenium >/dev/null 2>&1 || skip "pip could not install openai and selenium from PyPI"
fi
exec "$VENV/bin/python" "$HERE/chat_page_test.py" "$BIN" "$@"
