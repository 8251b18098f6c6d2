#!/usr/bin/env bash
# Builds and runs tfhvd's TensorFlow-free NCCL checks on a GPU machine: one
# rank, then two ranks sharing the one GPU.
#
#   bash tests/gpu/device_check.sh            # from the repository root
#
# Needs only: python3, g++, a CUDA toolkit's nvcc (any major version: the
# harness needs no TensorFlow, so CUDA 13 with NCCL's cu13 wheel is fine) and
# NCCL (TFHVD_NCCL_HOME, the nvidia-nccl-cu* wheel, or /usr).  No MPI, no
# TensorFlow, no network: ranks are processes started here, with rank, size
# and rank 0's address in their environment (tests/gpu/socket_backend.cc);
# negotiation runs over tfhvd's TCP control channel on loopback.
#
# Two ranks on one GPU: NCCL refuses two ranks of one communicator on one GPU
# of one host ("Duplicate GPU detected"), so each rank gets its own
# NCCL_HOSTID (two "hosts"), with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 over
# loopback sockets; tfhvd's topology makes each rank its own node as well.
#
# What it checks: every collective on device tensors through the real runtime
# (negotiation, fusion buffer, the embedded copy/scale kernels loaded with the
# driver API, ready events, NCCL): uneven allgather, alltoall with real
# splits, reducescatter, broadcast from both roots, flat and hierarchical
# allreduce, the mixed CPU/GPU error, the loop launching the next response
# while one is in flight; then the tables at 1 and 2 ranks: allreduce in
# microseconds per call against the raw ncclAllReduce (waited and
# pipelined), a training step's gradients (ResNet-50, BERT-base) against raw
# NCCL, and (1 rank) the copy/scale kernels against cudaMemcpyAsync.
#
# Device code: by default what ships, the NVRTC (CUDA 12) images that
# `make gpu-build` embeds (build-gpu/cuda/device_images.cc, or
# TFHVD_DEVICE_IMAGES); where there is none, or with
# TFHVD_DEVICE_COMPILER=nvcc, this machine's nvcc compiles the kernels.
#
# A lost peer: two ranks run allreduces in a loop, rank 1 is killed
# (SIGKILL), and rank 0 must end non-zero within its TFHVD_NCCL_TIMEOUT (20 s
# here) plus 15 s, naming NCCL or the deadline.
#
# Output: the log in $OUT (when set, e.g. by a device runner) or the build
# folder; the last line is "N passed, M failed" (checks counted per rank).
# Exit: 0 all passed; 1 a failure; 2 cannot configure or build; 3 no GPU on
# this machine (everything was built, nothing could run).  Each run has a
# time limit (TFHVD_DEVICE_RUN_TIMEOUT, 120 s); the whole check stays within
# 8 minutes on a one-GPU H200.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${TFHVD_DEVICE_BUILD:-$ROOT/build-device}"
OUTDIR="${OUT:-$BUILD}"
LOG="$OUTDIR/device_check.log"
ITERS="${TFHVD_BENCH_ITERS:-20}"
RUN_TIMEOUT="${TFHVD_DEVICE_RUN_TIMEOUT:-120}"
mkdir -p "$BUILD/obj" "$OUTDIR"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
# A TCP port free on this host now (the kernel's pick for port 0).  A random
# port of 20000-39999 could already be taken: the kernel's ephemeral ports
# start at 32768, and once rank 0 failed to bind one while rank 1 waited.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export TFHVD_NCCL_TIMEOUT="${TFHVD_NCCL_TIMEOUT:-60}"

say "== tfhvd device check $(date -u +%FT%TZ)"
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1 |
    tee -a "$LOG"
elif [ -e /dev/nvidiactl ]; then
  gpu=1
  say "/dev/nvidiactl exists but nvidia-smi does not work"
else
  say "no NVIDIA GPU on this machine: building only"
fi

# Architectures: this machine's GPUs (one arch compiles fastest); sm_90
# where there is none.
if [ -z "${TFHVD_CUDA_ARCHS:-}" ]; then
  TFHVD_CUDA_ARCHS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    tr -d ' .' | sort -u | paste -sd ';' -)" || true
  export TFHVD_CUDA_ARCHS="${TFHVD_CUDA_ARCHS:-90}"
fi

say "== configuring (tfhvd_ops/gpu_config.py, device code by nvcc)"
if ! args="$(TFHVD_GPU_OPERATIONS=NCCL TFHVD_DEVICE_COMPILER=nvcc \
    python3 "$ROOT/tfhvd_ops/gpu_config.py" --cmake 2>"$BUILD/configure.out")"; then
  tee -a "$LOG" <"$BUILD/configure.out"
  say "device check: cannot configure the GPU build (see above); nothing was run"
  exit 2
fi
tee -a "$LOG" <"$BUILD/configure.out"
get() { sed -n "s/^-D$1=//p" <<<"$args"; }
NVCC="$(get TFHVD_DEVICE_TOOL)"
CUDART="$(get TFHVD_CUDART_LIB)"
NCCL_LIB="$(get TFHVD_NCCL_LIB)"
ARCHS="$(get TFHVD_CUDA_ARCHS)"
INCLUDES=("-I$(get TFHVD_NCCL_INCLUDE)")
IFS=';' read -ra cuda_inc <<<"$(get TFHVD_CUDA_INCLUDE)"
for d in "${cuda_inc[@]}"; do INCLUDES+=("-I$d"); done

OPS="$ROOT/tfhvd_ops"
start=$(date +%s)
IMAGES="${TFHVD_DEVICE_IMAGES:-$ROOT/build-gpu/cuda/device_images.cc}"
if [ "${TFHVD_DEVICE_COMPILER:-}" != nvcc ] && [ -f "$IMAGES" ]; then
  say "== device code: what ships ($IMAGES, from make gpu-build)"
  grep -o 'kDeviceCodeInfo\[\] = "[^"]*"' "$IMAGES" | tee -a "$LOG"
  cp "$IMAGES" "$BUILD/device_images.cc"
else
  say "== device code: $NVCC for sm $ARCHS (no shipped images at $IMAGES, or TFHVD_DEVICE_COMPILER=nvcc)"
  if ! timeout 300 python3 "$OPS/cuda/build_device_code.py" --compiler nvcc --tool "$NVCC" \
      --archs "$ARCHS" --source "$OPS/cuda/gpu_kernels.cu" --output "$BUILD/device_images.cc" \
      2>&1 | tee -a "$LOG"; then
    say "device check: the device code did not compile"
    exit 2
  fi
fi
SOURCES=("$OPS"/core/*.cc "$OPS"/backends/nccl/*.cc "$OPS"/backends/tcp/*.cc
         "$OPS/cuda/device_kernels.cc" "$BUILD/device_images.cc"
         "$ROOT"/tests/gpu/{nccl_harness,harness_checks,harness_bench,harness_step,socket_backend}.cc)
CXX="${CXX:-g++}"
say "== compiling ${#SOURCES[@]} files with $CXX in $BUILD"
rm -f "$BUILD"/obj/*.o
export CXX BUILD
flags="-std=c++17 -O2 -fPIC ${INCLUDES[*]}"
compile_all() {
  printf '%s\n' "${SOURCES[@]}" | timeout 400 xargs -P "$(nproc)" -I{} sh -c \
    'o="$BUILD/obj/$(echo "{}" | md5sum | cut -c1-12).o"; '"$CXX $flags"' -c "{}" -o "$o" || { echo "FAILED: {}"; exit 255; }'
}
# libcrypto where the core signs its rendezvous with it (core/auth.cc).
extra_libs=()
if grep -qs "openssl/" "$OPS"/core/*.cc "$OPS"/core/*.h "$OPS"/backends/tcp/*; then
  extra_libs+=(-lcrypto)
  if ! echo '#include <openssl/hmac.h>' | "$CXX" -E -x c++ - >/dev/null 2>&1; then
    # No headers (a GPU machine without libssl-dev and no registry): declare the
    # three functions auth.cc calls and link OpenSSL 3's runtime library itself.
    crypto="$(ldconfig -p 2>/dev/null | sed -n 's/.*libcrypto\.so\.3 .*=> //p' | head -n 1)"
    if [ -z "$crypto" ]; then
      say "device check: the core needs OpenSSL's libcrypto (apt-get install libssl-dev)"
      exit 2
    fi
    say "no OpenSSL headers here: declaring HMAC/SHA256 (tests/gpu/libcrypto_decls), linking $crypto"
    flags="$flags -I$ROOT/tests/gpu/libcrypto_decls"
    extra_libs=("$crypto")
  fi
fi
link() {
  "$CXX" -o "$BUILD/tfhvd_nccl_harness" "$BUILD"/obj/*.o "$CUDART" "$NCCL_LIB" -ldl -lpthread \
    ${extra_libs[@]+"${extra_libs[@]}"} \
    -Wl,-rpath,"$(dirname "$CUDART")" -Wl,-rpath,"$(dirname "$NCCL_LIB")"
}
if ! compile_all 2>&1 | tee -a "$LOG" || ! link 2>&1 | tee -a "$LOG"; then
  say "device check: the harness did not build"
  exit 2
fi
say "== built in $(( $(date +%s) - start )) s"

HARNESS="$BUILD/tfhvd_nccl_harness"
passed=0
failed=0
# count FILE RC: adds a run's (or rank's) "N passed, M failed" to the totals;
# a process that ended without that line (a crash, a timeout) is a failure.
count() {
  local line
  line="$(grep -E '^(rank [0-9]+: )?[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1)"
  if [ -z "$line" ]; then
    say "FAIL: $(basename "$1") ended (exit $2) without its summary line"
    failed=$((failed + 1))
    return
  fi
  line="${line#rank *: }"
  passed=$((passed + ${line%% passed*}))
  local f="${line#*passed, }"
  failed=$((failed + ${f%% failed}))
  if [ "$2" != 0 ] && [ "${f%% failed}" = 0 ]; then
    say "FAIL: $(basename "$1") exited $2"
    failed=$((failed + 1))
  fi
}

# one_rank NAME ARGS...: the harness alone.
one_rank() {
  local name="$1" rc
  shift
  TFHVD_HARNESS_SIZE=1 timeout -k 5 "$RUN_TIMEOUT" "$HARNESS" "$@" >"$BUILD/$name.out" 2>&1
  rc=$?
  tee -a "$LOG" <"$BUILD/$name.out"
  [ "$rc" = 124 ] && say "FAIL: $name passed its $RUN_TIMEOUT s limit"
  count "$BUILD/$name.out" "$rc"
}

# two_ranks NAME ARGS...: two processes, each its own NCCL "host", sharing GPU 0.
two_ranks() {
  local name="$1" port="$(free_port)" pids=() r rc
  shift
  for r in 0 1; do
    TFHVD_HARNESS_RANK=$r TFHVD_HARNESS_SIZE=2 TFHVD_HARNESS_ADDR="127.0.0.1:$port" \
      NCCL_HOSTID="tfhvd-device-check-rank$r" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
      timeout -k 5 "$RUN_TIMEOUT" "$HARNESS" "$@" >"$BUILD/$name.$r.out" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}"
    rc=$?
    say "-- $name: rank $r of 2 (exit $rc, loopback port $port)"
    tee -a "$LOG" <"$BUILD/$name.$r.out"
    [ "$rc" = 124 ] && say "FAIL: $name rank $r passed its $RUN_TIMEOUT s limit"
    if grep -q "Duplicate GPU" "$BUILD/$name.$r.out"; then
      say "NOTE: NCCL refused two ranks on one GPU despite distinct NCCL_HOSTID"
    fi
    count "$BUILD/$name.$r.out" "$rc"
  done
}

if [ "$gpu" = 0 ]; then
  say "== no GPU: the harness's host-tensor checks over the same sockets and runtime"
  one_rank host1 --host
  two_ranks host2 --host
  "$HARNESS" --require-gpu 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  say "device check: no GPU on this machine; the harness was built (GPU run: exit $rc, 3 = no GPU); no GPU check ran"
  say "$passed passed, $failed failed"
  [ "$failed" = 0 ] && [ "$rc" = 3 ] && exit 3
  exit 1
fi

say "== the finalizer and the executor's hand-over, on the host (tests/gpu/finalizer_test.cc)"
if "$CXX" -std=c++17 -O2 -o "$BUILD/finalizer_test" "$ROOT/tests/gpu/finalizer_test.cc" \
    "$OPS/backends/nccl/finalizer.cc" "$OPS"/core/{operations,adasum,timeline,process_set,common,cpu_math,response_cache,message}.cc \
    -lpthread 2>&1 | tee -a "$LOG"; then
  timeout -k 5 60 "$BUILD/finalizer_test" >"$BUILD/finalizer.out" 2>&1
  rc=$?
  tee -a "$LOG" <"$BUILD/finalizer.out"
  count "$BUILD/finalizer.out" "$rc"
else
  say "FAIL: finalizer_test did not build"
  failed=$((failed + 1))
fi

say "== 1 rank: every check, the allreduce and training-step tables, the copy/scale kernels"
one_rank rank1 --require-gpu --bench --bench-step --bench-copy --iters "$ITERS"
say "== 2 ranks on GPU 0 (NCCL_HOSTID per rank, P2P and SHM off, loopback sockets)"
two_ranks rank2 --require-gpu --bench --bench-step --iters "$ITERS"

say "== a lost peer: rank 1 is killed while both run allreduces; rank 0 must end in time"
lost_peer() {
  local port="$(free_port)" pids=() r rc t0 took deadline=20
  for r in 0 1; do
    TFHVD_HARNESS_RANK=$r TFHVD_HARNESS_SIZE=2 TFHVD_HARNESS_ADDR="127.0.0.1:$port" \
      NCCL_HOSTID="tfhvd-device-check-rank$r" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo TFHVD_NCCL_TIMEOUT=$deadline \
      timeout -k 5 "$RUN_TIMEOUT" "$HARNESS" --require-gpu --flat --loop 1000000000 \
      >"$BUILD/lost_peer.$r.out" 2>&1 &
    pids+=($!)
  done
  sleep 20  # both ranks past init and into the loop
  pkill -9 -P "${pids[1]}" 2>/dev/null  # the harness under rank 1's timeout
  kill -9 "${pids[1]}" 2>/dev/null
  t0=$(date +%s)
  wait "${pids[0]}"
  rc=$?
  took=$(( $(date +%s) - t0 ))
  wait "${pids[1]}" 2>/dev/null
  tee -a "$LOG" <"$BUILD/lost_peer.0.out"
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] && [ "$took" -le $((deadline + 15)) ] &&
      grep -qE "NCCL|TFHVD_NCCL_TIMEOUT" "$BUILD/lost_peer.0.out"; then
    say "PASS lost peer: rank 0 ended (exit $rc) $took s after rank 1 was killed"
    passed=$((passed + 1))
  else
    say "FAIL lost peer: rank 0 exit $rc, $took s after rank 1 was killed (deadline $deadline s)"
    failed=$((failed + 1))
  fi
}
lost_peer

say "== device check finished in $(( $(date +%s) - start )) s; log: $LOG"
say "$passed passed, $failed failed"
[ "$failed" = 0 ]
