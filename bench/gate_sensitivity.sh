#!/usr/bin/env bash
# The whole gate-sensitivity matrix (both targets, every stage x every kind at 2x and 0.5x
# the limit, the structural kinds at their least size, plus clean deploys) into
# docs/gate_sensitivity.md. About 30-55 minutes on 2 cores. Arguments are passed to
# bench/gate_sensitivity.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 bench/gate_sensitivity.py "$@"
