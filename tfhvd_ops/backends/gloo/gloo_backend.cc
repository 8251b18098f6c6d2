#include "gloo_backend.h"

#include <gloo/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/device.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

#include "../tcp/tcp_control.h"
#include "gloo_collectives.h"
#include "http_store.h"

namespace tfhvd {
namespace {

constexpr int kHostBytes = 256;  // allgathered host name, zero-padded

std::string ThisHost(const LaunchEnv& env) {
  if (!env.hostname.empty()) return env.hostname;
  char buf[kHostBytes] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// The control channel of a job of one process: nobody to talk to, but a
// Wait() that sleeps on the tensor queue's eventfd, so an idle runtime
// sleeps instead of polling.
class LocalControl : public ControlChannel {
 public:
  Status SendToCoordinator(std::string) override { return Lone(); }
  Status SendToWorker(int, std::string) override { return Lone(); }
  Status PollWorkers(std::vector<std::pair<int, std::string>>*) override { return Status::OK(); }
  Status PollCoordinator(std::vector<std::string>*) override { return Status::OK(); }
  Status FlushSends(double) override { return Status::OK(); }
  bool Wait(int wake_fd, std::chrono::microseconds timeout) override {
    struct pollfd p = {wake_fd, POLLIN, 0};
    const int64_t ms = std::min<int64_t>((timeout.count() + 999) / 1000, 1 << 30);
    poll(&p, 1, static_cast<int>(ms));
    return true;
  }
  std::string Describe() const override { return "none (a job of one process)"; }

 private:
  static Status Lone() {
    return Status::Internal("tfhvd: a job of one process has no peer to send to");
  }
};

class GlooBackend : public Backend {
 public:
  ~GlooBackend() override {
    // Collectives and channel before the contexts' device goes.
    control_.reset();
    local_cpu_.reset();
    cross_cpu_.reset();
    cpu_.reset();
    peers_.device.reset();
  }

  Status Init(const BackendOptions& opts, bool* excluded) {
    const LaunchEnv& env = opts.launch;
    if (opts.comm_handle != nullptr) {
      return Status::InvalidArgument(
          "tfhvd: init(comm=<mpi4py communicator>) needs the MPI backend; under Gloo pass a "
          "list of ranks");
    }
    if (opts.control == ControlKind::kMpi) {
      return Status::InvalidArgument(
          "tfhvd: TFHVD_CONTROL=mpi needs the MPI backend; the Gloo backend negotiates over "
          "TCP (unset TFHVD_CONTROL, or run under mpirun)");
    }
    int rank = 0, size = 1;
    if (env.complete()) {
      rank = env.rank;
      size = env.size;
    }
    peers_.timeout = std::chrono::milliseconds(static_cast<int64_t>(env.timeout_s * 1000));
    const std::string scope =
        !env.scope.empty() ? env.scope : "init" + std::to_string(opts.generation);
    if (size > 1) {
      auto http = std::make_unique<HttpStore>(env.rendezvous_addr, env.rendezvous_port, scope,
                                              peers_.timeout, env.secret);
      http_ = http.get();
      store_ = std::move(http);
    } else {
      store_ = std::make_unique<gloo::rendezvous::HashStore>();
    }
    peers_.store = store_.get();
    const std::string host = ThisHost(env);
    if (size > 1) TFHVD_RETURN_IF_ERROR(CheckEnv(rank, size, host, scope));

    // init(comm=[ranks]): only those ranks connect.
    std::string prefix = "global";
    if (!opts.ranks.empty()) {
      for (int r : opts.ranks) {
        if (r < 0 || r >= size) {
          return Status::InvalidArgument("tfhvd: init(comm=...) rank " + std::to_string(r) +
                                         " is out of range for a Gloo job of " +
                                         std::to_string(size) + " processes");
        }
      }
      auto it = std::find(opts.ranks.begin(), opts.ranks.end(), rank);
      if (it == opts.ranks.end()) {
        *excluded = true;
        return Status::OK();
      }
      rank = static_cast<int>(it - opts.ranks.begin());
      size = static_cast<int>(opts.ranks.size());
      prefix = "subset";
      for (int r : opts.ranks) prefix += "_" + std::to_string(r);
    }
    topo_.rank = rank;
    topo_.size = size;
    TFHVD_RETURN_IF_ERROR(CreateGlooDevice(env.iface, env.hostname, &peers_.device));
    std::shared_ptr<gloo::Context> world;
    TFHVD_RETURN_IF_ERROR(ConnectGlooContext(peers_, prefix, rank, size, &world));
    cpu_ = std::make_unique<GlooCollectives>(world);
    TFHVD_RETURN_IF_ERROR(ReadTopology(host, opts.ranks.empty() ? env : LaunchEnv()));
    if (size > 1) {
      TcpOptions tcp;
      tcp.ifname = opts.socket_ifname.empty() && env.iface != "lo" ? env.iface
                                                                    : opts.socket_ifname;
      tcp.shared_memory = opts.control_shm;
      tcp.connect_timeout_s = env.timeout_s;
      tcp.secret = env.secret;
      tcp.loopback_only = env.iface == "lo" || topo_.local_size == topo_.size;
      TFHVD_RETURN_IF_ERROR(CreateTcpControl(rank, size, Bootstrap(), tcp, &control_));
    } else {
      control_ = std::make_unique<LocalControl>();
    }
    return Status::OK();
  }

  const Topology& topology() const override { return topo_; }
  ControlChannel* control() override { return control_.get(); }
  Collectives* collectives(int device) override { return device < 0 ? cpu_.get() : nullptr; }
  // Gloo contexts may be used from any thread, one call at a time each.
  bool threads_supported() const override { return true; }
  Collectives* local_collectives() override {
    if (!local_cpu_) local_cpu_ = Subset("local/" + hosts_[topo_.rank], local_ranks_);
    return local_cpu_.get();
  }
  Collectives* cross_collectives() override {
    if (!cross_cpu_) {
      cross_cpu_ = Subset("cross/" + std::to_string(topo_.local_rank), cross_ranks_);
    }
    return cross_cpu_.get();
  }

  Status CreateSubsetCollectives(int set_id, const std::vector<int>& world_ranks,
                                 std::unique_ptr<Collectives>* out) override {
    out->reset();
    // Every rank calls this the same number of times, so the counter makes
    // a fresh prefix even when a set id is reused.
    const std::string prefix =
        "set" + std::to_string(set_id) + "/" + std::to_string(subset_calls_++);
    for (size_t i = 0; i < world_ranks.size(); ++i) {
      const int r = world_ranks[i];
      if (r < 0 || r >= topo_.size || (i > 0 && world_ranks[i - 1] >= r)) {
        return Status::InvalidArgument("tfhvd: process set " + std::to_string(set_id) +
                                       ": ranks must be distinct, sorted and below " +
                                       std::to_string(topo_.size));
      }
    }
    auto it = std::find(world_ranks.begin(), world_ranks.end(), topo_.rank);
    if (it == world_ranks.end()) return Status::OK();
    std::shared_ptr<gloo::Context> ctx;
    TFHVD_RETURN_IF_ERROR(ConnectGlooContext(peers_, prefix,
                                             static_cast<int>(it - world_ranks.begin()),
                                             static_cast<int>(world_ranks.size()), &ctx));
    *out = std::make_unique<GlooCollectives>(ctx);
    return Status::OK();
  }

 private:
  // Step 2: a second process with this rank, or ranks whose HOROVOD_SIZE
  // differs, fail here with both named instead of hanging in the mesh.
  Status CheckEnv(int rank, int size, const std::string& host, const std::string& scope) {
    const std::string mine = "size=" + std::to_string(size) + " host=" + host +
                             " pid=" + std::to_string(getpid());
    std::string error;
    try {
      const std::string key = "env/" + std::to_string(rank);
      std::vector<char> v(mine.begin(), mine.end());
      if (!http_->SetExclusive(key, v)) {
        auto theirs = store_->get(key);
        throw std::runtime_error("two processes were started as rank " + std::to_string(rank) +
                                 " (" + std::string(theirs.begin(), theirs.end()) + ", and " +
                                 mine + "); every rank needs its own HOROVOD_RANK");
      }
      if (rank != 0) {
        auto theirs = store_->get("env/0");
        std::string s(theirs.begin(), theirs.end());
        if (s.compare(0, s.find(' '), mine, 0, mine.find(' ')) != 0) {
          error = "ranks disagree on the job: rank 0 has " + s + ", rank " +
                  std::to_string(rank) + " has " + mine +
                  " (every rank must get the same HOROVOD_SIZE)";
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) {
      return Status::InvalidArgument("tfhvd: rank " + std::to_string(rank) + " in scope " +
                                     scope + ": " + error);
    }
    return Status::OK();
  }

  // Step 4.
  Status ReadTopology(const std::string& host, const LaunchEnv& env) {
    const int size = topo_.size;
    std::vector<char> mine(kHostBytes, 0), all(static_cast<size_t>(kHostBytes) * size);
    std::memcpy(mine.data(), host.data(), std::min<size_t>(host.size(), kHostBytes - 1));
    TFHVD_RETURN_IF_ERROR(
        cpu_->Allgatherv(mine.data(), kHostBytes, all.data(),
                         std::vector<int64_t>(size, kHostBytes)));
    std::map<std::string, int> node_of;  // host -> node index, by first rank
    std::vector<int> per_node;
    for (int r = 0; r < size; ++r) {
      hosts_.emplace_back(all.data() + static_cast<size_t>(r) * kHostBytes);
      if (!node_of.count(hosts_[r])) {
        node_of[hosts_[r]] = static_cast<int>(per_node.size());
        per_node.push_back(0);
      }
      const int node = node_of[hosts_[r]];
      if (r == topo_.rank) topo_.local_rank = per_node[node];
      ++per_node[node];
    }
    const int my_node = node_of[host];
    topo_.local_size = per_node[my_node];
    topo_.homogeneous = true;
    for (int n : per_node) topo_.homogeneous &= n == per_node[0];
    for (int r = 0; r < size; ++r) {
      if (hosts_[r] == host) local_ranks_.push_back(r);
    }
    // Cross: the ranks with my local rank, in rank order.
    std::vector<int> seen(per_node.size(), 0);
    for (int r = 0; r < size; ++r) {
      const int lr = seen[node_of[hosts_[r]]]++;
      if (lr == topo_.local_rank) {
        if (r == topo_.rank) topo_.cross_rank = static_cast<int>(cross_ranks_.size());
        cross_ranks_.push_back(r);
      }
    }
    topo_.cross_size = static_cast<int>(cross_ranks_.size());
    auto check = [&](const char* name, int given, int actual) -> Status {
      if (given < 0 || given == actual) return Status::OK();
      return Status::InvalidArgument(
          std::string("tfhvd: rank ") + std::to_string(topo_.rank) + " was started with " +
          name + "=" + std::to_string(given) + " but the job's hosts make it " +
          std::to_string(actual) + " (the ranks' environments disagree)");
    };
    TFHVD_RETURN_IF_ERROR(check("HOROVOD_LOCAL_RANK", env.local_rank, topo_.local_rank));
    TFHVD_RETURN_IF_ERROR(check("HOROVOD_LOCAL_SIZE", env.local_size, topo_.local_size));
    TFHVD_RETURN_IF_ERROR(check("HOROVOD_CROSS_RANK", env.cross_rank, topo_.cross_rank));
    TFHVD_RETURN_IF_ERROR(check("HOROVOD_CROSS_SIZE", env.cross_size, topo_.cross_size));
    return Status::OK();
  }

  // Step 5: what the TCP channel needs while it connects.
  TcpBootstrap Bootstrap() {
    TcpBootstrap b;
    GlooCollectives* c = cpu_.get();
    b.broadcast = [c](std::string* v) {
      int64_t n = static_cast<int64_t>(v->size());
      TFHVD_RETURN_IF_ERROR(c->Broadcast(&n, sizeof(n), 0));
      v->resize(static_cast<size_t>(n));
      return n > 0 ? c->Broadcast(&(*v)[0], n, 0) : Status::OK();
    };
    b.all_min = [c](int value, int* min) {
      *min = value;
      return c->Allreduce(nullptr, min, 1, DataType::kInt32, ReduceOp::kMin);
    };
    return b;
  }

  std::unique_ptr<GlooCollectives> Subset(const std::string& prefix,
                                          const std::vector<int>& ranks) {
    auto it = std::find(ranks.begin(), ranks.end(), topo_.rank);
    std::shared_ptr<gloo::Context> ctx;
    Status st = ConnectGlooContext(peers_, prefix, static_cast<int>(it - ranks.begin()),
                                   static_cast<int>(ranks.size()), &ctx);
    if (!st.ok()) {
      std::fprintf(stderr, "[tfhvd ERROR rank %d] %s\n", topo_.rank, st.message().c_str());
      return nullptr;
    }
    return std::make_unique<GlooCollectives>(ctx);
  }

  Topology topo_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  HttpStore* http_ = nullptr;  // store_, when the job has peers
  GlooPeers peers_;
  std::vector<std::string> hosts_;  // by rank
  std::vector<int> local_ranks_;    // ranks on this host
  std::vector<int> cross_ranks_;    // ranks with this local rank
  int subset_calls_ = 0;
  std::unique_ptr<GlooCollectives> cpu_;
  std::unique_ptr<GlooCollectives> local_cpu_;
  std::unique_ptr<GlooCollectives> cross_cpu_;
  std::unique_ptr<ControlChannel> control_;
};

}  // namespace

Status CreateGlooBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out,
                         bool* excluded) {
  *excluded = false;
  auto backend = std::make_unique<GlooBackend>();
  TFHVD_RETURN_IF_ERROR(backend->Init(opts, excluded));
  if (!*excluded) *out = std::move(backend);
  return Status::OK();
}

}  // namespace tfhvd
