// Host side of tfhvd's CUDA kernels: the device code is compiled apart
// (cuda/build_device_code.py: NVRTC of TensorFlow's CUDA by default) into
// cubins for each architecture plus PTX of the newest one, embedded in the
// library as data (a generated device_images.cc), and loaded at run time
// with the driver API (cuModuleLoadData, cuLaunchKernel), as Triton and CuPy
// do.  So the library needs no NVIDIA fatbinary tool and no nvcc to build,
// and its device code comes from the CUDA that TensorFlow uses.
//
// libcuda is opened with dlopen: the library still loads on a machine
// without a driver (CPU collectives keep working there).
#ifndef TFHVD_CUDA_DEVICE_KERNELS_H_
#define TFHVD_CUDA_DEVICE_KERNELS_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../core/common.h"
#include "gpu_kernels.h"

namespace tfhvd {
namespace cuda {

// Numbers the tiles of a batch task after task (each task's first_tile) and
// returns how many there are: the launch's blocks.  A task with nothing to
// do (a plain copy onto itself, no elements) gets no tile.  -1: more tiles
// than a launch can number.
inline int64_t LayOutTiles(CopyBatch* batch) {
  int64_t tiles = 0;
  for (int i = 0; i < batch->n; ++i) {
    CopyTask& t = batch->tasks[i];
    t.first_tile = static_cast<int32_t>(tiles);
    const bool noop = t.src == t.dst &&
                      (t.factor == 1.0 || t.dtype == static_cast<int32_t>(DataType::kBool));
    const int64_t bytes =
        noop ? 0 : t.count * DataTypeSize(static_cast<DataType>(t.dtype));
    tiles += (bytes + kTileBytes - 1) / kTileBytes;
    if (tiles > int64_t{0x7fffffff}) return -1;
  }
  return tiles;
}

// One embedded image: a cubin ("cubin", real code for sm_<arch>) or PTX
// ("ptx", compute_<arch>, JIT-compiled by the driver; NUL-terminated).
struct DeviceImage {
  const char* kind;
  int arch;
  const unsigned char* data;
  size_t size;
};

// Images of `images[0..n)` that can run on compute capability `cc`
// (major*10+minor), best first: the exact cubin, a cubin of the same major
// and a lower minor (binary compatible), then PTX of an arch <= cc, newest
// first (the driver JIT-compiles it).
inline std::vector<const DeviceImage*> ImageCandidates(const DeviceImage* images, int n, int cc) {
  std::vector<const DeviceImage*> cubins, ptx;
  for (int i = 0; i < n; ++i) {
    const DeviceImage& im = images[i];
    const bool cubin = std::string(im.kind) == "cubin";
    if (cubin && im.arch / 10 == cc / 10 && im.arch <= cc) cubins.push_back(&im);
    if (!cubin && im.arch <= cc) ptx.push_back(&im);
  }
  auto newest = [](const DeviceImage* a, const DeviceImage* b) { return a->arch > b->arch; };
  std::sort(cubins.begin(), cubins.end(), newest);
  std::sort(ptx.begin(), ptx.end(), newest);
  cubins.insert(cubins.end(), ptx.begin(), ptx.end());
  return cubins;
}

// Defined by the generated device_images.cc.
extern const DeviceImage kDeviceImages[];
extern const int kNumDeviceImages;
// "NVRTC 12.5 (CUDA 12.5.82): cubin sm_80 sm_90, PTX compute_90": which tool
// built the device code, for which architectures (check-build shows it).
extern const char kDeviceCodeInfo[];

// The kernels of one process on its GPU.  Owned by the NCCL collectives;
// only their (background) thread uses it.
class DeviceKernels {
 public:
  DeviceKernels();
  ~DeviceKernels();  // unloads the module
  DeviceKernels(const DeviceKernels&) = delete;
  DeviceKernels& operator=(const DeviceKernels&) = delete;

  // Loads the best image for `device` into its primary context: the cubin
  // of its architecture, else a cubin of the same major version, else the
  // PTX.  The calling thread's current device must be `device`.
  Status Load(int device);
  bool loaded() const { return function_ != nullptr; }
  // Which image was loaded ("cubin sm_90"), for messages.
  const std::string& image() const { return image_; }
  int sm_count() const { return sm_count_; }

  // One launch for the whole batch on `stream` (a cudaStream_t): a block per
  // tile (LayOutTiles).
  Status LaunchBatchedScaledCopy(const CopyBatch& batch, void* stream);

 private:
  struct Driver;
  std::unique_ptr<Driver> driver_;
  void* module_ = nullptr;
  void* function_ = nullptr;
  int device_ = -1;
  int sm_count_ = 0;
  std::string image_;
};

}  // namespace cuda
}  // namespace tfhvd

#endif  // TFHVD_CUDA_DEVICE_KERNELS_H_
