#!/usr/bin/env bash
# Perplexity: tessera against llama.cpp's llama-perplexity, same model file, same text.
#
#   bench/perplexity.sh [MODEL] [--file TEXT] [--ctx N] [--threads N] [--chunks N]
#                       [--target cpu|oracle] [--f32-peer] [--llama-arg ARG]... [--tessera BIN]
#                       [--json FILE]
#
# MODEL: a GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf), or a Hugging Face
# directory, which llama.cpp is given as a BF16 GGUF written by `tessera convert` (cached).
# TEXT defaults to /usr/share/common-licenses/GPL-3 (on every Debian system), --ctx to 512,
# --threads to nproc, --chunks to every chunk, --target to cpu. llama-perplexity,
# llama-tokenize and llama-quantize are built by bench/llama_cpp_build.sh. Both tools
# tokenize the text (their ids are compared first), split it into chunks of --ctx tokens and
# score the second half of each; the table prints each side's PPL +/- its error, tokens/s
# and the ratios. --f32-peer adds llama-perplexity on the same weights dequantized to F32 by
# llama-quantize (llama.cpp's own exact evaluation, without its 8-bit activations).
# --llama-arg passes one more argument to llama-perplexity. See bench/README.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/llama_cpp_build.sh
source "$ROOT/bench/llama_cpp_build.sh"

MODEL=""
TEXT=/usr/share/common-licenses/GPL-3
CTX=512
THREADS=$(nproc)
CHUNKS=""
TARGET=cpu
TESSERA=$ROOT/build/tessera
JSON_OUT=""
F32_PEER=0
LLAMA_ARGS=()

die() { echo "perplexity.sh: error: $*" >&2; exit 1; }
say() { echo "perplexity.sh: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --file|-f) TEXT=${2:?--file needs TEXT}; shift 2 ;;
    --ctx|-c) CTX=${2:?--ctx needs N}; shift 2 ;;
    --threads|-t) THREADS=${2:?--threads needs N}; shift 2 ;;
    --chunks) CHUNKS=${2:?--chunks needs N}; shift 2 ;;
    --target) TARGET=${2:?--target needs a target}; shift 2 ;;
    --tessera) TESSERA=${2:?--tessera needs BIN}; shift 2 ;;
    --json) JSON_OUT=${2:?--json needs FILE}; shift 2 ;;
    --f32-peer) F32_PEER=1; shift ;;
    --llama-arg) LLAMA_ARGS+=("${2:?--llama-arg needs ARG}"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$MODEL" ] || die "more than one MODEL given ('$MODEL', '$1')"; MODEL=$1; shift ;;
  esac
done
[ -n "$MODEL" ] || MODEL=${TESSERA_DEFAULT_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -e "$MODEL" ] || die "$MODEL: no such model (run scripts/setup.sh for the default model)"
MODEL=$(realpath "$MODEL")
[ -f "$TEXT" ] || die "--file $TEXT: no such file"
TEXT=$(realpath "$TEXT")
[[ "$CTX" =~ ^[1-9][0-9]*$ ]] || die "--ctx must be a positive integer, got '$CTX'"
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$THREADS'"
[ -z "$CHUNKS" ] || [[ "$CHUNKS" =~ ^[1-9][0-9]*$ ]] || die "--chunks must be a positive integer, got '$CHUNKS'"
[ -x "$TESSERA" ] || die "$TESSERA: no tessera binary (build it: scripts/setup.sh, or pass --tessera BIN)"
command -v python3 >/dev/null || die "python3 is needed to read the results"

llama_cpp_build || die "could not build llama.cpp's tools"

# llama.cpp reads GGUF only: a Hugging Face directory goes to it as a BF16 GGUF (cached by
# path and mtime, as bench/llama_cpp.sh does); tessera reads MODEL itself.
LLAMA_MODEL=$MODEL
if [ -d "$MODEL" ]; then
  MTIME=$(find "$MODEL" -maxdepth 1 -type f \( -name '*.json' -o -name '*.safetensors' \) -printf '%T@\n' | sort -n | tail -1)
  KEY=$(printf 'convert-v1\n%s\n%s\n' "$MODEL" "$MTIME" | sha256sum | cut -c1-16)
  LLAMA_MODEL=$LLAMA_CPP_CACHE/models/$(basename "$MODEL")-$KEY.bf16.gguf
  if [ ! -f "$LLAMA_MODEL" ]; then
    mkdir -p "$LLAMA_CPP_CACHE/models"
    say "converting $MODEL to BF16 GGUF for llama.cpp ..."
    "$TESSERA" convert "$MODEL" --to gguf --dtype bf16 --out "$LLAMA_MODEL.part" --quiet >&2 \
      || { rm -f "$LLAMA_MODEL.part"; die "tessera convert failed"; }
    mv "$LLAMA_MODEL.part" "$LLAMA_MODEL"
  fi
fi

# llama.cpp's AMX kernels (used for Q4_0/Q4_1/Q8_0 weights when the CPU has AMX) crash or
# give wrong results in this llama.cpp (ggml-org/llama.cpp#20824, #16315): on such a CPU
# bench/llama_cpp_build.sh builds llama.cpp without AMX, so no flag is needed here.

# --f32-peer: the same weights dequantized to F32 by llama-quantize (cached by path and mtime).
F32_MODEL=""
if [ "$F32_PEER" = 1 ]; then
  KEY=$(printf 'f32-v1\n%s\n%s\n' "$LLAMA_MODEL" "$(stat -c %Y "$LLAMA_MODEL")" | sha256sum | cut -c1-16)
  F32_MODEL=$LLAMA_CPP_CACHE/models/$(basename "${LLAMA_MODEL%.gguf}")-$KEY.f32.gguf
  if [ ! -f "$F32_MODEL" ]; then
    mkdir -p "$LLAMA_CPP_CACHE/models"
    say "dequantizing $LLAMA_MODEL to F32 with llama-quantize ..."
    "$LLAMA_CPP_BIN/llama-quantize" --allow-requantize "$LLAMA_MODEL" "$F32_MODEL.part" F32 >"$LLAMA_CPP_CACHE/models/quantize.log" 2>&1 \
      || { rm -f "$F32_MODEL.part"; tail -5 "$LLAMA_CPP_CACHE/models/quantize.log" >&2; die "llama-quantize to F32 failed"; }
    mv "$F32_MODEL.part" "$F32_MODEL"
  fi
fi

LOAD=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
if awk -v l="$LOAD" -v n="$(nproc)" 'BEGIN { exit !(l > 0.5 * n) }'; then
  say "warning: load average $LOAD on $(nproc) cores: the machine is busy, tokens/s will be noisy"
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- 1. the same tokens? Both tokenizers on the text as llama-perplexity reads it (one
# trailing newline dropped); llama-tokenize would keep it, so it gets the trimmed copy.
python3 - "$TEXT" "$WORK/text.txt" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(data[:-1] if data.endswith(b"\n") else data)
PY
say "tokenizing $TEXT with llama-tokenize and tessera tokenize ..."
"$LLAMA_CPP_BIN/llama-tokenize" -m "$LLAMA_MODEL" -f "$WORK/text.txt" --ids --no-escape --log-disable \
  >"$WORK/llama.ids" 2>"$WORK/llama_tokenize.err" || { cat "$WORK/llama_tokenize.err" >&2; die "llama-tokenize failed"; }
"$TESSERA" tokenize "$MODEL" --file "$WORK/text.txt" --prompt >"$WORK/tessera.ids" 2>"$WORK/tessera_tokenize.err" \
  || { cat "$WORK/tessera_tokenize.err" >&2; die "tessera tokenize failed"; }

# --- 2. llama-perplexity, then tessera perplexity (one after the other, never competing) --
CHUNK_ARGS=(); [ -z "$CHUNKS" ] || CHUNK_ARGS=(--chunks "$CHUNKS")
# Timestamps on every log line: tokens/s is read from them (chunk loop start to the estimate).
run_llama() {  # MODEL LOG
  say "llama-perplexity $(basename "$1") -c $CTX -t $THREADS ${CHUNK_ARGS[*]} ${LLAMA_ARGS[*]} ..."
  "$LLAMA_CPP_BIN/llama-perplexity" -m "$1" -f "$TEXT" -c "$CTX" -t "$THREADS" "${CHUNK_ARGS[@]}" "${LLAMA_ARGS[@]}" \
    --log-timestamps --log-prefix >"$2" 2>&1 || { tail -20 "$2" >&2; die "llama-perplexity failed on $1"; }
}
run_llama "$LLAMA_MODEL" "$WORK/llama.log"
[ -z "$F32_MODEL" ] || run_llama "$F32_MODEL" "$WORK/llama_f32.log"
say "tessera perplexity --ctx $CTX --threads $THREADS --target $TARGET ${CHUNK_ARGS[*]} ..."
"$TESSERA" perplexity "$MODEL" --file "$TEXT" --ctx "$CTX" --threads "$THREADS" --target "$TARGET" \
  "${CHUNK_ARGS[@]}" --json >"$WORK/tessera.json" 2>"$WORK/tessera.err" \
  || { cat "$WORK/tessera.err" >&2; die "tessera perplexity failed"; }

# --- 3. the table ----------------------------------------------------------------------
python3 - "$WORK" "$MODEL" "$LLAMA_MODEL" "$TEXT" "$CTX" "$THREADS" "$LLAMA_CPP_PYTHON_VERSION" "$JSON_OUT" \
  "$F32_MODEL" "${LLAMA_ARGS[*]}" <<'PY'
import json, os, re, sys
work, model, llama_model, text, ctx, threads, version, json_out, f32_model, llama_args = sys.argv[1:11]

def read(name):
    with open(os.path.join(work, name), encoding="utf-8", errors="replace") as f:
        return f.read()

llama_ids = [int(x) for x in re.findall(r"-?\d+", read("llama.ids"))]
tessera_ids = [int(x) for x in read("tessera.ids").strip().split(",") if x]
if llama_ids == tessera_ids:
    tok_line = f"identical ({len(llama_ids)} tokens)"
else:
    at = next((i for i, (a, b) in enumerate(zip(llama_ids, tessera_ids)) if a != b), min(len(llama_ids), len(tessera_ids)))
    tok_line = (f"DIFFER: llama.cpp {len(llama_ids)} tokens, tessera {len(tessera_ids)}; first difference at index {at} "
                f"(llama.cpp {llama_ids[at:at + 5]}, tessera {tessera_ids[at:at + 5]})")

def stamp(line):
    """Seconds of a log line's timestamp, 'M.SS.mmm.uuu' (llama.cpp's --log-timestamps)."""
    m = re.match(r"\s*(\d+)\.(\d+)\.(\d+)\.(\d+) ", line)
    return int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6 if m else None

def parse_llama(name):
    log = read(name)
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if not m:
        sys.exit(f"perplexity.sh: error: no 'Final estimate' in llama-perplexity's output:\n" + log[-2000:])
    r = {"ppl": float(m.group(1)), "stderr": float(m.group(2)), "chunks": None, "tokens_per_second": None}
    start = end = None
    for line in log.splitlines():
        c = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", line)
        if c:
            r["chunks"], r["n_seq"], start = int(c.group(1)), int(c.group(4)), stamp(line)
        if "Final estimate" in line:
            end = stamp(line)
    if r["chunks"] and start is not None and end is not None and end > start:
        # As tessera's figure: the tokens evaluated over the wall time of the chunk loop.
        r["seconds"] = end - start
        r["tokens_per_second"] = r["chunks"] * int(ctx) / (end - start)
    return r

llama = parse_llama("llama.log")
llama_f32 = parse_llama("llama_f32.log") if f32_model else None
t = json.loads(read("tessera.json"))

def fmt(v, spec):
    return format(v, spec) if v is not None else "n/a"

print(f"model      {model}" + (f" (llama.cpp: {llama_model})" if llama_model != model else ""))
print(f"text       {text}")
print(f"tokens     {tok_line}")
print(f"setup      n_ctx {ctx}, {threads} threads; llama-perplexity from llama-cpp-python {version}"
      f"{' (' + llama_args + ')' if llama_args else ''}; tessera --target {t['target']}")
print()
W = 22
print(f"{'':<{W}} | {'PPL':>10} | {'+/-':>8} | {'chunks':>6} | {'tokens/s':>9}")
print(f"{'-' * W}-+-{'-' * 10}-+-{'-' * 8}-+-{'-' * 6}-+-{'-' * 9}")
def row(name, r):
    print(f"{name:<{W}} | {r['ppl']:10.4f} | {r['stderr']:8.5f} | {fmt(r['chunks'], '>6')} | {fmt(r['tokens_per_second'], '9.1f')}")
row("llama.cpp", llama)
if llama_f32:
    row("llama.cpp, F32 weights", llama_f32)
stderr_t = t["stderr"] if t["stderr"] is not None else float("nan")
row(f"tessera ({t['target']})", {**t, "stderr": stderr_t})
print()
rel = t["ppl"] / llama["ppl"] - 1
speed = t["tokens_per_second"] / llama["tokens_per_second"] if llama["tokens_per_second"] else None
print(f"PPL tessera / llama.cpp = {t['ppl'] / llama['ppl']:.5f} ({100 * rel:+.3f} %; llama.cpp's +/- is "
      f"{100 * llama['stderr'] / llama['ppl']:.2f} % of its PPL)")
if llama_f32:
    print(f"PPL tessera / llama.cpp on F32 weights = {t['ppl'] / llama_f32['ppl']:.5f} "
          f"({100 * (t['ppl'] / llama_f32['ppl'] - 1):+.3f} %)")
print(f"tokens/s tessera / llama.cpp = {fmt(speed, '.2f')} (each: chunks x n_ctx tokens over the wall time of its "
      f"chunk loop, forward passes and scoring)")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"model": model, "llama_model": llama_model, "text": text, "n_ctx": int(ctx), "threads": int(threads),
                   "llama_cpp_python": version, "tokens_identical": llama_ids == tessera_ids,
                   "tokens_llama_cpp": len(llama_ids), "tokens_tessera": len(tessera_ids),
                   "llama_cpp": llama, "llama_cpp_f32": llama_f32, "llama_args": llama_args, "tessera": t, "ppl_ratio": t["ppl"] / llama["ppl"], "speed_ratio": speed}, f, indent=1)
PY
