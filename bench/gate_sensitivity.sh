#!/usr/bin/env bash
# The whole gate-sensitivity matrix (both targets, every stage, every continuous kind, at 2x
# and 0.5x the limit, plus clean deploys) into docs/gate_sensitivity.md. About 20-30 minutes
# on 2 cores. Arguments are passed to bench/gate_sensitivity.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 bench/gate_sensitivity.py "$@"
