#!/usr/bin/env bash
# The compile matrix's op axis: tfhvd_ops/tensorflow/gpu_kernels.cc compiled
# for each per-op GPU set a user can ask for (TFHVD_GPU_ALLREDUCE=NCCL alone,
# TFHVD_GPU_BROADCAST=NCCL alone, ...; gpu_config.py turns them into
# TFHVD_GPU_<OP>=1), with the GPU build's own compiler flags, warnings as
# errors.  Each object must register GPU kernels for exactly the ops of its
# set: the registration's op names are read from the object's strings.
#
#   tests/gpu/check_gpu_op_subsets.sh build-gpu [OUT_DIR]
#
# BUILD_DIR is a configured GPU build (make gpu-build); its flags.make gives
# the includes and flags.  -O0: only the preprocessor branches matter here.
set -euo pipefail

BUILD="$1"
OUT="${2:-$BUILD/op-subsets}"
FLAGS="$BUILD/CMakeFiles/tfhvd_tf.dir/flags.make"
SOURCE="tfhvd_ops/tensorflow/gpu_kernels.cc"
[ -f "$FLAGS" ] || { echo "no $FLAGS: run make gpu-build first"; exit 2; }
value() { sed -n "s/^$1 = //p" "$FLAGS"; }
# Every -I as -isystem: warnings count in our source, not in TF's headers.
INCLUDES="$(value CXX_INCLUDES | sed 's/-I/-isystem /g')"
CXXFLAGS="$(value CXX_FLAGS | sed 's/-O[0-3s]//g; s/-DNDEBUG//; s/-I/-isystem /g')"
CXX="$(sed -n 's/^# compile CXX with //p' "$FLAGS")"
mkdir -p "$OUT"

# op -> the kernels gpu_kernels.cc registers for it.
declare -A KERNELS=(
  [ALLREDUCE]="HorovodAllreduce HorovodGroupedAllreduce"
  [ALLGATHER]="HorovodAllgather HorovodGroupedAllgather"
  [BROADCAST]="HorovodBroadcast HorovodBroadcastInplace HorovodBroadcastInplaceResource"
  [ALLTOALL]="HorovodAlltoall"
  [REDUCESCATTER]="HorovodReducescatter HorovodGroupedReducescatter"
)
ALL="${!KERNELS[*]}"

compile() {  # compile OP: the object of the set {OP}
  # shellcheck disable=SC2086  # the flags are words
  $CXX -DTFHVD_GPU_"$1"=1 $INCLUDES $CXXFLAGS -O0 -g0 -Wall -Werror -c "$SOURCE" -o "$OUT/$1.o" \
    >"$OUT/$1.log" 2>&1
}

pids=()
names=()
for op in $ALL; do
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 0.2; done
  compile "$op" &
  pids+=($!)
  names+=("$op")
done
failed=0
passed=0
for i in "${!pids[@]}"; do
  op="${names[$i]}"
  if ! wait "${pids[$i]}"; then
    echo "FAIL TFHVD_GPU_$op alone does not compile:"; tail -n 15 "$OUT/$op.log"
    failed=$((failed + 1)); continue
  fi
  found="$(strings "$OUT/$op.o" | grep -xE 'Horovod[A-Za-z]+' | sort -u | tr '\n' ' ')"
  why=""
  for other in $ALL; do
    for k in ${KERNELS[$other]}; do
      if [ "$other" = "$op" ]; then
        [[ " $found " == *" $k "* ]] || why="$why$k missing; "
      else
        [[ " $found " != *" $k "* ]] || why="$why$k registered; "
      fi
    done
  done
  if [ -z "$why" ]; then
    echo "PASS TFHVD_GPU_$op alone: registers ${KERNELS[$op]}"; passed=$((passed + 1))
  else
    echo "FAIL TFHVD_GPU_$op alone: $why(found: $found)"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
