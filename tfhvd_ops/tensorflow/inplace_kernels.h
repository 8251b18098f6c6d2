// In-place broadcast of variables (hvd.broadcast_): Horovod's
// HorovodBroadcastInplace (TF1 reference variables) and
// HorovodBroadcastInplaceResource (resource variables).  The kernels are
// defined in inplace_kernels.cc; gpu_kernels.cc registers them for GPUs
// through PlaceEntry.
#ifndef TFHVD_TENSORFLOW_INPLACE_KERNELS_H_
#define TFHVD_TENSORFLOW_INPLACE_KERNELS_H_

#include <functional>
#include <string>
#include <vector>

#include "kernels.h"

namespace tensorflow {
namespace tfhvd_kernels {

// Whether a variable's buffer is device memory: what its allocator says, or,
// where it does not say, TensorFlow's rule for a GPU kernel's arguments
// (int32 lives in host memory).
inline bool InDeviceMemory(const Tensor& t) {
  const AllocatorMemoryType m = t.GetMemoryType();
  if (m != AllocatorMemoryType::kUnknown) return m == AllocatorMemoryType::kDevice;
  return MTypeFromDType(t.dtype()) == DEVICE_MEMORY;
}

class BroadcastInplaceBase : public HorovodOp {
 public:
  explicit BroadcastInplaceBase(OpKernelConstruction* c);
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override;

 protected:
  // Fills e's input and output for variable i; `commit` (may stay empty) runs
  // after a successful broadcast.
  virtual absl::Status PrepareVariable(OpKernelContext* ctx, int i, bool root,
                                       core::TensorTableEntry* e,
                                       std::function<void()>* commit) = 0;
  virtual std::string VariableName(OpKernelContext* ctx, int i) { return variable_names_[i]; }
  // Where entry i's buffers live once prepared: the CPU kernels leave it a
  // host entry; the GPU registration (gpu_kernels.cc) puts a variable in
  // device memory on the op's GPU, after TF's stream.
  virtual absl::Status PlaceEntry(OpKernelContext* ctx, int i, core::TensorTableEntry* e) {
    return absl::OkStatus();
  }
  absl::Status Describe(const Tensor& t, core::TensorTableEntry* e);

  int num_variables_ = 0;
  std::vector<std::string> variable_names_;
};

class BroadcastInplaceRefOp : public BroadcastInplaceBase {
 public:
  explicit BroadcastInplaceRefOp(OpKernelConstruction* c) : BroadcastInplaceBase(c) {}

 protected:
  absl::Status PrepareVariable(OpKernelContext* ctx, int i, bool root, core::TensorTableEntry* e,
                               std::function<void()>* commit) override;
};

class BroadcastInplaceResourceOp : public BroadcastInplaceBase {
 public:
  explicit BroadcastInplaceResourceOp(OpKernelConstruction* c) : BroadcastInplaceBase(c) {}

 protected:
  std::string VariableName(OpKernelContext* ctx, int i) override;
  absl::Status PrepareVariable(OpKernelContext* ctx, int i, bool root, core::TensorTableEntry* e,
                               std::function<void()>* commit) override;
};

}  // namespace tfhvd_kernels
}  // namespace tensorflow

#endif  // TFHVD_TENSORFLOW_INPLACE_KERNELS_H_
