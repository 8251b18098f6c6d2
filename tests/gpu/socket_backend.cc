// The host backend of the TF-free NCCL harness: no MPI, so it runs on a GPU
// machine that has only a compiler, CUDA and NCCL (tests/gpu/device_check.sh).
// It stands in for backends/factory.cc; the NCCL backend runs on top of it
// exactly as it runs on top of MPI.
//
// Ranks come from the launcher's environment:
//   TFHVD_HARNESS_RANK, TFHVD_HARNESS_SIZE (default 0 and 1),
//   TFHVD_HARNESS_ADDR=host:port (rank 0 listens there; default
//   127.0.0.1:29517).
// Host collectives go through a star of blocking loopback sockets centred on
// rank 0 (ncclUniqueId, the init agreement, the cross-node step of the
// hierarchical allreduce); negotiation goes through tfhvd's real TCP control
// channel, bootstrapped over that star.  Every rank is its own "node"
// (local_size 1, cross_size = size), matching the distinct NCCL_HOSTID each
// rank gets so that two ranks may share one GPU.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../../tfhvd_ops/backends/nccl/nccl_backend.h"
#include "../../tfhvd_ops/backends/tcp/tcp_control.h"
#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/cpu_math.h"

namespace tfhvd {
namespace {

constexpr int kSocketTimeoutS = 120;

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

Status Errno(const std::string& what) {
  return Status::Internal("harness sockets: " + what + ": " + std::strerror(errno));
}

// Blocking, framed (8-byte length + bytes) messages between rank 0 and the
// others.
class Star {
 public:
  ~Star() {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  Status Connect(int rank, int size, const std::string& addr) {
    rank_ = rank;
    size_ = size;
    fds_.assign(size, -1);
    if (size == 1) return Status::OK();
    const size_t colon = addr.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::atoi(addr.substr(colon + 1).c_str())));
    if (colon == std::string::npos || inet_pton(AF_INET, addr.substr(0, colon).c_str(),
                                                &sa.sin_addr) != 1) {
      return Status::InvalidArgument("harness: TFHVD_HARNESS_ADDR=" + addr +
                                     " is not ipv4:port");
    }
    if (rank == 0) {
      int lfd = socket(AF_INET, SOCK_STREAM, 0);
      int one = 1;
      setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        close(lfd);
        return Errno("bind " + addr);
      }
      listen(lfd, size);
      for (int i = 1; i < size; ++i) {
        int fd = accept(lfd, nullptr, nullptr);
        if (fd < 0) {
          close(lfd);
          return Errno("accept");
        }
        Tune(fd);
        int32_t peer = -1;
        TFHVD_RETURN_IF_ERROR(RecvAll(fd, &peer, sizeof(peer)));
        if (peer <= 0 || peer >= size || fds_[peer] >= 0) {
          close(lfd);
          return Status::Internal("harness: bad rank " + std::to_string(peer) + " connected");
        }
        fds_[peer] = fd;
      }
      close(lfd);
      return Status::OK();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (true) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
        Tune(fd);
        fds_[0] = fd;
        int32_t me = rank;
        return SendAll(fd, &me, sizeof(me));
      }
      close(fd);
      if (std::chrono::steady_clock::now() > deadline) return Errno("connect to " + addr);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // A star over some of `world`'s ranks (a process set): `set_rank` of
  // `set_size`, -1 for a rank outside it.  Every world rank calls this at
  // the same point: the set's first rank listens on an ephemeral port of
  // `host` and `world` carries the port to everyone.
  Status ConnectSubset(Star* world, int hub_world_rank, int set_rank, int set_size,
                       const std::string& host) {
    int lfd = -1;
    int32_t port = 0;
    if (set_rank == 0 && set_size > 1) {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
      lfd = socket(AF_INET, SOCK_STREAM, 0);
      socklen_t len = sizeof(sa);
      if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(lfd, set_size) != 0 ||
          getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
        close(lfd);
        lfd = -1;  // the others then get port 0 and fail alike
      } else {
        port = ntohs(sa.sin_port);
      }
    }
    std::vector<std::string> all;
    std::string mine(reinterpret_cast<const char*>(&port), sizeof(port)), hub;
    TFHVD_RETURN_IF_ERROR(world->Gather(mine, &all));
    if (world->rank() == 0) hub = all[hub_world_rank];
    TFHVD_RETURN_IF_ERROR(world->Bcast(&hub));
    std::memcpy(&port, hub.data(), sizeof(port));
    if (set_rank < 0 || set_size == 1) {
      rank_ = std::max(set_rank, 0);
      size_ = 1;
      return Status::OK();
    }
    if (port == 0) return Status::Internal("harness: the process set's first rank cannot listen");
    rank_ = set_rank;
    size_ = set_size;
    fds_.assign(set_size, -1);
    if (set_rank == 0) {
      for (int i = 1; i < set_size; ++i) {
        int fd = accept(lfd, nullptr, nullptr);
        int32_t peer = -1;
        if (fd < 0 || !RecvAll(fd, &peer, sizeof(peer)).ok() || peer <= 0 || peer >= set_size ||
            fds_[peer] >= 0) {
          if (fd >= 0) close(fd);
          close(lfd);
          return Status::Internal("harness: a process set's rank did not connect");
        }
        Tune(fd);
        fds_[peer] = fd;
      }
      close(lfd);
      return Status::OK();
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      close(fd);
      return Errno("connect to a process set's first rank");
    }
    Tune(fd);
    fds_[0] = fd;
    int32_t me = set_rank;
    return SendAll(fd, &me, sizeof(me));
  }

  // Rank 0 gets every rank's bytes (in rank order); the others get nothing.
  Status Gather(const std::string& mine, std::vector<std::string>* all) {
    if (rank_ != 0) return Send(fds_[0], mine);
    all->assign(size_, std::string());
    (*all)[0] = mine;
    for (int r = 1; r < size_; ++r) TFHVD_RETURN_IF_ERROR(Recv(fds_[r], &(*all)[r]));
    return Status::OK();
  }
  // Rank 0's bytes to every rank.
  Status Bcast(std::string* v) {
    if (rank_ != 0) return Recv(fds_[0], v);
    for (int r = 1; r < size_; ++r) TFHVD_RETURN_IF_ERROR(Send(fds_[r], *v));
    return Status::OK();
  }
  // Rank 0 sends parts[r] to rank r; every rank gets its own in *mine.
  Status Scatter(const std::vector<std::string>& parts, std::string* mine) {
    if (rank_ != 0) return Recv(fds_[0], mine);
    for (int r = 1; r < size_; ++r) TFHVD_RETURN_IF_ERROR(Send(fds_[r], parts[r]));
    *mine = parts[0];
    return Status::OK();
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  static void Tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{kSocketTimeoutS, 0};  // nothing waits forever
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  static Status SendAll(int fd, const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
      if (k <= 0) return Errno("send");
      c += k;
      n -= static_cast<size_t>(k);
    }
    return Status::OK();
  }
  static Status RecvAll(int fd, void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t k = recv(fd, c, n, 0);
      if (k == 0) return Status::Aborted("harness sockets: a peer closed its connection");
      if (k < 0) return Errno("recv");
      c += k;
      n -= static_cast<size_t>(k);
    }
    return Status::OK();
  }
  static Status Send(int fd, const std::string& v) {
    uint64_t n = v.size();
    TFHVD_RETURN_IF_ERROR(SendAll(fd, &n, sizeof(n)));
    return SendAll(fd, v.data(), v.size());
  }
  static Status Recv(int fd, std::string* v) {
    uint64_t n = 0;
    TFHVD_RETURN_IF_ERROR(RecvAll(fd, &n, sizeof(n)));
    v->resize(n);
    return n > 0 ? RecvAll(fd, &(*v)[0], n) : Status::OK();
  }

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> fds_;
};

template <typename T>
void ReduceInto(const T* in, T* acc, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kMin: acc[i] = std::min(acc[i], in[i]); break;
      case ReduceOp::kMax: acc[i] = std::max(acc[i], in[i]); break;
      case ReduceOp::kProduct: acc[i] = acc[i] * in[i]; break;
      default: acc[i] = acc[i] + in[i]; break;
    }
  }
}

void Reduce(const void* in, void* acc, int64_t n, DataType dt, ReduceOp op) {
  switch (dt) {
    case DataType::kUInt8: case DataType::kBool:
      ReduceInto(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(acc), n, op); break;
    case DataType::kInt8:
      ReduceInto(static_cast<const int8_t*>(in), static_cast<int8_t*>(acc), n, op); break;
    case DataType::kUInt16:
      ReduceInto(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(acc), n, op); break;
    case DataType::kInt16:
      ReduceInto(static_cast<const int16_t*>(in), static_cast<int16_t*>(acc), n, op); break;
    case DataType::kInt32:
      ReduceInto(static_cast<const int32_t*>(in), static_cast<int32_t*>(acc), n, op); break;
    case DataType::kInt64:
      ReduceInto(static_cast<const int64_t*>(in), static_cast<int64_t*>(acc), n, op); break;
    case DataType::kFloat32:
      ReduceInto(static_cast<const float*>(in), static_cast<float*>(acc), n, op); break;
    case DataType::kFloat64:
      ReduceInto(static_cast<const double*>(in), static_cast<double*>(acc), n, op); break;
    case DataType::kFloat16: case DataType::kBFloat16:
      Reduce16(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(acc), n,
               dt == DataType::kBFloat16, op);
      break;
  }
}

// Host collectives over the star: rank 0 gathers, computes, sends back.
class StarCollectives : public HostMemoryOps {
 public:
  explicit StarCollectives(Star* star) : star_(star) {}
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    const int64_t bytes = count * DataTypeSize(dtype);
    std::string mine(static_cast<const char*>(send ? send : recv), bytes), out;
    std::vector<std::string> all;
    TFHVD_RETURN_IF_ERROR(star_->Gather(mine, &all));
    if (star_->rank() == 0) {
      out = all[0];
      for (int r = 1; r < star_->size(); ++r) Reduce(all[r].data(), &out[0], count, dtype, op);
    }
    TFHVD_RETURN_IF_ERROR(star_->Bcast(&out));
    if (bytes > 0) std::memcpy(recv, out.data(), bytes);
    return Status::OK();
  }
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>&) override {
    std::vector<std::string> all;
    std::string out;
    TFHVD_RETURN_IF_ERROR(
        star_->Gather(std::string(static_cast<const char*>(send), send_bytes), &all));
    for (const std::string& s : all) out += s;
    TFHVD_RETURN_IF_ERROR(star_->Bcast(&out));
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
    return Status::OK();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    std::vector<std::string> all;
    std::string out;
    const bool mine = star_->rank() == root;
    TFHVD_RETURN_IF_ERROR(star_->Gather(
        mine ? std::string(static_cast<const char*>(buf), bytes) : std::string(), &all));
    if (star_->rank() == 0) out = all[root];
    TFHVD_RETURN_IF_ERROR(star_->Bcast(&out));
    if (!mine && bytes > 0) std::memcpy(buf, out.data(), std::min<int64_t>(bytes, out.size()));
    return Status::OK();
  }
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>&) override {
    const int n = star_->size();
    std::string mine(reinterpret_cast<const char*>(send_bytes.data()), n * sizeof(int64_t));
    int64_t total = 0;
    for (int64_t b : send_bytes) total += b;
    mine.append(static_cast<const char*>(send), total);
    std::vector<std::string> all, parts(n);
    TFHVD_RETURN_IF_ERROR(star_->Gather(mine, &all));
    if (star_->rank() == 0) {
      for (int s = 0; s < n; ++s) {
        const int64_t* sizes = reinterpret_cast<const int64_t*>(all[s].data());
        int64_t off = n * sizeof(int64_t);
        for (int d = 0; d < n; ++d) {
          parts[d].append(all[s], off, sizes[d]);
          off += sizes[d];
        }
      }
    }
    std::string out;
    TFHVD_RETURN_IF_ERROR(star_->Scatter(parts, &out));
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
    return Status::OK();
  }
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override {
    int64_t total = 0, before = 0;
    for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
      if (r < star_->rank()) before += counts[r];
      total += counts[r];
    }
    const int64_t es = DataTypeSize(dtype);
    std::vector<char> all(total * es);
    if (total > 0) std::memcpy(all.data(), send, total * es);
    TFHVD_RETURN_IF_ERROR(Allreduce(nullptr, all.data(), total, dtype, op));
    const int64_t mine = counts[star_->rank()] * es;
    if (mine > 0) std::memcpy(recv, all.data() + before * es, mine);
    return Status::OK();
  }
  Status Barrier() override {
    std::vector<std::string> all;
    std::string none;
    TFHVD_RETURN_IF_ERROR(star_->Gather(none, &all));
    return star_->Bcast(&none);
  }
  const char* name() const override { return "HARNESS_SOCKETS"; }

 private:
  Star* star_;
};

// A process set's host collectives: a star of its own, so that the set's
// worker thread never shares a socket with the global set's.
class SubsetCollectives : public StarCollectives {
 public:
  SubsetCollectives() : StarCollectives(&own_) {}
  Star own_;
};

// One rank: nobody to negotiate with.
class NoPeersControl : public ControlChannel {
 public:
  Status SendToCoordinator(std::string) override { return NoPeers(); }
  Status SendToWorker(int, std::string) override { return NoPeers(); }
  Status PollWorkers(std::vector<std::pair<int, std::string>>*) override { return Status::OK(); }
  Status PollCoordinator(std::vector<std::string>*) override { return Status::OK(); }
  Status FlushSends(double) override { return Status::OK(); }
  std::string Describe() const override { return "none (one rank)"; }

 private:
  static Status NoPeers() { return Status::Internal("harness: one rank has no peers"); }
};

class SocketBackend : public Backend {
 public:
  Status Init() {
    const int rank = EnvInt("TFHVD_HARNESS_RANK", 0);
    const int size = EnvInt("TFHVD_HARNESS_SIZE", 1);
    if (size < 1 || rank < 0 || rank >= size) {
      return Status::InvalidArgument("harness: TFHVD_HARNESS_RANK/SIZE out of range");
    }
    const char* addr = std::getenv("TFHVD_HARNESS_ADDR");
    const std::string where = addr ? addr : "127.0.0.1:29517";
    host_ip_ = where.substr(0, where.rfind(':'));
    TFHVD_RETURN_IF_ERROR(star_.Connect(rank, size, where));
    topo_.rank = topo_.cross_rank = rank;
    topo_.size = topo_.cross_size = size;
    topo_.local_rank = 0;
    topo_.local_size = 1;
    self_.Connect(0, 1, "");
    if (size == 1) {
      control_ = std::make_unique<NoPeersControl>();
      return Status::OK();
    }
    TcpBootstrap b;
    b.broadcast = [this](std::string* v) { return star_.Bcast(v); };
    b.all_min = [this](int value, int* min) {
      std::vector<std::string> all;
      std::string out(reinterpret_cast<const char*>(&value), sizeof(value));
      TFHVD_RETURN_IF_ERROR(star_.Gather(out, &all));
      if (star_.rank() == 0) {
        int m = value;
        for (const std::string& s : all) m = std::min(m, *reinterpret_cast<const int*>(s.data()));
        out.assign(reinterpret_cast<const char*>(&m), sizeof(m));
      }
      TFHVD_RETURN_IF_ERROR(star_.Bcast(&out));
      *min = *reinterpret_cast<const int*>(out.data());
      return Status::OK();
    };
    return CreateTcpControl(rank, size, b, TcpOptions(), &control_);
  }
  const Topology& topology() const override { return topo_; }
  ControlChannel* control() override { return control_.get(); }
  Collectives* collectives(int device) override { return device < 0 ? &host_ : nullptr; }
  bool threads_supported() const override { return true; }
  Collectives* local_collectives() override { return &local_; }
  Collectives* cross_collectives() override { return &host_; }
  Status CreateSubsetCollectives(int set_id, const std::vector<int>& world_ranks,
                                 std::unique_ptr<Collectives>* out) override {
    (void)set_id;
    const auto me = std::find(world_ranks.begin(), world_ranks.end(), topo_.rank);
    const int set_rank = me == world_ranks.end() ? -1 : static_cast<int>(me - world_ranks.begin());
    auto sub = std::make_unique<SubsetCollectives>();
    TFHVD_RETURN_IF_ERROR(sub->own_.ConnectSubset(&star_, world_ranks.at(0), set_rank,
                                                  static_cast<int>(world_ranks.size()), host_ip_));
    if (set_rank < 0) {
      out->reset();
    } else {
      *out = std::move(sub);
    }
    return Status::OK();
  }

 private:
  Topology topo_;
  std::string host_ip_;
  Star star_;
  Star self_;  // a world of one: this rank's "node"
  std::unique_ptr<ControlChannel> control_;
  StarCollectives host_{&star_};
  StarCollectives local_{&self_};
};

}  // namespace

Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded) {
  *excluded = false;
  auto host = std::make_unique<SocketBackend>();
  TFHVD_RETURN_IF_ERROR(host->Init());
  return CreateNcclBackend(opts, std::move(host), out);
}

void FinalizeTransports() {}

void AbortTransports(int code) {
  // The peers see the closed sockets (and NCCL its lost peer) and end too.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.nccl = true;
  info.cuda = true;
  info.device_code = NcclDeviceCodeInfo();
  return info;
}

}  // namespace tfhvd
