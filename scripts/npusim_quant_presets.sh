#!/usr/bin/env bash
# npusim W4A16 / W8A16 over every tiny preset: synthesizes each preset's tiny form, quantizes it
# to Q4_0, Q8_0 and Q4_K_M (`tessera quantize`), deploys each file on npusim through phases 0-6 and
# prints one line per deployment (the exit status: 0 every gate passed, 3 a gate failed). The
# default test suite deploys a representative pair (NpusimQuantDeploy.*); this is the full set.
# Usage: scripts/npusim_quant_presets.sh [WORK_DIR] (default: a new temporary directory)
# TESSERA (default build/tessera) names the binary; SCHEMES (default "q4_0 q8_0 q4_k_m") the schemes.
# A Q4_K_M file mixes types (Q4_K; Q6_K for v/down in some layers and the head; Q5_0/Q8_0 where a
# row is not whole 256-weight super-blocks): the last column lists the buffers held in blocks.
set -uo pipefail

TESSERA=${TESSERA:-build/tessera}
SCHEMES=${SCHEMES:-"q4_0 q8_0 q4_k_m"}
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
    printf '%-14s %-6s %-40s %4ds  %s\n' "$p" "$q" "$status" $((SECONDS - start)) "$formats"
    [[ $rc -eq 0 ]] || failed=1
  done
done
exit $failed
