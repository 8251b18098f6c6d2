// Stands in for the generated device_images.cc of the real build: the same
// three images (cubin sm_80, cubin sm_90, PTX compute_90), whose bytes name
// their kind and architecture for the fake driver (driver.cc), so the
// backend's choice of image (cuda/device_kernels.h ImageCandidates) meets a
// driver that refuses what a real one would.
#include "../../../tfhvd_ops/cuda/device_kernels.h"

namespace tfhvd {
namespace cuda {
namespace {
const unsigned char kCubin80[] = "TFHVD-FAKE-IMAGE cubin 80";
const unsigned char kCubin90[] = "TFHVD-FAKE-IMAGE cubin 90";
const unsigned char kPtx90[] = "TFHVD-FAKE-IMAGE ptx 90";
}  // namespace

const DeviceImage kDeviceImages[] = {
    {"cubin", 80, kCubin80, sizeof(kCubin80)},
    {"cubin", 90, kCubin90, sizeof(kCubin90)},
    {"ptx", 90, kPtx90, sizeof(kPtx90)},
};
const int kNumDeviceImages = 3;
const char kDeviceCodeInfo[] =
    "fake device code (tests/gpu/fake_cuda): cubin sm_80 sm_90, PTX compute_90";

}  // namespace cuda
}  // namespace tfhvd
