#!/usr/bin/env bash
# Installs Debian's openssh-server for the multi-node test (tests/integration/
# test_multinode.py), which starts its own sshd in two network namespaces.
# Nothing is enabled or started here: the test runs sshd itself, with keys and
# a config it generates, and stops it when done.
set -euo pipefail
if [ -x /usr/sbin/sshd ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_sshd.sh: needs root and apt-get to install openssh-server" >&2
  exit 1
fi
echo "== installing openssh-server (for the multi-node test)"
export DEBIAN_FRONTEND=noninteractive
# Keep the package from starting a system sshd: the test starts its own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod +x "$policy"
  created_policy=1
fi
apt-get update -qq
apt-get install -y -qq openssh-server openssh-client >/dev/null
if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
test -x /usr/sbin/sshd
