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
  pip_log="$(mktemp)"
  # The whole log is kept; a failed install stops the build with its tail.
  if ! "$PYTHON" -m pip install --no-cache-dir --no-build-isolation --no-deps -v . \
      >"$pip_log" 2>&1; then
    tail -n 80 "$pip_log" >&2
    echo "build_tfhvd.sh: pip install of tfhvd failed (log above)" >&2
    exit 1
  fi
  grep -E "tfhvd GPU build|device code|NCCL|note:|Successfully" "$pip_log" || true
  rm -f "$pip_log"
  # Outside the source tree (whose tfhvd/ would shadow the installed one),
  # and loading the compiled library, not just the Python package.
  (cd "${TMPDIR:-/tmp}" && "$PYTHON" - <<'PY'
import os
from tfhvd.common import basics, library
library.load()
want_nccl = os.environ.get("TFHVD_GPU_OPERATIONS", "").upper() == "NCCL"
assert basics.nccl_built() or not want_nccl, "the installed library has no NCCL"
print("loaded %s (NCCL: %s; device code: %s)"
      % (library.library_path(), basics.nccl_built(), basics.gpu_code_info() or "none"))
PY
  )
else
  : "${TFHVD_LIB_DIR:?set TFHVD_LIB_DIR for TFHVD_INSTALL=0}"
  log "building into $TFHVD_LIB_DIR (GPU operations: $TFHVD_GPU_OPERATIONS)"
  "$PYTHON" setup.py -q build_py -d "$TFHVD_LIB_DIR" build_ext -b "$TFHVD_LIB_DIR" \
    -t "${TFHVD_BUILD_DIR:-build}/setuptools-tmp"
fi
log "built in $(( $(date +%s) - start )) s"
