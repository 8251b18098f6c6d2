#!/usr/bin/env bash
# Checks a GPU build: the library loads into TensorFlow, reports NCCL the way
# `tfhvdrun --check-build` shows it, and has GPU kernels for the collectives;
# on a machine with a GPU it also runs tests/gpu.  The image build runs it
# last; make test runs it on the CPU machine's GPU build (PYTHONPATH set to
# that build).
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Not from the source tree: `python -m` puts the working folder first on
# sys.path, and its tfhvd/ would shadow the build under test.
cd "${TMPDIR:-/tmp}"

report="$("$PYTHON" -m tfhvd.runner --check-build 2>/dev/null)"
echo "$report"
grep -q '\[X\] NCCL' <<<"$report" || { echo "check-build does not report NCCL" >&2; exit 1; }
"$PYTHON" - <<'PY'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tfhvd
from tfhvd.common import library
from tensorflow.python.framework import kernels

library.load()
capi = library.capi()
assert capi.tfhvd_nccl_built() == 1 and capi.tfhvd_cuda_built() == 1, "library lacks NCCL"
ops = ["HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodBroadcast",
       "HorovodAlltoall", "HorovodReducescatter"]
missing = [op for op in ops
           if "GPU" not in {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}]
assert not missing, "no GPU kernel for %s" % missing
print("GPU kernels registered for %s; library %s" % (", ".join(ops), library.library_path()))
PY
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  log "GPU present: running tests/gpu"
  "$PYTHON" -m pytest -q -rs -p no:cacheprovider "$TFHVD_ROOT/tests/gpu"
fi
