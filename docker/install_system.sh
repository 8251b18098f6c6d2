#!/usr/bin/env bash
# System packages: OpenMPI (OPENMPI_VERSION pins the Debian/Ubuntu package
# version; empty takes the distribution's), CMake, Python's venv and
# headers, and OpenSSL's libcrypto headers (libssl-dev: HMAC-SHA256 for the
# job's authentication, docs/security.md), and the two header-only libraries
# TensorFlow's XLA headers include (libhighwayhash-dev, libfarmhash-dev: the
# XLA ops, docs/keras.md).  Nothing to do when everything is installed already, which is the
# case on a tfhvd dev machine (make docker-check runs this there).
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pin() { echo "$1${OPENMPI_VERSION:+=$OPENMPI_VERSION}"; }
packages=("$(pin openmpi-bin)" "$(pin libopenmpi-dev)" cmake python3-venv python3-dev g++ make
  libssl-dev libhighwayhash-dev libfarmhash-dev)
missing=()
for p in "${packages[@]}"; do
  name="${p%%=*}"
  if ! dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  log "system packages present: $(mpirun --version 2>/dev/null | head -n 1)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing system packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
log "installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
rm -rf /var/lib/apt/lists/*
mpirun --version | head -n 1
