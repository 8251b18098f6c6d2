// The NCCL functions the backend calls: ids, communicators, errors, groups,
// and the collectives as launches of transfers and local reductions
// (fake_nccl.h).  Reductions run in rank order on every rank, so every rank
// gets the same bits.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "../../../tfhvd_ops/core/cpu_math.h"
#include "fake_gpu.h"
#include "fake_nccl.h"

namespace fakegpu {

namespace {

std::mutex last_mu;
char last_global[1024] = "";
std::atomic<long> launches{0};

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// One element of any type as the arithmetic type T reads it.
template <typename T, typename S>
T Load(const void* p, size_t i) {
  return static_cast<T>(static_cast<const S*>(p)[i]);
}

template <typename A>
A Combine(A a, A b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return a + b;  // sum, avg, PreMulSum
  }
}

// out[i] = in[0][i] (op) in[1][i] ... in rank order; S is the element type,
// A the arithmetic type.  `scale`: PreMulSum's factor (1 otherwise); avg
// divides by the number of ranks at the end.
template <typename S, typename A>
void ReduceAs(const std::vector<const void*>& in, void* out, size_t count, ncclRedOp_t op,
              double scale, bool premul) {
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    A acc = Load<A, S>(in[0], i);
    if (premul) acc = static_cast<A>(acc * static_cast<A>(scale));
    for (int r = 1; r < n; ++r) {
      A v = Load<A, S>(in[r], i);
      if (premul) v = static_cast<A>(v * static_cast<A>(scale));
      acc = Combine(acc, v, op);
    }
    if (op == ncclAvg) acc = static_cast<A>(acc / static_cast<A>(n));
    static_cast<S*>(out)[i] = static_cast<S>(acc);
  }
}

// 16-bit floats: in float, rounded back at each step as NCCL's half adds do.
void Reduce16(const std::vector<const void*>& in, void* out, size_t count, ncclRedOp_t op,
              bool bf16) {
  auto to_f = [bf16](uint16_t h) {
    return bf16 ? tfhvd::BFloat16ToFloat(h) : tfhvd::HalfToFloat(h);
  };
  auto to_h = [bf16](float f) {
    return bf16 ? tfhvd::FloatToBFloat16(f) : tfhvd::FloatToHalf(f);
  };
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    uint16_t acc = static_cast<const uint16_t*>(in[0])[i];
    for (int r = 1; r < n; ++r) {
      acc = to_h(Combine(to_f(acc), to_f(static_cast<const uint16_t*>(in[r])[i]), op));
    }
    if (op == ncclAvg) acc = to_h(to_f(acc) / static_cast<float>(n));
    static_cast<uint16_t*>(out)[i] = acc;
  }
}

void Reduce(const std::vector<const void*>& in, void* out, size_t count, ncclDataType_t t,
            ncclRedOp_t op, double scale, bool premul) {
  switch (t) {
    case ncclInt8: ReduceAs<int8_t, int8_t>(in, out, count, op, scale, premul); break;
    case ncclUint8: ReduceAs<uint8_t, uint8_t>(in, out, count, op, scale, premul); break;
    case ncclInt32: ReduceAs<int32_t, int32_t>(in, out, count, op, scale, premul); break;
    case ncclUint32: ReduceAs<uint32_t, uint32_t>(in, out, count, op, scale, premul); break;
    case ncclInt64: ReduceAs<int64_t, int64_t>(in, out, count, op, scale, premul); break;
    case ncclUint64: ReduceAs<uint64_t, uint64_t>(in, out, count, op, scale, premul); break;
    case ncclFloat32: ReduceAs<float, float>(in, out, count, op, scale, premul); break;
    case ncclFloat64: ReduceAs<double, double>(in, out, count, op, scale, premul); break;
    case ncclFloat16: Reduce16(in, out, count, op, false); break;
    case ncclBfloat16: Reduce16(in, out, count, op, true); break;
    default: break;
  }
}

// One collective or point-to-point call, waiting for its launch.
struct Call {
  enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv } kind;
  const char* send;
  char* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  double scale = 1;
  bool premul = false;
  int root;  // or the peer of a send/recv
  ncclComm_t comm;
  cudaStream_t stream;
};

struct Group {
  int depth = 0;
  std::vector<Call> calls;
};
thread_local Group group;

// The transfers and steps of `call` for this rank, appended to `l`.
void Plan(const Call& k, Launch* l) {
  ncclComm* c = k.comm;
  const int me = c->rank, n = c->nranks;
  const size_t bytes = k.count * TypeSize(k.type);
  // Scratch for each peer's contribution to a reduction; slot[r] indexes it.
  auto scratch_slots = [l, me, n, bytes] {
    std::vector<size_t> slot(n, 0);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      slot[r] = l->scratch.size();
      l->scratch.emplace_back(bytes);
    }
    return slot;
  };
  switch (k.kind) {
    case Call::kAllReduce:
    case Call::kReduce:
    case Call::kReduceScatter: {
      const bool scatter = k.kind == Call::kReduceScatter;
      const bool to_me = k.kind != Call::kReduce || k.root == me;
      std::vector<size_t> slot;
      if (to_me) slot = scratch_slots();
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (k.kind != Call::kReduce || k.root == p) {
          char* part = const_cast<char*>(k.send) + (scatter ? p * bytes : 0);
          l->xfers.push_back({p, true, part, bytes});
        }
        if (to_me) l->xfers.push_back({p, false, l->scratch[slot[p]].data(), bytes});
      }
      if (!to_me) break;
      l->steps.push_back([l, k, me, n, bytes, slot, scatter] {
        std::vector<const void*> in(n);
        for (int r = 0; r < n; ++r) {
          in[r] = r == me ? k.send + (scatter ? me * bytes : 0) : l->scratch[slot[r]].data();
        }
        Reduce(in, k.recv, k.count, k.type, k.op, k.scale, k.premul);
      });
      break;
    }
    case Call::kBroadcast:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (me == k.root) l->xfers.push_back({p, true, const_cast<char*>(k.send), bytes});
        if (p == k.root) l->xfers.push_back({p, false, k.recv, bytes});
      }
      if (me == k.root && k.recv != k.send) {
        l->steps.push_back([k, bytes] { std::memmove(k.recv, k.send, bytes); });
      }
      break;
    case Call::kAllGather:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        l->xfers.push_back({p, true, const_cast<char*>(k.send), bytes});
        l->xfers.push_back({p, false, k.recv + p * bytes, bytes});
      }
      if (k.recv + me * bytes != k.send) {
        l->steps.push_back([k, me, bytes] { std::memmove(k.recv + me * bytes, k.send, bytes); });
      }
      break;
    case Call::kSend:
      l->xfers.push_back({k.root, true, const_cast<char*>(k.send), bytes});
      break;
    case Call::kRecv:
      l->xfers.push_back({k.root, false, k.recv, bytes});
      break;
  }
}

// Puts `calls` (one communicator, one stream) on the stream as one launch.
ncclResult_t Submit(const std::vector<Call>& calls) {
  if (calls.empty()) return ncclSuccess;
  ncclComm* c = calls[0].comm;
  for (const Call& k : calls) {
    if (k.comm != c || k.stream != calls[0].stream) {
      SetLastError(c, "the fake NCCL runs a group on one communicator and stream only");
      return ncclInvalidUsage;
    }
  }
  if (c->async_error.load() != ncclSuccess) return static_cast<ncclResult_t>(c->async_error.load());
  if (c->aborted || c->shared == nullptr) return ncclInvalidUsage;
  if (!ValidStream(calls[0].stream)) {
    SetLastError(c, "invalid CUDA stream");
    return ncclInvalidArgument;
  }
  auto* launch = new Launch;
  for (const Call& k : calls) Plan(k, launch);
  const Config& cfg = GetConfig();
  const long n = ++launches;
  launch->fail_async = cfg.nccl_async_after >= 0 && n == cfg.nccl_async_after + 1;
  launch->hang = cfg.nccl_hang_after >= 0 && n == cfg.nccl_hang_after + 1;
  ++c->inflight;
  StreamOf(calls[0].stream)->Push([c, launch] {
    if (BeginStreamOp()) Execute(c, launch);  // counted like any stream operation
    delete launch;
    if (--c->inflight == 0 && c->aborted && c->shared != nullptr) Detach(c);
  });
  return ncclSuccess;
}

ncclResult_t Add(Call k) {
  ncclComm* c = k.comm;
  if (c == nullptr) return ncclInvalidArgument;
  if (TypeSize(k.type) == 0) {
    SetLastError(c, "the fake NCCL has no data type " + std::to_string(k.type));
    return ncclInvalidArgument;
  }
  const bool rooted = k.kind == Call::kBroadcast || k.kind == Call::kReduce ||
                      k.kind == Call::kSend || k.kind == Call::kRecv;
  if (rooted && (k.root < 0 || k.root >= c->nranks)) {
    SetLastError(c, "root or peer " + std::to_string(k.root) + " out of range");
    return ncclInvalidArgument;
  }
  if (k.op >= ncclNumOps) {
    std::lock_guard<std::mutex> l(c->mu);
    const size_t i = static_cast<size_t>(k.op) - ncclNumOps;
    if (i >= c->premul.size() || std::isnan(c->premul[i])) return ncclInvalidArgument;
    k.scale = c->premul[i];  // read now: the op may be destroyed after the call
    k.premul = true;
    k.op = ncclSum;
  } else if (k.op < 0) {
    return ncclInvalidArgument;
  }
  if (k.count > 0 && ((k.kind != Call::kRecv && k.send == nullptr) ||
                      (k.kind != Call::kSend && k.recv == nullptr && k.kind != Call::kReduce))) {
    SetLastError(c, "null buffer");
    return ncclInvalidArgument;
  }
  if (group.depth > 0) {
    group.calls.push_back(k);
    return ncclSuccess;
  }
  return Submit({k});
}

}  // namespace

void SetLastError(ncclComm* comm, const std::string& why) {
  std::lock_guard<std::mutex> l(last_mu);
  std::snprintf(last_global, sizeof(last_global), "%s", why.c_str());
  if (comm != nullptr) comm->last_error = why;
}

}  // namespace fakegpu

using fakegpu::Call;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;  // NCCL's is process-wide too
  std::lock_guard<std::mutex> l(fakegpu::last_mu);
  return fakegpu::last_global;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  unsigned char rnd[12] = {0};
  const int fd = open("/dev/urandom", O_RDONLY);
  const bool ok = fd >= 0 && read(fd, rnd, sizeof(rnd)) == static_cast<ssize_t>(sizeof(rnd));
  if (fd >= 0) close(fd);
  if (!ok) return ncclSystemError;
  std::string name = "/tfhvd-fake-nccl-" + fakegpu::GetConfig().shm_tag + "-";
  char hex[3];
  for (unsigned char b : rnd) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    name += hex;
  }
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, name.data(), std::min(name.size(), sizeof(id->internal) - 1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return ncclInvalidArgument;
  *out = nullptr;
  if (nranks < 1 || nranks > fakegpu::kMaxRanks || rank < 0 || rank >= nranks) {
    fakegpu::SetLastError(nullptr, "nranks " + std::to_string(nranks) + " or rank " +
                                       std::to_string(rank) + " out of range");
    return ncclInvalidArgument;
  }
  if (fakegpu::GetConfig().nccl_init_error) {
    fakegpu::SetLastError(nullptr, "injected init failure (TFHVD_FAKE_NCCL_INIT_ERROR)");
    return ncclSystemError;
  }
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  cudaGetDevice(&c->device);
  std::string why;
  ncclResult_t r = fakegpu::Attach(c, id, &why);
  if (r != ncclSuccess) {
    fakegpu::SetLastError(nullptr, why);
    fakegpu::Detach(c);
    delete c;
    return r;
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  fakegpu::Detach(comm);  // (a communicator with launches in flight is left behind)
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (comm == nullptr || async == nullptr) return ncclInvalidArgument;
  *async = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  if (op == nullptr || scalar == nullptr || comm == nullptr) return ncclInvalidArgument;
  if (residence != ncclScalarHostImmediate) return ncclInvalidArgument;  // all the backend uses
  double v;
  switch (type) {
    case ncclFloat32: v = *static_cast<float*>(scalar); break;
    case ncclFloat64: v = *static_cast<double*>(scalar); break;
    default: return ncclInvalidArgument;
  }
  std::lock_guard<std::mutex> l(comm->mu);
  size_t i = 0;
  while (i < comm->premul.size() && !std::isnan(comm->premul[i])) ++i;
  if (i == comm->premul.size()) comm->premul.push_back(0);
  comm->premul[i] = v;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + i);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(comm->mu);
  const size_t i = static_cast<size_t>(op) - ncclNumOps;
  if (op < ncclNumOps || i >= comm->premul.size()) return ncclInvalidArgument;
  comm->premul[i] = std::numeric_limits<double>::quiet_NaN();
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++fakegpu::group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (fakegpu::group.depth == 0) return ncclInvalidUsage;
  if (--fakegpu::group.depth > 0) return ncclSuccess;
  std::vector<Call> calls;
  calls.swap(fakegpu::group.calls);
  return fakegpu::Submit(calls);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kAllReduce, static_cast<const char*>(send), static_cast<char*>(recv),
                       count, type, op, 1, false, 0, comm, stream});
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kReduce, static_cast<const char*>(send), static_cast<char*>(recv),
                       count, type, op, 1, false, root, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kReduceScatter, static_cast<const char*>(send),
                       static_cast<char*>(recv), count, type, op, 1, false, 0, comm, stream});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kBroadcast, static_cast<const char*>(send), static_cast<char*>(recv),
                       count, type, ncclSum, 1, false, root, comm, stream});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kAllGather, static_cast<const char*>(send), static_cast<char*>(recv),
                       count, type, ncclSum, 1, false, 0, comm, stream});
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return fakegpu::Add({Call::kSend, static_cast<const char*>(send), nullptr, count, type, ncclSum,
                       1, false, peer, comm, stream});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return fakegpu::Add({Call::kRecv, nullptr, static_cast<char*>(recv), count, type, ncclSum, 1,
                       false, peer, comm, stream});
}

}  // extern "C"
