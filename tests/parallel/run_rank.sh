#!/usr/bin/env bash
# Runs one rank of a parallel test command under mpirun.  Rank 0 prints to the
# terminal; the other ranks write to a log that is shown only if they fail, so
# the output ends with rank 0's pytest summary.
rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${HOROVOD_RANK:-0}}}"
if [ "$rank" = 0 ]; then
  exec "$@"
fi
log="$(mktemp "${TMPDIR:-/tmp}/tfhvd-rank${rank}-XXXX.log")"
"$@" >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "---- rank $rank failed (exit $rc); its output:" >&2
  tail -n 80 "$log" >&2
fi
rm -f "$log"
exit $rc
