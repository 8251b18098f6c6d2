#!/usr/bin/env bash
# Runs a build command with ccache as the compiler launcher, when ccache is
# installed (`make test` installs it; scripts/install_system_packages.sh ccache):
#
#   scripts/with_build_cache.sh COMMAND [ARG...]
#
# CMake (3.17+) reads CMAKE_CXX_COMPILER_LAUNCHER and CMAKE_C_COMPILER_LAUNCHER
# from the environment when it configures a new build folder, and
# tests/gpu/fake_cuda/fake.mk puts $CMAKE_CXX_COMPILER_LAUNCHER before its
# compiler.  The cache lives in build/ccache (TFHVD_CCACHE_DIR overrides it), so
# `make clean` empties it and nothing outside the checkout changes.
#
# Why: `make test` builds the library three times (the main build, the Gloo-only
# variant, the GPU variant) and the fake-GPU harness twice.  The files that see
# TensorFlow's headers preprocess to the same text in all three library builds,
# and ccache's preprocessor mode hashes that text, not the -I/-D flags around
# it: the later builds reuse those objects (docs/testing.md has the figures).
# Without ccache the command runs unchanged.
set -euo pipefail
if command -v ccache >/dev/null 2>&1; then
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  export CCACHE_DIR="${TFHVD_CCACHE_DIR:-$here/build/ccache}"
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi
exec "$@"
