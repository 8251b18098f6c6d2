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

.PHONY: setup mpi demo test test-core test-single test-parallel test-parallel-np4 \
	test-integration clean \
	gpu-deps gpu-build test-gpu-build test-gpu docker-check

# The GPU variant (TFHVD_GPU_OPERATIONS=NCCL), built in its own folder so the
# CPU library above stays as it is.  Its CUDA runtime and NCCL wheels go to
# GPU_DEPS (pip --target), found through PYTHONPATH like an installed
# tensorflow[and-cuda] would be.  A machine without a CUDA 12 nvcc (this one
# has CUDA 13's) compiles the .cu files with the nvcc it has, as a
# compile-and-link check (TFHVD_CUDA_COMPILE_CHECK=1); set TFHVD_CUDA_HOME to
# a CUDA 12 toolkit for a library to run.
GPU_BUILD_DIR ?= build-gpu
GPU_DEPS := $(VENV)/gpu-deps
GPU_DEPS_STAMP := $(GPU_DEPS)/.tfhvd-gpu-deps
GPU_LIB := $(GPU_BUILD_DIR)/lib/tfhvd/tfhvd_ops.so
GPU_ENV := PYTHON=$(abspath $(PY)) PYTHONPATH=$(abspath $(GPU_DEPS)) TFHVD_GPU_OPERATIONS=NCCL \
	TFHVD_CUDA_COMPILE_CHECK=$${TFHVD_CUDA_COMPILE_CHECK:-1} TFHVD_BUILD_DIR=$(abspath $(GPU_BUILD_DIR))
GPU_SOURCES := $(shell find tfhvd_ops tests/gpu -name '*.cc' -o -name '*.h' -o -name '*.cu' \
	-o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name 'gpu_config.py')

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
	$(MPIRUN) -np 2 $(PY) examples/keras_mnist.py --epochs 5

test: setup test-core test-single test-parallel test-parallel-np4 test-integration test-gpu-build \
	docker-check
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

# Process sets need more ranks than two sets of one: np 4, oversubscribed (about 30 s).
test-parallel-np4: setup
	@echo "== process-set tests under mpirun -np 4"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 4 tests/parallel/run_rank.sh $(PY) -m pytest -q --color=no -p no:cacheprovider tests/parallel/test_process_sets.py

# Real tfhvdrun jobs: launcher, bad input, faults, stall inspector, timeline,
# multi-node (two network namespaces with sshd; needs root, else it skips).
test-integration: setup
	@echo "== integration tests: tfhvdrun, faults, timeline, multi-node"
	@bash scripts/install_sshd.sh || echo "(no sshd: the multi-node test will skip)"
	timeout --signal=KILL 1800 $(PY) -m pytest -q --color=no -p no:cacheprovider tests/integration

gpu-deps: $(GPU_DEPS_STAMP)
$(GPU_DEPS_STAMP): docker/versions.env docker/install_gpu_wheels.sh $(DEPS_STAMP)
	TFHVD_PIP_TARGET=$(GPU_DEPS) PYTHON=$(PY) docker/install_gpu_wheels.sh
	@touch $@

gpu-build: setup $(GPU_LIB)
$(GPU_LIB): $(GPU_SOURCES) $(NATIVE_SOURCES) setup.py $(GPU_DEPS_STAMP) docker/build_tfhvd.sh
	@echo "== building the GPU variant in $(GPU_BUILD_DIR) (TFHVD_GPU_OPERATIONS=NCCL)"
	$(GPU_ENV) TFHVD_INSTALL=0 TFHVD_LIB_DIR=$(abspath $(GPU_BUILD_DIR))/lib docker/build_tfhvd.sh
	@touch $@

# On a CPU machine: the GPU library loads, reports NCCL, registers GPU
# kernels and still runs CPU collectives; the harness and tests/gpu say why
# they skip.  On a GPU machine the same commands run the GPU checks.
test-gpu-build: gpu-build
	@echo "== GPU build checks"
	$(TIMEOUT) $(GPU_BUILD_DIR)/tfhvd_nccl_harness
	@# The GPU machine's script, MPI-free variant: builds, then exits 3 (no GPU here).
	rc=0; PYTHONPATH=$(abspath $(GPU_DEPS)) TFHVD_HARNESS_LOOPBACK=1 $(TIMEOUT) \
	  tests/gpu/device_check.sh >$(GPU_BUILD_DIR)/device_check.out 2>&1 || rc=$$?; \
	  tail -n 4 $(GPU_BUILD_DIR)/device_check.out; test $$rc = 3
	PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib PYTHON=$(abspath $(PY)) $(TIMEOUT) docker/check_image.sh
	@# -P: the source tree's tfhvd/ (CPU library) must not shadow the GPU build.
	PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib $(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 2 \
	  tests/parallel/run_rank.sh $(PY) -P -m pytest -q -rs --color=no -p no:cacheprovider \
	  tests/gpu tests/parallel/test_collectives.py -k "gpu or test_allreduce"

# On a GPU machine: every GPU test, one process and one process per GPU.
test-gpu: gpu-build
	PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib $(TEST_ENV) $(PY) -P -m pytest -q -rs --color=no \
	  -p no:cacheprovider tests/gpu
	n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); if [ "$${n:-0}" -gt 1 ]; then \
	  PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib $(TEST_ENV) $(MPIRUN) -np $$n \
	  tests/parallel/run_rank.sh $(PY) -P -m pytest -q -rs --color=no -p no:cacheprovider tests/gpu; fi

# The Dockerfile's lint and its install scripts, in CPU mode on this machine
# (make gpu-build and test-gpu-build run the rest of docker/).
docker-check: $(DEPS_STAMP)
	@echo "== Dockerfile: hadolint, versions, install scripts in CPU mode"
	PYTHON=$(PY) docker/lint.sh
	PYTHON=$(PY) docker/install_system.sh
	PYTHON=$(PY) TFHVD_GPU=0 docker/install_python_deps.sh

clean:
	rm -rf $(BUILD_DIR) $(GPU_BUILD_DIR) $(LIB) *.egg-info
