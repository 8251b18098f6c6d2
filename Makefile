# tfhvd: the two commands a newcomer needs are `make demo` and `make test`.
# Both run `make setup` first, which is idempotent and rebuilds only what changed.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
BUILD_DIR ?= build
LIB := tfhvd/tfhvd_ops.so
NATIVE_SOURCES := $(shell find tfhvd_ops tests/core -name '*.cc' -o -name '*.h' -o -name 'CMakeLists.txt')
DEPS_STAMP := $(VENV)/.tfhvd-deps
INSTALL_STAMP := $(VENV)/.tfhvd-install

# mpirun as a user expects it here: root needs --allow-run-as-root, 2 cores need
# --oversubscribe for -np 3; the vader single-copy mechanism needs ptrace, which
# containers often forbid.
MPIRUN_FLAGS := --oversubscribe --mca btl_vader_single_copy_mechanism none \
	$(if $(filter 0,$(shell id -u)),--allow-run-as-root,)
MPIRUN := mpirun $(MPIRUN_FLAGS)
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1
TEST_ENV := TFHVD_STALL_CHECK_TIME_SECONDS=20 TFHVD_STALL_SHUTDOWN_TIME_SECONDS=60
# Per-command ceiling so that no broken test can hang CI.
TIMEOUT := timeout --signal=KILL 900

.PHONY: setup mpi demo test test-core test-single test-parallel clean

setup: mpi $(DEPS_STAMP) $(LIB) $(INSTALL_STAMP)

mpi:
	@if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "== installing OpenMPI from Debian packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      openmpi-bin libopenmpi-dev >/dev/null; \
	  else \
	    echo "OpenMPI is missing: run 'sudo apt-get install -y openmpi-bin libopenmpi-dev'"; exit 1; \
	  fi; \
	fi

$(DEPS_STAMP): requirements.txt
	@echo "== creating $(VENV) and installing requirements.txt"
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	@touch $@

$(LIB): $(NATIVE_SOURCES) setup.py $(DEPS_STAMP)
	@echo "== building the tfhvd library"
	TFHVD_BUILD_DIR=$(abspath $(BUILD_DIR)) $(PY) setup.py -q build_ext --inplace
	@touch $@

$(INSTALL_STAMP): setup.py $(DEPS_STAMP) $(LIB)
	@echo "== installing tfhvd into $(VENV) (editable)"
	TFHVD_BUILD_DIR=$(abspath $(BUILD_DIR)) $(PIP) install -q --no-build-isolation --no-deps -e .
	@touch $@

demo: setup
	$(MPIRUN) -np 2 $(PY) examples/tensorflow_digits.py --epochs 5

test: setup test-core test-single test-parallel
	@echo "== all tests passed"

test-core: setup
	@echo "== core tests (no TensorFlow): 1, 2 and 3 processes"
	$(TIMEOUT) $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(MPIRUN) -np 2 $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(MPIRUN) -np 3 $(BUILD_DIR)/tfhvd_core_test

test-single: setup
	@echo "== single-process tests"
	$(TEST_ENV) $(TIMEOUT) $(PY) -m pytest -q --color=no -p no:cacheprovider tests/single

test-parallel: setup
	@echo "== parallel tests under mpirun -np 2"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 2 tests/parallel/run_rank.sh $(PY) -m pytest -q --color=no -p no:cacheprovider tests/parallel
	@echo "== parallel tests under mpirun -np 3"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 3 tests/parallel/run_rank.sh $(PY) -m pytest -q --color=no -p no:cacheprovider tests/parallel

clean:
	rm -rf $(BUILD_DIR) $(LIB) *.egg-info
