#!/usr/bin/env bash
# Create the Python environment for the reference tools in tools/reference
# (Hugging Face transformers on CPU, float32). It lives outside the repository:
# $TESSERA_REF_VENV, default $HOME/.cache/tessera/ref-venv. Never used by CI or by
# tessera itself. Idempotent: an existing environment is updated in place.
set -euo pipefail

VENV="${TESSERA_REF_VENV:-$HOME/.cache/tessera/ref-venv}"
PACKAGES=(torch transformers tokenizers safetensors numpy gguf accelerate)

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "ref-env: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi
echo "ref-env: installing ${PACKAGES[*]} (torch is large; this takes a few minutes the first time)"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "${PACKAGES[@]}"
"$VENV/bin/python" -c 'import torch, transformers; print(f"ref-env: ready: torch {torch.__version__}, transformers {transformers.__version__}")'
echo "ref-env: use it with TESSERA_REF_VENV=$VENV (the tools find the default location by themselves)"
