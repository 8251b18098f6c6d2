#!/usr/bin/env bash
# Compares two builds of tfhvd on the same machine, run after run, alternating,
# so that both see the same noise (docs/PERFORMANCE.md).
#
#   scripts/compare_builds.sh OLD NEW [RUNS]
#
# OLD and NEW are directories that each hold a built `tfhvd` package (for
# example: `git worktree add /tmp/old <commit> && make -C /tmp/old setup`, then
# OLD=/tmp/old; or a copy of a checkout's tfhvd/ directory).  Each run prints,
# for OLD then NEW (NEW first on even runs):
#   * examples/graph_benchmark.py's collective rows (--reps 100 --rounds 2, or
#     the arguments in $GRAPH_BENCH_ARGS, e.g. "--large --reps 60 --skip-mlp");
#   * rank 0's negotiation rounds of the 64 x 4 KiB function (300 calls, from
#     TFHVD_LOG_LEVEL=debug): how many rounds carried all 64 tensors, and the
#     medians of "negotiation took" and "executed in" over those rounds.
# Run from anywhere; uses this checkout's .venv and examples.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
old="$1"; new="$2"; runs="${3:-3}"
py="$here/.venv/bin/python"
read -r -a bench_args <<< "${GRAPH_BENCH_ARGS:---reps 100 --rounds 2 --skip-mlp}"
mpirun=(mpirun -np 2 --bind-to none --oversubscribe --mca btl_vader_single_copy_mechanism none
        -x OMP_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL=3)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
summary='
import re, statistics, sys
neg, ex, rounds = [], [], 0
lines = sys.stdin.read().splitlines()
for i, line in enumerate(lines):
    m = re.search(r"round: \d+ responses for (\d+) tensors", line)
    if not m:
        continue
    rounds += 1
    for nxt in lines[i + 1:i + 4]:
        t = re.search(r"executed in ([\d.]+) us; negotiation took ([\d.]+) us", nxt)
        if t:
            if m.group(1) == "64":
                ex.append(float(t.group(1)))
                neg.append(float(t.group(2)))
            break
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("  rounds: %d, of all 64 tensors: %d; negotiation %.1f us, execution %.1f us (medians)"
      % (rounds, len(neg), med(neg), med(ex)))
'
for ((i = 1; i <= runs; i++)); do
  pair=("$old" "$new")
  (( i % 2 == 0 )) && pair=("$new" "$old")
  for dir in "${pair[@]}"; do
    echo "== run $i: $dir ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))"
    (cd /tmp && "${mpirun[@]}" -x PYTHONPATH="$dir" "$py" "$here/examples/graph_benchmark.py" \
        "${bench_args[@]}" 2>&1 | grep -E '^\| (1 x|64 x)|over twin /')
    (cd /tmp && "${mpirun[@]}" -x PYTHONPATH="$dir" -x TFHVD_LOG_LEVEL=debug "$py" \
        "$here/examples/graph_benchmark.py" --probe-64 300 2>&1 | "$py" -c "$summary")
  done
done
