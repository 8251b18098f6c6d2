// The driver entry points the backend opens with dlopen("libcuda.so.1")
// (cuda/device_kernels.cc): modules are the fake images of
// device_images.cc, and the one function launches the batched copy kernel
// on the host, in stream order (kernel_host.cc).
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fake_gpu.h"

namespace fakegpu {
namespace {

constexpr char kMagic[] = "TFHVD-FAKE-IMAGE ";
constexpr char kKernel[] = "tfhvd_batched_scaled_copy";

struct Module {
  std::string kind;
  int arch = 0;
  int function = 0;  // the address handed out as the CUfunction
};

}  // namespace
}  // namespace fakegpu

extern "C" {

CUresult cuGetErrorName(CUresult r, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (r) {
    case CUDA_SUCCESS: *s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
    case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      *s = "no kernel image is available for execution on the device";
      break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      *s = "the provided PTX was compiled with an unsupported toolchain.";
      break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// Like the driver: a cubin runs on its own major version at an equal or
// higher minor; PTX on any equal or newer architecture.
CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  using fakegpu::GetConfig;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fakegpu::Sticky() != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (GetConfig().module_load_error) return CUDA_ERROR_INVALID_IMAGE;
  const char* text = static_cast<const char*>(image);
  const size_t magic = sizeof(fakegpu::kMagic) - 1;
  if (std::strncmp(text, fakegpu::kMagic, magic) != 0) return CUDA_ERROR_INVALID_IMAGE;
  char kind[16] = {0};
  int arch = 0;
  if (std::sscanf(text + magic, "%15s %d", kind, &arch) != 2) return CUDA_ERROR_INVALID_IMAGE;
  const int cc = GetConfig().cc;
  const std::string k = kind;
  if (k == "cubin" && (arch / 10 != cc / 10 || arch > cc)) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (k == "ptx" && arch > cc) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (k != "cubin" && k != "ptx") return CUDA_ERROR_INVALID_IMAGE;
  auto* m = new fakegpu::Module;
  m->kind = k;
  m->arch = arch;
  *module = reinterpret_cast<CUmodule>(m);
  if (GetConfig().report_loads) std::fprintf(stderr, "fake-gpu: kernel module loaded\n");
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  if (fn == nullptr || module == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (std::strcmp(name, fakegpu::kKernel) != 0) return CUDA_ERROR_NOT_FOUND;
  auto* m = reinterpret_cast<fakegpu::Module*>(module);
  *fn = reinterpret_cast<CUfunction>(&m->function);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<fakegpu::Module*>(module);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream,
                        void** params, void** extra) {
  if (fakegpu::Sticky() != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (f == nullptr || !fakegpu::ValidStream(reinterpret_cast<cudaStream_t>(stream))) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (params == nullptr || params[0] == nullptr || extra != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The kernel indexes its tiles with 256 threads a block, one dimension.
  if (gx == 0 || gz != 1 || bx == 0 || bx > 256 || by != 1 || bz != 1 || shared != 0 ||
      !fakegpu::CopyKernelGridFits(params[0], gx, gy, bx)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The parameter block is copied at launch, like the driver does.
  std::vector<char> block(static_cast<const char*>(params[0]),
                          static_cast<const char*>(params[0]) + fakegpu::CopyKernelParamBytes());
  fakegpu::StreamOf(reinterpret_cast<cudaStream_t>(stream))->Push([block, gx, gy, bx] {
    if (fakegpu::BeginStreamOp()) fakegpu::RunCopyKernel(block.data(), gx, gy, bx);
  });
  return CUDA_SUCCESS;
}

}  // extern "C"
