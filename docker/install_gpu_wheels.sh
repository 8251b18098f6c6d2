#!/usr/bin/env bash
# The NCCL, CUDA runtime and NVRTC wheels tfhvd's GPU build finds on its own: the
# same NCCL that TensorFlow loads, so one process never mixes two.  With
# TFHVD_PIP_TARGET they go to that folder (a dev machine keeps them out of
# its venv; put the folder on PYTHONPATH for the build), else into $PYTHON's
# environment.
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# NVRTC compiles the device code (tfhvd_ops/cuda/build_device_code.py) with
# the CUDA 12 release TensorFlow uses; the runtime wheel brings its headers.
wheels=("nvidia-nccl-cu12==$NCCL_VERSION" "nvidia-cuda-runtime-cu12==$CUDA_RUNTIME_VERSION"
        "nvidia-cuda-nvrtc-cu12==$CUDA_RUNTIME_VERSION")
target=()
[ -n "${TFHVD_PIP_TARGET:-}" ] && target=(--target "$TFHVD_PIP_TARGET" --upgrade)
log "installing ${wheels[*]}${TFHVD_PIP_TARGET:+ into $TFHVD_PIP_TARGET}"
"$PYTHON" -m pip install --no-cache-dir -q "${target[@]}" "${wheels[@]}"
