#include "operations.h"

#include <cstring>

#include "adasum.h"


namespace tfhvd {
namespace {

// Scale applied after the reduction: the user's postscale, and 1/size for
// Average (Horovod's semantics: integer averages truncate).
double PostFactor(const CollectiveParams& p, int size) {
  double f = p.postscale;
  if (p.reduce_op == ReduceOp::kAverage) f /= size;
  return f;
}

ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// Orders the transport's work after the framework produced (or allocated)
// `t`; a no-op for host tensors.
Status AwaitTensor(Collectives* c, const Tensor* t) {
  std::shared_ptr<ReadyEvent> ev = t ? t->ready_event() : nullptr;
  return ev ? c->WaitFor(*ev) : Status::OK();
}

Shape WithFirstDim(const Shape& s, int64_t d0) {
  Shape out = s.empty() ? Shape{d0} : s;
  out[0] = d0;
  return out;
}

int64_t RowElements(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.size(); ++i) n *= s[i];
  return n;
}

}  // namespace

Collectives* Executor::CollectivesFor(ProcessSet& set, int device) {
  if (set.id == 0) return backend_->collectives(device);
  if (device < 0) return set.host.get();
  return backend_->SubsetDeviceCollectives(set.id, set.host.get(), set.rank, set.size(), device);
}

namespace {

// What completes a response once its transport finished it: the timeline
// rows, the error message with the tensor's name, the callbacks.  Owns the
// entries (and so the tensors) until then.
struct Completion {
  Timeline* timeline = nullptr;
  int32_t set_id = 0;
  CollectiveType type = CollectiveType::kAllreduce;
  std::string first_name;
  bool rows = false;  // timeline rows were started
  Status launched;    // the executor's own result (the transport's comes later)
  std::vector<std::unique_ptr<TensorTableEntry>> entries;
  std::shared_ptr<Executor::InFlight> in_flight;  // counted in, while pending

  void Finish(const Status& transport) {
    Status st = launched.ok() ? transport : launched;
    for (size_t i = 0; i < entries.size() && rows && timeline->enabled(); ++i) {
      if (entries[i]) timeline->End(TimelineName(set_id, entries[i]->name));
    }
    if (!st.ok() && st.message().find(first_name) == std::string::npos &&
        st.code() == StatusCode::kInternal) {
      st = Status::Internal("tfhvd: " + std::string(CollectiveName(type)) + " of tensor '" +
                            first_name + "' failed: " + st.message());
    }
    for (auto& e : entries) {
      if (e && e->callback) e->callback(st);
    }
    entries.clear();
    if (in_flight) {
      std::lock_guard<std::mutex> l(in_flight->mu);
      if (--in_flight->n == 0) in_flight->cv.notify_all();
    }
  }
};

}  // namespace

void Executor::Execute(const Response& r,
                       std::vector<std::unique_ptr<TensorTableEntry>>& entries,
                       ProcessSet& set) {
  Status st;
  if (r.kind == ResponseKind::kError) {
    switch (r.error_code) {
      case StatusCode::kAborted: st = Status::Aborted(r.error); break;
      case StatusCode::kInternal: st = Status::Internal(r.error); break;
      case StatusCode::kInvalidArgument: st = Status::InvalidArgument(r.error); break;
      // Ranks that disagree: Horovod's PRECONDITION_ERROR.
      default: st = Status::FailedPrecondition(r.error); break;
    }
    for (auto& e : entries) {
      if (e && e->callback) e->callback(st);
    }
    return;
  }
  const CollectiveParams& p = r.params;
  // Ranks agree on the memory kind; the GPU ordinal is each rank's own.
  int device = p.device;
  bool mine = false;
  for (const auto& e : entries) {
    if (e) {
      device = e->params.device;
      mine = true;
      break;
    }
  }
  // A joined rank has no tensor here: it works on its own GPU.
  if (!mine && device >= 0) device = kOwnDevice;
  Collectives* c = CollectivesFor(set, device);
  bool launched = false;
  if (c == nullptr && p.type != CollectiveType::kJoin && p.type != CollectiveType::kBarrier) {
    st = Status::FailedPrecondition(
        "tfhvd: tensor '" + r.names[0] + "' is on GPU " + std::to_string(device) +
        " but this build has no GPU collectives; rebuild with TFHVD_GPU_OPERATIONS=NCCL "
        "or place the tensor on the CPU");
  } else if (p.reduce_op == ReduceOp::kAdasum && p.type == CollectiveType::kReducescatter) {
    st = Status::InvalidArgument("tfhvd: tensor '" + r.names[0] +
                                 "': reducescatter does not support Adasum; use Average or Sum");
  } else if (p.reduce_op == ReduceOp::kAdasum && p.type == CollectiveType::kAllreduce &&
             !(st = CheckAdasum(r.names[0], p.dtype, device, set.size())).ok()) {
    // (Every rank of the set finds this alone, before moving any bytes.)
  } else {
    launched = true;
    // (Row names are built only when the timeline records: every tensor
    // of every round passes here.)
    for (size_t i = 0; i < entries.size() && timeline_->enabled(); ++i) {
      if (entries[i]) {
        timeline_->Start(TimelineName(set.id, r.names[i]), CollectiveName(p.type),
                         entries[i]->input ? entries[i]->input->size_bytes() : 0);
      }
    }
    for (const auto& e : entries) {
      if (!e || c == nullptr || !st.ok()) continue;
      st = AwaitTensor(c, e->input.get());
      if (st.ok()) st = AwaitTensor(c, e->output.get());
    }
    if (st.ok()) {
      switch (p.type) {
        case CollectiveType::kAllreduce: st = Allreduce(r, entries, c, set); break;
        case CollectiveType::kAllgather: st = Allgather(r, *entries[0], c); break;
        case CollectiveType::kBroadcast: st = Broadcast(r, *entries[0], c, set); break;
        case CollectiveType::kAlltoall: st = Alltoall(r, *entries[0], c, set); break;
        case CollectiveType::kReducescatter: st = Reducescatter(r, *entries[0], c, set); break;
        case CollectiveType::kJoin: st = Join(r, *entries[0]); break;
        case CollectiveType::kBarrier: break;  // negotiation already synchronised
        default:  // process-set changes are the runtime's (Runtime::ChangeSet)
          st = Status::Internal("tfhvd: internal error: executor got a process-set change");
      }
    }
  }
  auto done = std::make_shared<Completion>();
  done->timeline = timeline_;
  done->set_id = set.id;
  done->type = p.type;
  done->first_name = r.names[0];
  done->launched = st;
  done->entries = std::move(entries);  // (the caller's vector is left empty)
  done->rows = launched;
  // Outputs must be complete before the callbacks hand them back: the
  // transport calls back once its work has finished (a device transport
  // from its finalizer, while this thread goes on with the next response).
  if (c == nullptr || !launched) {
    done->Finish(Status::OK());
  } else {
    done->in_flight = in_flight_;
    {
      std::lock_guard<std::mutex> l(in_flight_->mu);
      ++in_flight_->n;
    }
    c->Complete([done](const Status& sync) { done->Finish(sync); });
  }
}

void Executor::Drain() {
  std::unique_lock<std::mutex> l(in_flight_->mu);
  in_flight_->cv.wait(l, [this] { return in_flight_->n == 0; });
}

Status Executor::Allreduce(const Response& r,
                           std::vector<std::unique_ptr<TensorTableEntry>>& entries,
                           Collectives* c, const ProcessSet& set) {
  const CollectiveParams& p = r.params;
  const int size = set.size();
  const int64_t esize = DataTypeSize(p.dtype);
  const double post = PostFactor(p, size);
  const ReduceOp op = WireOp(p.reduce_op);
  // A set of one rank on a GPU: the reduction is the identity, so each
  // tensor is copied (scaled) straight to its output: no fusion buffer and
  // no NCCL call, one batched kernel launch for a whole fused response.
  // What the transport cannot reduce still fails, as with peers.  With both
  // a prescale and a postscale, the general path (two roundings, as with
  // peers).
  if (size == 1 && p.device >= 0 && p.reduce_op != ReduceOp::kAdasum &&
      (p.prescale == 1.0 || post == 1.0)) {
    TFHVD_RETURN_IF_ERROR(c->CheckReduce(p.dtype, op));
    in_phase_ = false;
    Phase(r, entries, std::string(c->name()) + "_ALLREDUCE");
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!entries[i]) continue;
      TensorTableEntry& e = *entries[i];
      TFHVD_RETURN_IF_ERROR(PlaceOutput(e));
      TFHVD_RETURN_IF_ERROR(c->ScaledCopy(e.input->data(), e.output->mutable_data(), r.sizes[i],
                                          p.dtype, p.prescale * post));
    }
    Phase(r, entries, "");
    return Status::OK();
  }
  if (entries.size() == 1 && entries[0]) {
    TensorTableEntry& e = *entries[0];
    const int64_t n = r.sizes[0];
    TFHVD_RETURN_IF_ERROR(PlaceOutput(e));
    void* out = e.output->mutable_data();
    if (p.reduce_op == ReduceOp::kAdasum) {
      TFHVD_RETURN_IF_ERROR(c->ScaledCopy(e.input->data(), out, n, p.dtype, p.prescale));
      TFHVD_RETURN_IF_ERROR(ReduceInPlace(r, {0}, out, n, c, set));
      return c->ScaledCopy(out, out, n, p.dtype, post);
    }
    if (p.prescale != 1.0) {
      TFHVD_RETURN_IF_ERROR(c->ScaledCopy(e.input->data(), out, n, p.dtype, p.prescale));
      return c->AllreduceScaled(nullptr, out, n, p.dtype, op, post);
    }
    const void* in = e.input->data() == out ? nullptr : e.input->data();  // forwarded
    return c->AllreduceScaled(in, out, n, p.dtype, op, post);
  }
  // Every rank lays the tensors out alike, from the response alone (a joined
  // rank has no entries; one tensor has no padding): host tensors each at an
  // aligned offset, so that outputs can view the buffer; device tensors
  // packed (the device copies stay one batch), and the reduction ends with
  // the last tensor.
  const int64_t align = p.device < 0 ? kFusionAlign : 1;
  std::vector<int64_t> offsets(entries.size());
  int64_t total_bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    offsets[i] = (total_bytes + align - 1) / align * align;
    total_bytes = offsets[i] + r.sizes[i] * esize;
  }
  // Host outputs left to us become views of one buffer that the framework
  // allocates: the reduction happens where the outputs live, so there is
  // nothing to copy out.  Otherwise the collectives' own fusion buffer.
  TensorTableEntry* first = nullptr;
  bool views = p.device < 0;
  for (const auto& e : entries) {
    if (!e) continue;
    if (first == nullptr) first = e.get();
    views &= !e->output && e->context && e->context->SupportsViews();
  }
  views &= first != nullptr;
  std::shared_ptr<Tensor> shared;
  char* buf = nullptr;
  if (views) {
    TFHVD_RETURN_IF_ERROR(first->context->AllocateShared(total_bytes, &shared));
    buf = static_cast<char*>(shared->mutable_data());
  } else {
    for (auto& e : entries) {
      if (e) TFHVD_RETURN_IF_ERROR(PlaceOutput(*e));
    }
    buf = static_cast<char*>(
        c->FusionBuffer(total_bytes, first != nullptr ? first->context.get() : nullptr));
  }
  in_phase_ = false;
  Phase(r, entries, "MEMCPY_IN_FUSION_BUFFER");
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t bytes = r.sizes[i] * esize;
    const int64_t end = i + 1 < entries.size() ? offsets[i + 1] : total_bytes;
    if (entries[i]) {
      TFHVD_RETURN_IF_ERROR(c->ScaledCopy(entries[i]->input->data(), buf + offsets[i],
                                          r.sizes[i], p.dtype, p.prescale));
      if (end > offsets[i] + bytes) {
        TFHVD_RETURN_IF_ERROR(c->Zero(buf + offsets[i] + bytes, end - offsets[i] - bytes));
      }
    } else {
      TFHVD_RETURN_IF_ERROR(c->Zero(buf + offsets[i], end - offsets[i]));  // a joined rank
    }
  }
  Phase(r, entries, std::string(c->name()) +
                       (p.reduce_op == ReduceOp::kAdasum ? "_ADASUM_ALLREDUCE" : "_ALLREDUCE"));
  const int64_t count = total_bytes / esize;
  for (int64_t& o : offsets) o /= esize;  // in elements from here on
  if (views) {
    TFHVD_RETURN_IF_ERROR(ReduceInPlace(r, offsets, buf, count, c, set));
    // (The timeline keeps Horovod's phase: here the scaling in place and
    // the placing of the outputs.)
    Phase(r, entries, "MEMCPY_OUT_FUSION_BUFFER");
    if (post != 1.0) TFHVD_RETURN_IF_ERROR(c->ScaledCopy(buf, buf, count, p.dtype, post));
    for (size_t i = 0; i < entries.size(); ++i) {
      TensorTableEntry* e = entries[i].get();
      if (!e) continue;
      // (An empty tensor has no bytes to view.)
      TFHVD_RETURN_IF_ERROR(r.sizes[i] == 0
                                ? PlaceOutput(*e)
                                : e->context->SetOutputView(0, *shared, offsets[i] * esize,
                                                            p.dtype, e->params.shape));
    }
    Phase(r, entries, "");
    return Status::OK();
  }
  TFHVD_RETURN_IF_ERROR(ReduceInPlace(r, offsets, buf, count, c, set));
  Phase(r, entries, "MEMCPY_OUT_FUSION_BUFFER");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i]) {
      TFHVD_RETURN_IF_ERROR(c->ScaledCopy(buf + offsets[i] * esize,
                                          entries[i]->output->mutable_data(),
                                          r.sizes[i], p.dtype, post));
    }
  }
  Phase(r, entries, "");
  return Status::OK();
}

Status Executor::ReduceInPlace(const Response& r, const std::vector<int64_t>& offsets, void* buf,
                               int64_t count, Collectives* c, const ProcessSet& set) {
  const CollectiveParams& p = r.params;
  if (p.reduce_op != ReduceOp::kAdasum) {
    return c->Allreduce(nullptr, buf, count, p.dtype, WireOp(p.reduce_op));
  }
  // Each tensor with its padding: zeros change no dot product or norm.
  std::vector<int64_t> counts(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    counts[i] = (i + 1 < offsets.size() ? offsets[i + 1] : count) - offsets[i];
  }
  return adasum_.Reduce(c, set.rank, set.size(), buf, p.dtype, counts);
}

Status Executor::PlaceOutput(TensorTableEntry& e) {
  if (e.output) return Status::OK();
  if (!e.context) {
    return Status::Internal("tfhvd: internal error: tensor '" + e.name + "' has no output");
  }
  return e.context->ForwardOrAllocateOutput(0, e.params.shape, &e.output);
}

void Executor::Phase(const Response& r, std::vector<std::unique_ptr<TensorTableEntry>>& entries,
                     const std::string& next) {
  if (!timeline_->enabled()) return;
  const int32_t set = r.params.process_set_id;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i]) continue;
    if (in_phase_) timeline_->End(TimelineName(set, r.names[i]));
    if (!next.empty()) timeline_->Start(TimelineName(set, r.names[i]), next);
  }
  in_phase_ = !next.empty();
}

Status Executor::Allgather(const Response& r, TensorTableEntry& e, Collectives* c) {
  const Shape& in = e.params.shape;
  const int64_t row_bytes = RowElements(in) * DataTypeSize(e.params.dtype);
  int64_t rows = 0;
  std::vector<int64_t> recv_bytes;
  for (int64_t d : r.sizes) {
    rows += d;
    recv_bytes.push_back(d * row_bytes);
  }
  std::shared_ptr<Tensor> out;
  TFHVD_RETURN_IF_ERROR(e.context->AllocateOutput(0, WithFirstDim(in, rows), &out));
  e.output = out;
  TFHVD_RETURN_IF_ERROR(AwaitTensor(c, out.get()));
  return c->Allgatherv(e.input->data(), e.input->size_bytes(), out->mutable_data(), recv_bytes);
}

Status Executor::Broadcast(const Response& r, TensorTableEntry& e, Collectives* c,
                           const ProcessSet& set) {
  const int root = r.params.root_rank;  // a world rank, as in Horovod
  if (backend_->topology().rank == root && e.output->mutable_data() != e.input->data()) {
    TFHVD_RETURN_IF_ERROR(c->ScaledCopy(e.input->data(), e.output->mutable_data(),
                                        e.input->size_bytes(), DataType::kUInt8, 1.0));
  }
  return c->Broadcast(e.output->mutable_data(), e.output->size_bytes(), set.IndexOf(root));
}

Status Executor::Alltoall(const Response& r, TensorTableEntry& e, Collectives* c,
                          const ProcessSet& set) {
  const int size = set.size();
  const int rank = set.rank;
  const Shape& in = e.params.shape;
  const int64_t row_bytes = RowElements(in) * DataTypeSize(e.params.dtype);
  std::vector<int64_t> send_bytes(size), recv_bytes(size);
  int64_t recv_rows = 0;
  std::shared_ptr<Tensor> rsplits;
  TFHVD_RETURN_IF_ERROR(e.context->AllocateOutput(1, Shape{size}, &rsplits));
  int32_t* rs = static_cast<int32_t*>(rsplits->mutable_data());
  for (int j = 0; j < size; ++j) {
    send_bytes[j] = r.sizes[rank * size + j] * row_bytes;
    const int64_t rows = r.sizes[j * size + rank];
    recv_bytes[j] = rows * row_bytes;
    rs[j] = static_cast<int32_t>(rows);
    recv_rows += rows;
  }
  std::shared_ptr<Tensor> out;
  TFHVD_RETURN_IF_ERROR(e.context->AllocateOutput(0, WithFirstDim(in, recv_rows), &out));
  e.output = out;
  TFHVD_RETURN_IF_ERROR(AwaitTensor(c, out.get()));
  return c->Alltoallv(e.input->data(), send_bytes, out->mutable_data(), recv_bytes);
}

Status Executor::Reducescatter(const Response& r, TensorTableEntry& e, Collectives* c,
                               const ProcessSet& set) {
  const CollectiveParams& p = r.params;
  const int size = set.size();
  const int rank = set.rank;
  const int64_t d0 = p.shape[0];
  const int64_t row = RowElements(p.shape);
  std::vector<int64_t> counts(size);
  for (int j = 0; j < size; ++j) counts[j] = (d0 / size + (j < d0 % size ? 1 : 0)) * row;
  std::shared_ptr<Tensor> out;
  TFHVD_RETURN_IF_ERROR(
      e.context->AllocateOutput(0, WithFirstDim(p.shape, counts[rank] / (row ? row : 1)), &out));
  e.output = out;
  TFHVD_RETURN_IF_ERROR(AwaitTensor(c, out.get()));
  const void* send = e.input->data();
  if (p.prescale != 1.0) {
    void* buf = c->FusionBuffer(e.input->size_bytes(), e.context.get());
    TFHVD_RETURN_IF_ERROR(c->ScaledCopy(send, buf, NumElements(p.shape), p.dtype, p.prescale));
    send = buf;
  }
  TFHVD_RETURN_IF_ERROR(
      c->ReduceScatter(send, out->mutable_data(), counts, p.dtype, WireOp(p.reduce_op)));
  return c->ScaledCopy(out->mutable_data(), out->mutable_data(), counts[rank], p.dtype,
                       PostFactor(p, size));
}

Status Executor::Join(const Response& r, TensorTableEntry& e) {
  std::shared_ptr<Tensor> out;
  TFHVD_RETURN_IF_ERROR(e.context->AllocateOutput(0, Shape{}, &out));
  *static_cast<int32_t*>(out->mutable_data()) = r.last_joined_rank;
  e.output = out;
  return Status::OK();
}

SetWorker::SetWorker(Backend* backend, Timeline* timeline, std::shared_ptr<ProcessSet> set,
                     std::function<void()> after_each)
    : executor_(backend, timeline), set_(std::move(set)), after_each_(std::move(after_each)) {
  thread_ = std::thread([this] { Run(); });
}

SetWorker::~SetWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SetWorker::Submit(Response r, std::vector<std::unique_ptr<TensorTableEntry>> entries) {
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.emplace_back(std::move(r), std::move(entries));
  }
  cv_.notify_one();
}

void SetWorker::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [this] { return jobs_.empty() && !busy_; });
}

void SetWorker::Abandon() {
  if (thread_.joinable()) thread_.detach();
}

void SetWorker::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stop_, and nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    l.unlock();
    executor_.Execute(job.first, job.second, *set_);
    job.second.clear();
    if (after_each_) after_each_();
    l.lock();
    busy_ = false;
    if (jobs_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace tfhvd
