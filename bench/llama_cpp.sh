#!/usr/bin/env bash
# tessera against llama.cpp on the host CPU, same weights, same threads, same run.
#
#   bench/llama_cpp.sh [MODEL] [--threads N] [--tessera BIN] [--rounds N] [--reps N] [--gen N]
#                      [--llama-only] [--tessera-on-bf16] [--isa PATH] [--json FILE]
#
# --isa PATH forces tessera's kernel path (TESSERA_ISA: amx, avx512bf16, AVX3, AVX2, ...) and
# builds the peer for the same instructions where they differ: with AVX2 (or SSE4, SCALAR)
# llama.cpp is built for AVX2 alone (LLAMA_CPP_ISA=avx2, bench/llama_cpp_build.sh), as on
# an AVX2-only CPU; otherwise it runs its best path on this CPU. The table names both.
#
# MODEL: a Hugging Face directory or GGUF file (default: the default model,
# models/SmolLM2-135M-Instruct.Q4_1.gguf). llama.cpp's llama-bench is built from the
# llama.cpp vendored in the source distribution of the PyPI package llama-cpp-python
# (pinned below), once, under ${TESSERA_CACHE:-$HOME/.cache/tessera}/llama.cpp. A quantized
# GGUF runs as it is on both sides (--tessera-on-bf16: both on its BF16 conversion); any other
# model is written as a BF16 GGUF for llama.cpp with `tessera convert` (cached by source path
# and mtime), tessera running MODEL itself unless --tessera-on-bf16. Then both
# sides run back to back with the same thread count, --rounds times (default 3), and a table
# prints each metric: each side's median over the rounds and the median of the per-round
# ratios tessera / llama.cpp (> 1: tessera is faster), with every round's ratio.
# See bench/README.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

MODEL=""
THREADS=$(nproc)
TESSERA=$ROOT/build/tessera
REPS=3
ROUNDS=3
GEN=32
LLAMA_ONLY=0
TESSERA_ON_BF16=0
JSON_OUT=""
ISA=${TESSERA_ISA:-auto}

die() { echo "llama_cpp.sh: error: $*" >&2; exit 1; }
say() { echo "llama_cpp.sh: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --threads|-t) THREADS=${2:?--threads needs N}; shift 2 ;;
    --threads=*) THREADS=${1#*=}; shift ;;
    --tessera) TESSERA=${2:?--tessera needs BIN}; shift 2 ;;
    --tessera=*) TESSERA=${1#*=}; shift ;;
    --reps|-r) REPS=${2:?--reps needs N}; shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs N}; shift 2 ;;
    --gen) GEN=${2:?--gen needs N}; shift 2 ;;
    --llama-only) LLAMA_ONLY=1; shift ;;
    --tessera-on-bf16) TESSERA_ON_BF16=1; shift ;;
    --json) JSON_OUT=${2:?--json needs FILE}; shift 2 ;;
    --isa) ISA=${2:?--isa needs PATH}; shift 2 ;;
    --isa=*) ISA=${1#*=}; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$MODEL" ] || die "more than one MODEL given ('$MODEL', '$1')"; MODEL=$1; shift ;;
  esac
done
case "$ISA" in
  AVX2|SSE4|SCALAR|scalar) export LLAMA_CPP_ISA=avx2 ;;
  *) export LLAMA_CPP_ISA=native ;;
esac
export TESSERA_ISA=$ISA
# shellcheck source=bench/llama_cpp_build.sh
source "$ROOT/bench/llama_cpp_build.sh"  # LLAMA_CPP_PYTHON_VERSION, llama_cpp_build, LLAMA_CPP_BIN
CACHE=$LLAMA_CPP_CACHE
[ -n "$MODEL" ] || MODEL=${TESSERA_DEFAULT_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -e "$MODEL" ] || die "$MODEL: no such model (run scripts/setup.sh for the default model)"
MODEL=$(realpath "$MODEL")
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$THREADS'"
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer, got '$REPS'"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$ROUNDS'"
[[ "$GEN" =~ ^[1-9][0-9]*$ ]] || die "--gen must be a positive integer, got '$GEN'"
[ -x "$TESSERA" ] || die "$TESSERA: no tessera binary (build it: scripts/setup.sh, or pass --tessera BIN)"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
mkdir -p "$CACHE"

# --- 1. llama-bench from the llama-cpp-python source distribution (cached) -------------
# bench/llama_cpp_build.sh builds llama-bench, llama-perplexity, llama-quantize and llama-tokenize together.
llama_cpp_build || die "could not build llama.cpp's tools"
LLAMA_BENCH=$LLAMA_CPP_BIN/llama-bench
[ -x "$LLAMA_BENCH" ] || die "$LLAMA_BENCH was not built (see $LLAMA_CPP_LOG)"
LLAMA_BENCH_HELP=$("$LLAMA_BENCH" --help 2>&1 || true)
grep -q -- '--n-depth' <<<"$LLAMA_BENCH_HELP" \
  || die "this llama-bench has no -d/--n-depth option (decode at a context needs it)"

# --- 2. the same weights: a quantized GGUF as it is, else a BF16 GGUF ------------------
# A quantized file (Q4_0, Q4_K_M, ...) runs as it is on both sides (--tessera-on-bf16: both on
# its BF16 conversion instead); anything else is converted to BF16 for llama.cpp (cached by
# source path and mtime).
QUANTIZED=0
if [ -f "$MODEL" ] && "$TESSERA" inspect "$MODEL" --json 2>/dev/null | python3 -c '
import json, sys
types = json.load(sys.stdin).get("tensors", {}).get("dtypes", {})
sys.exit(0 if any(t.startswith(("Q", "IQ")) for t in types) else 1)'; then
  QUANTIZED=1
fi
if [ -d "$MODEL" ]; then
  MTIME=$(find "$MODEL" -maxdepth 1 -type f \( -name '*.json' -o -name '*.safetensors' \) -printf '%T@\n' | sort -n | tail -1)
else
  MTIME=$(stat -c %Y "$MODEL")
fi
KEY=$(printf 'convert-v1\n%s\n%s\n' "$MODEL" "$MTIME" | sha256sum | cut -c1-16)
NAME=$(basename "$MODEL"); NAME=${NAME%.gguf}
GGUF=$CACHE/models/$NAME-$KEY.bf16.gguf
if [ "$QUANTIZED" = 1 ] && [ "$TESSERA_ON_BF16" = 0 ]; then
  GGUF=$MODEL
  say "$MODEL is quantized: both engines run it as it is"
elif [ ! -f "$GGUF" ]; then
  mkdir -p "$CACHE/models"
  say "converting $MODEL to BF16 GGUF ..."
  "$TESSERA" convert "$MODEL" --to gguf --dtype bf16 --out "$GGUF.part" --quiet >&2 \
    || { rm -f "$GGUF.part"; die "tessera convert failed"; }
  mv "$GGUF.part" "$GGUF"
fi

# A busy machine distorts both sides (llama.cpp's spinning threads most): say so.
LOAD=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
if awk -v l="$LOAD" -v n="$(nproc)" 'BEGIN { exit !(l > 0.5 * n) }'; then
  say "warning: load average $LOAD on $(nproc) cores: the machine is busy, the numbers will be noisy"
fi

# --- 3./4. llama.cpp and tessera, alternating, ROUNDS times ----------------------------
# The machine's memory bandwidth drifts by tens of percent within minutes (shared VM), so
# one llama.cpp run then one tessera run compares two different machines. Each round runs
# both sides back to back; the table reports each side's median over the rounds and the
# median of the per-round ratios (a paired comparison).
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TESSERA_STATUS=ok
if [ "$LLAMA_ONLY" = 1 ]; then
  TESSERA_STATUS="skipped (--llama-only)"
elif ! grep -qE '^ +bench( |$)' <<<"$("$TESSERA" --help 2>/dev/null || true)"; then
  TESSERA_STATUS="$TESSERA has no 'bench' command yet"
fi
TESSERA_MODEL=$MODEL
[ "$TESSERA_ON_BF16" = 1 ] && TESSERA_MODEL=$GGUF
for ((round = 1; round <= ROUNDS; round++)); do
  say "round $round/$ROUNDS: llama-bench prefill (-p 128,512), $THREADS threads, $REPS repetitions ..."
  "$LLAMA_BENCH" -m "$GGUF" -t "$THREADS" -p 128,512 -n 0 -r "$REPS" -o json \
    >"$WORK/llama_prefill.$round.json" 2>"$WORK/llama_prefill.err" \
    || { cat "$WORK/llama_prefill.err" >&2; die "llama-bench (prefill) failed"; }
  say "round $round/$ROUNDS: llama-bench decode $GEN tokens at depth 128 and 512 (-d 128,512) ..."
  "$LLAMA_BENCH" -m "$GGUF" -t "$THREADS" -p 0 -n "$GEN" -d 128,512 -r "$REPS" -o json \
    >"$WORK/llama_decode.$round.json" 2>"$WORK/llama_decode.err" \
    || { cat "$WORK/llama_decode.err" >&2; die "llama-bench (decode) failed"; }
  [ "$TESSERA_STATUS" = ok ] || continue
  say "round $round/$ROUNDS: tessera bench $TESSERA_MODEL --target cpu --threads $THREADS ..."
  if ! "$TESSERA" bench "$TESSERA_MODEL" --target cpu --threads "$THREADS" --repeats "$REPS" \
       --decode-tokens "$GEN" --json >"$WORK/tessera.$round.json" 2>"$WORK/tessera.err"; then
    cat "$WORK/tessera.err" >&2
    TESSERA_STATUS="tessera bench failed (exit status above)"
    rm -f "$WORK"/tessera.*.json
  fi
done

# --- 5. the table -----------------------------------------------------------------------
CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
LLAMA_FLAGS=$(grep -oE -- '-DGGML_(NATIVE|AVX[A-Z0-9_]*|AMX[A-Z0-9_]*|FMA|F16C|BMI2)=(ON|OFF)' <<<"${LLAMA_CPP_CMAKE_FLAGS[*]}" | grep -E '=ON' | sed 's/-DGGML_//; s/=ON//' | tr '\n' ' ')
python3 - "$WORK" "$MODEL" "$GGUF" "$THREADS" "$LLAMA_CPP_PYTHON_VERSION" "$TESSERA_STATUS" "$JSON_OUT" "$ROUNDS" \
  "$CPU_NAME" "$ISA" "$LLAMA_FLAGS" <<'PY'
import json, os, sys
work, model, gguf, threads, version, status, json_out, rounds, cpu, isa, llama_flags = sys.argv[1:12]

def load(name):
    p = os.path.join(work, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"llama_cpp.sh: error: {name} is not JSON ({e}): {text[:200]!r}")

def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

# Per round: {metric: tokens/s} for each side.
llama_rounds, tess_rounds, tess_json = [], [], []
for r in range(1, int(rounds) + 1):
    lr = {}
    for entry in (load(f"llama_prefill.{r}.json") or []) + (load(f"llama_decode.{r}.json") or []):
        if entry.get("n_gen", 0) == 0:
            lr[f"prefill {entry['n_prompt']}"] = entry["avg_ts"]
        else:
            lr[f"decode @{entry.get('n_depth', 0)}"] = entry["avg_ts"]
    llama_rounds.append(lr)
    t = load(f"tessera.{r}.json")
    tr = {}
    if t:
        tess_json.append(t)
        for p in t.get("prefill", []):
            tr[f"prefill {p['prompt_len']}"] = p["tokens_per_s"]
        for d in t.get("decode", []):
            tr[f"decode @{d['context']}"] = d["tokens_per_s"]
    tess_rounds.append(tr)

rows = ["prefill 128", "prefill 512", "decode @128", "decode @512"]
print(f"model      {model}")
print(f"llama.cpp  llama-bench from llama-cpp-python {version}, weights {os.path.basename(gguf)}")
print(f"cpu        {cpu}")
isa_line = ", ".join(sorted({t.get("isa", "?") for t in tess_json})) if tess_json else "?"
print(f"paths      tessera {isa_line} (TESSERA_ISA={isa}); llama.cpp built with {llama_flags.strip()}")
print(f"threads    {threads}; {rounds} rounds, each llama.cpp then tessera back to back")
print()
print(f"{'metric (tokens/s)':<20} | {'tessera':>10} | {'llama.cpp':>10} | {'ratio':>6} | {'per-round ratios':<24}")
print(f"{'-' * 20}-+-{'-' * 10}-+-{'-' * 10}-+-{'-' * 6}-+-{'-' * 24}")
summary = {"model": model, "cpu": cpu, "tessera_isa": isa, "llama_cpp_flags": llama_flags.split(), "threads": int(threads), "rounds": int(rounds), "llama_cpp_python": version, "rows": []}
for m in rows:
    lv = [lr[m] for lr in llama_rounds if m in lr]
    tv = [tr[m] for tr in tess_rounds if m in tr]
    ratios = [tr[m] / lr[m] for lr, tr in zip(llama_rounds, tess_rounds) if m in lr and m in tr and lr[m] > 0]
    ls = f"{median(lv):10.1f}" if lv else f"{'n/a':>10}"
    ts = f"{median(tv):10.1f}" if tv else f"{'n/a':>10}"
    rs = f"{median(ratios):6.2f}" if ratios else f"{'n/a':>6}"
    print(f"{m:<20} | {ts} | {ls} | {rs} | {' '.join(f'{x:.2f}' for x in ratios)}")
    summary["rows"].append({"metric": m, "tessera": median(tv) if tv else None, "llama_cpp": median(lv) if lv else None,
                            "ratio": median(ratios) if ratios else None, "round_ratios": ratios,
                            "tessera_rounds": tv, "llama_cpp_rounds": lv})
print()
if tess_json:
    # Per round, tessera's roofline fraction (its decode paired with bandwidth measured right
    # after) and llama.cpp's decode against the same round's bandwidth and bytes per token.
    for ctx in [k.split("@")[1] for k in rows if k.startswith("decode")]:
        tf, lf, bws = [], [], []
        for lr, t in zip(llama_rounds, tess_json):
            bw, bpt = t.get("read_bandwidth_gbs"), t.get("bytes_per_token", {}).get(ctx)
            if ctx in t.get("roofline_fraction", {}):
                tf.append(float(t["roofline_fraction"][ctx]))
            if bw and bpt and f"decode @{ctx}" in lr:
                # llama.cpp reads the same bytes per token (same BF16 weights, same KV cache size).
                lf.append(lr[f"decode @{ctx}"] * float(bpt) / (bw * 1e9))
            if bw:
                bws.append(bw)
        if tf:
            print(f"decode @{ctx} roofline fraction (tokens/s x bytes/token / read bandwidth), median over rounds: "
                  f"tessera {median(tf):.2f}" + (f", llama.cpp {median(lf):.2f}" if lf else "") +
                  f"  (bandwidth {min(bws):.1f}-{max(bws):.1f} GB/s across rounds)")
    summary["tessera"] = tess_json
else:
    print(f"tessera: {status}")
if json_out:
    with open(json_out, "w") as f:
        json.dump(summary, f, indent=1)
PY
if [ "$TESSERA_STATUS" != ok ] && [ "$LLAMA_ONLY" != 1 ]; then
  die "tessera side: $TESSERA_STATUS (the llama.cpp numbers above stand alone; --llama-only skips tessera)"
fi
