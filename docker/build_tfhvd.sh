#!/usr/bin/env bash
# Builds tfhvd with GPU collectives (TFHVD_GPU_OPERATIONS=NCCL unless set).
# TFHVD_INSTALL=1 (default): pip-installs it into $PYTHON's environment.
# TFHVD_INSTALL=0: builds into TFHVD_LIB_DIR (package + library) without
# installing, in TFHVD_BUILD_DIR, so a dev machine's CPU library stays as it
# is (make gpu-build).
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export TFHVD_GPU_OPERATIONS="${TFHVD_GPU_OPERATIONS:-NCCL}"
export TFHVD_CUDA_ARCHS
cd "$TFHVD_ROOT"
start=$(date +%s)
if [ "${TFHVD_INSTALL:-1}" = 1 ]; then
  log "pip install (GPU operations: $TFHVD_GPU_OPERATIONS, archs $TFHVD_CUDA_ARCHS)"
  "$PYTHON" -m pip install --no-cache-dir --no-build-isolation --no-deps -v . 2>&1 |
    grep -E "tfhvd GPU build|nvcc|NCCL|note:|error|Successfully" || true
  "$PYTHON" -c "import tfhvd"
else
  : "${TFHVD_LIB_DIR:?set TFHVD_LIB_DIR for TFHVD_INSTALL=0}"
  log "building into $TFHVD_LIB_DIR (GPU operations: $TFHVD_GPU_OPERATIONS)"
  "$PYTHON" setup.py -q build_py -d "$TFHVD_LIB_DIR" build_ext -b "$TFHVD_LIB_DIR" \
    -t "${TFHVD_BUILD_DIR:-build}/setuptools-tmp"
fi
log "built in $(( $(date +%s) - start )) s"
