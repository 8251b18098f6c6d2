# The GPU part of the build: CUDA kernels compiled by nvcc, the NCCL backend,
# and an interface target `tfhvd_cuda` carrying CUDA/NCCL headers, libraries
# and run paths.  Included by CMakeLists.txt only when TFHVD_WITH_NCCL is on.
# The paths come from gpu_config.py (setup.py or tests/gpu/device_check.sh
# run it); this file only checks them, so a hand-run cmake fails clearly too.
# Paths are relative to tfhvd_ops/ so that tests/gpu/CMakeLists.txt can
# include this file too.
get_filename_component(TFHVD_OPS_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(TFHVD_GPU_OPS "ALLREDUCE;ALLGATHER;BROADCAST;ALLTOALL;REDUCESCATTER" CACHE STRING
    "Ops that get GPU kernels")
set(TFHVD_NVCC "" CACHE FILEPATH "nvcc")
set(TFHVD_CUDA_INCLUDE "" CACHE STRING "CUDA runtime header folders")
set(TFHVD_CUDART_LIB "" CACHE FILEPATH "libcudart")
set(TFHVD_NCCL_INCLUDE "" CACHE PATH "folder of nccl.h")
set(TFHVD_NCCL_LIB "" CACHE FILEPATH "libnccl")
set(TFHVD_CUDA_ARCHS "80;90" CACHE STRING "GPU architectures (sm_XX) for the .cu files")

foreach(var TFHVD_NVCC TFHVD_CUDART_LIB TFHVD_NCCL_LIB)
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

# The .cu files: nvcc straight from a custom command, not CMake's CUDA
# language, so no toolkit layout is assumed (only bin/nvcc).  Real code for
# each listed architecture plus PTX of the newest for later GPUs.
set(_gencode "")
foreach(arch ${TFHVD_CUDA_ARCHS})
  list(APPEND _gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
  set(_last ${arch})
endforeach()
list(APPEND _gencode "-gencode=arch=compute_${_last},code=compute_${_last}")
set(TFHVD_CUDA_OBJECTS "")
foreach(cu cuda/gpu_kernels.cu)
  get_filename_component(_name ${cu} NAME_WE)
  set(_obj "${CMAKE_CURRENT_BINARY_DIR}/cuda/${_name}.o")
  add_custom_command(
    OUTPUT ${_obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/cuda
    COMMAND ${TFHVD_NVCC} -ccbin ${CMAKE_CXX_COMPILER} -std=c++17 -O3 -Xcompiler -fPIC
            ${_gencode} -c ${TFHVD_OPS_DIR}/${cu} -o ${_obj}
    DEPENDS ${TFHVD_OPS_DIR}/${cu} ${TFHVD_OPS_DIR}/cuda/gpu_kernels.h
    COMMENT "nvcc ${cu} (sm ${TFHVD_CUDA_ARCHS})"
    VERBATIM)
  list(APPEND TFHVD_CUDA_OBJECTS ${_obj})
endforeach()

# A static library of the nvcc objects (built with -fPIC), so every target
# that links the core gets them.
add_library(tfhvd_cuda_kernels STATIC ${TFHVD_CUDA_OBJECTS})
set_target_properties(tfhvd_cuda_kernels PROPERTIES LINKER_LANGUAGE CXX)

add_library(tfhvd_cuda INTERFACE)
target_include_directories(tfhvd_cuda INTERFACE ${TFHVD_CUDA_INCLUDE} ${TFHVD_NCCL_INCLUDE})
target_link_libraries(tfhvd_cuda INTERFACE tfhvd_cuda_kernels ${TFHVD_CUDART_LIB} ${TFHVD_NCCL_LIB})
# Find the libraries where they were found at build time, and beside the
# package in a wheel layout (site-packages/tfhvd next to site-packages/nvidia).
get_filename_component(_cudart_dir ${TFHVD_CUDART_LIB} DIRECTORY)
get_filename_component(_nccl_dir ${TFHVD_NCCL_LIB} DIRECTORY)
set(TFHVD_GPU_RPATH "${_cudart_dir};${_nccl_dir};$ORIGIN/../nvidia/nccl/lib;$ORIGIN/../nvidia/cuda_runtime/lib")

set(TFHVD_NCCL_SOURCES
  ${TFHVD_OPS_DIR}/backends/nccl/gpu_events.cc
  ${TFHVD_OPS_DIR}/backends/nccl/nccl_backend.cc
  ${TFHVD_OPS_DIR}/backends/nccl/nccl_collectives.cc)

set(TFHVD_GPU_OP_DEFINITIONS "")
foreach(op ${TFHVD_GPU_OPS})
  list(APPEND TFHVD_GPU_OP_DEFINITIONS "TFHVD_GPU_${op}=1")
endforeach()
message(STATUS "tfhvd: GPU build with NCCL (${TFHVD_NCCL_LIB}), nvcc ${TFHVD_NVCC}, "
               "sm ${TFHVD_CUDA_ARCHS}, GPU kernels for: ${TFHVD_GPU_OPS}")
