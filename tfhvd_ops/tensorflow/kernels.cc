// CPU registrations of the collective kernels (kernels.h), and the kernels
// that need no device (join, barrier and the topology queries), registered
// for CPUs and GPUs.
#include "kernels.h"

namespace tensorflow {
namespace tfhvd_kernels {

// Join and barrier have no tensor: one entry under a fixed name.
class NoTensorOp : public HorovodOp {
 public:
  NoTensorOp(OpKernelConstruction* c, core::CollectiveType t, const char* name)
      : HorovodOp(c, t), fixed_name_(name) {}

 protected:
  int NumEntries(OpKernelContext*) override { return 1; }
  absl::Status Prepare(OpKernelContext*, int, core::TensorTableEntry* e) override {
    e->name = fixed_name_;
    e->params.dtype = core::DataType::kInt32;
    return absl::OkStatus();
  }
  const char* fixed_name_;
};

class JoinOp : public NoTensorOp {
 public:
  explicit JoinOp(OpKernelConstruction* c)
      : NoTensorOp(c, core::CollectiveType::kJoin, "join.noname") {}
};
class BarrierOp : public NoTensorOp {
 public:
  explicit BarrierOp(OpKernelConstruction* c)
      : NoTensorOp(c, core::CollectiveType::kBarrier, "barrier.noname") {}
};

// Size, rank and membership of a process set (process_set_id attr).
class SetTopologyOp : public OpKernel {
 public:
  enum What { kSize, kRank, kIncluded };
  SetTopologyOp(OpKernelConstruction* c, What what) : OpKernel(c), what_(what) {
    if (c->HasAttr("process_set_id")) OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &id_));
  }
  void Compute(OpKernelContext* ctx) override {
    auto rt = core::CurrentRuntime();
    OP_REQUIRES(ctx, rt != nullptr, errors::FailedPrecondition(core::kNotInitialized));
    auto set = rt->FindSet(id_);
    OP_REQUIRES(ctx, set != nullptr,
                errors::InvalidArgument("tfhvd: process set ", id_,
                                        " does not exist, or has been removed"));
    OP_REQUIRES(ctx, what_ != kRank || set->included(),
                errors::InvalidArgument("tfhvd: rank ", rt->topology().rank,
                                        " is not a member of process set ", id_));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32>()() =
        what_ == kSize ? set->size() : what_ == kRank ? set->rank : (set->included() ? 1 : 0);
  }

 private:
  What what_;
  int id_ = 0;
};

// Every kernel of this file also has a GPU registration, as Horovod gives
// them: a TF1 graph that places them under tf.device('/gpu:0') without soft
// placement runs.  Their outputs stay in host memory (TF would otherwise
// hand out device memory and the kernels write it from the host).  The GPU
// registrations cost nothing in a CPU build or a CPU-only TensorFlow.
#define TFHVD_SET_TOPOLOGY_KERNEL(CLASS, NAME, OUT, WHAT)                           \
  class CLASS : public SetTopologyOp {                                             \
   public:                                                                         \
    explicit CLASS(OpKernelConstruction* c) : SetTopologyOp(c, WHAT) {}            \
  };                                                                               \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_CPU), CLASS);                   \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_GPU).HostMemory(OUT), CLASS);

TFHVD_SET_TOPOLOGY_KERNEL(SizeOp, "HorovodSize", "size", kSize)
TFHVD_SET_TOPOLOGY_KERNEL(RankOp, "HorovodRank", "rank", kRank)
TFHVD_SET_TOPOLOGY_KERNEL(IncludedOp, "HorovodProcessSetIncluded", "included", kIncluded)

// Local size and rank: synchronous scalars read from the runtime.
class TopologyOp : public OpKernel {
 public:
  TopologyOp(OpKernelConstruction* c, int (*get)(const core::Topology&))
      : OpKernel(c), get_(get) {}
  void Compute(OpKernelContext* ctx) override {
    auto rt = core::CurrentRuntime();
    OP_REQUIRES(ctx, rt != nullptr, errors::FailedPrecondition(core::kNotInitialized));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32>()() = get_(rt->topology());
  }

 private:
  int (*get_)(const core::Topology&);
};

#define TFHVD_TOPOLOGY_KERNEL(CLASS, NAME, OUT, EXPR)                              \
  class CLASS : public TopologyOp {                                                \
   public:                                                                         \
    explicit CLASS(OpKernelConstruction* c)                                        \
        : TopologyOp(c, [](const core::Topology& t) { return EXPR; }) {}           \
  };                                                                               \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_CPU), CLASS);                   \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_GPU).HostMemory(OUT), CLASS);

TFHVD_TOPOLOGY_KERNEL(LocalSizeOp, "HorovodLocalSize", "local_size", t.local_size)
TFHVD_TOPOLOGY_KERNEL(LocalRankOp, "HorovodLocalRank", "local_rank", t.local_rank)

// The benchmark reference of ops.cc: TensorFlow's own cost of an asynchronous node.
class AsyncIdentityOp : public AsyncOpKernel {
 public:
  explicit AsyncIdentityOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ctx->set_output(0, ctx->input(0));
    done();
  }
};
REGISTER_KERNEL_BUILDER(Name("TfhvdAsyncIdentity").Device(DEVICE_CPU), AsyncIdentityOp);

REGISTER_KERNEL_BUILDER(Name("HorovodAllreduce").Device(DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllreduce").Device(DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodAllgather").Device(DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllgather").Device(DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcast").Device(DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("HorovodAlltoall").Device(DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("HorovodReducescatter").Device(DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedReducescatter").Device(DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("HorovodJoin").Device(DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBarrier").Device(DEVICE_CPU), BarrierOp);

// On a GPU, join and barrier leave the runtime to its own thread, which owns
// the NCCL streams: while a rank is joined, its share of the other ranks'
// GPU collectives runs there, never on a TF thread.
template <class Op>
class OnRuntimeThread : public Op {
 public:
  explicit OnRuntimeThread(OpKernelConstruction* c) : Op(c) {}

 protected:
  bool DriveOnCaller() const override { return false; }
};
REGISTER_KERNEL_BUILDER(Name("HorovodJoin").Device(DEVICE_GPU).HostMemory("output"),
                        OnRuntimeThread<JoinOp>);
REGISTER_KERNEL_BUILDER(Name("HorovodBarrier").Device(DEVICE_GPU), OnRuntimeThread<BarrierOp>);

}  // namespace tfhvd_kernels
}  // namespace tensorflow
