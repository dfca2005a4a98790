# Sourced by the serve tests' ctest wrappers (serve_e2e.sh, chat_page_test.sh): the test
# clients' Python environment, outside the repository ($TESSERA_SERVE_VENV, default
# $HOME/.cache/tessera/serve-venv, like tools/reference's). `serve_venv MODULE... -- PACKAGE...`
# makes it (or adds to it) until the modules import; when it cannot (no python3-venv, no
# network to PyPI), the test is skipped (exit 77) with the reason. Sets VENV.
VENV="${TESSERA_SERVE_VENV:-$HOME/.cache/tessera/serve-venv}"
skip() { echo "SKIPPED: $*"; exit 77; }
serve_venv() {
  local modules=() packages=()
  while [[ $# -gt 0 && $1 != -- ]]; do modules+=("$1"); shift; done
  shift
  packages=("$@")
  local imports
  imports=$(IFS=,; echo "${modules[*]}")
  "$VENV/bin/python" -c "import $imports" 2>/dev/null && return 0
  echo "serve tests: installing ${packages[*]} into $VENV"
  mkdir -p "$(dirname "$VENV")"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  "$VENV/bin/python" -m pip install --quiet "${packages[@]}" >/dev/null 2>&1 \
    || skip "pip could not install ${packages[*]} from PyPI"
}
