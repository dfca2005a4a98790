#!/usr/bin/env bash
# npusim W4A16 / W8A16 over every tiny preset: synthesizes each preset's tiny form, quantizes it
# to Q4_0 and Q8_0 (`tessera quantize`), deploys each file on npusim through phases 0-6 and
# prints one line per deployment (the exit status: 0 every gate passed, 3 a gate failed). The
# default test suite deploys a representative pair (NpusimQuantDeploy.*); this is the full set.
# Usage: scripts/npusim_quant_presets.sh [WORK_DIR] (default: a new temporary directory)
# TESSERA (default build/tessera) names the binary; SCHEMES (default "q4_0 q8_0") the types.
set -uo pipefail

TESSERA=${TESSERA:-build/tessera}
SCHEMES=${SCHEMES:-"q4_0 q8_0"}
WORK=${1:-$(mktemp -d /tmp/npusim_quant.XXXXXX)}
mkdir -p "$WORK"
PRESETS=$("$TESSERA" synth --list | awk 'NR > 1 && NF > 0 {print $1}')
failed=0
for p in $PRESETS; do
  [[ -d "$WORK/$p" ]] || "$TESSERA" synth --preset "$p" --tiny --out "$WORK/$p" >/dev/null || { echo "$p: synth failed"; failed=1; continue; }
  for q in $SCHEMES; do
    f="$WORK/$p.$q.gguf"
    [[ -f "$f" ]] || "$TESSERA" quantize "$WORK/$p" --to "$q" --out "$f" --quiet >/dev/null || { echo "$p $q: quantize failed"; failed=1; continue; }
    start=$SECONDS
    "$TESSERA" deploy "$f" --target npusim --out "$WORK/$p.$q.npusim" --quiet >"$WORK/$p.$q.log" 2>&1
    rc=$?
    status=$([[ $rc -eq 0 ]] && echo PASS || echo "FAIL (exit $rc, see $WORK/$p.$q.npusim/issues.md)")
    formats=$(tr -d '\n ' <"$WORK/$p.$q.npusim/plan.json" 2>/dev/null | grep -o '"weight_formats":{[^}]*}' || echo "?")
    printf '%-14s %-5s %-40s %4ds  %s\n' "$p" "$q" "$status" $((SECONDS - start)) "$formats"
    [[ $rc -eq 0 ]] || failed=1
  done
done
exit $failed
