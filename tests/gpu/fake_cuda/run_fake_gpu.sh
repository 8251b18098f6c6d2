#!/usr/bin/env bash
# Runs the NCCL harness built against the fake CUDA + NCCL (fake_gpu.h) on a
# machine without a GPU: every GPU check at 1, 2 and 3 ranks, then fault cases
# that check what the library does when the GPU side fails.
#
#   tests/gpu/fake_cuda/run_fake_gpu.sh build-gpu/fake-gpu/tfhvd_fake_gpu_harness
#   tests/gpu/fake_cuda/run_fake_gpu.sh HARNESS --checks-only   (every GPU check
#       at 1 and 2 ranks, no fault cases: a harness built against other headers)
#
# Ranks are processes started here (tests/gpu/socket_backend.cc reads their
# rank, size and rank 0's address); two ranks get distinct PCI bus ids
# (TFHVD_FAKE_GPU_BUS_ID), i.e. two GPUs of one host, unless a case says
# otherwise.  Each case checks exit codes, messages and how long it took
# (a hang is a failure, never a wait), and that it left nothing in /dev/shm.
# The last line is "N passed, M failed"; exit 0 when nothing failed.
set -uo pipefail

HARNESS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
WORK="$(dirname "$HARNESS")/runs"
TAG="run$$"
export TFHVD_FAKE_SHM_TAG="$TAG"
RUN_LIMIT=60  # seconds per process; every case ends far sooner
mkdir -p "$WORK"
rm -f "$WORK"/*.out
passed=0
failed=0

leftovers() { ls /dev/shm 2>/dev/null | grep -E "^tfhvd-fake-nccl-${TAG}-" || true; }
cleanup() { for f in $(leftovers); do rm -f "/dev/shm/$f"; done; }
PIDS=()
trap cleanup EXIT
# Interrupted (make's timeout): end the ranks started here first.
trap 'for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null; done; wait; cleanup; exit 130' INT TERM

ok() { echo "PASS $1 ($2 s)"; passed=$((passed + 1)); }
bad() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  for f in "$WORK/$CASE".*out; do
    [ -f "$f" ] && { echo "  --- $(basename "$f") (last lines)"; tail -n 6 "$f" | cut -c1-400 | sed 's/^/  /'; }
  done
}
now() { date +%s.%N; }
# A TCP port free on this host now (the kernel's pick for port 0).  A random
# port of 20000-39999 could already be taken: the kernel's ephemeral ports
# start at 32768, and once rank 0 failed to bind one while rank 1 waited.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# run NAME NRANKS [VAR=VALUE ...] -- ARGS...: starts the ranks (a variable
# written rK:VAR=VALUE goes to rank K only), waits; sets RC[r] and ELAPSED.
run() {
  CASE="$1"
  local n="$2" port="$(free_port)" start r
  shift 2
  local vars=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  start="$(now)"
  PIDS=()
  for ((r = 0; r < n; r++)); do
    local env_r=("TFHVD_HARNESS_RANK=$r" "TFHVD_HARNESS_SIZE=$n" "TFHVD_HARNESS_ADDR=127.0.0.1:$port"
                 "TFHVD_FAKE_GPU_BUS_ID=0000:$((41 + r)):00.0")
    for v in ${vars[@]+"${vars[@]}"}; do
      case "$v" in
        r[0-9]:*) [ "${v:1:1}" = "$r" ] && env_r+=("${v#r[0-9]:}") ;;
        *) env_r+=("$v") ;;
      esac
    done
    env "${env_r[@]}" timeout -k 5 "$RUN_LIMIT" "$HARNESS" --require-gpu "$@" \
      >"$WORK/$CASE.$r.out" 2>&1 &
    PIDS+=($!)
  done
  RC=()
  for ((r = 0; r < n; r++)); do
    wait "${PIDS[$r]}"
    RC[$r]=$?
  done
  ELAPSED="$(secs "$start")"
  # The fake unlinks a segment once every rank mapped it; only a rank that
  # died waiting for a peer that never came (KILLED_WAITING=1) leaves one,
  # which the trap would remove anyway.
  local left
  left="$(leftovers)"
  cleanup
  if [ -n "$left" ] && [ "${KILLED_WAITING:-0}" != 1 ]; then
    bad "$CASE" "left in /dev/shm: $left"
    return 1
  fi
  return 0
}

# has NAME RANK TEXT: the rank's output contains TEXT (not counting the
# harness's banner, which names NCCL).
has() { grep -v '^tfhvd NCCL harness: ' "$WORK/$1.$2.out" | grep -qF -- "$3"; }
summary() { grep -E '^(rank [0-9]+: )?[0-9]+ passed, [0-9]+ failed$' "$WORK/$1.$2.out" | tail -n 1; }
under() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# every_check NAME NRANKS [VARS] -- ARGS: every rank exits 0, its summary says 0 failed.
every_check() {
  local name="$1" n="$2" r why=""
  run "$@" || return
  for ((r = 0; r < n; r++)); do
    local s
    s="$(summary "$name" "$r")"
    local p="${s#rank *: }"
    p="${p%% passed*}"
    if [ "${RC[$r]}" != 0 ] || [[ "$s" != *" 0 failed" ]] || [ "${p:-0}" -lt 1 ]; then
      why="${why}rank $r exited ${RC[$r]} ('${s:-no summary}'); "
    fi
  done
  if [ -z "$why" ]; then ok "$name: $(summary "$name" 0)" "$ELAPSED"; else bad "$name" "$why"; fi
}

# fails_with NAME NRANKS MAX_S TEXT [VARS] -- ARGS: every rank exits non-zero
# within MAX_S seconds, each with TEXT in its output (a hang or a pass fails).
fails_with() {
  local name="$1" n="$2" max="$3" text="$4" r why=""
  shift 4
  run "$name" "$n" "$@" || return
  for ((r = 0; r < n; r++)); do
    [ "${RC[$r]}" = 0 ] && why="${why}rank $r succeeded; "
    [ "${RC[$r]}" = 124 ] || [ "${RC[$r]}" = 137 ] && why="${why}rank $r hung (killed after $RUN_LIMIT s); "
    has "$name" "$r" "$text" || why="${why}rank $r lacks '$text'; "
  done
  under "$ELAPSED" "$max" || why="${why}took $ELAPSED s (limit $max s); "
  if [ -z "$why" ]; then ok "$name: every rank failed with '$text'" "$ELAPSED"; else bad "$name" "$why"; fi
}

finish() {
  cleanup
  left="$(leftovers)"
  [ -z "$left" ] || bad shm "still in /dev/shm after the run: $left"
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
}

one=(--only "allreduce sum float32" --flat)
one_nccl=(--only "broadcast int64 from the last rank" --flat)
echo "== the harness's GPU checks on the fake GPU (flat and hierarchical)"
every_check gpu-1rank 1 TFHVD_NCCL_TIMEOUT=30 --
every_check gpu-2ranks 2 TFHVD_NCCL_TIMEOUT=30 --
[ "${2:-}" = --checks-only ] && finish
every_check gpu-3ranks 3 TFHVD_NCCL_TIMEOUT=30 --
# Ordering with every stream operation slowed down: a collective that does
# not wait for its input's ready event (or a launch that waits for the
# device on the loop) reads garbage or completes out of order.
every_check ordering-slow-streams 2 TFHVD_FAKE_OP_DELAY_MS=40 TFHVD_NCCL_TIMEOUT=30 -- \
  --only "ready event" --flat
every_check in-flight-slow-streams 2 TFHVD_FAKE_OP_DELAY_MS=20 TFHVD_NCCL_TIMEOUT=30 -- \
  --only "in flight" --flat
every_check sm86-loads-the-sm80-cubin 1 TFHVD_FAKE_GPU_CC=86 -- "${one[@]}"

# Process sets: each gets its own communicator, removed and made again, and
# every set on a GPU shares the global set's kernel module (one load per
# process, where a module per set would load one per set and re-creation).
shared_kernels() {
  local name="$1" n="$2" r why=""
  shift 2
  run "$name" "$n" TFHVD_FAKE_REPORT_MODULE_LOADS=1 TFHVD_NCCL_TIMEOUT=30 -- \
    --only "process sets" --flat || return
  for ((r = 0; r < n; r++)); do
    local loads
    loads="$(grep -c '^fake-gpu: kernel module loaded$' "$WORK/$name.$r.out")"
    [ "${RC[$r]}" = 0 ] || why="${why}rank $r exited ${RC[$r]} ('$(summary "$name" "$r")'); "
    [ "$loads" = 1 ] || why="${why}rank $r loaded the kernel module $loads times; "
  done
  if [ -z "$why" ]; then ok "$name: $(summary "$name" 0), one kernel module per process" "$ELAPSED"
  else bad "$name" "$why"; fi
}
shared_kernels process-sets-share-kernels-2ranks 2
shared_kernels process-sets-share-kernels-3ranks 3

echo "== placement: two ranks on one GPU"
fails_with one-gpu-two-ranks 2 10 "one GPU per rank is required" \
  TFHVD_FAKE_GPU_BUS_ID=0000:41:00.0 r1:TFHVD_FAKE_GPU_BUS_ID=0000:41:00.0 -- "${one[@]}"
for r in 0 1; do
  if ! has one-gpu-two-ranks "$r" "Pin each rank's GPU" || has one-gpu-two-ranks "$r" "Duplicate GPU"; then
    bad one-gpu-two-ranks "rank $r: no pinning advice, or NCCL's own message got through"
  fi
done
every_check one-gpu-two-hosts 2 r1:TFHVD_FAKE_GPU_BUS_ID=0000:41:00.0 \
  r0:NCCL_HOSTID=host-a r1:NCCL_HOSTID=host-b -- "${one[@]}"

echo "== NCCL failures: every rank ends with an error naming NCCL, within the timeout"
fails_with nccl-async-error-2ranks 2 8 "NCCL" \
  TFHVD_NCCL_TIMEOUT=20 r1:TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER=2 -- --only "allreduce sum" --flat
has nccl-async-error-2ranks 1 "TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER" ||
  bad nccl-async-error-2ranks "rank 1 does not name its own NCCL error"
# (Rank 0 may see rank 1's exit first: an NCCL remote error, or its own timeout.)
fails_with nccl-hang-2ranks 2 13 "NCCL" \
  TFHVD_NCCL_TIMEOUT=3 r1:TFHVD_FAKE_NCCL_HANG_AFTER=1 -- --only "allreduce sum" --flat
has nccl-hang-2ranks 1 "did not finish within 3 s (TFHVD_NCCL_TIMEOUT" ||
  bad nccl-hang-2ranks "rank 1 does not report its own timeout"
under 2.5 "$ELAPSED" || bad nccl-hang-2ranks "ended after $ELAPSED s, before its 3 s timeout"
# (One rank's allreduce is a copy, without NCCL: these run a broadcast.)
fails_with nccl-async-error-1rank 1 8 "NCCL error on rank 0" \
  TFHVD_NCCL_TIMEOUT=20 TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER=0 -- "${one_nccl[@]}"
fails_with nccl-hang-1rank 1 13 "did not finish within 3 s (TFHVD_NCCL_TIMEOUT" \
  TFHVD_NCCL_TIMEOUT=3 TFHVD_FAKE_NCCL_HANG_AFTER=0 -- "${one_nccl[@]}"
# Rank 1's ncclCommInitRank fails before it meets rank 0, which waits in
# its own ncclCommInitRank (as NCCL's bootstrap does) until the deadline.
KILLED_WAITING=1 fails_with nccl-init-error-rank1 2 13 "NCCL" \
  TFHVD_NCCL_TIMEOUT=3 r1:TFHVD_FAKE_NCCL_INIT_ERROR=1 -- "${one[@]}"
has nccl-init-error-rank1 0 "creating the NCCL communicator did not finish within 3 s" ||
  bad nccl-init-error-rank1 "rank 0 does not report the deadline of ncclCommInitRank"
has nccl-init-error-rank1 1 "in ncclCommInitRank: unhandled system error" ||
  bad nccl-init-error-rank1 "rank 1 does not report its own ncclCommInitRank failure"

# A lost peer: rank 1 is killed (SIGKILL) while both run collectives in a loop;
# rank 0 must end non-zero within its deadline, naming NCCL or the deadline.
kill_one_rank() {
  CASE=kill-one-rank
  local port="$(free_port)" start r pids=() why=""
  for r in 0 1; do
    env TFHVD_HARNESS_RANK=$r TFHVD_HARNESS_SIZE=2 TFHVD_HARNESS_ADDR="127.0.0.1:$port" \
      TFHVD_FAKE_GPU_BUS_ID="0000:$((41 + r)):00.0" TFHVD_NCCL_TIMEOUT=5 \
      timeout -k 5 "$RUN_LIMIT" "$HARNESS" --require-gpu --flat --loop 100000000 \
      >"$WORK/$CASE.$r.out" 2>&1 &
    pids+=($!)
  done
  PIDS=("${pids[@]}")
  sleep 3
  pkill -9 -P "${pids[1]}" 2>/dev/null  # the harness under rank 1's timeout
  kill -9 "${pids[1]}" 2>/dev/null
  start="$(now)"
  wait "${pids[0]}"
  local rc=$?
  wait "${pids[1]}" 2>/dev/null
  ELAPSED="$(secs "$start")"
  KILLED_WAITING=1 cleanup
  [ "$rc" = 0 ] && why="${why}rank 0 succeeded; "
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && why="${why}rank 0 hung; "
  grep -qE "NCCL|TFHVD_NCCL_TIMEOUT" "$WORK/$CASE.0.out" || why="${why}rank 0 names neither NCCL nor its deadline; "
  under "$ELAPSED" 12 || why="${why}rank 0 took $ELAPSED s after the kill; "
  if [ -z "$why" ]; then ok "$CASE: rank 0 ended (exit $rc) after rank 1 was killed" "$ELAPSED"
  else bad "$CASE" "$why"; fi
}
kill_one_rank

echo "== elastic jobs: a GPU failure is an error, and the next init works"
# HOROVOD_ELASTIC=1 (what the elastic launchers set): rank 1's NCCL fails in
# the first (flat) round.  No rank is killed: each gets the failure as an
# error of its collectives, shuts down (aborting its communicators), and the
# second round's init builds fresh communicators that pass every check.
run elastic-reset-after-nccl-error 2 HOROVOD_ELASTIC=1 TFHVD_NCCL_TIMEOUT=3 \
  r1:TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER=2 -- --only "allreduce sum" && {
  why=""
  for r in 0 1; do
    [ "${RC[$r]}" = 1 ] || why="${why}rank $r exited ${RC[$r]} (want 1: failed checks, not killed); "
    [ -n "$(summary elastic-reset-after-nccl-error "$r")" ] || why="${why}rank $r has no summary; "
    has elastic-reset-after-nccl-error "$r" "ending the job" && why="${why}rank $r ended the job; "
    grep -q '^FAIL .*\[hierarchical\]' "$WORK/elastic-reset-after-nccl-error.$r.out" &&
      why="${why}rank $r failed after the reset; "
  done
  has elastic-reset-after-nccl-error 1 "TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER" ||
    why="${why}rank 1 does not name its NCCL error; "
  has elastic-reset-after-nccl-error 0 "[hierarchical] (rank 0)" ||
    why="${why}no check ran after the reset; "
  under "$ELAPSED" 40 || why="${why}took $ELAPSED s; "
  if [ -z "$why" ]; then ok "elastic-reset-after-nccl-error: errors, then fresh communicators" "$ELAPSED"
  else bad elastic-reset-after-nccl-error "$why"; fi
}

echo "== CUDA failures"
fails_with cuda-sticky-error 1 10 "cudaErrorIllegalAddress" \
  TFHVD_FAKE_CUDA_STICKY_ERROR_AFTER=3 -- "${one[@]}"
# Kernels that cannot load are no failure of the job: they load at the first
# queued copy; plain copies then use cudaMemcpyAsync and only a collective
# that scales on the GPU fails, on every rank alike, naming the GPU, its
# compute capability and the library's images; the checks after it still run.
kernels_unavailable() {  # NAME NRANKS TEXT [VARS] -- ARGS
  local name="$1" n="$2" text="$3" r why=""
  shift 3
  run "$name" "$n" "$@" || return
  for ((r = 0; r < n; r++)); do
    local out="$WORK/$name.$r.out"
    [ "${RC[$r]}" = 1 ] || why="${why}rank $r exited ${RC[$r]} (want 1: failed checks, not killed); "
    [ -n "$(summary "$name" "$r")" ] || why="${why}rank $r has no summary; "
    has "$name" "$r" "ending the job" && why="${why}rank $r ended the job; "
    grep -q "^FAIL reducescatter, prescaled: .*$text" "$out" ||
      why="${why}rank $r: the prescaled reducescatter did not fail with '$text'; "
    grep -q "^FAIL allreduce sum float32" "$out" && why="${why}rank $r: a plain allreduce failed; "
  done
  grep -q "^PASS allreduce sum float32" "$WORK/$name.0.out" || why="${why}no plain allreduce passed; "
  grep -q "^PASS empty tensors" "$WORK/$name.0.out" || why="${why}the checks after it did not run; "
  under "$ELAPSED" 15 || why="${why}took $ELAPSED s; "
  if [ -z "$why" ]; then ok "$name: plain copies run, scaling fails with '$text'" "$ELAPSED"
  else bad "$name" "$why"; fi
}
kernels_unavailable kernel-module-load-fails 2 "cannot load tfhvd's CUDA kernels on GPU 0 (sm_90)" \
  TFHVD_FAKE_CU_MODULE_LOAD_ERROR=1 -- --flat
kernels_unavailable sm75-has-no-image 1 "GPU 0 is sm_75 but this library's GPU code covers only" \
  TFHVD_FAKE_GPU_CC=75 -- --flat

finish
