#!/usr/bin/env bash
# make test's check of the GPU library's device code (tests/gpu/check_device_code.py):
#   1. the built library holds cubins for every generation from Volta (sm_70)
#      to Hopper (sm_90) that CUDA 12.5's NVRTC knows, PTX of compute_70 for
#      newer GPUs, and no device code from CUDA 13 (or newer) tools, read from
#      its bytes;
#   2. the same check refuses device code from a CUDA 13 nvcc (the named
#      fallback route), so it is shown to fail where it must.  Needs an nvcc
#      of CUDA 13 or newer; without one, step 2 says so and is not run.
#   tests/gpu/check_device_code.sh PYTHON LIBRARY SCRATCH_DIR
set -euo pipefail
PY="$1"
LIB="$2"
SCRATCH="$3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$PY" "$ROOT/tests/gpu/check_device_code.py" "$LIB" --require-arch 70 --require-arch 75 \
  --require-arch 80 --require-arch 86 --require-arch 89 --require-arch 90 --require-ptx 70 \
  --max-cuda-major 12
nvcc="$(command -v nvcc || true)"
major="$([ -n "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p' || true)"
if [ -z "$major" ] || [ "$major" -lt 13 ]; then
  echo "(no CUDA 13 nvcc here: the refusal of CUDA 13 device code was not exercised)"
  exit 0
fi
mkdir -p "$SCRATCH"
"$PY" "$ROOT/tfhvd_ops/cuda/build_device_code.py" --compiler nvcc --tool "$nvcc" --archs 90 \
  --source "$ROOT/tfhvd_ops/cuda/gpu_kernels.cu" --output "$SCRATCH/cuda13_images.cc" >/dev/null
"${CXX:-g++}" -shared -fPIC -o "$SCRATCH/cuda13_images.so" "$SCRATCH/cuda13_images.cc"
if "$PY" "$ROOT/tests/gpu/check_device_code.py" "$SCRATCH/cuda13_images.so" \
    --require-arch 90 --max-cuda-major 12 >"$SCRATCH/cuda13_check.out"; then
  cat "$SCRATCH/cuda13_check.out"
  echo "FAIL: the device-code check accepted CUDA $major device code" >&2
  exit 1
fi
echo "ok: the check refuses CUDA $major device code: $(grep -c '^FAIL' "$SCRATCH/cuda13_check.out") problem(s) found"
