#!/usr/bin/env bash
# ctest ReportPageE2E: runs tests/report_page_test.py (the deployment report in headless
# Chromium, driven by selenium) in the test clients' Python environment (tests/serve_venv.sh).
# Skipped (exit 77) with the reason when Chromium or chromedriver is missing or the
# environment cannot be made. Screenshots go to $TESSERA_REPORT_SHOTS (default: the work
# directory, removed afterwards).
set -uo pipefail
BIN="$1"
shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/serve_venv.sh"
command -v chromedriver >/dev/null || skip "chromedriver is not installed (apt install chromium chromium-driver)"
serve_venv selenium -- selenium
if [[ -n "${TESSERA_REPORT_SHOTS:-}" ]]; then set -- --shots "$TESSERA_REPORT_SHOTS" "$@"; fi
exec "$VENV/bin/python" "$HERE/report_page_test.py" "$BIN" "$@"
