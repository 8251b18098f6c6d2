#include "mpi_backend.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <list>
#include <string>
#include <type_traits>
#include <vector>

#include "../../core/cpu_math.h"
#include "../tcp/tcp_control.h"

namespace tfhvd {
namespace {

constexpr int kRequestTag = 7101;
constexpr int kResponseTag = 7102;
constexpr int kExchangeTag = 7103;  // Collectives::SendRecv, on the data communicator
constexpr int64_t kExchangeChunk = int64_t{1} << 30;  // bytes per MPI_Sendrecv

// Whether this process's MPI_Init was ours.  A process-wide fact about the
// MPI library, which has exactly one init per process.
bool& OwnsMpi() {
  static bool owns = false;
  return owns;
}

Status MpiError(int code, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return Status::Internal(std::string(what) + " failed: " + std::string(msg, len));
}

#define MPI_CHECK(call)                                     \
  do {                                                      \
    int _rc = (call);                                       \
    if (_rc != MPI_SUCCESS) return MpiError(_rc, #call);    \
  } while (0)

Status CheckCount(int64_t n, const char* what) {
  if (n > INT_MAX) {
    return Status::InvalidArgument(std::string("tfhvd: ") + what +
                                   " is larger than 2^31-1 elements, which MPI cannot move in "
                                   "one call; split the tensor");
  }
  return Status::OK();
}

// MPI has no 16-bit float types: tfhvd registers reductions of its own.
template <bool kBFloat, ReduceOp kOp>
void Reduce16Fn(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce16(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, kBFloat, kOp);
}

// 8- and 16-bit integers are reduced by tfhvd too, with TensorFlow's wrapping
// arithmetic.  Open MPI 4.1's AVX reduction component (Debian 12's 4.1.4; `mca
// op avx`) saturates them instead: two ranks' uint8 229 sum to 255, not 202,
// for every element of a 64-byte block.  A user-defined op never reaches that
// component, whoever called MPI_Init (mpi4py may have, before tfhvd) and
// whatever OMPI_MCA_op says.
template <typename T, ReduceOp kOp>
void SmallIntFn(void* in, void* inout, int* len, MPI_Datatype*) {
  using U = std::make_unsigned_t<T>;
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    // Sums and products in unsigned arithmetic wrap modulo 2^bits, as TensorFlow's do.
    U x = static_cast<U>(a[i]), y = static_cast<U>(b[i]);
    switch (kOp) {
      case ReduceOp::kSum: b[i] = static_cast<T>(static_cast<U>(x + y)); break;
      case ReduceOp::kProduct:
        b[i] = static_cast<T>(static_cast<U>(static_cast<unsigned>(x) * static_cast<unsigned>(y)));
        break;
      case ReduceOp::kMin: b[i] = a[i] < b[i] ? a[i] : b[i]; break;
      default: b[i] = a[i] > b[i] ? a[i] : b[i]; break;  // kMax
    }
  }
}

// ops[type][op]: type in (int8, uint8, int16, uint16), op in (Sum, Min, Max, Product).
struct SmallIntOps {
  template <typename T>
  void Create(MPI_Op* row) {
    MPI_Op_create(&SmallIntFn<T, ReduceOp::kSum>, 1, &row[0]);
    MPI_Op_create(&SmallIntFn<T, ReduceOp::kMin>, 1, &row[1]);
    MPI_Op_create(&SmallIntFn<T, ReduceOp::kMax>, 1, &row[2]);
    MPI_Op_create(&SmallIntFn<T, ReduceOp::kProduct>, 1, &row[3]);
  }
  SmallIntOps() {
    Create<int8_t>(ops[0]);
    Create<uint8_t>(ops[1]);
    Create<int16_t>(ops[2]);
    Create<uint16_t>(ops[3]);
  }
  void Free() {
    for (auto& row : ops) {
      for (auto& op : row) MPI_Op_free(&op);
    }
  }
  MPI_Op ops[4][4];
};

class MpiControl : public ControlChannel {
 public:
  explicit MpiControl(MPI_Comm comm) : comm_(comm) {}
  std::string Describe() const override { return "MPI messages"; }

  Status SendToCoordinator(std::string bytes) override { return Send(0, kRequestTag, std::move(bytes)); }
  Status SendToWorker(int rank, std::string bytes) override {
    return Send(rank, kResponseTag, std::move(bytes));
  }
  Status PollWorkers(std::vector<std::pair<int, std::string>>* out) override {
    return Poll(MPI_ANY_SOURCE, kRequestTag, out);
  }
  Status PollCoordinator(std::vector<std::string>* out) override {
    std::vector<std::pair<int, std::string>> msgs;
    TFHVD_RETURN_IF_ERROR(Poll(0, kResponseTag, &msgs));
    for (auto& m : msgs) out->push_back(std::move(m.second));
    return Status::OK();
  }
  Status FlushSends(double) override {  // MPI: sends complete as the peer receives
    for (auto& s : sends_) MPI_CHECK(MPI_Wait(&s.req, MPI_STATUS_IGNORE));
    sends_.clear();
    return Status::OK();
  }

 private:
  struct PendingSend {
    MPI_Request req;
    std::string bytes;
  };

  Status Send(int dest, int tag, std::string bytes) {
    Reap();
    sends_.emplace_back();
    PendingSend& s = sends_.back();
    s.bytes = std::move(bytes);
    MPI_CHECK(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, dest, tag,
                        comm_, &s.req));
    return Status::OK();
  }

  void Reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      MPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
      it = done ? sends_.erase(it) : std::next(it);
    }
  }

  Status Poll(int source, int tag, std::vector<std::pair<int, std::string>>* out) {
    Reap();
    while (true) {
      int flag = 0;
      MPI_Status st;
      MPI_CHECK(MPI_Iprobe(source, tag, comm_, &flag, &st));
      if (!flag) return Status::OK();
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::string buf(count, '\0');
      MPI_CHECK(MPI_Recv(&buf[0], count, MPI_BYTE, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE));
      out->emplace_back(st.MPI_SOURCE, std::move(buf));
    }
  }

  MPI_Comm comm_;
  std::list<PendingSend> sends_;
};

class MpiCollectives : public HostMemoryOps {
 public:
  // `owned`: the communicator is freed with the collectives (a process set's).
  explicit MpiCollectives(MPI_Comm comm, bool owned = false) : comm_(comm), owned_(owned) {
    MPI_Type_contiguous(2, MPI_BYTE, &half_);
    MPI_Type_commit(&half_);
    MPI_Type_contiguous(2, MPI_BYTE, &bhalf_);
    MPI_Type_commit(&bhalf_);
    MPI_Op_create(&Reduce16Fn<false, ReduceOp::kSum>, 1, &ops16_[0][0]);
    MPI_Op_create(&Reduce16Fn<false, ReduceOp::kMin>, 1, &ops16_[0][1]);
    MPI_Op_create(&Reduce16Fn<false, ReduceOp::kMax>, 1, &ops16_[0][2]);
    MPI_Op_create(&Reduce16Fn<false, ReduceOp::kProduct>, 1, &ops16_[0][3]);
    MPI_Op_create(&Reduce16Fn<true, ReduceOp::kSum>, 1, &ops16_[1][0]);
    MPI_Op_create(&Reduce16Fn<true, ReduceOp::kMin>, 1, &ops16_[1][1]);
    MPI_Op_create(&Reduce16Fn<true, ReduceOp::kMax>, 1, &ops16_[1][2]);
    MPI_Op_create(&Reduce16Fn<true, ReduceOp::kProduct>, 1, &ops16_[1][3]);
  }
  ~MpiCollectives() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& row : ops16_) {
      for (auto& op : row) MPI_Op_free(&op);
    }
    small_.Free();
    MPI_Type_free(&half_);
    MPI_Type_free(&bhalf_);
    if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    TFHVD_RETURN_IF_ERROR(CheckCount(count, "an allreduce"));
    if (count == 0) return Status::OK();
    MPI_Datatype t;
    MPI_Op o;
    TFHVD_RETURN_IF_ERROR(Resolve(dtype, op, &t, &o));
    MPI_CHECK(MPI_Allreduce(send ? send : MPI_IN_PLACE, recv, static_cast<int>(count), t, o, comm_));
    return Status::OK();
  }

  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override {
    std::vector<int> counts, displs;
    TFHVD_RETURN_IF_ERROR(Layout(recv_bytes, &counts, &displs));
    MPI_CHECK(MPI_Allgatherv(send, static_cast<int>(send_bytes), MPI_BYTE, recv, counts.data(),
                             displs.data(), MPI_BYTE, comm_));
    return Status::OK();
  }

  Status Broadcast(void* buf, int64_t bytes, int root) override {
    TFHVD_RETURN_IF_ERROR(CheckCount(bytes, "a broadcast"));
    if (bytes == 0) return Status::OK();
    MPI_CHECK(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_));
    return Status::OK();
  }

  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override {
    std::vector<int> sc, sd, rc, rd;
    TFHVD_RETURN_IF_ERROR(Layout(send_bytes, &sc, &sd));
    TFHVD_RETURN_IF_ERROR(Layout(recv_bytes, &rc, &rd));
    MPI_CHECK(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                            MPI_BYTE, comm_));
    return Status::OK();
  }

  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override {
    std::vector<int> counts, displs;
    TFHVD_RETURN_IF_ERROR(Layout(recv_counts, &counts, &displs));
    MPI_Datatype t;
    MPI_Op o;
    TFHVD_RETURN_IF_ERROR(Resolve(dtype, op, &t, &o));
    MPI_CHECK(MPI_Reduce_scatter(send, recv, counts.data(), t, o, comm_));
    return Status::OK();
  }

  Status Barrier() override {
    MPI_CHECK(MPI_Barrier(comm_));
    return Status::OK();
  }

  // In chunks of at most 1 GiB each way (MPI counts are ints); both sides
  // make the same number of calls, the shorter side sending or receiving
  // nothing once it is done.
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override {
    const char* out = static_cast<const char*>(send);
    char* in = static_cast<char*>(recv);
    for (int64_t off = 0; off == 0 || off < std::max(send_bytes, recv_bytes);
         off += kExchangeChunk) {
      const int64_t s = std::max<int64_t>(0, std::min(kExchangeChunk, send_bytes - off));
      const int64_t r = std::max<int64_t>(0, std::min(kExchangeChunk, recv_bytes - off));
      MPI_CHECK(MPI_Sendrecv(s ? out + off : nullptr, static_cast<int>(s), MPI_BYTE, peer,
                             kExchangeTag, r ? in + off : nullptr, static_cast<int>(r), MPI_BYTE,
                             peer, kExchangeTag, comm_, MPI_STATUS_IGNORE));
    }
    return Status::OK();
  }

  const char* name() const override { return "MPI"; }

 private:
  Status Layout(const std::vector<int64_t>& sizes, std::vector<int>* counts,
                std::vector<int>* displs) {
    int64_t off = 0;
    for (int64_t s : sizes) {
      TFHVD_RETURN_IF_ERROR(CheckCount(off + s, "a gathered or scattered tensor"));
      counts->push_back(static_cast<int>(s));
      displs->push_back(static_cast<int>(off));
      off += s;
    }
    return Status::OK();
  }

  Status Resolve(DataType dtype, ReduceOp op, MPI_Datatype* t, MPI_Op* o) {
    int idx;
    switch (op) {
      case ReduceOp::kSum: idx = 0; *o = MPI_SUM; break;
      case ReduceOp::kMin: idx = 1; *o = MPI_MIN; break;
      case ReduceOp::kMax: idx = 2; *o = MPI_MAX; break;
      case ReduceOp::kProduct: idx = 3; *o = MPI_PROD; break;
      default:
        return Status::InvalidArgument(std::string("tfhvd: reduce op ") + ReduceOpName(op) +
                                       " is not supported by the MPI backend");
    }
    switch (dtype) {
      case DataType::kInt8: *t = MPI_INT8_T; *o = small_.ops[0][idx]; break;
      case DataType::kUInt8: *t = MPI_UINT8_T; *o = small_.ops[1][idx]; break;
      case DataType::kInt16: *t = MPI_INT16_T; *o = small_.ops[2][idx]; break;
      case DataType::kUInt16: *t = MPI_UINT16_T; *o = small_.ops[3][idx]; break;
      case DataType::kInt32: *t = MPI_INT32_T; break;
      case DataType::kInt64: *t = MPI_INT64_T; break;
      case DataType::kFloat32: *t = MPI_FLOAT; break;
      case DataType::kFloat64: *t = MPI_DOUBLE; break;
      case DataType::kFloat16: *t = half_; *o = ops16_[0][idx]; break;
      case DataType::kBFloat16: *t = bhalf_; *o = ops16_[1][idx]; break;
      case DataType::kBool:
        return Status::InvalidArgument("tfhvd: bool tensors cannot be reduced; cast them first");
    }
    return Status::OK();
  }

  MPI_Comm comm_;
  bool owned_;
  MPI_Datatype half_, bhalf_;
  MPI_Op ops16_[2][4];
  SmallIntOps small_;  // 8- and 16-bit integers (see SmallIntFn)
};

class MpiBackend : public Backend {
 public:
  ~MpiBackend() override {
    cpu_.reset();
    local_cpu_.reset();
    cross_cpu_.reset();
    control_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm* c : {&data_, &ctrl_, &local_, &cross_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }

  Status Init(const BackendOptions& opts, bool* excluded) {
    *excluded = false;
    MPI_Comm base = MPI_COMM_WORLD;
    MPI_Comm created = MPI_COMM_NULL;
    if (opts.comm_handle != nullptr) {
      base = (MPI_Comm)(intptr_t)opts.comm_handle;  // a pointer in Open MPI, an int in MPICH
    } else if (!opts.ranks.empty()) {
      int world = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &world);
      for (int r : opts.ranks) {
        if (r < 0 || r >= world) {
          return Status::InvalidArgument("tfhvd: init(comm=...) rank " + std::to_string(r) +
                                         " is out of range for an MPI world of " +
                                         std::to_string(world) + " processes");
        }
      }
      MPI_Group wg, g;
      MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
      MPI_CHECK(MPI_Group_incl(wg, static_cast<int>(opts.ranks.size()), opts.ranks.data(), &g));
      MPI_CHECK(MPI_Comm_create(MPI_COMM_WORLD, g, &created));
      MPI_Group_free(&g);
      MPI_Group_free(&wg);
      if (created == MPI_COMM_NULL) {
        *excluded = true;
        return Status::OK();
      }
      base = created;
    }
    MPI_CHECK(MPI_Comm_dup(base, &data_));
    MPI_CHECK(MPI_Comm_dup(base, &ctrl_));
    if (created != MPI_COMM_NULL) MPI_Comm_free(&created);
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
    TFHVD_RETURN_IF_ERROR(ReadTopology());
    int provided = 0;
    MPI_Query_thread(&provided);
    threads_ = provided == MPI_THREAD_MULTIPLE;
    if (opts.control != ControlKind::kMpi && topo_.size > 1) {
      TcpOptions tcp;
      tcp.ifname = opts.socket_ifname;
      tcp.shared_memory = opts.control_shm;
      tcp.loopback_only = topo_.local_size == topo_.size;
      std::unique_ptr<ControlChannel> sockets;
      Status st = CreateTcpControl(topo_.rank, topo_.size, Bootstrap(), tcp, &sockets);
      if (st.ok()) control_ = std::move(sockets);
      if (!st.ok() && topo_.rank == 0) {
        std::fprintf(stderr,
                     "[tfhvd WARNING rank 0] %s; negotiating over MPI instead (set "
                     "TFHVD_SOCKET_IFNAME to pick an interface, or TFHVD_CONTROL=mpi)\n",
                     st.message().c_str());
      }
    }
    if (!control_) control_ = std::make_unique<MpiControl>(ctrl_);
    cpu_ = std::make_unique<MpiCollectives>(data_);
    return Status::OK();
  }

  const Topology& topology() const override { return topo_; }

  // Collectives the TCP control channel needs while it connects.
  TcpBootstrap Bootstrap() {
    TcpBootstrap b;
    MPI_Comm comm = ctrl_;
    b.broadcast = [comm](std::string* v) {
      int n = static_cast<int>(v->size());
      MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, comm));
      v->resize(n);
      if (n > 0) MPI_CHECK(MPI_Bcast(&(*v)[0], n, MPI_CHAR, 0, comm));
      return Status::OK();
    };
    b.all_min = [comm](int value, int* min) {
      MPI_CHECK(MPI_Allreduce(&value, min, 1, MPI_INT, MPI_MIN, comm));
      return Status::OK();
    };
    return b;
  }
  ControlChannel* control() override { return control_.get(); }
  Collectives* collectives(int device) override { return device < 0 ? cpu_.get() : nullptr; }
  bool threads_supported() const override { return threads_; }
  Collectives* local_collectives() override {
    if (!local_cpu_) local_cpu_ = std::make_unique<MpiCollectives>(local_);
    return local_cpu_.get();
  }
  Collectives* cross_collectives() override {
    if (!cross_cpu_) cross_cpu_ = std::make_unique<MpiCollectives>(cross_);
    return cross_cpu_.get();
  }

  // A sub-communicator of the data communicator.  MPI_Comm_create is
  // collective over data_, whose only user is the runtime's loop, the caller.
  Status CreateSubsetCollectives(int set_id, const std::vector<int>& world_ranks,
                                 std::unique_ptr<Collectives>* out) override {
    out->reset();
    MPI_Group all, group;
    MPI_CHECK(MPI_Comm_group(data_, &all));
    int rc = MPI_Group_incl(all, static_cast<int>(world_ranks.size()), world_ranks.data(), &group);
    MPI_Group_free(&all);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Group_incl");
    MPI_Comm comm = MPI_COMM_NULL;
    rc = MPI_Comm_create(data_, group, &comm);
    MPI_Group_free(&group);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_create");
    if (comm == MPI_COMM_NULL) return Status::OK();  // not a member
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    *out = std::make_unique<MpiCollectives>(comm, /*owned=*/true);
    return Status::OK();
  }

 private:
  Status ReadTopology() {
    MPI_Comm_rank(data_, &topo_.rank);
    MPI_Comm_size(data_, &topo_.size);
    // Kept (not freed) for local_collectives() and cross_collectives().
    MPI_Comm& local = local_;
    MPI_Comm& cross = cross_;
    MPI_CHECK(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, topo_.rank, MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &topo_.local_rank);
    MPI_Comm_size(local, &topo_.local_size);
    MPI_CHECK(MPI_Comm_split(data_, topo_.local_rank, topo_.rank, &cross));
    MPI_Comm_rank(cross, &topo_.cross_rank);
    MPI_Comm_size(cross, &topo_.cross_size);
    std::vector<int> local_sizes(topo_.size);
    MPI_CHECK(MPI_Allgather(&topo_.local_size, 1, MPI_INT, local_sizes.data(), 1, MPI_INT, data_));
    topo_.homogeneous = true;
    for (int s : local_sizes) topo_.homogeneous &= s == local_sizes[0];
    MPI_Comm_set_errhandler(local_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(cross_, MPI_ERRORS_RETURN);
    return Status::OK();
  }

  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm ctrl_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;  // this node's ranks
  MPI_Comm cross_ = MPI_COMM_NULL;  // the ranks with this local_rank
  Topology topo_;
  bool threads_ = false;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<MpiCollectives> cpu_;
  std::unique_ptr<MpiCollectives> local_cpu_;
  std::unique_ptr<MpiCollectives> cross_cpu_;
};

}  // namespace

Status CreateMpiBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out,
                        bool* excluded) {
  int initialized = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::FailedPrecondition(
        "tfhvd: MPI has already been finalized in this process; tfhvd cannot start again");
  }
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI reads its parameters from the environment at MPI_Init.  A
    // blocking collective spins in opal_progress while it waits for a peer;
    // with as many ranks as cores (and TensorFlow's threads besides) that
    // spin takes the core the late peer needs, and a training step's
    // allreduce then costs milliseconds (docs/PERFORMANCE.md, graph mode).
    // Yielding while idle costs a system call per progress pass, nothing
    // measurable when cores are free.  A value the user set wins.
    if (opts.mpi_yield_when_idle) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    OwnsMpi() = true;
  }
  auto backend = std::make_unique<MpiBackend>();
  TFHVD_RETURN_IF_ERROR(backend->Init(opts, excluded));
  if (!*excluded) *out = std::move(backend);
  return Status::OK();
}

void AbortMpi(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

void FinalizeMpiIfOwned() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (OwnsMpi() && initialized && !finalized) MPI_Finalize();
  OwnsMpi() = false;
}

}  // namespace tfhvd
