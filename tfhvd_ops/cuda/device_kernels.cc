#include "device_kernels.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <vector>

namespace tfhvd {
namespace cuda {

// The few driver entry points, with their stable C signatures (cuda.h), so
// that no driver library is needed at link time.
struct DeviceKernels::Driver {
  using Result = int;  // CUresult
  void* handle = nullptr;
  Result (*module_load_data)(void** module, const void* image) = nullptr;
  Result (*module_get_function)(void** fn, void* module, const char* name) = nullptr;
  Result (*module_unload)(void* module) = nullptr;
  Result (*launch_kernel)(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void* stream, void** params,
                          void** extra) = nullptr;
  Result (*get_error_name)(Result r, const char** s) = nullptr;
  Result (*get_error_string)(Result r, const char** s) = nullptr;

  std::string Error(Result r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (get_error_name) get_error_name(r, &name);
    if (get_error_string) get_error_string(r, &text);
    return std::string(name ? name : "CUDA driver error " + std::to_string(r)) +
           (text ? std::string(": ") + text : std::string());
  }

  Status Open() {
    if (handle != nullptr) return Status::OK();
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return Status::Internal(std::string("tfhvd: cannot open the CUDA driver (libcuda.so.1): ") +
                              dlerror());
    }
    bool ok = Sym("cuModuleLoadData", &module_load_data) &&
              Sym("cuModuleGetFunction", &module_get_function) &&
              Sym("cuModuleUnload", &module_unload) && Sym("cuLaunchKernel", &launch_kernel) &&
              Sym("cuGetErrorName", &get_error_name) && Sym("cuGetErrorString", &get_error_string);
    if (!ok) return Status::Internal("tfhvd: the CUDA driver lacks the module API: " + missing);
    return Status::OK();
  }

  template <typename F>
  bool Sym(const char* name, F** out) {
    *out = reinterpret_cast<F*>(dlsym(handle, name));
    if (*out == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
    return *out != nullptr;
  }
  std::string missing;
};

DeviceKernels::DeviceKernels() : driver_(std::make_unique<Driver>()) {}

DeviceKernels::~DeviceKernels() {
  // At process exit the context may be gone already; the result is moot.
  if (module_ != nullptr && driver_->module_unload != nullptr) driver_->module_unload(module_);
  if (driver_->handle != nullptr) dlclose(driver_->handle);
}

namespace {

std::string Available() {
  std::string s;
  for (int i = 0; i < kNumDeviceImages; ++i) {
    const DeviceImage& im = kDeviceImages[i];
    s += std::string(s.empty() ? "" : ", ") +
         (std::string(im.kind) == "ptx" ? "PTX compute_" : "cubin sm_") + std::to_string(im.arch);
  }
  return s;
}

Status RuntimeError(cudaError_t e, const std::string& what, int device) {
  return Status::Internal("tfhvd: CUDA error on GPU " + std::to_string(device) + " in " + what +
                          ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace

Status DeviceKernels::Load(int device) {
  if (function_ != nullptr && device == device_) return Status::OK();
  if (function_ != nullptr) {
    return Status::Internal("tfhvd: internal error: the CUDA kernels were loaded for GPU " +
                            std::to_string(device_) + ", not GPU " + std::to_string(device));
  }
  TFHVD_RETURN_IF_ERROR(driver_->Open());
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device);
  }
  if (e == cudaSuccess) e = cudaFree(nullptr);  // makes the primary context current
  if (e != cudaSuccess) return RuntimeError(e, "querying the GPU", device);
  const int cc = major * 10 + minor;
  std::vector<const DeviceImage*> candidates = ImageCandidates(kDeviceImages, kNumDeviceImages, cc);
  if (candidates.empty()) {
    return Status::Internal("tfhvd: GPU " + std::to_string(device) + " is sm_" +
                            std::to_string(cc) + " but this library's GPU code covers only " +
                            Available() + "; rebuild tfhvd with TFHVD_CUDA_ARCHS including " +
                            std::to_string(cc));
  }
  std::string failures;
  for (const DeviceImage* im : candidates) {
    const std::string name = std::string(std::string(im->kind) == "ptx" ? "PTX compute_"
                                                                        : "cubin sm_") +
                             std::to_string(im->arch);
    Driver::Result r = driver_->module_load_data(&module_, im->data);
    if (r == 0) {
      r = driver_->module_get_function(&function_, module_, TFHVD_BATCHED_COPY_KERNEL);
      if (r != 0) {
        driver_->module_unload(module_);
        module_ = nullptr;
        function_ = nullptr;
      }
    }
    if (r == 0) {
      device_ = device;
      image_ = name;
      return Status::OK();
    }
    module_ = nullptr;
    failures += (failures.empty() ? "" : "; ") + name + ": " + driver_->Error(r);
  }
  return Status::Internal("tfhvd: cannot load tfhvd's CUDA kernels on GPU " +
                          std::to_string(device) + " (sm_" + std::to_string(cc) +
                          "): " + failures + " (built by " + kDeviceCodeInfo +
                          "; a driver older than that CUDA cannot load its PTX)");
}

Status DeviceKernels::LaunchBatchedScaledCopy(const CopyBatch& batch, void* stream) {
  if (batch.n <= 0) return Status::OK();
  if (function_ == nullptr) {
    return Status::Internal("tfhvd: internal error: CUDA kernels used before they were loaded");
  }
  CopyBatch laid = batch;  // the parameter block, with each task's first tile
  const int64_t tiles = LayOutTiles(&laid);
  if (tiles == 0) return Status::OK();  // nothing to copy
  if (tiles < 0) {
    return Status::InvalidArgument("tfhvd: a batch of GPU copies too large for one launch");
  }
  void* params[] = {&laid};
  Driver::Result r = driver_->launch_kernel(function_, static_cast<unsigned>(tiles), 1, 1,
                                            kThreadsPerBlock, 1, 1, 0, stream, params, nullptr);
  if (r != 0) {
    return Status::Internal("tfhvd: CUDA error on GPU " + std::to_string(device_) +
                            " launching the batched copy kernel (" + image_ +
                            "): " + driver_->Error(r));
  }
  return Status::OK();
}

}  // namespace cuda
}  // namespace tfhvd
