#!/usr/bin/env bash
# Installs Debian's openssh-server for the multi-node test (tests/integration/
# test_multinode.py), which starts its own sshd in two network namespaces.
# Nothing is enabled or started here: the test runs sshd itself, with keys and
# a config it generates, and stops it when done.  Fails (exit 1) when sshd is
# missing and cannot be installed.
set -euo pipefail
[ -x /usr/sbin/sshd ] && exit 0
bash "$(dirname "${BASH_SOURCE[0]}")/install_system_packages.sh" sshd
[ -x /usr/sbin/sshd ] || { echo "install_sshd.sh: needs root and apt-get to install openssh-server" >&2; exit 1; }
