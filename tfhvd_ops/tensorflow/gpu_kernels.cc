// GPU registrations of the collective kernels, compiled only in a GPU build
// (TFHVD_GPU_OPERATIONS=NCCL); CMake defines TFHVD_GPU_<OP>=1 for each op
// that gets a GPU kernel.  An op without one runs its CPU kernel, with TF
// copying the tensor to the host and back (Horovod's behaviour).
//
// Ordering with TF's compute stream (the op's stream): when the kernel
// starts, a CUDA event is recorded on that stream and attached to the input
// and pre-allocated output; outputs allocated later on the background thread
// get an event recorded right after their allocation.  The NCCL backend makes
// its own stream wait on these events before it touches a tensor, and
// synchronises its stream before the op's callback calls done().
//
// Host or device memory is asked of TF per tensor (input_memory_type,
// output_memory_type), never assumed from the dtype: where TF hands a GPU
// kernel a tensor in host memory (an int32 in some executors, an argument
// the registration declares HostMemory), that entry stays a host entry
// (device -1) and goes over the CPU transport; every rank does the same, so
// ranks agree.
#include "inplace_kernels.h"
#include "kernels.h"

#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"

namespace tensorflow {
namespace tfhvd_kernels {
namespace {

struct GpuStream {
  int device = -1;        // CUDA ordinal (not TF's GPU id)
  void* stream = nullptr; // cudaStream_t
};

absl::Status OpStream(OpKernelContext* ctx, GpuStream* out) {
  DeviceContext* dc = ctx->op_device_context();
  stream_executor::Stream* s = dc != nullptr ? dc->stream() : nullptr;
  if (s == nullptr) {
    return errors::Internal("tfhvd: GPU kernel ", ctx->op_kernel().name(), " has no GPU stream");
  }
  out->device = s->parent()->device_ordinal();
  out->stream = s->platform_specific_handle().stream;
  return absl::OkStatus();
}

// Output allocation after negotiation, followed by an event on TF's stream:
// memory TF just handed out may still be read by work queued on that stream.
class GpuOpContext : public TFOpContext {
 public:
  GpuOpContext(OpKernelContext* ctx, int base, GpuStream stream)
      : TFOpContext(ctx, base), stream_(stream) {}
  // Device outputs are allocated, with their event, before the op runs.
  bool SupportsViews() const override { return false; }
  core::Status AllocateOutput(int index, const core::Shape& shape,
                              std::shared_ptr<core::Tensor>* out) override {
    TFHVD_RETURN_IF_ERROR(TFOpContext::AllocateOutput(index, shape, out));
    if (ctx_->output_memory_type(base_ + index) == HOST_MEMORY) return core::Status::OK();
    std::shared_ptr<core::ReadyEvent> ev;
    TFHVD_RETURN_IF_ERROR(core::RecordReadyEvent(stream_.device, stream_.stream, &ev));
    static_cast<TFTensor*>(out->get())->set_ready_event(std::move(ev));
    return core::Status::OK();
  }
  // The GPU fusion buffer, from TensorFlow's allocator on the op's GPU (the
  // memory TensorFlow reserves), as Horovod does.  Its ready event, on the
  // op's stream, orders the NCCL stream after TensorFlow's last use of it.
  bool HasDeviceAllocator() const override { return true; }
  core::Status AllocateDeviceBuffer(int64_t bytes, std::shared_ptr<core::Tensor>* out) override {
    tensorflow::Tensor t;
    absl::Status s = ctx_->allocate_temp(DT_UINT8, TensorShape({bytes}), &t);
    if (!s.ok()) return core::Status::Internal(std::string(s.message()));
    auto buffer = std::make_shared<TFTensor>(t);
    std::shared_ptr<core::ReadyEvent> ev;
    TFHVD_RETURN_IF_ERROR(core::RecordReadyEvent(stream_.device, stream_.stream, &ev));
    buffer->set_ready_event(std::move(ev));
    *out = std::move(buffer);
    return core::Status::OK();
  }

 private:
  GpuStream stream_;
};

template <class Op>
class GpuOp : public Op {
 public:
  explicit GpuOp(OpKernelConstruction* c) : Op(c) {}

 protected:
  bool DriveOnCaller() const override { return false; }
  bool PlacesOutputsLater() const override { return false; }
  absl::Status Prepare(OpKernelContext* ctx, int i, core::TensorTableEntry* e) override {
    TF_RETURN_IF_ERROR(Op::Prepare(ctx, i, e));
    if (ctx->input_memory_type(i) == HOST_MEMORY) return absl::OkStatus();
    // One ready event per op: a grouped op's entries (prepared in order,
    // from i == 0, on this thread) share the one recorded for its first.
    thread_local OpKernelContext* last_ctx = nullptr;
    thread_local GpuStream s;
    thread_local std::shared_ptr<core::ReadyEvent> ev;
    if (i == 0 || ctx != last_ctx || !ev) {
      last_ctx = nullptr;
      ev.reset();
      TF_RETURN_IF_ERROR(OpStream(ctx, &s));
      TF_RETURN_IF_ERROR(ToTF(core::RecordReadyEvent(s.device, s.stream, &ev)));
      last_ctx = ctx;
    }
    e->params.device = s.device;
    static_cast<TFTensor*>(e->input.get())->set_ready_event(ev);
    if (e->output) static_cast<TFTensor*>(e->output.get())->set_ready_event(ev);
    e->context = std::make_shared<GpuOpContext>(ctx, i, s);
    return absl::OkStatus();
  }
};

#if TFHVD_GPU_ALLREDUCE
REGISTER_KERNEL_BUILDER(Name("HorovodAllreduce").Device(DEVICE_GPU), GpuOp<AllreduceOp>);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllreduce").Device(DEVICE_GPU), GpuOp<AllreduceOp>);
#endif
#if TFHVD_GPU_ALLGATHER
REGISTER_KERNEL_BUILDER(Name("HorovodAllgather").Device(DEVICE_GPU), GpuOp<AllgatherOp>);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllgather").Device(DEVICE_GPU), GpuOp<AllgatherOp>);
#endif
#if TFHVD_GPU_BROADCAST
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcast").Device(DEVICE_GPU), GpuOp<BroadcastOp>);
#endif
#if TFHVD_GPU_ALLTOALL
REGISTER_KERNEL_BUILDER(Name("HorovodAlltoall")
                            .Device(DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("received_splits"),
                        GpuOp<AlltoallOp>);
#endif
#if TFHVD_GPU_BROADCAST
// hvd.broadcast_ of variables on a GPU (an implicitly placed TF1 variable
// included): each variable in device memory becomes a device entry on the
// op's GPU, with a ready event recorded after its buffers were taken (a
// non-root rank's fresh buffer included), so NCCL's stream waits for TF's.
// A variable in host memory (int32) stays a host entry.  One event per
// variable: broadcast_ runs once, at the start of training.
template <class Op>
class GpuInplaceOp : public Op {
 public:
  explicit GpuInplaceOp(OpKernelConstruction* c) : Op(c) {}

 protected:
  bool DriveOnCaller() const override { return false; }
  absl::Status PlaceEntry(OpKernelContext* ctx, int i, core::TensorTableEntry* e) override {
    if (!InDeviceMemory(static_cast<TFTensor*>(e->input.get())->tf())) return absl::OkStatus();
    GpuStream s;
    TF_RETURN_IF_ERROR(OpStream(ctx, &s));
    std::shared_ptr<core::ReadyEvent> ev;
    TF_RETURN_IF_ERROR(ToTF(core::RecordReadyEvent(s.device, s.stream, &ev)));
    e->params.device = s.device;
    static_cast<TFTensor*>(e->input.get())->set_ready_event(ev);
    static_cast<TFTensor*>(e->output.get())->set_ready_event(ev);
    return absl::OkStatus();
  }
};

REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplace").Device(DEVICE_GPU),
                        GpuInplaceOp<BroadcastInplaceRefOp>);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplaceResource")
                            .Device(DEVICE_GPU)
                            .HostMemory("resources"),
                        GpuInplaceOp<BroadcastInplaceResourceOp>);
#endif
#if TFHVD_GPU_REDUCESCATTER
REGISTER_KERNEL_BUILDER(Name("HorovodReducescatter").Device(DEVICE_GPU), GpuOp<ReducescatterOp>);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedReducescatter").Device(DEVICE_GPU),
                        GpuOp<ReducescatterOp>);
#endif

}  // namespace
}  // namespace tfhvd_kernels
}  // namespace tensorflow
