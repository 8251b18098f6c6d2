#!/usr/bin/env bash
# TensorFlow and mpi4py into $PYTHON's environment.  With TFHVD_VENV, that
# virtual environment is created first and used.  TFHVD_GPU=1 installs
# tensorflow[and-cuda] (CUDA 12 runtime, cuDNN and NCCL wheels), else the
# plain wheel.  mpi4py is built from source against the system MPI.
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ -n "${TFHVD_VENV:-}" ]; then
  [ -x "$TFHVD_VENV/bin/python" ] || "$PYTHON" -m venv "$TFHVD_VENV"
  PYTHON="$TFHVD_VENV/bin/python"
  "$PYTHON" -m pip install --no-cache-dir -q --upgrade pip
fi
tf="tensorflow==$TF_VERSION"
[ "${TFHVD_GPU:-0}" = 1 ] && tf="tensorflow[and-cuda]==$TF_VERSION"
log "installing $tf mpi4py==$MPI4PY_VERSION into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
"$PYTHON" -m pip install --no-cache-dir -q "$tf" "mpi4py==$MPI4PY_VERSION" --no-binary mpi4py \
  numpy pytest
"$PYTHON" -c "import tensorflow as tf, mpi4py; print('TensorFlow', tf.__version__, '(CUDA', \
tf.sysconfig.get_build_info().get('cuda_version'), ') mpi4py', mpi4py.__version__)"
