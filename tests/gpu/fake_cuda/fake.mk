# Builds the fake CUDA + NCCL (libcuda.so.1, fake_gpu.h) and the NCCL
# harness linked against it instead of libcudart/libnccl/libcuda:
#
#   make -f tests/gpu/fake_cuda/fake.mk OUT=build-gpu/fake-gpu \
#        CUDA_INCLUDE="<dirs of cuda_runtime_api.h ...>" NCCL_INCLUDE=<dir of nccl.h>
#
# Run from the repository root; incremental (-MMD).  The harness is the
# socket build of tests/gpu/device_check.sh (no MPI): the core, the TCP
# control channel, the NCCL backend and tfhvd_ops/cuda/device_kernels.cc,
# compiled unchanged; only device_images.cc is the fake's.
OUT ?= build-gpu/fake-gpu
CXX ?= g++
# ccache where scripts/with_build_cache.sh set it (empty otherwise); not on links.
COMPILE := $(CMAKE_CXX_COMPILER_LAUNCHER) $(CXX)
CUDA_INCLUDE ?=
NCCL_INCLUDE ?=
FAKE := tests/gpu/fake_cuda
OPS := tfhvd_ops
O := $(OUT)/obj
INCLUDES := $(addprefix -I,$(CUDA_INCLUDE) $(NCCL_INCLUDE))
CXXFLAGS := -std=c++17 -O1 -g0 -Wall -fPIC -MMD -MP

LIB_SOURCES := $(FAKE)/stream.cc $(FAKE)/runtime.cc $(FAKE)/driver.cc $(FAKE)/nccl_shm.cc \
	$(FAKE)/nccl_api.cc $(OPS)/core/cpu_math.cc $(OPS)/core/common.cc
# The kernel's source through the host emulation of the CUDA headers (no real ones).
KERNEL_SOURCE := $(FAKE)/kernel_host.cc
HARNESS_SOURCES := $(wildcard $(OPS)/core/*.cc) $(wildcard $(OPS)/backends/tcp/*.cc) \
	$(wildcard $(OPS)/backends/nccl/*.cc) $(OPS)/cuda/device_kernels.cc $(FAKE)/device_images.cc \
	$(addprefix tests/gpu/,nccl_harness.cc harness_checks.cc harness_bench.cc harness_step.cc \
	socket_backend.cc)

LIB_OBJECTS := $(patsubst %.cc,$(O)/lib/%.o,$(LIB_SOURCES)) $(O)/kernel/$(KERNEL_SOURCE:.cc=.o)
HARNESS_OBJECTS := $(patsubst %.cc,$(O)/harness/%.o,$(HARNESS_SOURCES))
LIB := $(OUT)/lib/libcuda.so.1
HARNESS := $(OUT)/tfhvd_fake_gpu_harness

all: $(LIB) $(HARNESS)

$(O)/lib/%.o: %.cc
	@mkdir -p $(@D)
	$(COMPILE) $(CXXFLAGS) $(INCLUDES) -c $< -o $@

$(O)/kernel/%.o: %.cc
	@mkdir -p $(@D)
	$(COMPILE) $(CXXFLAGS) -O2 -Wno-unknown-pragmas -I tests/gpu/emulated_cuda -c $< -o $@

$(O)/harness/%.o: %.cc
	@mkdir -p $(@D)
	$(COMPILE) $(CXXFLAGS) $(INCLUDES) -c $< -o $@

# One library for the runtime, the driver and NCCL; its soname is the name
# the backend dlopens for the driver, so that dlopen finds it loaded.
$(LIB): $(LIB_OBJECTS) $(FAKE)/exports.map
	@mkdir -p $(@D)
	$(CXX) -shared -o $@ $(LIB_OBJECTS) -Wl,-soname,libcuda.so.1 \
	  -Wl,--version-script=$(FAKE)/exports.map -Wl,--no-undefined -lpthread -lrt

$(HARNESS): $(HARNESS_OBJECTS) $(LIB)
	$(CXX) -o $@ $(HARNESS_OBJECTS) $(LIB) -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/lib' -lcrypto -ldl -lpthread

-include $(LIB_OBJECTS:.o=.d) $(HARNESS_OBJECTS:.o=.d)

.PHONY: all
