// Host-memory collectives over one Gloo context (Debian's libgloo, TCP
// transport), and the construction of such contexts.
//
// A context is a full mesh of TCP pairs between `size` processes, connected
// through a rendezvous Store under a key prefix: the world ("global"), a
// node ("local/<host>"), the ranks sharing a local rank ("cross/<n>") and
// process sets ("set<id>/<n>") all come from the same store and device, so
// a context over any subset of ranks costs one more rendezvous.
//
// Gloo's own algorithms move the bytes: ring allreduce with our reduction
// function (every dtype, float16/bfloat16 included, Sum/Min/Max/Product),
// allgatherv, alltoallv, broadcast, barrier; SendRecv is a pair of unbound
// buffers on a slot that Gloo's own algorithms never take.  This Gloo version has no
// reduce-scatter with a custom reduction, so ReduceScatter is an allreduce
// into a scratch buffer and a copy of this rank's block.
// Gloo reports failures by throwing; every call here returns them as a
// Status instead, naming the collective.
#ifndef TFHVD_BACKENDS_GLOO_GLOO_COLLECTIVES_H_
#define TFHVD_BACKENDS_GLOO_GLOO_COLLECTIVES_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../../core/backend.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class Device;
}
}  // namespace gloo

namespace tfhvd {

// What every context of one backend is made from.
struct GlooPeers {
  std::shared_ptr<gloo::transport::Device> device;
  gloo::rendezvous::Store* store = nullptr;
  std::chrono::milliseconds timeout{30000};
};

// The TCP device: on interface `iface` when given, else on the address that
// `hostname` resolves to (this host's name when empty).
Status CreateGlooDevice(const std::string& iface, const std::string& hostname,
                        std::shared_ptr<gloo::transport::Device>* out);

// Connects `size` processes (this one is `rank`) under `prefix` of the store.
Status ConnectGlooContext(const GlooPeers& peers, const std::string& prefix, int rank, int size,
                          std::shared_ptr<gloo::Context>* out);

class GlooCollectives : public HostMemoryOps {
 public:
  explicit GlooCollectives(std::shared_ptr<gloo::Context> context);
  ~GlooCollectives() override;

  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buf, int64_t bytes, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override;
  const char* name() const override { return "Gloo"; }

  int rank() const;
  int size() const;

 private:
  std::shared_ptr<gloo::Context> context_;
  std::vector<char> scratch_;  // ReduceScatter's full result
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_GLOO_GLOO_COLLECTIVES_H_
