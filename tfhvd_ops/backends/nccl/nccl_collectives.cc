#include "nccl_collectives.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "cuda_check.h"
#include "placement.h"

namespace tfhvd {
namespace {

constexpr int kInitMessageBytes = 512;
// Plain copies from 16 MiB use cudaMemcpyAsync (4 us of host time each, 8 us
// of copying at 16 MiB on an H200); smaller ones share one kernel launch.
constexpr int64_t kMemcpyBytes = int64_t{16} << 20;
// The finalizer spins this long on an event before it sleeps in
// cudaEventSynchronize (AwaitEvent), and stays awake this long after a
// delivery.
constexpr std::chrono::microseconds kSpinWait(1000), kLinger(50);

// NCCL's element type for a reduction; null when NCCL cannot reduce it.
bool NcclType(DataType dt, ncclDataType_t* t) {
  switch (dt) {
    case DataType::kUInt8: *t = ncclUint8; return true;
    case DataType::kInt8: *t = ncclInt8; return true;
    case DataType::kInt32: *t = ncclInt32; return true;
    case DataType::kInt64: *t = ncclInt64; return true;
    case DataType::kFloat16: *t = ncclFloat16; return true;
    case DataType::kBFloat16: *t = ncclBfloat16; return true;
    case DataType::kFloat32: *t = ncclFloat32; return true;
    case DataType::kFloat64: *t = ncclFloat64; return true;
    default: return false;
  }
}

Status ReduceArgs(DataType dt, ReduceOp op, ncclDataType_t* t, ncclRedOp_t* o) {
  if (dt == DataType::kBool) {
    return Status::InvalidArgument("tfhvd: bool tensors cannot be reduced; cast them first");
  }
  if (!NcclType(dt, t)) {
    return Status::InvalidArgument(std::string("tfhvd: NCCL cannot reduce ") + DataTypeName(dt) +
                                   " tensors on the GPU; cast to int32 or float32 first, or "
                                   "place the tensor on the CPU");
  }
  switch (op) {
    case ReduceOp::kSum: *o = ncclSum; return Status::OK();
    case ReduceOp::kMin: *o = ncclMin; return Status::OK();
    case ReduceOp::kMax: *o = ncclMax; return Status::OK();
    case ReduceOp::kProduct: *o = ncclProd; return Status::OK();
    default:
      return Status::InvalidArgument(std::string("tfhvd: reduce op ") + ReduceOpName(op) +
                                     " is not supported by the NCCL backend");
  }
}

bool AllEqual(const std::vector<int64_t>& v) {
  for (int64_t x : v) {
    if (x != v[0]) return false;
  }
  return true;
}

const char* At(const void* p, int64_t off) { return static_cast<const char*>(p) + off; }
char* At(void* p, int64_t off) { return static_cast<char*>(p) + off; }

}  // namespace

NcclCollectives::NcclCollectives(const Topology& topo, NcclPeers peers, bool hierarchical,
                                 double timeout_s, KernelCache* kernels, bool elastic)
    : topo_(topo), peers_(peers), hierarchical_(hierarchical), timeout_s_(timeout_s),
      elastic_(elastic), kernel_cache_(kernels) {}

NcclCollectives::~NcclCollectives() {
  if (device_ < 0) return;
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  // What is in flight completes first (the finalizer's watchdog keeps its
  // deadline).  After a failure a wait may never end: what is pending fails
  // now, and the stuck thread, the stream and the buffers it may still use
  // are left behind.  (Pending() may be 0 while a wait is still stuck: the
  // watchdog's FailPending delivered its result already, as after a
  // timeout or an NCCL async error in a one-rank job.)
  bool stuck = false;
  if (finalizer_ != nullptr) {
    if (is_broken_) {
      stuck = true;
      finalizer_->FailPending(Sticky());
      finalizer_->Abandon();
    }
    finalizer_->Stop();  // (its watchdog may still call Watch meanwhile)
  }
  // A clean shutdown: drain the stream, then ncclCommFinalize and
  // ncclCommDestroy, under the deadline (both wait for the peers).  After a
  // failure the communicators are left alone: destroying one that a lost
  // peer still shares can hang.
  if (!is_broken_ && stream_ != nullptr) WaitStream("draining the GPU stream at shutdown");
  if (!is_broken_) {
    WithDeadline("finalizing the NCCL communicators", [this] {
      for (ncclComm_t* c : {&comm_, &local_comm_}) {
        if (*c == nullptr) continue;
        ncclCommFinalize(*c);
        ncclCommDestroy(*c);
        *c = nullptr;
      }
    });
  }
  // An elastic job's failure: abort the communicators, so a stuck NCCL kernel
  // ends and the next init's communicators get the GPU.  ncclCommAbort does
  // not wait for the peers; it still runs on a thread of its own, waited for
  // up to the deadline, so that a reset never hangs on it.
  if (is_broken_ && elastic_) AbortCommunicators();
  // Stuck: the fusion buffer is left held like the rest (stuck work may write it).
  if (stuck && fusion_owner_) new std::shared_ptr<Tensor>(std::move(fusion_owner_));
  if (!stuck) {
    if (fusion_ != nullptr && !fusion_owner_) cudaFree(fusion_);
    fusion_owner_.reset();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (host_buf_ != nullptr) cudaFreeHost(host_buf_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

Status NcclCollectives::Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Broken(CudaStatus(e, what, topo_.rank, device_ >= 0 ? device_ : requested_));
}

Status NcclCollectives::Nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return Status::OK();
  return Broken(NcclStatus(r, what, topo_.rank, device_, comm));
}

Status NcclCollectives::Sticky() const {
  if (!is_broken_) return Status::OK();
  std::lock_guard<std::mutex> l(broken_mu_);
  return broken_;
}

Status NcclCollectives::Broken(const Status& st) {
  // The loop, the finalizer and its watchdog may all get here.
  std::lock_guard<std::mutex> l(broken_mu_);
  if (is_broken_) return broken_;
  // The peers may already wait inside a collective this rank will not
  // join, and ncclCommAbort/ncclCommDestroy are collective within a node,
  // so neither is safe here: the job ends through the host transport's
  // abort, with the reason on this rank's stderr.  One rank has no peers to
  // strand: there the error stays a value, and sticky.
  if (topo_.size > 1 && !elastic_) {
    std::fprintf(stderr,
                 "%s\ntfhvd: rank %d gives up on its GPU collectives (its peers would wait for "
                 "it forever): ending the job\n",
                 st.message().c_str(), topo_.rank);
    std::fflush(stdout);
    std::fflush(stderr);
    AbortTransports(1);
  }
  if (topo_.size > 1) {
    std::fprintf(stderr,
                 "%s\ntfhvd: rank %d: its GPU collectives failed; an elastic job resets (the "
                 "NCCL communicators are aborted at shutdown)\n",
                 st.message().c_str(), topo_.rank);
    std::fflush(stderr);
  }
  const std::string msg = st.message() + "; GPU collectives cannot run again in this job";
  broken_ = st.code() == StatusCode::kInvalidArgument ? Status::InvalidArgument(msg)
                                                      : Status::Aborted(msg);
  is_broken_ = true;
  return broken_;
}

void NcclCollectives::AbortCommunicators() {
  std::vector<ncclComm_t> comms;
  for (ncclComm_t* c : {&comm_, &local_comm_}) {
    if (*c != nullptr) comms.push_back(*c);
    *c = nullptr;
  }
  if (comms.empty()) return;
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([comms, shared] {
    for (ncclComm_t c : comms) ncclCommAbort(c);
    std::lock_guard<std::mutex> l(shared->mu);
    shared->done = true;
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(shared->mu);
  if (!shared->cv.wait_for(l, std::chrono::duration<double>(timeout_s_),
                           [&] { return shared->done; })) {
    std::fprintf(stderr,
                 "tfhvd: rank %d: ncclCommAbort did not return within %.0f s "
                 "(TFHVD_NCCL_TIMEOUT); its communicators are left behind\n",
                 topo_.rank, timeout_s_);
  }
}

void NcclCollectives::WithDeadline(const char* what, const std::function<void()>& work) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const double timeout = timeout_s_;
  const int rank = topo_.rank;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return done; })) return;
    std::fprintf(stderr,
                 "tfhvd: rank %d: %s did not finish within %.0f s (TFHVD_NCCL_TIMEOUT): a peer "
                 "is gone or stuck; ending the job\n",
                 rank, what, timeout);
    std::fflush(stderr);
    AbortTransports(1);
  });
  work();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
}

Status NcclCollectives::EnsureDevice() {
  if (is_broken_) return Sticky();
  if (device_ >= 0) {
    // (The loop thread keeps its device: a call per response, not per entry.)
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device_) return Status::OK();
    return Cuda(cudaSetDevice(device_), "cudaSetDevice");
  }
  if (requested_ < 0) {
    return Status::Internal("tfhvd: internal error: a GPU collective without a GPU");
  }
  int want = requested_;
  if (want == kOwnDevice) {  // a joined rank's first GPU collective: its own GPU
    int count = 0;
    TFHVD_RETURN_IF_ERROR(Cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    want = count > 0 ? topo_.local_rank % count : 0;
  }
  TFHVD_RETURN_IF_ERROR(Cuda(cudaSetDevice(want), "cudaSetDevice"));
  // The highest priority, as Horovod gives its NCCL stream: a collective
  // that the other ranks wait for should not queue behind compute kernels.
  int lowest = 0, highest = 0;
  TFHVD_RETURN_IF_ERROR(Cuda(cudaDeviceGetStreamPriorityRange(&lowest, &highest),
                             "cudaDeviceGetStreamPriorityRange"));
  TFHVD_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, highest),
                             "cudaStreamCreateWithPriority"));
  device_ = want;
  Finalizer::Options fo;
  fo.on_start = [want] { cudaSetDevice(want); };
  fo.watch = [this](Finalizer::Clock::duration oldest) { Watch(oldest); };
  fo.linger = kLinger;
  finalizer_ = std::make_unique<Finalizer>(std::move(fo));
  return Status::OK();  // the copy/scale kernels load at their first use (Flush)
}

Status NcclCollectives::InitComm(Collectives* over, int nranks, int rank, ncclComm_t* comm,
                                 const char* what) {
  // Step 1: every rank's local readiness, rank 0's unique id.
  std::string mine;
  Status st = EnsureDevice();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (st.ok() && rank == 0) {
    st = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", topo_.rank, device_, nullptr);
  }
  if (!st.ok()) mine = st.message();
  auto agree = [&](const std::string& msg) -> Status {
    std::vector<char> all(static_cast<size_t>(nranks) * kInitMessageBytes, 0);
    char buf[kInitMessageBytes] = {0};
    std::strncpy(buf, msg.c_str(), kInitMessageBytes - 1);
    TFHVD_RETURN_IF_ERROR(over->Allgatherv(
        buf, kInitMessageBytes, all.data(), std::vector<int64_t>(nranks, kInitMessageBytes)));
    std::string failed;
    for (int r = 0; r < nranks; ++r) {
      const char* m = &all[static_cast<size_t>(r) * kInitMessageBytes];
      if (m[0] == '\0') continue;
      failed += (failed.empty() ? "" : "; ") + std::string(m, strnlen(m, kInitMessageBytes));
    }
    if (failed.empty()) return Status::OK();
    return Status::Internal(std::string("tfhvd: creating the NCCL communicator (") + what +
                            ") failed: " + failed);
  };
  TFHVD_RETURN_IF_ERROR(agree(mine));
  // Step 1b: one rank per GPU, said plainly before NCCL says it obscurely.
  GpuSeat seat;
  if (!LocalGpuSeat(topo_.rank, device_, &seat).ok()) seat = GpuSeat();
  TFHVD_RETURN_IF_ERROR(AgreeOneRankPerGpu(over, nranks, seat, what));
  // Step 2: rank 0's id to everyone.
  TFHVD_RETURN_IF_ERROR(over->Broadcast(&id, sizeof(id), 0));
  // Step 3: the communicator itself.  It waits for every rank: a rank whose
  // own ncclCommInitRank failed early never comes, so it has a deadline too.
  ncclResult_t init = ncclSuccess;
  WithDeadline("creating the NCCL communicator",
               [&] { init = ncclCommInitRank(comm, nranks, id, rank); });
  st = NcclStatus(init, "ncclCommInitRank", topo_.rank, device_, nullptr);
  Status all = agree(st.ok() ? std::string() : st.message());
  if (!all.ok() && !st.ok() && all.message().find(st.message()) == std::string::npos) {
    // The agreement itself failed (a peer is gone): still name this rank's own failure.
    all = Status::Internal(st.message() + " (then: " + all.message() + ")");
  }
  if (!all.ok() && *comm != nullptr) {  // a peer failed: do not wait for it
    ncclCommAbort(*comm);
    *comm = nullptr;
  }
  return all;
}

Status NcclCollectives::BeginCollective() {
  TFHVD_RETURN_IF_ERROR(EnsureDevice());
  if (comm_ == nullptr) {
    TFHVD_RETURN_IF_ERROR(InitComm(peers_.host, topo_.size, topo_.rank, &comm_, "all ranks"));
    watched_[0] = comm_;
  }
  return Flush();
}

Status NcclCollectives::Flush() {
  if (batch_.n == 0) return Status::OK();
  // The kernels load the first time a copy is queued.  Where they cannot
  // (a GPU the library holds no image for, a driver too old for its PTX),
  // that is no failure of the job: plain copies go through
  // cudaMemcpyAsync, and only a copy that scales fails, as an error of its
  // collective; every rank that scales the same tensors fails alike.
  if (kernels_ == nullptr) kernels_ = kernel_cache_->Get(device_);
  if (kernels_->error.ok()) {
    Status st = kernels_->kernels.LaunchBatchedScaledCopy(batch_, stream_);
    batch_.n = 0;
    return st.ok() ? st : Broken(st);
  }
  const int n = batch_.n;
  batch_.n = 0;
  for (int i = 0; i < n; ++i) {
    const cuda::CopyTask& t = batch_.tasks[i];
    if (t.factor != 1.0) {
      return Status::InvalidArgument(
          kernels_->error.message() + "; this collective scales on the GPU (an average, a "
          "prescale or postscale factor), which needs them (plain copies still run)");
    }
    TFHVD_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(t.dst, t.src,
                                               t.count * DataTypeSize(
                                                   static_cast<DataType>(t.dtype)),
                                               cudaMemcpyDeviceToDevice, stream_),
                               "cudaMemcpyAsync"));
  }
  return Status::OK();
}

Status NcclCollectives::WaitStream(const char* what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  std::chrono::microseconds nap(20);
  while (true) {
    cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return Sticky();
    if (q != cudaErrorNotReady) return Broken(CudaStatus(q, what, topo_.rank, device_));
    for (ncclComm_t c : {watched_[0].load(), watched_[1].load()}) {
      if (c == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(c, &async);
      if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        return Broken(NcclStatus(async, what, topo_.rank, device_, c));
      }
    }
    const Clock::time_point now = Clock::now();
    if (now > deadline) {
      return Broken(Status::Aborted(
          "tfhvd: rank " + std::to_string(topo_.rank) + " (GPU " + std::to_string(device_) +
          "): " + what + " did not finish within " + std::to_string(static_cast<int>(timeout_s_)) +
          " s (TFHVD_NCCL_TIMEOUT; the stall-shutdown time when set): a peer is gone, stuck, or "
          "never joined the collective"));
    }
    // Small collectives finish within microseconds: yield first, then
    // sleep, longer the longer the wait, so a long wait does not steal a core.
    if (now - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}

Status NcclCollectives::Synchronize() {
  if (device_ < 0 || stream_ == nullptr) return Sticky();
  // Even after an error, the stream is drained before the executor hands
  // outputs back: queued work may still write them.
  Status st = !is_broken_ ? EnsureDevice() : Cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (st.ok() && !is_broken_) st = Flush();
  Status drained = WaitStream("a GPU collective");
  return is_broken_ ? Sticky() : (st.ok() ? drained : st);
}

Status NcclCollectives::TakeEvent(cudaEvent_t* out) {
  {
    std::lock_guard<std::mutex> l(events_mu_);
    if (!events_.empty()) {
      *out = events_.back();
      events_.pop_back();
      return Status::OK();
    }
  }
  // Blocking sync: the finalizer's cudaEventSynchronize sleeps instead of
  // spinning through a long collective.
  return Cuda(cudaEventCreateWithFlags(out, cudaEventDisableTiming | cudaEventBlockingSync),
              "cudaEventCreate");
}

void NcclCollectives::GiveEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(events_mu_);
  events_.push_back(e);
}

void NcclCollectives::Complete(std::function<void(const Status&)> done) {
  waited_ = nullptr;
  if (device_ < 0 || stream_ == nullptr || finalizer_ == nullptr) {
    done(Sticky());  // nothing was ever queued here
    return;
  }
  Status st = !is_broken_ ? EnsureDevice() : Cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (st.ok() && !is_broken_) st = Flush();
  cudaEvent_t ev = nullptr;
  if (st.ok() && !is_broken_) st = TakeEvent(&ev);
  if (ev != nullptr) {
    Status rec = Cuda(cudaEventRecord(ev, stream_), "cudaEventRecord");
    if (!rec.ok()) {
      GiveEvent(ev);
      ev = nullptr;
      st = rec;
    }
  }
  const int rank = topo_.rank, device = device_;
  if (ev != nullptr) {
    // The usual path: one event per response.
    finalizer_->Push(
        [ev, rank, device] {
          return CudaStatus(AwaitEvent(ev, kSpinWait), "a GPU collective", rank, device);
        },
        [this, ev, done](const Status& waited) {
          GiveEvent(ev);
          done(waited.ok() ? Sticky() : Broken(waited));
        });
    return;
  }
  // After a failure: still in order, after the stream drained (the
  // watchdog's deadline bounds a stream that never does).
  cudaStream_t stream = stream_;
  finalizer_->Push([stream] { cudaStreamSynchronize(stream); return Status::OK(); },
                   [this, st, done](const Status&) {
                     done(is_broken_ ? Sticky() : st);
                   });
}

void NcclCollectives::Watch(Finalizer::Clock::duration oldest) {
  for (int i = 0; i < 2; ++i) {
    ncclComm_t c = watched_[i];
    if (c == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c, &async);
    if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      // With peers this ends the job; alone, what is pending fails.
      finalizer_->FailPending(Broken(NcclStatus(async, "a GPU collective", topo_.rank, device_, c)));
      return;
    }
  }
  if (oldest > std::chrono::duration<double>(timeout_s_)) {
    finalizer_->FailPending(Broken(Status::Aborted(
        "tfhvd: rank " + std::to_string(topo_.rank) + " (GPU " + std::to_string(device_) +
        "): a GPU collective did not finish within " +
        std::to_string(static_cast<int>(timeout_s_)) +
        " s (TFHVD_NCCL_TIMEOUT; the stall-shutdown time when set): a peer is gone, stuck, or "
        "never joined the collective")));
  }
}

Status NcclCollectives::WaitFor(const ReadyEvent& event) {
  TFHVD_RETURN_IF_ERROR(EnsureDevice());
  if (event.device() != device_) {
    return Broken(Status::InvalidArgument(
        "tfhvd: this process already runs its GPU collectives on GPU " + std::to_string(device_) +
        " but got a tensor on GPU " + std::to_string(event.device()) +
        "; tfhvd uses one GPU per process: make one GPU visible to each process "
        "(tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU'))"));
  }
  // A grouped op's entries share one event: one wait is enough (they all
  // hold it until the response completes, so it is not recorded again).
  if (event.handle() == waited_) return Status::OK();
  TFHVD_RETURN_IF_ERROR(Flush());
  waited_ = event.handle();
  return Cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event.handle()), 0),
              "cudaStreamWaitEvent");
}

void* NcclCollectives::FusionBuffer(int64_t bytes, OpContext* framework) {
  Status st = EnsureDevice();
  if (st.ok() && bytes > fusion_bytes_) {
    // The old buffer may still be in use by queued work.
    st = Flush();
    if (st.ok()) st = WaitStream("growing the fusion buffer");
    if (st.ok() && fusion_ != nullptr) {
      if (fusion_owner_) {
        fusion_owner_.reset();  // back to the framework's allocator
      } else {
        cudaFree(fusion_);
      }
      fusion_ = nullptr;
      fusion_bytes_ = 0;
    }
    const int64_t mib = 1 << 20;
    const int64_t want = (bytes + mib - 1) / mib * mib;
    if (st.ok() && framework != nullptr && framework->HasDeviceAllocator()) {
      st = framework->AllocateDeviceBuffer(want, &fusion_owner_);
      if (st.ok()) {
        fusion_ = fusion_owner_->mutable_data();
        // Memory the framework's stream may still use: wait for that stream.
        if (std::shared_ptr<ReadyEvent> ev = fusion_owner_->ready_event()) st = WaitFor(*ev);
      } else {
        fusion_owner_.reset();
        st = Broken(Status::Internal(
            "tfhvd: rank " + std::to_string(topo_.rank) + " (GPU " + std::to_string(device_) +
            "): TensorFlow could not allocate the " + std::to_string(want >> 20) + " MiB GPU "
            "fusion buffer (" + st.message() + "); a smaller TFHVD_FUSION_THRESHOLD shrinks it"));
      }
    } else if (st.ok()) {
      cudaError_t e = cudaMalloc(&fusion_, want);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // not sticky: clear it
        st = Broken(Status::Internal(
            "tfhvd: rank " + std::to_string(topo_.rank) + " (GPU " + std::to_string(device_) +
            "): out of GPU memory allocating the " + std::to_string(want >> 20) +
            " MiB GPU fusion buffer. TensorFlow reserves nearly all GPU memory by default: set "
            "TF_FORCE_GPU_ALLOW_GROWTH=true, or call "
            "tf.config.experimental.set_memory_growth(gpu, True) for each GPU before the "
            "first op; a smaller TFHVD_FUSION_THRESHOLD also shrinks this buffer"));
      } else {
        st = Cuda(e, "allocating the GPU fusion buffer");
      }
    }
    if (st.ok()) fusion_bytes_ = want;
  }
  return st.ok() ? fusion_ : nullptr;  // the error is sticky (Broken)
}

Status NcclCollectives::ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                                   double factor) {
  TFHVD_RETURN_IF_ERROR(EnsureDevice());
  if (count == 0 || (factor == 1.0 && src == dst)) return Status::OK();
  if (src == nullptr || dst == nullptr) {
    return Broken(Status::Internal("tfhvd: internal error: a GPU copy with a null pointer"));
  }
  const int64_t bytes = count * DataTypeSize(dtype);
  if (factor == 1.0 && bytes >= kMemcpyBytes) {
    // A large plain copy: the copy engine path (after the queued copies, to
    // keep the stream's order).
    TFHVD_RETURN_IF_ERROR(Flush());
    return Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                "cudaMemcpyAsync");
  }
  if (batch_.n == cuda::kMaxBatch) TFHVD_RETURN_IF_ERROR(Flush());
  batch_.tasks[batch_.n++] =
      cuda::CopyTask{src, dst, count, factor, static_cast<int32_t>(dtype)};
  return Status::OK();
}

Status NcclCollectives::CheckReduce(DataType dtype, ReduceOp op) {
  ncclDataType_t t;
  ncclRedOp_t o;
  return ReduceArgs(dtype, op, &t, &o);
}

Status NcclCollectives::Zero(void* dst, int64_t bytes) {
  TFHVD_RETURN_IF_ERROR(EnsureDevice());
  TFHVD_RETURN_IF_ERROR(Flush());
  if (bytes == 0) return Status::OK();
  return Cuda(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
}

Status NcclCollectives::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                  ReduceOp op) {
  ncclDataType_t t;
  ncclRedOp_t o;
  TFHVD_RETURN_IF_ERROR(ReduceArgs(dtype, op, &t, &o));
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  if (count == 0) return Status::OK();
  if (hierarchical_ && topo_.homogeneous && peers_.local != nullptr && peers_.cross != nullptr) {
    return HierarchicalAllreduce(send, recv, count, dtype, t, o);
  }
  return Nccl(ncclAllReduce(send ? send : recv, recv, count, t, o, comm_, stream_),
              "ncclAllReduce", comm_);
}

Status NcclCollectives::AllreduceScaled(const void* send, void* recv, int64_t count,
                                        DataType dtype, ReduceOp op, double post) {
  const bool flat = !(hierarchical_ && topo_.homogeneous && peers_.local && peers_.cross);
  const bool wide = dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
  const bool half = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
  // float32/float64: PreMulSum, Sum(post * x_r) == post * Sum(x_r); 16-bit
  // floats: only an exact average, as ncclAvg.
  const bool premul = wide && post != 1.0;
  const bool average = half && post == 1.0 / topo_.size;
  if (flat && op == ReduceOp::kSum && (premul || average)) {
    ncclDataType_t t;
    ncclRedOp_t o;
    TFHVD_RETURN_IF_ERROR(ReduceArgs(dtype, op, &t, &o));
    TFHVD_RETURN_IF_ERROR(BeginCollective());
    if (count == 0) return Status::OK();
    const void* in = send ? send : recv;
    if (average) {
      return Nccl(ncclAllReduce(in, recv, count, t, ncclAvg, comm_, stream_),
                  "ncclAllReduce (ncclAvg)", comm_);
    }
    // The scalar is read at enqueue time, and the op may be destroyed as
    // soon as the call returned.
    float f32 = static_cast<float>(post);
    double f64 = post;
    void* scalar = dtype == DataType::kFloat32 ? static_cast<void*>(&f32) : &f64;
    ncclRedOp_t premul_op;
    TFHVD_RETURN_IF_ERROR(
        Nccl(ncclRedOpCreatePreMulSum(&premul_op, scalar, t, ncclScalarHostImmediate, comm_),
             "ncclRedOpCreatePreMulSum", comm_));
    ncclResult_t r = ncclAllReduce(in, recv, count, t, premul_op, comm_, stream_);
    ncclRedOpDestroy(premul_op, comm_);
    return Nccl(r, "ncclAllReduce (PreMulSum)", comm_);
  }
  return Collectives::AllreduceScaled(send, recv, count, dtype, op, post);
}

Status NcclCollectives::HierarchicalAllreduce(const void* send, void* recv, int64_t count,
                                              DataType dtype, ncclDataType_t t, ncclRedOp_t o) {
  if (local_comm_ == nullptr) {
    TFHVD_RETURN_IF_ERROR(InitComm(peers_.local, topo_.local_size, topo_.local_rank,
                                   &local_comm_, "this node's ranks"));
    watched_[1] = local_comm_;
  }
  const int64_t esize = DataTypeSize(dtype);
  const int64_t chunk = count / topo_.local_size;
  const int64_t main = chunk * topo_.local_size;
  const void* in = send ? send : recv;
  if (chunk > 0) {
    void* mine = At(recv, topo_.local_rank * chunk * esize);
    TFHVD_RETURN_IF_ERROR(Nccl(ncclReduceScatter(in, mine, chunk, t, o, local_comm_, stream_),
                               "ncclReduceScatter (within the node)", local_comm_));
    if (topo_.cross_size > 1) {
      const int64_t bytes = chunk * esize;
      if (host_buf_bytes_ < bytes) {
        if (host_buf_ != nullptr) cudaFreeHost(host_buf_);
        host_buf_ = nullptr;
        host_buf_bytes_ = 0;
        TFHVD_RETURN_IF_ERROR(Cuda(cudaMallocHost(&host_buf_, bytes), "cudaMallocHost"));
        host_buf_bytes_ = bytes;
      }
      TFHVD_RETURN_IF_ERROR(Cuda(
          cudaMemcpyAsync(host_buf_, mine, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpy"));
      TFHVD_RETURN_IF_ERROR(WaitStream("the copy to the host"));
      ReduceOp op = o == ncclSum    ? ReduceOp::kSum
                    : o == ncclMin  ? ReduceOp::kMin
                    : o == ncclMax  ? ReduceOp::kMax
                                    : ReduceOp::kProduct;
      TFHVD_RETURN_IF_ERROR(peers_.cross->Allreduce(nullptr, host_buf_, chunk, dtype, op));
      TFHVD_RETURN_IF_ERROR(Cuda(
          cudaMemcpyAsync(mine, host_buf_, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpy"));
    }
    TFHVD_RETURN_IF_ERROR(Nccl(ncclAllGather(mine, recv, chunk, t, local_comm_, stream_),
                               "ncclAllGather (within the node)", local_comm_));
  }
  if (main < count) {
    TFHVD_RETURN_IF_ERROR(Nccl(ncclAllReduce(At(in, main * esize), At(recv, main * esize),
                                             count - main, t, o, comm_, stream_),
                               "ncclAllReduce", comm_));
  }
  return Status::OK();
}

Status NcclCollectives::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                   const std::vector<int64_t>& recv_bytes) {
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  if (AllEqual(recv_bytes)) {
    if (send_bytes == 0) return Status::OK();
    return Nccl(ncclAllGather(send, recv, send_bytes, ncclInt8, comm_, stream_), "ncclAllGather",
                comm_);
  }
  // Ranks contribute different sizes: one broadcast per rank, grouped.
  TFHVD_RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart", comm_));
  int64_t off = 0;
  Status st;
  for (int r = 0; r < topo_.size && st.ok(); ++r) {
    if (recv_bytes[r] > 0) {
      const void* src = r == topo_.rank ? send : At(recv, off);
      st = Nccl(ncclBroadcast(src, At(recv, off), recv_bytes[r], ncclInt8, r, comm_, stream_),
                "ncclBroadcast (allgather)", comm_);
    }
    off += recv_bytes[r];
  }
  Status end = Nccl(ncclGroupEnd(), "ncclGroupEnd (allgather)", comm_);
  return st.ok() ? end : st;
}

Status NcclCollectives::Broadcast(void* buf, int64_t bytes, int root) {
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  if (bytes == 0) return Status::OK();
  return Nccl(ncclBroadcast(buf, buf, bytes, ncclInt8, root, comm_, stream_), "ncclBroadcast",
              comm_);
}

Status NcclCollectives::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes) {
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  int64_t soff = 0, roff = 0;
  std::vector<int64_t> sdispl(topo_.size), rdispl(topo_.size);
  for (int j = 0; j < topo_.size; ++j) {
    sdispl[j] = soff;
    rdispl[j] = roff;
    soff += send_bytes[j];
    roff += recv_bytes[j];
  }
  const int me = topo_.rank;
  if (send_bytes[me] > 0) {  // this rank's own block
    TFHVD_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(At(recv, rdispl[me]), At(send, sdispl[me]),
                                               send_bytes[me], cudaMemcpyDeviceToDevice, stream_),
                               "cudaMemcpyAsync (alltoall)"));
  }
  if (topo_.size == 1) return Status::OK();
  TFHVD_RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart", comm_));
  Status st;
  for (int j = 0; j < topo_.size && st.ok(); ++j) {
    if (j == me) continue;
    if (send_bytes[j] > 0) {
      st = Nccl(ncclSend(At(send, sdispl[j]), send_bytes[j], ncclInt8, j, comm_, stream_),
                "ncclSend (alltoall)", comm_);
    }
    if (st.ok() && recv_bytes[j] > 0) {
      st = Nccl(ncclRecv(At(recv, rdispl[j]), recv_bytes[j], ncclInt8, j, comm_, stream_),
                "ncclRecv (alltoall)", comm_);
    }
  }
  Status end = Nccl(ncclGroupEnd(), "ncclGroupEnd (alltoall)", comm_);
  return st.ok() ? end : st;
}

Status NcclCollectives::ReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op) {
  ncclDataType_t t;
  ncclRedOp_t o;
  TFHVD_RETURN_IF_ERROR(ReduceArgs(dtype, op, &t, &o));
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  if (AllEqual(recv_counts)) {
    if (recv_counts[0] == 0) return Status::OK();
    return Nccl(ncclReduceScatter(send, recv, recv_counts[0], t, o, comm_, stream_),
                "ncclReduceScatter", comm_);
  }
  // Uneven parts: one reduce per destination rank, grouped.
  const int64_t esize = DataTypeSize(dtype);
  TFHVD_RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart", comm_));
  int64_t off = 0;
  Status st;
  for (int r = 0; r < topo_.size && st.ok(); ++r) {
    if (recv_counts[r] > 0) {
      // recvbuff is only written on the root; others pass their input.
      void* out = r == topo_.rank ? recv : const_cast<char*>(At(send, off * esize));
      st = Nccl(ncclReduce(At(send, off * esize), out, recv_counts[r], t, o, r, comm_, stream_),
                "ncclReduce (reducescatter)", comm_);
    }
    off += recv_counts[r];
  }
  Status end = Nccl(ncclGroupEnd(), "ncclGroupEnd (reducescatter)", comm_);
  return st.ok() ? end : st;
}

Status NcclCollectives::Barrier() {
  TFHVD_RETURN_IF_ERROR(BeginCollective());
  if (scratch_ == nullptr) {
    TFHVD_RETURN_IF_ERROR(Cuda(cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc"));
    TFHVD_RETURN_IF_ERROR(Cuda(cudaMemsetAsync(scratch_, 0, sizeof(int32_t), stream_), "memset"));
  }
  TFHVD_RETURN_IF_ERROR(
      Nccl(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_),
           "ncclAllReduce (barrier)", comm_));
  return WaitStream("a GPU barrier");
}

}  // namespace tfhvd
