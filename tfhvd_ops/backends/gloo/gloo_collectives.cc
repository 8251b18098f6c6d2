#include "gloo_collectives.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../../core/cpu_math.h"

namespace tfhvd {
namespace {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

// Integer sums and products wrap as TensorFlow's do: computed in an unsigned
// type at least as wide as unsigned int (uint16 * uint16 would otherwise be
// promoted to int and could overflow it, which is undefined).
template <typename T>
T Wrapping(T a, T b, bool product) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    W x = static_cast<U>(a), y = static_cast<U>(b);
    return static_cast<T>(static_cast<U>(product ? x * y : x + y));
  } else {
    return product ? a * b : a + b;
  }
}

template <typename T, ReduceOp kOp>
void ReduceTyped(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    switch (kOp) {
      case ReduceOp::kMin: o[i] = std::min(x[i], y[i]); break;
      case ReduceOp::kMax: o[i] = std::max(x[i], y[i]); break;
      case ReduceOp::kProduct: o[i] = Wrapping(x[i], y[i], true); break;
      default: o[i] = Wrapping(x[i], y[i], false); break;
    }
  }
}

// Gloo's reduction is out = a op b (out may alias a or b); Reduce16 is
// inout = in op inout.  Every op here is commutative.
template <bool kBFloat, ReduceOp kOp>
void Reduce16Fn(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  if (o == y) std::swap(x, y);
  if (o != x) std::memcpy(o, x, n * sizeof(uint16_t));
  Reduce16(y, o, static_cast<int64_t>(n), kBFloat, kOp);
}

template <ReduceOp kOp>
Status PickForOp(DataType dtype, ReduceFn* fn) {
  switch (dtype) {
    case DataType::kUInt8: *fn = &ReduceTyped<uint8_t, kOp>; break;
    case DataType::kInt8: *fn = &ReduceTyped<int8_t, kOp>; break;
    case DataType::kUInt16: *fn = &ReduceTyped<uint16_t, kOp>; break;
    case DataType::kInt16: *fn = &ReduceTyped<int16_t, kOp>; break;
    case DataType::kInt32: *fn = &ReduceTyped<int32_t, kOp>; break;
    case DataType::kInt64: *fn = &ReduceTyped<int64_t, kOp>; break;
    case DataType::kFloat32: *fn = &ReduceTyped<float, kOp>; break;
    case DataType::kFloat64: *fn = &ReduceTyped<double, kOp>; break;
    case DataType::kFloat16: *fn = &Reduce16Fn<false, kOp>; break;
    case DataType::kBFloat16: *fn = &Reduce16Fn<true, kOp>; break;
    case DataType::kBool:
      return Status::InvalidArgument("tfhvd: bool tensors cannot be reduced; cast them first");
  }
  return Status::OK();
}

Status PickReduction(DataType dtype, ReduceOp op, ReduceFn* fn) {
  switch (op) {
    case ReduceOp::kSum: return PickForOp<ReduceOp::kSum>(dtype, fn);
    case ReduceOp::kMin: return PickForOp<ReduceOp::kMin>(dtype, fn);
    case ReduceOp::kMax: return PickForOp<ReduceOp::kMax>(dtype, fn);
    case ReduceOp::kProduct: return PickForOp<ReduceOp::kProduct>(dtype, fn);
    default:
      return Status::InvalidArgument(std::string("tfhvd: reduce op ") + ReduceOpName(op) +
                                     " is not supported by the Gloo backend");
  }
}

template <typename E>
void SetBuffers(gloo::AllreduceOptions* opts, const void* send, void* recv, int64_t n) {
  if (send != nullptr) opts->setInput(static_cast<E*>(const_cast<void*>(send)), n);
  opts->setOutput(static_cast<E*>(recv), n);
}

// Runs a Gloo call, turning its exceptions into a Status.
template <typename F>
Status Guard(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return Status::Aborted(std::string("tfhvd: Gloo ") + what + " failed: " + e.what());
  }
  return Status::OK();
}

// Gloo wants a real pointer even for zero bytes.
char* NonNull(const void* p) {
  static char dummy;
  return p != nullptr ? static_cast<char*>(const_cast<void*>(p)) : &dummy;
}

}  // namespace

Status CreateGlooDevice(const std::string& iface, const std::string& hostname,
                        std::shared_ptr<gloo::transport::Device>* out) {
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) {
    attr.iface = iface;
  } else if (!hostname.empty()) {
    attr.hostname = hostname;
  } else {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    attr.hostname = buf;
  }
  return Guard("device creation", [&] { *out = gloo::transport::tcp::CreateDevice(attr); })
      .ok()
      ? Status::OK()
      : Status::InvalidArgument(
            "tfhvd: cannot open Gloo's TCP transport on " +
            (iface.empty() ? "the address of host '" + attr.hostname + "'"
                           : "interface '" + iface + "'") +
            "; set HOROVOD_GLOO_IFACE (tfhvdrun --network-interface) to an interface this "
            "host has");
}

Status ConnectGlooContext(const GlooPeers& peers, const std::string& prefix, int rank, int size,
                          std::shared_ptr<gloo::Context>* out) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(peers.timeout);
  std::string error;
  try {
    gloo::rendezvous::PrefixStore store(prefix, *peers.store);
    ctx->connectFullMesh(store, const_cast<std::shared_ptr<gloo::transport::Device>&>(peers.device));
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) {
    return Status::Aborted("tfhvd: rank " + std::to_string(rank) + " could not connect the Gloo " +
                           prefix + " context of " + std::to_string(size) +
                           " processes: " + error);
  }
  *out = std::move(ctx);
  return Status::OK();
}

GlooCollectives::GlooCollectives(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)) {}

GlooCollectives::~GlooCollectives() = default;

int GlooCollectives::rank() const { return context_->rank; }
int GlooCollectives::size() const { return context_->size; }

Status GlooCollectives::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                  ReduceOp op) {
  if (count == 0) return Status::OK();
  ReduceFn fn;
  TFHVD_RETURN_IF_ERROR(PickReduction(dtype, op, &fn));
  const int64_t esize = DataTypeSize(dtype);
  if (context_->size == 1) {
    if (send != nullptr && send != recv) std::memcpy(recv, send, count * esize);
    return Status::OK();
  }
  return Guard("allreduce", [&] {
    gloo::AllreduceOptions opts(context_);
    const void* in = send != recv ? send : nullptr;
    switch (esize) {  // Gloo learns the element size from the pointer type
      case 1: SetBuffers<uint8_t>(&opts, in, recv, count); break;
      case 2: SetBuffers<uint16_t>(&opts, in, recv, count); break;
      case 4: SetBuffers<uint32_t>(&opts, in, recv, count); break;
      default: SetBuffers<uint64_t>(&opts, in, recv, count); break;
    }
    opts.setReduceFunction(fn);
    gloo::allreduce(opts);
  });
}

Status GlooCollectives::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                   const std::vector<int64_t>& recv_bytes) {
  std::vector<size_t> counts(recv_bytes.begin(), recv_bytes.end());
  return Guard("allgather", [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(NonNull(send), static_cast<size_t>(send_bytes));
    opts.setOutput(NonNull(recv), counts);
    gloo::allgatherv(opts);
  });
}

Status GlooCollectives::Broadcast(void* buf, int64_t bytes, int root) {
  if (bytes == 0 || context_->size == 1) return Status::OK();
  return Guard("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setRoot(root);
    opts.setOutput(static_cast<char*>(buf), static_cast<size_t>(bytes));
    gloo::broadcast(opts);
  });
}

Status GlooCollectives::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes) {
  return Guard("alltoall", [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(NonNull(send), send_bytes);
    opts.setOutput(NonNull(recv), recv_bytes);
    gloo::alltoallv(opts);
  });
}

Status GlooCollectives::ReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op) {
  const int64_t esize = DataTypeSize(dtype);
  int64_t total = 0, offset = 0;
  for (int i = 0; i < static_cast<int>(recv_counts.size()); ++i) {
    if (i == context_->rank) offset = total;
    total += recv_counts[i];
  }
  scratch_.resize(static_cast<size_t>(total * esize));
  TFHVD_RETURN_IF_ERROR(Allreduce(send, scratch_.data(), total, dtype, op));
  const int64_t mine = recv_counts[context_->rank] * esize;
  if (mine > 0) std::memcpy(recv, scratch_.data() + offset * esize, mine);
  return Status::OK();
}

Status GlooCollectives::SendRecv(const void* send, int64_t send_bytes, void* recv,
                                 int64_t recv_bytes, int peer) {
  // Gloo's algorithms take slots from Context::nextSlot(), which counts up
  // from 0; this one is far above any count a job reaches.  Messages between
  // two ranks on one slot arrive in order.
  constexpr uint64_t kExchangeSlot = uint64_t{0x7fad} << 40;
  return Guard("point-to-point exchange", [&] {
    std::unique_ptr<gloo::transport::UnboundBuffer> in, out;
    if (recv_bytes > 0) {
      in = context_->createUnboundBuffer(recv, static_cast<size_t>(recv_bytes));
      in->recv(peer, kExchangeSlot);
    }
    if (send_bytes > 0) {
      out = context_->createUnboundBuffer(const_cast<void*>(send),
                                          static_cast<size_t>(send_bytes));
      out->send(peer, kExchangeSlot);
    }
    if (in && !in->waitRecv(context_->getTimeout())) {
      throw std::runtime_error("the receive from rank " + std::to_string(peer) + " was aborted");
    }
    if (out && !out->waitSend(context_->getTimeout())) {
      throw std::runtime_error("the send to rank " + std::to_string(peer) + " was aborted");
    }
  });
}

Status GlooCollectives::Barrier() {
  if (context_->size == 1) return Status::OK();
  return Guard("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  });
}

}  // namespace tfhvd
