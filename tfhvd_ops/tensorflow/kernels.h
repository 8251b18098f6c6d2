// The collective kernels, shared by the CPU registrations (kernels.cc) and,
// in a GPU build, the GPU registrations (gpu_kernels.cc).
//
// Every collective kernel is an AsyncOpKernel: ComputeAsync wraps its tensors
// in the core's Tensor/OpContext interfaces, enqueues them and returns; the
// runtime's loop later fills the outputs and the callback sets the status and
// calls done().  No kernel ever waits for a peer without bound: an op that was
// negotiated alone last time may run the loop on its executor thread for up
// to 100 us without progress before the background thread takes over
// (Runtime::EnqueueInline).  Eager execution, where TensorFlow calls the
// blocking Compute, runs the runtime on the caller's thread until the op is
// done (see Compute).
#ifndef TFHVD_TENSORFLOW_KERNELS_H_
#define TFHVD_TENSORFLOW_KERNELS_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "tensorflow/core/framework/log_memory.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "../core/backend.h"
#include "../core/c_api.h"
#include "../core/runtime.h"

namespace tensorflow {
namespace tfhvd_kernels {

namespace core = ::tfhvd;

// Horovod's classes (its ConvertStatus): ranks that disagree fail with
// FailedPrecondition (the coordinator's error responses), bad local input
// with InvalidArgument, and a runtime that shut down, a peer that left or a
// transport that failed with Unknown (Horovod's SHUT_DOWN_ERROR), which
// tfhvd.common.exceptions.is_internal_error recognises as HorovodInternalError.
inline absl::Status ToTF(const core::Status& st) {
  switch (st.code()) {
    case core::StatusCode::kOk: return absl::OkStatus();
    case core::StatusCode::kInvalidArgument: return errors::InvalidArgument(st.message());
    case core::StatusCode::kFailedPrecondition: return errors::FailedPrecondition(st.message());
    default: return errors::Unknown(st.message());  // kAborted, kInternal
  }
}

inline absl::Status ToCore(DataType dt, core::DataType* out) {
  switch (dt) {
    case DT_UINT8: *out = core::DataType::kUInt8; break;
    case DT_INT8: *out = core::DataType::kInt8; break;
    case DT_UINT16: *out = core::DataType::kUInt16; break;
    case DT_INT16: *out = core::DataType::kInt16; break;
    case DT_INT32: *out = core::DataType::kInt32; break;
    case DT_INT64: *out = core::DataType::kInt64; break;
    case DT_HALF: *out = core::DataType::kFloat16; break;
    case DT_BFLOAT16: *out = core::DataType::kBFloat16; break;
    case DT_FLOAT: *out = core::DataType::kFloat32; break;
    case DT_DOUBLE: *out = core::DataType::kFloat64; break;
    case DT_BOOL: *out = core::DataType::kBool; break;
    default:
      return errors::InvalidArgument("tfhvd does not support dtype ", DataTypeString(dt));
  }
  return absl::OkStatus();
}

inline core::Shape ToCore(const TensorShape& s) {
  core::Shape out;
  for (int i = 0; i < s.dims(); ++i) out.push_back(s.dim_size(i));
  return out;
}

// A TF tensor seen by the core.  An owning TFTensor holds a reference, which
// keeps the buffer alive.  A borrowed one points at a kernel's input, which
// the kernel's context owns until done(): the runtime reads inputs only
// before the entry's callback.  Borrowing adds no reference, so TensorFlow
// can still forward the input's buffer to the output (RefCountIsOne).
class TFTensor : public core::Tensor {
 public:
  explicit TFTensor(const tensorflow::Tensor& t) : own_(t), t_(&own_) { Describe(); }
  static std::shared_ptr<TFTensor> Borrow(const tensorflow::Tensor& t) {
    return std::shared_ptr<TFTensor>(new TFTensor(&t));
  }
  core::DataType dtype() const override { return dtype_; }
  const core::Shape& shape() const override { return shape_; }
  const void* data() const override { return t_->tensor_data().data(); }
  void* mutable_data() override { return const_cast<char*>(t_->tensor_data().data()); }
  int64_t size_bytes() const override { return static_cast<int64_t>(t_->tensor_data().size()); }
  std::shared_ptr<core::ReadyEvent> ready_event() const override { return event_; }
  const tensorflow::Tensor& tf() const { return *t_; }
  // GPU kernels: when TF's stream has produced or allocated the tensor.
  void set_ready_event(std::shared_ptr<core::ReadyEvent> e) { event_ = std::move(e); }

 private:
  explicit TFTensor(const tensorflow::Tensor* borrowed) : t_(borrowed) { Describe(); }
  void Describe() {
    shape_ = ToCore(t_->shape());
    ToCore(t_->dtype(), &dtype_).IgnoreError();
  }

  tensorflow::Tensor own_;        // empty when borrowed
  const tensorflow::Tensor* t_;   // &own_, or the kernel's input
  core::Shape shape_;
  core::DataType dtype_ = core::DataType::kFloat32;
  std::shared_ptr<core::ReadyEvent> event_;
};

// Allocates outputs after negotiation.  `base` offsets the output index for
// grouped ops, where tensor i owns output base + i.
class TFOpContext : public core::OpContext {
 public:
  TFOpContext(OpKernelContext* ctx, int base) : ctx_(ctx), base_(base) {}
  core::Status AllocateOutput(int index, const core::Shape& shape,
                              std::shared_ptr<core::Tensor>* out) override {
    TensorShape ts;
    TFHVD_RETURN_IF_ERROR(Convert(shape, &ts));
    tensorflow::Tensor* t = nullptr;
    absl::Status s = ctx_->allocate_output(base_ + index, ts, &t);
    if (!s.ok()) return core::Status::Internal("allocating an output: " + std::string(s.message()));
    *out = std::make_shared<TFTensor>(*t);
    return core::Status::OK();
  }
  // Output i of an allreduce has the shape of input i.
  core::Status ForwardOrAllocateOutput(int index, const core::Shape& shape,
                                       std::shared_ptr<core::Tensor>* out) override {
    TensorShape ts;
    TFHVD_RETURN_IF_ERROR(Convert(shape, &ts));
    tensorflow::Tensor* t = nullptr;
    absl::Status s =
        ctx_->forward_input_or_allocate_output({base_ + index}, base_ + index, ts, &t);
    if (!s.ok()) return core::Status::Internal("allocating an output: " + std::string(s.message()));
    *out = std::make_shared<TFTensor>(*t);
    return core::Status::OK();
  }
  bool SupportsViews() const override { return true; }
  core::Status AllocateShared(int64_t bytes, std::shared_ptr<core::Tensor>* out) override {
    tensorflow::Tensor t;
    // TensorFlow's CPU allocator aligns to 64 bytes (core::kFusionAlign).
    absl::Status s = ctx_->allocate_temp(DT_INT8, TensorShape({bytes}), &t);
    if (!s.ok()) {
      return core::Status::Internal("allocating a fused output: " + std::string(s.message()));
    }
    *out = std::make_shared<TFTensor>(t);
    return core::Status::OK();
  }
  // A view shares the shared buffer (a TensorFlow sub-buffer): TensorFlow
  // forwards no view to an op that writes in place while another view, or
  // the shared buffer, still references that memory (Tensor::RefCountIsOne).
  core::Status SetOutputView(int index, const core::Tensor& shared, int64_t offset,
                             core::DataType dtype, const core::Shape& shape) override {
    TensorShape ts;
    TFHVD_RETURN_IF_ERROR(Convert(shape, &ts));
    const int64_t bytes = core::NumElements(shape) * core::DataTypeSize(dtype);
    const tensorflow::Tensor slice =
        static_cast<const TFTensor&>(shared).tf().Slice(offset, offset + bytes);
    tensorflow::Tensor view;
    absl::Status s = view.BitcastFrom(slice, ctx_->expected_output_dtype(base_ + index), ts);
    if (!s.ok()) return core::Status::Internal("placing a fused output: " + std::string(s.message()));
    ctx_->set_output(base_ + index, std::move(view));
    return core::Status::OK();
  }

 protected:
  static core::Status Convert(const core::Shape& shape, TensorShape* ts) {
    for (int64_t d : shape) {
      absl::Status s = ts->AddDimWithStatus(d);
      if (!s.ok()) return core::Status::InvalidArgument(std::string(s.message()));
    }
    return core::Status::OK();
  }

  OpKernelContext* ctx_;
  int base_;
};

// Completes a kernel once all `n` of its entries have finished.  Callbacks
// run one at a time on whichever thread runs the runtime's loop (the
// background thread, or the kernel's own, see Runtime::EnqueueInline).
struct Completion {
  Completion(OpKernelContext* c, AsyncOpKernel::DoneCallback d, int n)
      : ctx(c), done(std::move(d)), remaining(n) {}
  void Finish(const core::Status& st) {
    if (!st.ok() && status.ok()) status = ToTF(st);
    if (--remaining == 0) {
      ctx->SetStatus(status);
      finished.store(true);  // sequentially consistent: Runtime::EnqueueInline
      done();
    }
  }
  OpKernelContext* ctx;
  AsyncOpKernel::DoneCallback done;
  std::atomic<int> remaining;
  std::atomic<bool> finished{false};
  absl::Status status;
};

// The collective's name from a tfhvd op's attributes: tensor_name, or the
// node's name (without its scope under ignore_name_scope), and its
// parameters (process set, reduce_op, scale factors, root rank); attributes an
// op lacks keep their defaults.  Shared by the TensorFlow kernels and the XLA
// kernels (xla_ops.cc), so that both name a tensor alike on every rank.
inline absl::Status ReadOpAttrs(OpKernelConstruction* c, std::string* name,
                                core::CollectiveParams* params) {
  bool ignore_name_scope = false;
  if (c->HasAttr("ignore_name_scope")) {
    TF_RETURN_IF_ERROR(c->GetAttr("ignore_name_scope", &ignore_name_scope));
  }
  std::string tensor_name;
  if (c->HasAttr("tensor_name")) TF_RETURN_IF_ERROR(c->GetAttr("tensor_name", &tensor_name));
  *name = tensor_name.empty() ? c->def().name() : tensor_name;
  if (ignore_name_scope) {
    const size_t pos = name->find_last_of('/');
    if (pos != std::string::npos) *name = name->substr(pos + 1);
  }
  if (c->HasAttr("process_set_id")) {
    // Checked when the op runs (Runtime::Enqueue): sets change at run time.
    TF_RETURN_IF_ERROR(c->GetAttr("process_set_id", &params->process_set_id));
  }
  if (c->HasAttr("reduce_op")) {
    int op = 0;
    TF_RETURN_IF_ERROR(c->GetAttr("reduce_op", &op));
    if (op < 0 || op > 5) return errors::InvalidArgument("unknown reduce_op ", op);
    params->reduce_op = static_cast<core::ReduceOp>(op);
  }
  float f;
  if (c->HasAttr("prescale_factor")) {
    TF_RETURN_IF_ERROR(c->GetAttr("prescale_factor", &f));
    params->prescale = f;
  }
  if (c->HasAttr("postscale_factor")) {
    TF_RETURN_IF_ERROR(c->GetAttr("postscale_factor", &f));
    params->postscale = f;
  }
  if (c->HasAttr("root_rank")) TF_RETURN_IF_ERROR(c->GetAttr("root_rank", &params->root_rank));
  return absl::OkStatus();
}

// Entry i of an op's n tensors: the op's name alone, or "<name>_<i+1>of<n>".
inline std::string EntryName(const std::string& base, int i, int n) {
  return n == 1 ? base : base + "_" + std::to_string(i + 1) + "of" + std::to_string(n);
}

// Constant folding (Grappler's, and the graph optimiser's when a function is
// instantiated) runs a kernel whose inputs are all constants once, while the
// graph is optimised, and puts its outputs in the graph as constants: a
// collective would run once and never again (Horovod issue 3229), and after a
// process set's removal or an elastic reset the old result would still come
// back.  Such a run has no step container (Grappler) or the constant-folding
// step id (the graph optimiser).  A collective refuses it, and its node stays
// in the graph.  (Marking the ops stateful would also stop the folding, but
// tf.function then runs them in program order, one at a time: no fusion.)
inline bool BeingConstantFolded(OpKernelContext* ctx) {
  return ctx->step_container() == nullptr ||
         ctx->step_id() == LogMemory::CONSTANT_FOLDING_STEP_ID;
}

inline constexpr char kNotFolded[] = "tfhvd: a collective is not constant-folded";

class HorovodOp : public AsyncOpKernel {
 public:
  explicit HorovodOp(OpKernelConstruction* c, core::CollectiveType type)
      : AsyncOpKernel(c), type_(type) {
    OP_REQUIRES_OK(c, ReadOpAttrs(c, &base_name_, &params_));
    params_.type = type;
  }

  // ComputeAsync only enqueues: running it inline in the executor is cheaper
  // than handing each collective to the inter-op thread pool.
  bool IsExpensive() override { return false; }
  // TensorFlow calls Compute, not ComputeAsync, where its caller blocks until
  // the op is done: eager execution.  Rather than sleep while the background
  // thread runs the collective and then be woken, this thread runs the
  // runtime itself until its op is done (Runtime::Drive explains why that
  // cannot deadlock).  Graph executors call ComputeAsync and never block.
  void Compute(OpKernelContext* ctx) override {
    if (BeingConstantFolded(ctx)) return ctx->SetStatus(errors::Unimplemented(kNotFolded));
    if (!DriveOnCaller()) return AsyncOpKernel::Compute(ctx);
    std::atomic<bool> finished{false};
    absl::Notification notification;
    auto done = [&finished, &notification] {
      finished.store(true);  // sequentially consistent: Runtime::Drive
      notification.Notify();
    };
    core::DriveUntil([&] { ComputeAsync(ctx, done); }, finished);
    notification.WaitForNotification();
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    if (BeingConstantFolded(ctx)) {
      ctx->SetStatus(errors::Unimplemented(kNotFolded));
      return done();
    }
    const int n = NumEntries(ctx);
    auto completion = std::make_shared<Completion>(ctx, std::move(done), n);
    std::vector<core::TensorTableEntry> entries;
    for (int i = 0; i < n; ++i) {
      core::TensorTableEntry e;
      e.name = EntryName(BaseName(), i, n);
      e.params = params_;
      e.context = std::make_shared<TFOpContext>(ctx, i);
      absl::Status s = Prepare(ctx, i, &e);
      if (!s.ok()) {
        ctx->SetStatus(s);
        completion->done();
        return;
      }
      e.callback = [completion](const core::Status& st) { completion->Finish(st); };
      entries.push_back(std::move(e));
    }
    Enqueue(ctx, *completion, std::move(entries));
  }

 protected:
  // Hands the kernel's entries to the runtime; when it refuses them (not
  // initialised, a bad process set) the kernel completes with that error.
  // The runtime may run them on this thread at once (Runtime::EnqueueInline):
  // `ctx` is not touched after a successful enqueue, since done() may have run.
  static void Enqueue(OpKernelContext* ctx, Completion& completion,
                      std::vector<core::TensorTableEntry> entries) {
    core::Status st = core::EnqueueInlineEntries(std::move(entries), completion.finished);
    if (!st.ok()) {
      ctx->SetStatus(ToTF(st));
      completion.done();
    }
  }

  // Whether Compute may run the runtime on the caller's thread.  GPU kernels
  // keep the background thread, which owns the NCCL communicators' streams.
  virtual bool DriveOnCaller() const { return true; }
  // Whether allreduce outputs are left to the executor (TensorTableEntry::
  // output); GPU kernels pre-allocate theirs, so that a ready event covers them.
  virtual bool PlacesOutputsLater() const { return true; }
  virtual int NumEntries(OpKernelContext* ctx) { return ctx->num_inputs(); }

  // Fills the entry for input i: its tensor, shape, dtype, output.
  virtual absl::Status Prepare(OpKernelContext* ctx, int i, core::TensorTableEntry* e) {
    const Tensor& in = ctx->input(i);
    TF_RETURN_IF_ERROR(ToCore(in.dtype(), &e->params.dtype));
    e->params.shape = ToCore(in.shape());
    // Borrowed, so that forward_input_or_allocate_output can forward it.
    e->input = TFTensor::Borrow(in);
    // A host allreduce's output is placed when it runs (OpContext): in the
    // input's buffer, or as a view of the fused buffer.
    if (type_ == core::CollectiveType::kAllreduce && PlacesOutputsLater()) {
      return absl::OkStatus();
    }
    if (type_ == core::CollectiveType::kAllreduce || type_ == core::CollectiveType::kBroadcast) {
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out));
      e->output = std::make_shared<TFTensor>(*out);
    }
    return absl::OkStatus();
  }

  // The collective's name: the tensor_name attribute, or the node's name
  // (without its scope under ignore_name_scope); fixed when the kernel is made.
  const std::string& BaseName() const { return base_name_; }

  core::CollectiveType type_;
  core::CollectiveParams params_;
  std::string base_name_;
};

#define TFHVD_SIMPLE_KERNEL(CLASS, TYPE)                                       \
  class CLASS : public HorovodOp {                                             \
   public:                                                                     \
    explicit CLASS(OpKernelConstruction* c) : HorovodOp(c, TYPE) {}            \
  };

TFHVD_SIMPLE_KERNEL(AllreduceOp, core::CollectiveType::kAllreduce)
TFHVD_SIMPLE_KERNEL(AllgatherOp, core::CollectiveType::kAllgather)
TFHVD_SIMPLE_KERNEL(BroadcastOp, core::CollectiveType::kBroadcast)
TFHVD_SIMPLE_KERNEL(ReducescatterOp, core::CollectiveType::kReducescatter)

class AlltoallOp : public HorovodOp {
 public:
  explicit AlltoallOp(OpKernelConstruction* c) : HorovodOp(c, core::CollectiveType::kAlltoall) {}

 protected:
  int NumEntries(OpKernelContext*) override { return 1; }
  absl::Status Prepare(OpKernelContext* ctx, int i, core::TensorTableEntry* e) override {
    TF_RETURN_IF_ERROR(HorovodOp::Prepare(ctx, i, e));
    const Tensor& splits = ctx->input(1);
    if (splits.dims() > 1) {
      return errors::InvalidArgument("alltoall splits must be a vector, got shape ",
                                     splits.shape().DebugString());
    }
    auto flat = splits.flat<int32>();
    e->params.splits.assign(flat.data(), flat.data() + flat.size());
    return absl::OkStatus();
  }
};

}  // namespace tfhvd_kernels
}  // namespace tensorflow

#endif  // TFHVD_TENSORFLOW_KERNELS_H_
