# The GPU part of the build: CUDA kernels (embedded cubins + PTX), the NCCL backend,
# and an interface target `tfhvd_cuda` carrying CUDA/NCCL headers, libraries
# and run paths.  Included by CMakeLists.txt only when TFHVD_WITH_NCCL is on.
# The paths come from gpu_config.py (setup.py or tests/gpu/device_check.sh
# run it); this file only checks them, so a hand-run cmake fails clearly too.
# Paths are relative to tfhvd_ops/ so that tests/gpu/CMakeLists.txt can
# include this file too.
get_filename_component(TFHVD_OPS_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(TFHVD_GPU_OPS "ALLREDUCE;ALLGATHER;BROADCAST;ALLTOALL;REDUCESCATTER" CACHE STRING
    "Ops that get GPU kernels")
set(TFHVD_DEVICE_COMPILER "nvrtc" CACHE STRING "nvrtc or nvcc: compiles cuda/gpu_kernels.cu")
set(TFHVD_DEVICE_TOOL "" CACHE FILEPATH "libnvrtc.so.N (nvrtc) or bin/nvcc (nvcc)")
set(TFHVD_DEVICE_INCLUDE "" CACHE STRING "CUDA headers for the device compile (cuda_fp16.h)")
set(TFHVD_PYTHON "" CACHE FILEPATH "Python that runs cuda/build_device_code.py")
set(TFHVD_CUDA_INCLUDE "" CACHE STRING "CUDA runtime header folders")
set(TFHVD_CUDART_LIB "" CACHE FILEPATH "libcudart")
set(TFHVD_NCCL_INCLUDE "" CACHE PATH "folder of nccl.h")
set(TFHVD_NCCL_LIB "" CACHE FILEPATH "libnccl")
set(TFHVD_CUDA_ARCHS "70;75;80;86;89;90;100;120" CACHE STRING
    "GPU architectures (sm_XX) of the device code; those the compiler lacks are left out")

foreach(var TFHVD_DEVICE_TOOL TFHVD_PYTHON TFHVD_CUDART_LIB TFHVD_NCCL_LIB)
  if(NOT EXISTS "${${var}}")
    message(FATAL_ERROR "tfhvd GPU build: ${var}='${${var}}' does not exist. Configure through "
                        "setup.py with TFHVD_GPU_OPERATIONS=NCCL, or run "
                        "`python tfhvd_ops/gpu_config.py --cmake` for the arguments; it says "
                        "where it looks and which variables to set.")
  endif()
endforeach()
if(NOT EXISTS "${TFHVD_NCCL_INCLUDE}/nccl.h")
  message(FATAL_ERROR "tfhvd GPU build: no nccl.h in TFHVD_NCCL_INCLUDE='${TFHVD_NCCL_INCLUDE}'")
endif()

# The device code: a cubin per architecture plus PTX of the oldest, written
# as data into device_images.cc (cuda/build_device_code.py) and loaded at
# run time with the driver API (cuda/device_kernels.cc).  No fatbinary and
# no host code through a CUDA compiler.
set(TFHVD_DEVICE_IMAGES "${CMAKE_CURRENT_BINARY_DIR}/cuda/device_images.cc")
add_custom_command(
  OUTPUT ${TFHVD_DEVICE_IMAGES}
  COMMAND ${TFHVD_PYTHON} ${TFHVD_OPS_DIR}/cuda/build_device_code.py
          --compiler ${TFHVD_DEVICE_COMPILER} --tool ${TFHVD_DEVICE_TOOL}
          "--include=${TFHVD_DEVICE_INCLUDE}" "--archs=${TFHVD_CUDA_ARCHS}"
          --source ${TFHVD_OPS_DIR}/cuda/gpu_kernels.cu --output ${TFHVD_DEVICE_IMAGES}
  DEPENDS ${TFHVD_OPS_DIR}/cuda/gpu_kernels.cu ${TFHVD_OPS_DIR}/cuda/gpu_kernels.h
          ${TFHVD_OPS_DIR}/cuda/build_device_code.py
  COMMENT "${TFHVD_DEVICE_COMPILER}: cuda/gpu_kernels.cu for sm ${TFHVD_CUDA_ARCHS}"
  VERBATIM)

add_library(tfhvd_cuda INTERFACE)
target_include_directories(tfhvd_cuda INTERFACE ${TFHVD_CUDA_INCLUDE} ${TFHVD_NCCL_INCLUDE})
target_link_libraries(tfhvd_cuda INTERFACE ${TFHVD_CUDART_LIB} ${TFHVD_NCCL_LIB} ${CMAKE_DL_LIBS})
# Find the libraries where they were found at build time, and beside the
# package in a wheel layout (site-packages/tfhvd next to site-packages/nvidia).
get_filename_component(_cudart_dir ${TFHVD_CUDART_LIB} DIRECTORY)
get_filename_component(_nccl_dir ${TFHVD_NCCL_LIB} DIRECTORY)
set(TFHVD_GPU_RPATH "${_cudart_dir};${_nccl_dir};$ORIGIN/../nvidia/nccl/lib;$ORIGIN/../nvidia/cuda_runtime/lib")

set(TFHVD_NCCL_SOURCES
  ${TFHVD_DEVICE_IMAGES}
  ${TFHVD_OPS_DIR}/cuda/device_kernels.cc
  ${TFHVD_OPS_DIR}/backends/nccl/finalizer.cc
  ${TFHVD_OPS_DIR}/backends/nccl/gpu_events.cc
  ${TFHVD_OPS_DIR}/backends/nccl/nccl_backend.cc
  ${TFHVD_OPS_DIR}/backends/nccl/nccl_collectives.cc
  ${TFHVD_OPS_DIR}/backends/nccl/placement.cc)

set(TFHVD_GPU_OP_DEFINITIONS "")
foreach(op ${TFHVD_GPU_OPS})
  list(APPEND TFHVD_GPU_OP_DEFINITIONS "TFHVD_GPU_${op}=1")
endforeach()
message(STATUS "tfhvd: GPU build with NCCL (${TFHVD_NCCL_LIB}), device code by "
               "${TFHVD_DEVICE_COMPILER} (${TFHVD_DEVICE_TOOL}), "
               "sm ${TFHVD_CUDA_ARCHS}, GPU kernels for: ${TFHVD_GPU_OPS}")
