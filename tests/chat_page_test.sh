#!/usr/bin/env bash
# ctest ChatPageE2E: runs tests/chat_page_test.py (the chat page at / in headless Chromium,
# driven by selenium) in the test clients' Python environment (tests/serve_venv.sh), adding
# selenium from PyPI to it. Skipped (exit 77) with the reason when Chromium or chromedriver is
# missing (Debian: chromium chromium-driver, which scripts/install_deps.sh installs) or the
# environment cannot be made.
set -uo pipefail
BIN="$1"
shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/serve_venv.sh"
command -v chromedriver >/dev/null || skip "chromedriver is not installed (apt install chromium chromium-driver)"
serve_venv openai selenium -- openai selenium
exec "$VENV/bin/python" "$HERE/chat_page_test.py" "$BIN" "$@"
