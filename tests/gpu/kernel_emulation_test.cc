// Runs the device code of tfhvd's copy/scale kernel (cuda/gpu_kernels.cu) on
// the host, with the launcher's own grid (cuda/device_kernels.h BatchGridX),
// and compares every result with the host path (core/cpu_math.h), bit for
// bit: every dtype, plain copies and scaling, in place, source and
// destination at every element-aligned offset (the vector path, the head
// peel, the 4-byte and byte fallbacks, the tails), batches, and grids small
// enough that the grid-stride loops run many rounds; and which embedded
// image each GPU generation loads.  No GPU needed; the GPU runs the same
// code through tests/gpu/device_check.sh.
//   kernel_emulation_test          (make test-gpu-build builds and runs it)
// Last line: "N passed, M failed".  Build it with -I tests/gpu/emulated_cuda
// (host versions of the CUDA headers the kernel includes).
#include "../../tfhvd_ops/cuda/gpu_kernels.cu"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/common.h"
#include "../../tfhvd_ops/cuda/device_kernels.h"

namespace {

using tfhvd::DataType;
using tfhvd::cuda::CopyBatch;
using tfhvd::cuda::CopyTask;

void Launch(const CopyBatch& b, int sm_count) {
  const unsigned gx = tfhvd::cuda::BatchGridX(b, sm_count);
  gridDim = {gx, static_cast<unsigned>(b.n), 1};
  blockDim = {static_cast<unsigned>(tfhvd::cuda::kThreadsPerBlock), 1, 1};
  for (unsigned y = 0; y < static_cast<unsigned>(b.n); ++y) {
    for (unsigned bx = 0; bx < gx; ++bx) {
      for (unsigned t = 0; t < blockDim.x; ++t) {
        blockIdx = {bx, y, 0};
        threadIdx = {t, 0, 0};
        tfhvd_batched_scaled_copy(b);
      }
    }
  }
}

// Random bytes that are valid values of `dt` (finite 16-bit floats, 0/1 bools).
void Fill(std::mt19937* rng, DataType dt, void* p, int64_t n) {
  const int64_t es = tfhvd::DataTypeSize(dt);
  unsigned char* c = static_cast<unsigned char*>(p);
  for (int64_t i = 0; i < n * es; ++i) c[i] = static_cast<unsigned char>((*rng)() & 0xff);
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(static_cast<int>((*rng)() % 2001) - 1000) / 8;
    switch (dt) {
      case DataType::kBool: c[i] &= 1; break;
      case DataType::kFloat64:
        std::memcpy(c + i * 8, &v, 8);
        break;
      case DataType::kFloat32: {
        float f = static_cast<float>(v);
        std::memcpy(c + i * 4, &f, 4);
        break;
      }
      case DataType::kFloat16: case DataType::kBFloat16: {
        float f = static_cast<float>(v);
        uint16_t h = dt == DataType::kFloat16 ? tfhvd::FloatToHalf(f) : tfhvd::FloatToBFloat16(f);
        std::memcpy(c + i * 2, &h, 2);
        break;
      }
      default: break;
    }
  }
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::mt19937 rng(12);
  const DataType dtypes[] = {DataType::kUInt8, DataType::kInt8, DataType::kUInt16,
                             DataType::kInt16, DataType::kInt32, DataType::kInt64,
                             DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                             DataType::kFloat64, DataType::kBool};
  int passed = 0, failed = 0;
  auto check = [&](const std::string& what, bool ok) {
    if (!ok) std::printf("FAIL %s\n", what.c_str());
    (ok ? passed : failed)++;
  };
  for (DataType dt : dtypes) {
    const int64_t es = tfhvd::DataTypeSize(dt);
    for (double factor : {1.0, 0.5, 3.0}) {
      for (int64_t n : {1, 7, 33, 1000, 4099}) {
        for (int64_t soff : {0, 1, 2, 3, 4, 8, 12}) {
          for (int64_t doff : {0, 1, 2, 5, 8}) {
            for (bool in_place : {false, true}) {
              if (in_place && doff != soff) continue;
              for (int sms : {1, 132}) {
                // 16-byte aligned arenas; offsets in elements, as tensors are.
                std::vector<uint4> src_arena(static_cast<size_t>((n + 16) * es / 16 + 2));
                std::vector<uint4> dst_arena(src_arena.size()), ref_arena(src_arena.size());
                char* s = reinterpret_cast<char*>(src_arena.data()) + soff * es;
                char* d = in_place ? s : reinterpret_cast<char*>(dst_arena.data()) + doff * es;
                const int64_t cap = static_cast<int64_t>(src_arena.size()) * 16 / es;
                Fill(&rng, dt, src_arena.data(), cap);
                std::memcpy(ref_arena.data(), in_place ? src_arena.data() : dst_arena.data(),
                            src_arena.size() * 16);
                char* r =
                    reinterpret_cast<char*>(ref_arena.data()) + (in_place ? soff : doff) * es;
                tfhvd::ScaledCopy(in_place ? r : s, r, n, dt, factor);
                CopyBatch b;
                b.n = 1;
                b.tasks[0] = CopyTask{s, d, n, factor, static_cast<int32_t>(dt)};
                Launch(b, sms);
                const char* whole = in_place ? reinterpret_cast<char*>(src_arena.data())
                                             : reinterpret_cast<char*>(dst_arena.data());
                // Bit for bit, including the bytes around the destination.
                check(std::string(tfhvd::DataTypeName(dt)) + " x" + std::to_string(factor) +
                          " n=" + std::to_string(n) + " src+" + std::to_string(soff) + " dst+" +
                          std::to_string(doff) + (in_place ? " in place" : "") + " sms=" +
                          std::to_string(sms),
                      std::memcmp(whole, ref_arena.data(), src_arena.size() * 16) == 0);
              }
            }
          }
        }
      }
    }
  }
  // A batch: copies into one buffer at packed offsets (the fusion buffer's
  // layout), mixed with scaled ones, one launch.
  {
    std::vector<float> fused(1 + 7 + 1000 + 4099 + 64, -1.0f), want = fused;
    std::vector<std::vector<float>> ins;
    CopyBatch b;
    int64_t off = 0;
    for (int64_t n : {1, 7, 1000, 4099}) {
      ins.emplace_back(n);
      for (int64_t i = 0; i < n; ++i) ins.back()[i] = static_cast<float>(i % 13) - 6;
      const double f = b.n % 2 ? 0.25 : 1.0;
      b.tasks[b.n++] = CopyTask{ins.back().data(), fused.data() + off, n, f,
                                static_cast<int32_t>(DataType::kFloat32)};
      tfhvd::ScaledCopy(ins.back().data(), want.data() + off, n, DataType::kFloat32, f);
      off += n;
    }
    Launch(b, 4);
    check("batch of 4 into a packed buffer", fused == want);
  }
  // Which embedded image a GPU loads (device_kernels.h ImageCandidates).
  {
    const unsigned char none[1] = {0};
    const tfhvd::cuda::DeviceImage images[] = {
        {"cubin", 80, none, 1}, {"cubin", 90, none, 1}, {"ptx", 90, none, 1}};
    auto order = [&](int cc) {
      std::string s;
      for (const auto* im : tfhvd::cuda::ImageCandidates(images, 3, cc)) {
        s += std::string(s.empty() ? "" : " ") + im->kind + std::to_string(im->arch);
      }
      return s;
    };
    const std::pair<int, const char*> want[] = {
        {90, "cubin90 ptx90"}, {80, "cubin80"}, {86, "cubin80"}, {89, "cubin80"},
        {100, "ptx90"}, {120, "ptx90"}, {75, ""}};
    for (const auto& w : want) {
      check("images for sm_" + std::to_string(w.first) + ": got '" + order(w.first) +
                "', want '" + w.second + "'",
            order(w.first) == w.second);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
