#!/usr/bin/env bash
# Installs the Debian packages ctpu needs to build, test and run its demo.
# Idempotent: does nothing when everything is already installed.
# Usage: bash tools/install-deps.sh [--bench]   (--bench adds OpenBLAS, oneDNN and PyTorch)
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc g++ libc6-dev libxxhash-dev libjemalloc-dev check libsubunit-dev
      libsleef-dev zlib1g-dev libcjson-dev dataset-fashion-mnist python3-numpy
      libopenmpi-dev openmpi-bin   # Open MPI: data parallel (issue 19; meson -Dmpi=auto finds it)
      fortunes fortunes-min)   # the char-level GPT demo's corpus (examples/char_gpt.c, issue 14)
if [ "${1:-}" = "--bench" ]; then pkgs+=(libopenblas-dev libdnnl-dev python3-torch); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
