#!/usr/bin/env bash
# The Debian packages tfhvd's make targets need, installed in one apt-get run.
#
#   scripts/install_system_packages.sh GROUP...
#
# Each GROUP names what one need is for; a group whose check passes adds
# nothing.  The missing packages of every group given are installed together,
# with one `apt-get update` and one `apt-get install` (one dpkg run): on a new
# machine that saves an index download and a trigger run for each group.
#
#   mpi          OpenMPI (mpirun, mpicc)                        required
#   openssl      OpenSSL's libcrypto headers (job authentication) required
#   java         Java 17 for pyspark (tfhvd.spark)               required
#   gloo         Gloo, the second CPU backend                    optional
#   xla-headers  highwayhash + farmhash, for the XLA ops          optional
#   sshd         openssh-server for the multi-node tests        optional
#   ccache       compiler cache: make test's second and third
#                builds reuse the first one's objects          optional
#
# Without root or apt-get nothing is installed: the command to run is printed,
# and the exit status is 1 when a required group is missing (an optional one
# only warns, and tfhvd builds without it).
set -euo pipefail

have_file() { [ -f "$1" ]; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }

missing=()
required_missing=()
for group in "$@"; do
  packages=()
  required=0
  case "$group" in
    mpi)
      required=1
      { have_cmd mpirun && have_cmd mpicc; } || packages=(openmpi-bin libopenmpi-dev) ;;
    openssl)
      required=1
      have_file /usr/include/openssl/hmac.h || packages=(libssl-dev) ;;
    java)
      required=1
      have_cmd java || packages=(openjdk-17-jre-headless) ;;
    gloo)
      { have_file /usr/share/cmake/Gloo/GlooConfig.cmake || have_file /usr/lib/cmake/Gloo/GlooConfig.cmake; } \
        || packages=(libgloo-dev) ;;
    xla-headers)
      { have_file /usr/include/highwayhash/highwayhash.h && have_file /usr/include/farmhash.h; } \
        || packages=(libhighwayhash-dev libfarmhash-dev) ;;
    sshd)
      [ -x /usr/sbin/sshd ] || packages=(openssh-server openssh-client) ;;
    ccache)
      have_cmd ccache || packages=(ccache) ;;
    *)
      echo "install_system_packages.sh: unknown group '$group'" >&2
      exit 2 ;;
  esac
  if [ ${#packages[@]} -gt 0 ]; then
    missing+=("${packages[@]}")
    [ "$required" = 1 ] && required_missing+=("$group")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! have_cmd apt-get; then
  echo "missing Debian packages: run 'sudo apt-get install -y ${missing[*]}'" >&2
  if [ ${#required_missing[@]} -gt 0 ]; then
    echo "(required by tfhvd: ${required_missing[*]})" >&2
    exit 1
  fi
  echo "(optional: tfhvd builds and runs without them; the tests that need them skip)" >&2
  exit 0
fi

echo "== installing from Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# openssh-server must not start a system sshd: the multi-node tests start their own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod +x "$policy"
  created_policy=1
fi
trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
