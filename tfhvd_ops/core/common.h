// Core types shared by every layer of the tfhvd runtime.
//
// This header is framework-free: it never includes a TensorFlow (or MPI)
// header.  Frameworks plug in by implementing `Tensor` and `OpContext`; the
// runtime only ever sees these interfaces (Horovod's common.h does the same).
#ifndef TFHVD_CORE_COMMON_H_
#define TFHVD_CORE_COMMON_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tfhvd {

// Errors are values.  Every fallible call returns a Status; the TF adapter
// turns a non-OK status into an op error that Python raises.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // bad input or ranks that disagree
  kAborted = 2,           // runtime shut down, a peer left
  kInternal = 3,          // transport failure
  kFailedPrecondition = 4 // e.g. not initialised
};

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::kInvalidArgument, std::move(m));
  }
  static Status Aborted(std::string m) {
    return Status(StatusCode::kAborted, std::move(m));
  }
  static Status Internal(std::string m) {
    return Status(StatusCode::kInternal, std::move(m));
  }
  static Status FailedPrecondition(std::string m) {
    return Status(StatusCode::kFailedPrecondition, std::move(m));
  }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode c, std::string m) : code_(c), message_(std::move(m)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define TFHVD_RETURN_IF_ERROR(expr)      \
  do {                                   \
    ::tfhvd::Status _st = (expr);        \
    if (!_st.ok()) return _st;           \
  } while (0)

// Values match the order used by the TF adapter's dtype table.
enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
};

int64_t DataTypeSize(DataType dt);
const char* DataTypeName(DataType dt);
bool IsFloatingPoint(DataType dt);

// Horovod's integer values, kept so graphs that carry a `reduce_op` attr keep
// their meaning.
enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};
const char* ReduceOpName(ReduceOp op);

enum class CollectiveType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kJoin = 5,
  kBarrier = 6,
  // Process-set changes, negotiated on the global set like a collective
  // (params.splits: the set's world ranks; params.root_rank: the id).
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};
const char* CollectiveName(CollectiveType t);

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& s);
std::string ShapeString(const Shape& s);

// A point on a framework's device stream (a CUDA event) after which a device
// tensor may be read or written.  Host tensors have none.  Only the device
// Collectives look inside (Collectives::WaitFor); the core just passes it on.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  virtual int device() const = 0;     // GPU ordinal the event belongs to
  virtual void* handle() const = 0;   // e.g. a cudaEvent_t
};

// Records a ReadyEvent on `stream` (a cudaStream_t, or null for the legacy
// default stream) of GPU `device`; the calling thread's current device is
// left as it was.  An adapter records one on its compute stream when a
// tensor is ready and attaches it to the tensor (Tensor::ready_event); the
// device Collectives make their stream wait on it.  Declared here, defined
// by the device backend a GPU build links (backends/nccl/gpu_events.cc), so
// a framework adapter names no backend and includes no CUDA header.
Status RecordReadyEvent(int device, void* stream, std::shared_ptr<ReadyEvent>* out);

// A framework tensor, seen by the core as bytes plus metadata.
class Tensor {
 public:
  virtual ~Tensor() = default;
  virtual DataType dtype() const = 0;
  virtual const Shape& shape() const = 0;
  virtual const void* data() const = 0;
  virtual void* mutable_data() = 0;
  virtual int64_t size_bytes() const = 0;
  // Device tensors: when the framework's stream has produced (inputs) or
  // allocated (outputs) this tensor.  Null: ready now.
  virtual std::shared_ptr<ReadyEvent> ready_event() const { return nullptr; }
};

// Byte alignment of each tensor in a fused buffer: every rank lays a fused
// response out alike, and an output that views the buffer (OpContext::
// SetOutputView) starts aligned for the framework's kernels.
constexpr int64_t kFusionAlign = 64;

// The framework side of one op invocation: allocates outputs whose shape is
// only known after negotiation (allgather, alltoall, reducescatter), and
// places allreduce outputs that were left to the executor
// (TensorTableEntry::output null).
class OpContext {
 public:
  virtual ~OpContext() = default;
  virtual Status AllocateOutput(int index, const Shape& shape,
                                std::shared_ptr<Tensor>* out) = 0;
  // Output `index` in the buffer of input `index` where the framework allows
  // it (nothing else reads that input), else a fresh tensor.
  virtual Status ForwardOrAllocateOutput(int index, const Shape& shape,
                                         std::shared_ptr<Tensor>* out) {
    return AllocateOutput(index, shape, out);
  }
  // Device memory of `bytes` on the op's GPU from the framework's own
  // allocator, alive while *out is held: the GPU fusion buffer comes from
  // here, so it lies inside the memory the framework reserves (TensorFlow
  // takes nearly the whole GPU by default) instead of beside it.  Where
  // HasDeviceAllocator() is false the caller allocates the memory itself.
  virtual bool HasDeviceAllocator() const { return false; }
  virtual Status AllocateDeviceBuffer(int64_t bytes, std::shared_ptr<Tensor>* out) {
    return Status::FailedPrecondition("tfhvd: internal error: no device allocator here");
  }
  // Whether outputs can be views of a shared buffer (the two calls below).
  virtual bool SupportsViews() const { return false; }
  // A host buffer of `bytes`, aligned to kFusionAlign, whose parts can
  // become outputs of this op and of other ops of the same framework.
  virtual Status AllocateShared(int64_t bytes, std::shared_ptr<Tensor>* out) {
    return Status::FailedPrecondition("tfhvd: internal error: no shared outputs here");
  }
  // Makes output `index` the `dtype` tensor of `shape` that starts at byte
  // `offset` (a multiple of kFusionAlign) of `shared`, without a copy.
  virtual Status SetOutputView(int index, const Tensor& shared, int64_t offset, DataType dtype,
                               const Shape& shape) {
    return Status::FailedPrecondition("tfhvd: internal error: no shared outputs here");
  }
};

using StatusCallback = std::function<void(const Status&)>;

// How ranks exchange negotiation messages (see backends/tcp/tcp_control.h).
enum class ControlKind : int {
  kTcp = 0,  // TCP sockets: a waiting rank sleeps until a message arrives
  kMpi = 1,  // MPI messages: a waiting rank polls with growing sleeps
};

// Parameters of one collective call, exactly as the caller gave them.  This
// is what ranks compare during negotiation.
struct CollectiveParams {
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  Shape shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root_rank = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t device = -1;           // -1: host memory; >= 0: GPU ordinal
  std::vector<int32_t> splits;   // alltoall only
  int32_t process_set_id = 0;    // 0: the global set (every rank)
};

// One locally submitted collective waiting for the other ranks.
struct TensorTableEntry {
  std::string name;
  CollectiveParams params;
  std::shared_ptr<Tensor> input;    // absent for join/barrier
  // Pre-allocated when the shape is known; a host allreduce may leave it
  // null, for the executor to place (OpContext: forwarded, or a view of the
  // fused buffer).
  std::shared_ptr<Tensor> output;
  std::shared_ptr<OpContext> context;
  StatusCallback callback;
  // When the framework handed the entry over (for the timeline's QUEUE span).
  std::chrono::steady_clock::time_point enqueued;
  // How many entries were handed over with this one (one grouped op's).
  int32_t group_size = 1;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_COMMON_H_
