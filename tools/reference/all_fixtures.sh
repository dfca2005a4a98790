#!/usr/bin/env bash
# Regenerate every golden fixture under tests/fixtures/ with the reference tools here:
# oracle (oracle_fixtures.py --all), tokenizer, chat template and greedy generation.
# Needs the reference venv (tools/reference/setup_env.sh), the default model
# (scripts/setup.sh) and a built tessera: build/tessera, or $TESSERA / the first argument.
#
#     tools/reference/all_fixtures.sh                       # with build/tessera
#     tools/reference/all_fixtures.sh build-release/tessera
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TESSERA="${1:-${TESSERA:-$REPO/build/tessera}}"
if [[ ! -x "$TESSERA" ]]; then
  echo "all_fixtures: $TESSERA not found: build tessera first (scripts/setup.sh) or pass its path" >&2
  exit 1
fi

run() { echo "== $*"; "$@"; }
run "$HERE/oracle_fixtures.py" --all --tessera "$TESSERA"
run "$HERE/tokenizer_fixtures.py" --tessera "$TESSERA"
run "$HERE/chat_fixtures.py" --tessera "$TESSERA"
run "$HERE/generation_fixtures.py" --tessera "$TESSERA"
echo "all_fixtures: done; review with: git status tests/fixtures && git diff --stat tests/fixtures"
