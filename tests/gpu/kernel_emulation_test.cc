// Runs the device code of tfhvd's copy/scale kernel (cuda/gpu_kernels.cu) on
// the host, with the launcher's own tiles (cuda/device_kernels.h LayOutTiles),
// and compares every result with the host path (core/cpu_math.h), bit for
// bit: every dtype, plain copies and scaling, in place, source and
// destination at every element-aligned offset (the vector path, the
// unrolled whole tiles, the head peel, the 4-byte and byte fallbacks, the
// tails), tasks of one tile and of many, batches; and which embedded
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

// Launches as DeviceKernels does; returns the number of blocks (tiles).
int64_t Launch(const CopyBatch& batch) {
  CopyBatch b = batch;
  const int64_t tiles = tfhvd::cuda::LayOutTiles(&b);
  gridDim = {static_cast<unsigned>(tiles), 1, 1};
  blockDim = {static_cast<unsigned>(tfhvd::cuda::kThreadsPerBlock), 1, 1};
  for (int64_t bx = 0; bx < tiles; ++bx) {
    for (unsigned t = 0; t < blockDim.x; ++t) {
      blockIdx = {static_cast<unsigned>(bx), 0, 0};
      threadIdx = {t, 0, 0};
      tfhvd_batched_scaled_copy(b);
    }
  }
  return tiles;
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
      for (int64_t n : {1, 7, 33, 1000, 4099, 20000}) {
        for (int64_t soff : {0, 1, 2, 3, 4, 8, 12}) {
          for (int64_t doff : {0, 1, 2, 5, 8}) {
            for (bool in_place : {false, true}) {
              if (in_place && doff != soff) continue;
              {
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
                Launch(b);
                const char* whole = in_place ? reinterpret_cast<char*>(src_arena.data())
                                             : reinterpret_cast<char*>(dst_arena.data());
                // Bit for bit, including the bytes around the destination.
                check(std::string(tfhvd::DataTypeName(dt)) + " x" + std::to_string(factor) +
                          " n=" + std::to_string(n) + " src+" + std::to_string(soff) + " dst+" +
                          std::to_string(doff) + (in_place ? " in place" : ""),
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
    Launch(b);
    check("batch of 4 into a packed buffer", fused == want);
  }
  // Tasks of very different sizes in one launch, each with as many tiles as
  // its bytes need (a plain copy onto itself and an empty task have none),
  // and each tile's block on its own task.
  {
    const int64_t tile = tfhvd::cuda::kTileBytes;
    const int64_t sizes[] = {3 * tile / 4 + 5, 0, 7 * tile / 4, 1, tile / 4, 5 * tile / 4 + 4};
    std::vector<std::vector<float>> ins, outs, wants;
    CopyBatch b;
    for (int64_t n : sizes) {
      ins.emplace_back(n + 1);
      outs.emplace_back(n + 1, -7.0f);
      for (int64_t i = 0; i < n + 1; ++i) ins.back()[i] = static_cast<float>(i % 101) - 50;
      wants.push_back(outs.back());
      const double f = b.n % 3 == 2 ? 0.5 : 1.0;
      tfhvd::ScaledCopy(ins.back().data(), wants.back().data(), n, DataType::kFloat32, f);
      b.tasks[b.n++] = CopyTask{ins.back().data(), outs.back().data(), n, f,
                                static_cast<int32_t>(DataType::kFloat32), 0};
    }
    std::vector<float> self(100, 3.0f);  // no tile: nothing to do
    b.tasks[b.n++] = CopyTask{self.data(), self.data(), 100, 1.0,
                              static_cast<int32_t>(DataType::kFloat32), 0};
    CopyBatch laid = b;
    const int64_t tiles = tfhvd::cuda::LayOutTiles(&laid);
    // (sizes are in float32 elements: 4 bytes each, so 3, 0, 7, 1, 1 and 6
    // tiles, then none for the copy onto itself)
    int64_t want_tiles = 0;
    std::string firsts, want_firsts;
    for (int i = 0; i < laid.n; ++i) {
      firsts += std::to_string(laid.tasks[i].first_tile) + " ";
      want_firsts += std::to_string(want_tiles) + " ";
      if (i < static_cast<int>(std::size(sizes))) want_tiles += (sizes[i] * 4 + tile - 1) / tile;
    }
    check("tiles numbered task after task: " + firsts + "want " + want_firsts,
          firsts == want_firsts && tiles == want_tiles);
    Launch(b);
    bool same = self == std::vector<float>(100, 3.0f);
    for (size_t i = 0; i < outs.size(); ++i) same &= outs[i] == wants[i];
    check("a batch of tasks of 0 to 7 tiles, tile by tile", same);
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
