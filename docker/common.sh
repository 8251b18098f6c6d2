# shellcheck shell=bash
# Sourced by the docker/ scripts: defaults from versions.env for every
# variable the caller left unset, and a logger.
DOCKER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TFHVD_ROOT="$(dirname "$DOCKER_DIR")"
export TFHVD_ROOT
while IFS='=' read -r key value; do
  case "$key" in ''|'#'*) continue ;; esac
  if [ -z "${!key+x}" ]; then export "$key=$value"; fi
done <"$DOCKER_DIR/versions.env"
PYTHON="${PYTHON:-python3}"
log() { echo "== [$(basename "$0")] $*"; }
