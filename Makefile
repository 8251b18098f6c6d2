# tfhvd: the two commands a newcomer needs are `make demo` and `make test`.
# Both run `make setup` first, which is idempotent and rebuilds only what changed.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# `python -m pip`, not bin/pip: a venv copied from another checkout keeps that
# checkout's interpreter in its scripts' first line, and its pip would install there.
PIP := $(PY) -m pip
BUILD_DIR ?= build
LIB := tfhvd/tfhvd_ops.so
NATIVE_SOURCES := $(shell find tfhvd_ops tests/core -name '*.cc' -o -name '*.h' -o -name 'CMakeLists.txt')
DEPS_STAMP := $(VENV)/.tfhvd-deps
INSTALL_STAMP := $(VENV)/.tfhvd-install
# matplotlib (timeline pictures) beside the venv, not in it: Keras imports pyplot
# eagerly wherever it can, about 0.8 s of CPU in every TensorFlow process
# (requirements-timeline.txt).  The tests that draw, and the docs' commands, put
# it on PYTHONPATH (TIMELINE_DEPS, tests/conftest.py).
TIMELINE_DEPS := $(VENV)/timeline-deps
TIMELINE_STAMP := $(TIMELINE_DEPS)/.tfhvd-timeline-deps
export TIMELINE_DEPS_DIR := $(abspath $(TIMELINE_DEPS))

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

.PHONY: setup system-packages test-system-packages test-engines gloo-only-build test-gloo test-parallel-gloo test-gloo-only demo test \
	skip-report-reset test-core test-single test-parallel test-parallel-np4 test-integration \
	test-elastic test-docs clean \
	gpu-deps gpu-build test-gpu-build test-gpu docker-check

# The GPU variant (TFHVD_GPU_OPERATIONS=NCCL), built in its own folder so the
# CPU library above stays as it is.  Its CUDA 12 runtime, NVRTC and NCCL
# wheels go to GPU_DEPS (pip --target), found through PYTHONPATH like an
# installed tensorflow[and-cuda] would be.  The device code is compiled by
# CUDA 12.5's NVRTC into sm_80/sm_90 cubins plus PTX, embedded in the library
# and loaded with the driver API, so this is a CUDA 12 library that could
# ship, built without any nvcc.  TFHVD_CUDA_HOME=<CUDA 12 toolkit> uses that
# toolkit's nvcc instead; TFHVD_CUDA_COMPILE_CHECK=1 (the named fallback)
# accepts the CUDA 13 nvcc of this machine, for a compile check only.
GPU_BUILD_DIR ?= build-gpu
GPU_DEPS := $(VENV)/gpu-deps
GPU_DEPS_STAMP := $(GPU_DEPS)/.tfhvd-gpu-deps
GPU_LIB := $(GPU_BUILD_DIR)/lib/tfhvd/tfhvd_ops.so
GPU_ENV := PYTHON=$(abspath $(PY)) PYTHONPATH=$(abspath $(GPU_DEPS)) TFHVD_GPU_OPERATIONS=NCCL \
	TFHVD_CUDA_COMPILE_CHECK=$${TFHVD_CUDA_COMPILE_CHECK:-0} TFHVD_BUILD_DIR=$(abspath $(GPU_BUILD_DIR))
GPU_SOURCES := $(shell find tfhvd_ops tests/gpu -path tests/gpu/fake_cuda -prune -o \( -name '*.cc' \
	-o -name '*.h' -o -name '*.cu' -o -name '*.cmake' -o -name 'CMakeLists.txt' \
	-o -name 'gpu_config.py' -o -name 'build_device_code.py' \) -print)

setup: system-packages $(DEPS_STAMP) $(LIB) $(INSTALL_STAMP) $(TIMELINE_STAMP)

# Every compile of the library (main, Gloo-only, GPU) and of the fake-GPU harness
# goes through ccache where it is installed (make test installs it), with its
# cache in build/ccache: the later builds reuse the objects that preprocess to
# the same text, the TensorFlow files above all (scripts/with_build_cache.sh).
BUILD_CACHE := scripts/with_build_cache.sh

# Debian's packages, the missing ones in one apt-get run
# (scripts/install_system_packages.sh says what each group is for):
# OpenMPI, OpenSSL's libcrypto headers (HMAC-SHA256 that authenticates a job's
# requests, docs/security.md) and Java 17 for pyspark are required; Gloo (the
# second CPU backend, tfhvdrun --gloo) and the highwayhash and farmhash headers
# that TensorFlow's XLA headers include (the XLA ops) are optional: tfhvd
# builds without them.  Without root the command to run is printed.
# `make test` adds openssh-server (the multi-node tests) and ccache (see
# BUILD_CACHE) to the same run.
SYSTEM_GROUPS := mpi openssl java gloo xla-headers
.PHONY: $(SYSTEM_GROUPS)
system-packages:
	@bash scripts/install_system_packages.sh $(SYSTEM_GROUPS)
test-system-packages:
	@bash scripts/install_system_packages.sh $(SYSTEM_GROUPS) sshd ccache
$(SYSTEM_GROUPS):
	@bash scripts/install_system_packages.sh $@

$(DEPS_STAMP): requirements.txt
	@echo "== creating $(VENV) and installing requirements.txt"
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	@# A venv made before matplotlib moved beside it (TIMELINE_DEPS) drops its copy.
	@$(PIP) uninstall -q -y matplotlib 2>/dev/null || true
	@touch $@

$(TIMELINE_STAMP): requirements-timeline.txt $(DEPS_STAMP)
	@echo "== installing matplotlib for timeline pictures into $(TIMELINE_DEPS)"
	@rm -rf $(TIMELINE_DEPS)
	$(PIP) install -q --no-deps --target $(TIMELINE_DEPS) -r requirements-timeline.txt
	@touch $@

$(LIB): $(NATIVE_SOURCES) setup.py $(DEPS_STAMP)
	@echo "== building the tfhvd library"
	TFHVD_BUILD_DIR=$(abspath $(BUILD_DIR)) $(BUILD_CACHE) $(PY) setup.py -q build_ext --inplace
	@touch $@

$(INSTALL_STAMP): setup.py pyproject.toml $(DEPS_STAMP) $(LIB)
	@echo "== installing tfhvd into $(VENV) (editable)"
	TFHVD_BUILD_DIR=$(abspath $(BUILD_DIR)) $(PIP) install -q --no-build-isolation --no-deps -e .
	@touch $@

demo: setup
	$(MPIRUN) -np 2 $(PY) examples/keras_mnist.py --epochs 5

# Every pytest session of `make test` writes its skipped tests there; the last
# step lists them all with their reasons (scripts/skip_summary.py).
SKIP_REPORT_DIR := $(abspath $(BUILD_DIR))/test-skips
test: export TESTS_SKIP_REPORT_DIR := $(SKIP_REPORT_DIR)
test: test-system-packages setup skip-report-reset test-core test-single test-parallel test-parallel-np4 test-gloo \
	test-integration test-elastic test-engines test-gpu-build test-fake-gpu docker-check \
	test-docs-and-install test-network
	@$(PY) scripts/skip_summary.py $(SKIP_REPORT_DIR)
	@echo "== all tests passed"

# The docs' commands and the install check share no files (build/doc-commands,
# build/install-check) and mostly wait (on pip, on small jobs): they run side by
# side, each target's output printed whole when it ends. Either failing fails this.
.PHONY: test-docs-and-install
test-docs-and-install: setup
	$(MAKE) --no-print-directory -j2 --output-sync=target test-docs test-install

# The docs: the MkDocs site in strict mode (any warning fails, the theme needs no network),
# every relative link and #anchor of README.md and docs/*.md, and their commands.
# Not -q: it hides the warnings from strict mode's count, so a broken anchor passed.
# Then every command block of README.md and docs/*.md runs as written, or is
# checked the way its docs-test marker says (scripts/check_doc_commands.py).
test-docs: setup
	@echo "== docs: mkdocs build --strict (any warning fails), links, every command"
	$(TIMEOUT) $(PY) -m mkdocs build --strict -d build/site
	$(PY) scripts/check_links.py
	$(TIMEOUT) $(PY) scripts/check_doc_commands.py

# The sdist installed the way docs/install.md says into a scratch venv that
# holds only TensorFlow and a numpy other than our pin (build/install-check):
# the user's numpy stays, no scikit-learn or tf-keras arrives, and that venv's
# tfhvdrun runs a 2-rank job.  The venv and the CMake folder are kept, and the
# install is skipped while the sdist's content is unchanged.
.PHONY: test-install
test-install: setup
	@echo "== install check: the sdist into a venv with only TensorFlow and numpy 2.3.5"
	timeout --signal=KILL 1800 $(PY) tests/install/check_install.py \
	  --work $(abspath $(BUILD_DIR))/install-check --numpy 2.3.5

# Across a network (issue 36): a short scripts/network_benchmark.py on two hosts in
# network namespaces whose links are held to 1 Gbit/s (tbf), checked for correctness
# (every method measured, no faster than the link, the weights equal the one-host
# job's, no namespace left, also when stopped), and scripts/scaling_model.py --check
# against the committed bench output (docs/data/).  Needs root; skips otherwise.
.PHONY: test-network
test-network: setup
	@echo "== network: a short bench on namespaced hosts at 1 Gbit/s, the scaling model's check"
	timeout --signal=KILL 900 $(PY) -m pytest -q -rs --color=no -p no:cacheprovider tests/network

skip-report-reset:
	@rm -rf $(SKIP_REPORT_DIR)

test-core: setup
	@echo "== core tests (no TensorFlow): 1, 2 and 3 processes"
	$(TIMEOUT) $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(BUILD_DIR)/tfhvd_autotune_test
	$(TIMEOUT) $(BUILD_DIR)/tfhvd_handshake_test
	$(TIMEOUT) $(MPIRUN) -np 2 $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(MPIRUN) -np 3 $(BUILD_DIR)/tfhvd_core_test
	@echo "== Adasum over MPI exchanges (no TensorFlow): 2, 3 and 4 processes"
	for n in 2 3 4; do $(TIMEOUT) $(MPIRUN) -np $$n $(BUILD_DIR)/tfhvd_adasum_test || exit 1; done

# Two pytest-xdist workers (both cores), a test file to each at a time (its
# module fixtures stay in one process): the one-process and integration suites
# spend much of their time waiting on subprocesses and timeouts.  Files go out
# in collection order, which tests/conftest.py makes longest first (xdist's own
# reorder, most tests first, left a long file for one worker at the end).
# XDIST= runs them in one process.
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
test-single: setup
	@echo "== single-process tests"
	$(TEST_ENV) $(TIMEOUT) $(PY) -m pytest -q -rs --color=no -p no:cacheprovider $(XDIST) tests/single

test-parallel: setup
	@echo "== parallel tests under mpirun -np 2"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 2 tests/parallel/run_rank.sh $(PY) -m pytest -q -rs --color=no -p no:cacheprovider tests/parallel
	@echo "== parallel tests under mpirun -np 3 (less the Keras programs that depend on the size only through hvd.size())"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 3 tests/parallel/run_rank.sh $(PY) -m pytest -q -rs --color=no -p no:cacheprovider tests/parallel $(NP3_LEAVE_OUT)

# At 3 ranks the suite leaves out the files whose checks depend on the job's
# size only through hvd.size(): Keras state and configs, the XLA split, Horovod's
# Keras gaps and the tf-keras jobs (each a whole Keras program; with 3 ranks on 2
# cores they were half of the run).  They run at 2 ranks; test_keras.py (averaging
# over the ranks, lr x size) and every file about the transport, the collectives'
# shapes, process sets and Adasum stay at 3.
NP3_LEAVE_OUT := $(addprefix --ignore=tests/parallel/,test_keras_state.py test_keras_xla.py \
  test_keras_gaps.py test_keras_legacy.py) \
  --deselect=tests/parallel/test_async_modes.py::test_tf_keras_runs_these_checks

# The parallel suite again under tfhvdrun --gloo (no mpirun).
TFHVDRUN_GLOO := $(PY) -m tfhvd.runner --gloo
GLOO_NP3_TESTS := $(addprefix tests/parallel/,test_adasum.py test_broadcast_inplace.py \
  test_collectives.py test_elastic_states.py test_errors.py test_fused_outputs.py test_gloo.py \
  test_graph_inline.py test_process_sets.py test_small_int_sums.py)
test-parallel-gloo: setup
	@echo "== core and backend tests (no TensorFlow) under tfhvdrun --gloo: 2 and 3 processes"
	$(TIMEOUT) $(TFHVDRUN_GLOO) -np 2 $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(TFHVDRUN_GLOO) -np 3 $(BUILD_DIR)/tfhvd_core_test
	$(TIMEOUT) $(TFHVDRUN_GLOO) -np 2 $(BUILD_DIR)/tfhvd_backend_test
	$(TIMEOUT) $(TFHVDRUN_GLOO) -np 3 $(BUILD_DIR)/tfhvd_backend_test
	$(TIMEOUT) $(MPIRUN) -np 3 $(BUILD_DIR)/tfhvd_backend_test
	for n in 2 3 4; do $(TIMEOUT) $(TFHVDRUN_GLOO) -np $$n $(BUILD_DIR)/tfhvd_adasum_test || exit 1; done
	@# At 3 ranks over Gloo, the files about the transport; test-gloo-only runs
	@# them again at 2 ranks on the Gloo-only variant, with test_keras.py.  The
	@# Keras and gradient files compute above the transport: they run over MPI
	@# (Keras over Gloo runs in the integration, elastic and engine jobs).
	@echo "== parallel tests under tfhvdrun --gloo -np 3: collectives, process sets, errors, Adasum, elastic state"
	$(TEST_ENV) $(TIMEOUT) $(TFHVDRUN_GLOO) -np 3 tests/parallel/run_rank.sh $(PY) -m pytest -q -rs --color=no -p no:cacheprovider $(GLOO_NP3_TESTS)

# The Gloo-only variant (TFHVD_WITHOUT_MPI=1), built in its own folder like
# the GPU variant: ldd must show no MPI, and it passes the core and backend
# tests, the parallel suite's transport files and test_keras.py at 2 ranks
# (-P: the source tree's tfhvd/ must not shadow it).
GLOO_BUILD_DIR ?= build-gloo
GLOO_LIB := $(GLOO_BUILD_DIR)/lib/tfhvd/tfhvd_ops.so
GLOO_ONLY := PYTHONPATH=$(abspath $(GLOO_BUILD_DIR))/lib
gloo-only-build: setup $(GLOO_LIB)
$(GLOO_LIB): $(NATIVE_SOURCES) setup.py $(DEPS_STAMP)
	@echo "== building the Gloo-only variant in $(GLOO_BUILD_DIR) (TFHVD_WITHOUT_MPI=1)"
	TFHVD_WITHOUT_MPI=1 TFHVD_BUILD_DIR=$(abspath $(GLOO_BUILD_DIR)) $(BUILD_CACHE) $(PY) setup.py -q \
	  build_py -d $(GLOO_BUILD_DIR)/lib build_ext -b $(GLOO_BUILD_DIR)/lib -t $(GLOO_BUILD_DIR)/setuptools-tmp
	@touch $@

test-gloo-only: gloo-only-build
	@echo "== Gloo-only variant: no MPI linked, core test, transport files and test_keras.py under tfhvdrun --gloo"
	@if ldd $(GLOO_LIB) $(GLOO_BUILD_DIR)/tfhvd_core_test $(GLOO_BUILD_DIR)/tfhvd_backend_test | grep -i 'libmpi'; then \
	  echo "FAIL: the Gloo-only library links MPI"; exit 1; fi
	@ldd $(GLOO_LIB) | grep -q libgloo || { echo "FAIL: the Gloo-only library does not link Gloo"; exit 1; }
	$(GLOO_ONLY) $(PY) -P -m tfhvd.runner --check-build | grep -E '\[.\] (MPI|Gloo)'
	$(GLOO_ONLY) $(TIMEOUT) $(PY) -P -m tfhvd.runner -np 2 $(GLOO_BUILD_DIR)/tfhvd_core_test
	$(GLOO_ONLY) $(TIMEOUT) $(PY) -P -m tfhvd.runner -np 3 $(GLOO_BUILD_DIR)/tfhvd_backend_test
	$(GLOO_ONLY) $(TEST_ENV) $(TIMEOUT) $(PY) -P -m tfhvd.runner -np 2 tests/parallel/run_rank.sh \
	  $(PY) -P -m pytest -q -rs --color=no -p no:cacheprovider $(GLOO_NP3_TESTS) tests/parallel/test_keras.py

test-gloo: test-parallel-gloo test-gloo-only

# Process sets need more ranks than two sets of one, Adasum's tree two levels: np 4,
# oversubscribed (about 30 s).
test-parallel-np4: setup
	@echo "== process-set tests under mpirun -np 4"
	$(TEST_ENV) $(TIMEOUT) $(MPIRUN) -np 4 tests/parallel/run_rank.sh $(PY) -m pytest -q -rs --color=no -p no:cacheprovider tests/parallel/test_process_sets.py tests/parallel/test_adasum.py

# Real tfhvdrun jobs: launcher, bad input, faults, stall inspector, timeline,
# multi-node (two network namespaces with sshd; needs root, else it skips).
# As root, an sshd that cannot be installed fails the target: the multi-node
# test would otherwise skip unseen.
test-integration: setup
	@echo "== integration tests: tfhvdrun, faults, timeline, multi-node"
	@if [ "$$(id -u)" = 0 ]; then bash scripts/install_sshd.sh; \
	else bash scripts/install_sshd.sh || echo "(not root, no sshd: the multi-node test will skip)"; fi
	timeout --signal=KILL 1800 $(PY) -m pytest -q -rs --color=no -p no:cacheprovider $(XDIST) \
	  tests/integration \
	  --ignore=tests/integration/test_elastic.py \
	  --ignore=tests/integration/test_elastic_programs.py \
	  --ignore=tests/integration/test_ray.py --ignore=tests/integration/test_spark.py \
	  --ignore=tests/integration/test_spark_env.py --ignore=tests/integration/test_spark_elastic.py \
	  --ignore=tests/integration/test_spark_keras.py --ignore=tests/integration/test_data_service_spark.py \
	  --ignore=tests/integration/test_ray_multinode.py

# Elastic jobs over Gloo on loopback "hosts" (127.0.0.x): hosts added and
# removed, SIGKILL, raise, all failing, --min-np timeout, reset limit,
# cooldown, early finish, exact recovery, 20 resets (3-5 min on 2 cores); -s shows
# the measured reset cost and the resources after 20 resets.
# The driver's logic and the states have their tests in tests/single and
# tests/parallel (test_elastic_*), run by test-single and test-parallel.
test-elastic: setup
	@echo "== elastic tests: tfhvdrun --host-discovery-script over Gloo"
	timeout --signal=KILL 900 $(PY) -m pytest -q -rs -s --color=no -p no:cacheprovider \
	  tests/integration/test_elastic.py
	@echo "== elastic test programs (tests/integration/programs), hosts removed and re-added"
	timeout --signal=KILL 900 $(PY) -m pytest -q -rs -s --color=no -p no:cacheprovider \
	  tests/integration/test_elastic_programs.py

# tfhvd.ray and tfhvd.spark on real engines started by the tests: a local Ray
# cluster and Spark's local-cluster[2,1,1024] (collectives, Keras fit equal to
# tfhvdrun --gloo's, a rank that raises, a worker killed, no orphans).  The
# engines mostly wait on their JVMs and daemons, so the Ray files and the Spark
# files run as two pytest processes side by side (Ray's output follows Spark's).
# Each Spark application removes only its own folder under pyspark/work
# (tests/integration/spark_cluster.py).  Splitting the Spark files over two
# processes too gained nothing: the phase is CPU-bound on 2 cores then.
# ENGINES_SIDE_BY_SIDE=0 runs them one after the other.
ENGINES_SIDE_BY_SIDE ?= 1
ENGINES_PYTEST = timeout --signal=KILL 1800 $(PY) -m pytest -q -rs --color=no -p no:cacheprovider
RAY_TESTS = tests/integration/test_ray.py tests/integration/test_ray_multinode.py
SPARK_TESTS = tests/integration/test_spark.py tests/integration/test_spark_env.py \
  tests/integration/test_spark_elastic.py tests/integration/test_spark_keras.py \
  tests/integration/test_data_service_spark.py
test-engines: setup
	@echo "== Ray and Spark launchers on local engines"
	@mkdir -p build
	@if [ "$(ENGINES_SIDE_BY_SIDE)" = 1 ]; then \
	  echo "$(ENGINES_PYTEST) $(RAY_TESTS) > build/test-engines-ray.log &"; \
	  $(ENGINES_PYTEST) $(RAY_TESTS) > build/test-engines-ray.log 2>&1 & ray=$$!; \
	  echo "$(ENGINES_PYTEST) $(SPARK_TESTS)"; \
	  $(ENGINES_PYTEST) $(SPARK_TESTS); spark=$$?; \
	  wait $$ray; ray=$$?; \
	  echo "== Ray launcher tests (rc=$$ray)"; cat build/test-engines-ray.log; \
	  [ $$spark = 0 ] && [ $$ray = 0 ]; \
	else \
	  $(ENGINES_PYTEST) $(RAY_TESTS) $(SPARK_TESTS); \
	fi

gpu-deps: $(GPU_DEPS_STAMP)
$(GPU_DEPS_STAMP): docker/versions.env docker/install_gpu_wheels.sh $(DEPS_STAMP)
	TFHVD_PIP_TARGET=$(GPU_DEPS) PYTHON=$(PY) docker/install_gpu_wheels.sh
	@touch $@

gpu-build: setup $(GPU_LIB)
$(GPU_LIB): $(GPU_SOURCES) $(NATIVE_SOURCES) setup.py $(GPU_DEPS_STAMP) docker/build_tfhvd.sh
	@echo "== building the GPU variant in $(GPU_BUILD_DIR) (TFHVD_GPU_OPERATIONS=NCCL)"
	$(GPU_ENV) TFHVD_INSTALL=0 TFHVD_LIB_DIR=$(abspath $(GPU_BUILD_DIR))/lib $(BUILD_CACHE) docker/build_tfhvd.sh
	@touch $@

# On a CPU machine: the GPU library's device code is CUDA 12 with sm_80 and
# sm_90 cubins (read from its bytes); it loads, reports NCCL, registers GPU
# kernels and still runs CPU collectives; the device check builds the
# TF-free harness and runs its host-tensor checks over 1 and 2 processes.
# On a GPU machine (nvidia-smi works or /dev/nvidiactl exists) the same
# commands run the GPU checks, and "no GPU" is a failure there, not a pass.
# tests/gpu/memory_types_probe.cc: what TensorFlow's placer computes for every op
# and dtype of a library (test_kernel_registry.py runs it), with the GPU build's
# flags, linked against TensorFlow's framework library.
MEMORY_TYPES_PROBE := $(GPU_BUILD_DIR)/memory_types_probe
# (libtensorflow_cc loaded up front, as in a TensorFlow process: the XLA ops need it.)
$(MEMORY_TYPES_PROBE): tests/gpu/memory_types_probe.cc $(GPU_LIB) Makefile
	tf_dir="$$($(PY) -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))' 2>/dev/null)"; \
	  $(CXX) $$(sed -n 's/^CXX_FLAGS = //p' $(GPU_BUILD_DIR)/CMakeFiles/tfhvd_tf.dir/flags.make | sed 's/-O3//') \
	  -O1 -Wall -Wno-interference-size -o $@ $< -L"$$tf_dir" -l:libtensorflow_framework.so.2 \
	  -Wl,--no-as-needed -l:libtensorflow_cc.so.2 -Wl,--as-needed -Wl,-rpath,"$$tf_dir" -ldl

GPU_MACHINE := $(shell (nvidia-smi -L >/dev/null 2>&1 || test -e /dev/nvidiactl) && echo 1 || echo 0)
GPU_COUNT := $(shell n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); echo $${n:-0})
test-gpu-build: gpu-build $(MEMORY_TYPES_PROBE)
	@echo "== GPU build checks (GPU machine: $(GPU_MACHINE))"
	$(TIMEOUT) tests/gpu/check_device_code.sh $(PY) $(GPU_LIB) $(GPU_BUILD_DIR)/device-code-check
	@# The compile matrix's op axis: each TFHVD_GPU_<OP> alone compiles and registers its kernels only.
	set -o pipefail; $(TIMEOUT) tests/gpu/check_gpu_op_subsets.sh $(GPU_BUILD_DIR) | tail -n 6
	@# The copy/scale kernel's device code run on the host, against core/cpu_math.
	$(CXX) -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I tests/gpu/emulated_cuda \
	  -o $(GPU_BUILD_DIR)/kernel_emulation_test tests/gpu/kernel_emulation_test.cc tfhvd_ops/core/cpu_math.cc tfhvd_ops/core/common.cc
	set -o pipefail; $(TIMEOUT) $(GPU_BUILD_DIR)/kernel_emulation_test | tail -n 3
	$(CXX) -std=c++17 -O2 -Wall -o $(GPU_BUILD_DIR)/finalizer_test tests/gpu/finalizer_test.cc \
	  tfhvd_ops/backends/nccl/finalizer.cc $(addprefix tfhvd_ops/core/,operations.cc adasum.cc \
	  timeline.cc process_set.cc common.cc cpu_math.cc response_cache.cc message.cc) -lpthread
	set -o pipefail; $(TIMEOUT) $(GPU_BUILD_DIR)/finalizer_test | tail -n 3
	$(TIMEOUT) $(GPU_BUILD_DIR)/tfhvd_nccl_harness $(if $(filter 1,$(GPU_MACHINE)),--require-gpu,)
	@# The GPU machine's script (MPI-free): exit 0 on a GPU machine; 3 (no GPU,
	@# host checks passed) only where there is no GPU.
	rc=0; PYTHONPATH=$(abspath $(GPU_DEPS)) TFHVD_DEVICE_BUILD=$(abspath $(GPU_BUILD_DIR))/device \
	  $(TIMEOUT) tests/gpu/device_check.sh >$(GPU_BUILD_DIR)/device_check.out 2>&1 || rc=$$?; \
	  tail -n 4 $(GPU_BUILD_DIR)/device_check.out; \
	  if [ "$(GPU_MACHINE)" = 1 ]; then test $$rc = 0; else test $$rc = 3; fi
	PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib PYTHON=$(abspath $(PY)) $(TIMEOUT) docker/check_image.sh
	@# -P: the source tree's tfhvd/ (CPU library) must not shadow the GPU build.
	@# One rank per GPU on a GPU machine (NCCL refuses two ranks on one GPU),
	@# two ranks elsewhere (the GPU library's CPU collectives).
	PYTHONPATH=$(abspath $(GPU_BUILD_DIR))/lib $(TEST_ENV) $(TIMEOUT) $(MPIRUN) \
	  -np $(if $(filter 1,$(GPU_MACHINE)),$(if $(filter 0,$(GPU_COUNT)),1,$(GPU_COUNT)),2) \
	  tests/parallel/run_rank.sh $(PY) -P -m pytest -q -rs --color=no -p no:cacheprovider \
	  tests/gpu tests/parallel/test_collectives.py tests/single/test_kernel_registry.py \
	  -k "gpu or test_allreduce"

# Without a GPU: the NCCL harness linked against the fake CUDA + NCCL of
# tests/gpu/fake_cuda (host memory, a worker thread per stream, collectives
# between processes over /dev/shm) instead of libcudart/libnccl/libcuda: every
# GPU check at 1, 2 and 3 ranks, then injected faults (two ranks on one GPU, NCCL
# async errors and hangs against TFHVD_NCCL_TIMEOUT, CUDA sticky errors, kernel
# images that do not load).  Same headers as the GPU build: TensorFlow's CUDA 12
# headers and the NCCL wheel's.  About a minute from cold on 2 cores.
# The compile matrix's NCCL axis: the same harness built against the headers of
# the oldest NCCL the library supports (NCCL_OLDEST, from its nvidia-nccl-cu12
# wheel) passes every GPU check at 1 and 2 ranks.
FAKE_GPU_DIR := $(GPU_BUILD_DIR)/fake-gpu
NCCL_OLDEST := 2.16.2
NCCL_OLDEST_DIR := $(GPU_BUILD_DIR)/nccl-$(NCCL_OLDEST)
FAKE_GPU_CUDA_INCLUDE = $$(ls -d $(VENV)/lib/python3*/site-packages/tensorflow/include/third_party/gpus/cuda | head -n 1)
.PHONY: test-fake-gpu
test-fake-gpu: gpu-deps
	@echo "== fake CUDA + NCCL: the NCCL harness's GPU checks and fault cases without a GPU"
	tf_cuda="$(FAKE_GPU_CUDA_INCLUDE)"; \
	  test -f "$$tf_cuda/include/cuda_runtime_api.h" || { echo "no CUDA headers in TensorFlow's include folder"; exit 1; }; \
	  $(BUILD_CACHE) $(MAKE) --no-print-directory -s -j2 -f tests/gpu/fake_cuda/fake.mk OUT=$(FAKE_GPU_DIR) \
	  CUDA_INCLUDE="$$tf_cuda/include $$tf_cuda/libcudacxx/include" NCCL_INCLUDE=$(GPU_DEPS)/nvidia/nccl/include
	timeout -k 10 150 tests/gpu/fake_cuda/run_fake_gpu.sh $(FAKE_GPU_DIR)/tfhvd_fake_gpu_harness
	@echo "== fake CUDA + NCCL: built against NCCL $(NCCL_OLDEST)'s headers, the oldest supported"
	$(PY) tests/gpu/fake_cuda/nccl_headers.py $(NCCL_OLDEST) $(NCCL_OLDEST_DIR) >/dev/null
	grep -q '^#define NCCL_MINOR 16$$' $(NCCL_OLDEST_DIR)/include/nccl.h
	tf_cuda="$(FAKE_GPU_CUDA_INCLUDE)"; \
	  $(BUILD_CACHE) $(MAKE) --no-print-directory -s -j2 -f tests/gpu/fake_cuda/fake.mk OUT=$(FAKE_GPU_DIR)-nccl-$(NCCL_OLDEST) \
	  CUDA_INCLUDE="$$tf_cuda/include $$tf_cuda/libcudacxx/include" NCCL_INCLUDE=$(NCCL_OLDEST_DIR)/include
	timeout -k 10 100 tests/gpu/fake_cuda/run_fake_gpu.sh \
	  $(FAKE_GPU_DIR)-nccl-$(NCCL_OLDEST)/tfhvd_fake_gpu_harness --checks-only

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
	rm -rf $(BUILD_DIR) $(GPU_BUILD_DIR) $(GLOO_BUILD_DIR) $(LIB) *.egg-info
