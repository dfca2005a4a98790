#!/usr/bin/env bash
# The relocatable install: `cmake --install BUILD --prefix P` into a temporary prefix, then
# `tessera inspect`, `synth` (a tiny preset), `deploy` (cpu) and `run` from another directory
# with the source tree out of reach: HOME and the XDG directories point into a temporary
# directory seeded only by the install and the default model (plus phase 0's references, as
# scripts/setup.sh does, which phase 0 must use), no TESSERA_* variable is set, the installed
# binary must not contain the source or build directory's path, and where `unshare` allows it
# the source tree, the build tree and ../shared are hidden under empty tmpfs mounts.
# Usage: tests/install_test.sh BUILD_DIR SOURCE_DIR. Exit 77 (skipped) with the reason when
# something it needs is missing.
set -euo pipefail

BUILD="$(cd "$1" && pwd -P)"
SRC="$(cd "$2" && pwd -P)"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
PRESET="Qwen3-0.6B"  # its tiny form: the tokenizer files come from the install's share/

say() { echo "install_test: $*"; }
skip() { echo "install_test: SKIP: $*"; exit 77; }
die() { echo "install_test: FAIL: $*" >&2; exit 1; }

command -v strings >/dev/null || skip "strings (binutils) is missing"

model=""
for m in "${TESSERA_DEFAULT_MODEL:-}" "$SRC/models/$MODEL_FILE" \
         "${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/tessera/models/$MODEL_FILE"; do
  if [[ -n "$m" && -f "$m" ]]; then model="$m"; break; fi
done
[[ -n "$model" ]] || skip "the default model $MODEL_FILE is missing: run scripts/setup.sh"

TMP="$(mktemp -d /tmp/tessera-install-test.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
case "$TMP/" in "$SRC/"* | "$BUILD/"*) die "the temporary directory $TMP is inside the source or build tree" ;; esac
PREFIX="$TMP/prefix"

say "cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1 || { cat "$TMP/install.log"; die "cmake --install failed"; }
TESSERA="$PREFIX/bin/tessera"
[[ -x "$TESSERA" ]] || die "$TESSERA was not installed"
[[ -f "$PREFIX/share/tessera/devices/xdna2.json" ]] || die "no device profiles in $PREFIX/share/tessera/devices"
[[ -f "$PREFIX/share/tessera/skills/deploy-model/SKILL.md" ]] || die "no skills in $PREFIX/share/tessera/skills"
[[ -f "$PREFIX/share/tessera/tokenizers/qwen3/tokenizer.json" ]] ||
  skip "the install has no tokenizer files (scripts/setup.sh fetches data/tokenizers/*/tokenizer.json)"
[[ ! -e "$PREFIX/bin/tessera-data-dirs.txt" ]] || die "the build tree's tessera-data-dirs.txt was installed"
say "installed: $(cd "$PREFIX" && find . -maxdepth 3 | sort | tr '\n' ' ')"

# Nothing of the source or build tree is compiled in.
SHARED_DIR="$(cd "$SRC/.." && pwd -P)/shared"
strings -a "$TESSERA" >"$TMP/strings.txt"
found="$(grep -F -e "$SRC" -e "$BUILD" -e "$SHARED_DIR" "$TMP/strings.txt" || true)"
if grep -q -e '^__asan_init' -e '^__ubsan_handle' "$TMP/strings.txt"; then
  # A sanitizer build's reports name the source files and directories it was compiled from
  # (metadata that -ffile-prefix-map does not remove, never read at run time): bare names of
  # source files and of directories of the trees are allowed; the run below, with the trees
  # hidden, is what shows nothing is read from them.
  found="$(printf '%s\n' "$found" | grep -v -E '^[^ ]+\.(cc|h|hpp|hxx|inc)(:[0-9]+)*$' |
           grep -v -x -F -e "$SRC" -e "$BUILD" | grep -v -x -E "($SRC|$BUILD)(/[A-Za-z0-9_.-]+)*" || true)"
  say "sanitizer build: the source file and directory names in its sanitizer metadata are allowed"
fi
if [[ -n "$found" ]]; then
  printf '%s\n' "$found" | head -5 >&2
  die "the installed binary contains a path of the source tree, build tree or ../shared"
fi
say "strings: the installed binary names none of $SRC, $BUILD, $SHARED_DIR"

# A home seeded only by the install (nothing: share/ is found from the binary) and the user's
# downloads: the default model in the cache directory, phase 0's references beside it.
H="$TMP/home"
mkdir -p "$H/.cache/tessera/models" "$H/.local/share" "$H/.config" "$TMP/work" "$TMP/empty-home"
ln "$model" "$H/.cache/tessera/models/$MODEL_FILE" 2>/dev/null || cp "$model" "$H/.cache/tessera/models/$MODEL_FILE"
cp -r "$SRC/tests/fixtures/oracle" "$H/.cache/tessera/references"

cat >"$TMP/run.sh" <<'EOF'
set -euo pipefail
say() { echo "install_test: $*"; }
die() { echo "install_test: FAIL: $*" >&2; exit 1; }
cd "$WORK"
for d in "$SRC" "$BUILD" "$SHARED"; do
  if [[ -d "$d" && -n "$(ls -A "$d" 2>/dev/null)" ]]; then say "note: $d is visible (no mount namespace)"
  else say "out of reach: $d (empty or absent)"; fi
done
if env | grep -q '^TESSERA_'; then die "a TESSERA_ variable is set"; fi

say "tessera inspect (the default model, from \$XDG_CACHE_HOME/tessera/models)"
"$TESSERA" inspect >inspect.txt || die "tessera inspect failed"
head -n 3 inspect.txt

say "tessera synth --preset $PRESET --tiny (tokenizer from $PREFIX/share/tessera/tokenizers)"
"$TESSERA" synth --preset "$PRESET" --tiny --out tiny >synth.txt 2>&1 || { cat synth.txt; die "tessera synth failed"; }
cmp tiny/tokenizer.json "$PREFIX/share/tessera/tokenizers/qwen3/tokenizer.json" || die "synth's tokenizer.json is not the installed one"

say "tessera deploy tiny --target cpu"
"$TESSERA" deploy tiny --target cpu --out dep --quiet >deploy.txt 2>&1 || { cat deploy.txt; die "tessera deploy failed"; }
# Phase 0 finds its reference (tests/fixtures/oracle, seeded as setup.sh does) in the cache.
row0="$(grep -m1 '^| 0 | oracle' deploy.txt || true)"
echo "$row0"
[[ "$row0" == *"| passed |"*"verified"*"$HOME/.cache/tessera/references/"* ]] ||
  die "phase 0 did not use the reference in \$HOME/.cache/tessera/references"
tail -n 3 deploy.txt

say "tessera run dep"
"$TESSERA" run dep --prompt hi -n 4 >run.txt 2>&1 || { cat run.txt; die "tessera run failed"; }
tail -n 2 run.txt

# Without the user's downloads, the error names every place the default model was looked for.
if HOME="$EMPTY_HOME" XDG_CACHE_HOME= XDG_DATA_HOME= "$TESSERA" inspect >missing.txt 2>&1; then
  die "inspect without a default model succeeded"
fi
for place in "$EMPTY_HOME/.cache/tessera/models/$MODEL_FILE" "$EMPTY_HOME/.local/share/tessera/models/$MODEL_FILE" \
             "$PREFIX/share/tessera/models/$MODEL_FILE"; do
  grep -F -q -- "$place" missing.txt || { cat missing.txt; die "the error does not name $place"; }
done
say "missing model: $(cat missing.txt)"
say "PASS"
EOF

run_env=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$H" XDG_CACHE_HOME="$H/.cache"
         XDG_DATA_HOME="$H/.local/share" XDG_CONFIG_HOME="$H/.config" LANG=C.UTF-8
         TESSERA="$TESSERA" PREFIX="$PREFIX" PRESET="$PRESET" MODEL_FILE="$MODEL_FILE" WORK="$TMP/work"
         EMPTY_HOME="$TMP/empty-home" SRC="$SRC" BUILD="$BUILD" SHARED="$(cd "$SRC/.." && pwd -P)/shared")

# Hide the source tree, the build tree and ../shared where a private mount namespace can be had.
hide='for d in "$SRC" "$BUILD" "$SHARED"; do if [[ -d "$d" ]]; then mount -t tmpfs tessera-hidden "$d"; fi; done; exec bash "$0"'
if unshare -rm true 2>/dev/null; then
  say "hiding $SRC, $BUILD and ../shared under empty tmpfs mounts (unshare -rm)"
  "${run_env[@]}" unshare -rm bash -c "$hide" "$TMP/run.sh"
else
  say "unshare -rm is not allowed here: the source tree stays on disk (HOME, XDG, cwd and strings still checked)"
  "${run_env[@]}" bash "$TMP/run.sh"
fi
