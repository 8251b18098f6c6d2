#!/usr/bin/env bash
# Builds and runs tfhvd's TensorFlow-free NCCL checks on a GPU machine.
#
#   bash tests/gpu/device_check.sh            # from the repository root
#
# Needs: a GPU with its driver, a CUDA toolkit (nvcc; any major version: the
# harness needs no TensorFlow, so CUDA 13 with an NCCL for CUDA 13 is fine),
# NCCL (TFHVD_NCCL_HOME, the nvidia-nccl wheel or /usr), g++ and python3.
# MPI is optional: with mpicxx the harness uses the real MPI backend (and
# mpirun, one process per GPU); without it, a one-process loopback backend.
# No CMake, no network, no TensorFlow; finishes within 10 minutes and writes
# only a few MiB (the build folder and the log).
#
# What it checks: every collective on device tensors through the real
# runtime (negotiation, fusion buffer, batched copy/scale kernels, ready
# events, NCCL), flat and hierarchical allreduce, clear errors; then the
# allreduce bandwidth table, tfhvd against the raw ncclAllReduce.
# Output: the log in $OUT (when set, e.g. by a device runner) or the build
# folder; the last line of the checks is "N passed, N failed".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${TFHVD_DEVICE_BUILD:-$ROOT/build-device}"
OUTDIR="${OUT:-$BUILD}"
LOG="$OUTDIR/device_check.log"
ITERS="${TFHVD_BENCH_ITERS:-20}"
mkdir -p "$BUILD/obj" "$OUTDIR"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

say "== tfhvd device check $(date -u +%FT%TZ)"
if command -v nvidia-smi >/dev/null; then
  run nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv || true
else
  say "nvidia-smi not found"
fi

# Architectures: the GPUs of this machine (compiling for one arch is fastest).
if [ -z "${TFHVD_CUDA_ARCHS:-}" ] && command -v nvidia-smi >/dev/null; then
  TFHVD_CUDA_ARCHS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    tr -d ' .' | sort -u | paste -sd ';' -)" || true
  export TFHVD_CUDA_ARCHS
fi

say "== configuring (tfhvd_ops/gpu_config.py)"
if ! args="$(TFHVD_GPU_OPERATIONS=NCCL python3 "$ROOT/tfhvd_ops/gpu_config.py" --cmake 2>>"$LOG")"; then
  tail -n 20 "$LOG"
  say "device check: cannot configure the GPU build (see above); nothing was run"
  exit 2
fi
tail -n 8 "$LOG"
get() { sed -n "s/^-D$1=//p" <<<"$args"; }
NVCC="$(get TFHVD_NVCC)"
CUDART="$(get TFHVD_CUDART_LIB)"
NCCL_INC="$(get TFHVD_NCCL_INCLUDE)"
NCCL_LIB="$(get TFHVD_NCCL_LIB)"
ARCHS="$(get TFHVD_CUDA_ARCHS)"
INCLUDES=()
IFS=';' read -ra cuda_inc <<<"$(get TFHVD_CUDA_INCLUDE)"
for d in "${cuda_inc[@]}"; do INCLUDES+=("-I$d"); done
INCLUDES+=("-I$NCCL_INC")
run "$NVCC" --version | tail -n 1 || true

OPS="$ROOT/tfhvd_ops"
SOURCES=("$OPS"/core/*.cc "$OPS"/backends/nccl/*.cc "$ROOT/tests/gpu/nccl_harness.cc"
         "$ROOT/tests/gpu/harness_checks.cc")
CXX="${CXX:-g++}"
DEFINES=()
if command -v mpicxx >/dev/null && [ "${TFHVD_HARNESS_LOOPBACK:-0}" != 1 ]; then
  say "== MPI found: the harness uses the MPI backend"
  CXX=mpicxx
  SOURCES+=("$OPS/backends/factory.cc" "$OPS"/backends/mpi/*.cc "$OPS"/backends/tcp/*.cc)
  DEFINES+=(-DTFHVD_WITH_NCCL -DTFHVD_WITH_MPI -DOMPI_SKIP_MPICXX=1)
else
  say "== no MPI: the harness runs one process over the loopback backend"
  SOURCES+=("$ROOT/tests/gpu/loopback_backend.cc")
fi

say "== building in $BUILD"
start=$(date +%s)
gencode=()
last=""
IFS=';' read -ra arch_list <<<"$ARCHS"
for a in "${arch_list[@]}"; do gencode+=("-gencode=arch=compute_$a,code=sm_$a"); last=$a; done
gencode+=("-gencode=arch=compute_$last,code=compute_$last")
timeout 300 "$NVCC" -ccbin "$(command -v g++)" -std=c++17 -O3 -Xcompiler -fPIC "${gencode[@]}" \
  -c "$OPS/cuda/gpu_kernels.cu" -o "$BUILD/obj/gpu_kernels.o" 2>&1 | tee -a "$LOG"
export CXX BUILD
printf '%s\n' "${SOURCES[@]}" | timeout 300 xargs -P "$(nproc)" -I{} sh -c \
  'o="$BUILD/obj/$(echo "{}" | md5sum | cut -c1-12).o"; '"$CXX"' -std=c++17 -O2 -fPIC '"${DEFINES[*]} ${INCLUDES[*]}"' -c "{}" -o "$o" || { echo "FAILED: {}"; exit 255; }' \
  2>&1 | tee -a "$LOG"
"$CXX" -o "$BUILD/tfhvd_nccl_harness" "$BUILD"/obj/*.o "$CUDART" "$NCCL_LIB" -lpthread \
  -Wl,-rpath,"$(dirname "$CUDART")" -Wl,-rpath,"$(dirname "$NCCL_LIB")" 2>&1 | tee -a "$LOG"
say "== built in $(( $(date +%s) - start )) s"

NGPU=1
if command -v nvidia-smi >/dev/null; then NGPU="$(nvidia-smi -L | grep -c '^GPU' || echo 1)"; fi
cmd=("$BUILD/tfhvd_nccl_harness" --require-gpu --bench --iters "$ITERS")
if [ "$CXX" = mpicxx ] && [ "$NGPU" -gt 1 ]; then
  root_flag=()
  [ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
  cmd=(mpirun "${root_flag[@]}" -np "$NGPU" "${cmd[@]}")
fi
say "== running: ${cmd[*]}"
set +e
timeout 300 "${cmd[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
say "== device check finished with exit code $rc; log: $LOG"
exit "$rc"
