// In-place broadcast of variables (hvd.broadcast_), declared in
// inplace_kernels.h.
//
// Both are asynchronous like every collective kernel (kernels.h): one
// broadcast entry per variable is enqueued and the kernel returns; the last
// entry's callback completes it.  No variable lock is held while the
// collective is in flight, because the callback runs on another thread:
//  - a reference variable is a plain buffer, so the broadcast writes straight
//    into it (what Horovod does);
//  - a resource variable's buffer may be shared with tensors already read
//    from it, which must not change, so non-root ranks receive into a fresh
//    buffer that replaces the variable's under its lock when the broadcast is
//    done (what AssignVariableOp does when the buffer is shared).  The root
//    sends from its current buffer and keeps it.
#include "inplace_kernels.h"

#include <cctype>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tensorflow {
namespace tfhvd_kernels {
namespace {

std::string Normalize(const std::string& name) {
  std::string out = name;
  for (char& ch : out) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = '_';
  }
  return out;
}

}  // namespace

BroadcastInplaceBase::BroadcastInplaceBase(OpKernelConstruction* c)
    : HorovodOp(c, core::CollectiveType::kBroadcast) {
  OP_REQUIRES_OK(c, c->GetAttr("num_variables", &num_variables_));
  OP_REQUIRES_OK(c, c->GetAttr("variable_names", &variable_names_));
  OP_REQUIRES(c, static_cast<int>(variable_names_.size()) == num_variables_,
              errors::InvalidArgument("len(variable_names) needs to be equal to num_variables"));
}

void BroadcastInplaceBase::ComputeAsync(OpKernelContext* ctx, DoneCallback done) {
  auto rt = core::CurrentRuntime();
  OP_REQUIRES_ASYNC(ctx, rt != nullptr, errors::FailedPrecondition(core::kNotInitialized), done);
  const int size = rt->topology().size;
  OP_REQUIRES_ASYNC(ctx, params_.root_rank >= 0 && params_.root_rank < size,
                    errors::InvalidArgument("broadcast_ root_rank ", params_.root_rank,
                                            " is out of range for ", size, " ranks"),
                    done);
  const bool root = rt->topology().rank == params_.root_rank;
  auto completion = std::make_shared<Completion>(ctx, std::move(done), num_variables_);
  std::vector<core::TensorTableEntry> entries;
  for (int i = 0; i < num_variables_; ++i) {
    core::TensorTableEntry e;
    e.name = BaseName() + "_" + std::to_string(i + 1) + "of" + std::to_string(num_variables_) +
             "_" + Normalize(VariableName(ctx, i));
    e.params = params_;
    e.context = std::make_shared<TFOpContext>(ctx, i);
    std::function<void()> commit;
    absl::Status s = PrepareVariable(ctx, i, root, &e, &commit);
    if (s.ok()) s = PlaceEntry(ctx, i, &e);
    if (!s.ok()) {
      ctx->SetStatus(s);
      completion->done();
      return;
    }
    e.callback = [completion, commit](const core::Status& st) {
      if (st.ok() && commit) commit();
      completion->Finish(st);
    };
    entries.push_back(std::move(e));
  }
  Enqueue(ctx, *completion, std::move(entries));
}

absl::Status BroadcastInplaceBase::Describe(const Tensor& t, core::TensorTableEntry* e) {
  absl::Status s = ToCore(t.dtype(), &e->params.dtype);
  if (!s.ok()) {
    return errors::InvalidArgument("tfhvd broadcast_ does not support dtype ",
                                   DataTypeString(t.dtype()));
  }
  e->params.shape = ToCore(t.shape());
  return absl::OkStatus();
}

absl::Status BroadcastInplaceRefOp::PrepareVariable(OpKernelContext* ctx, int i, bool,
                                                    core::TensorTableEntry* e,
                                                    std::function<void()>*) {
  Tensor t = ctx->mutable_input(i, /*lock_held=*/false);
  if (!t.IsInitialized()) {
    return errors::FailedPrecondition("broadcast_ of an uninitialized variable '",
                                      variable_names_[i], "'");
  }
  TF_RETURN_IF_ERROR(Describe(t, e));
  ctx->forward_ref_input_to_ref_output(i, i);
  e->input = std::make_shared<TFTensor>(t);
  e->output = e->input;  // the variable's own buffer, on every rank
  return absl::OkStatus();
}

std::string BroadcastInplaceResourceOp::VariableName(OpKernelContext* ctx, int i) {
  // Horovod's fallback when Python gave no name: the handle's name.
  return variable_names_[i].empty() ? HandleFromInput(ctx, i).name() : variable_names_[i];
}

absl::Status BroadcastInplaceResourceOp::PrepareVariable(OpKernelContext* ctx, int i, bool root,
                                                         core::TensorTableEntry* e,
                                                         std::function<void()>* commit) {
  ::tensorflow::core::RefCountPtr<Var> var;
  TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, i), &var));
  Tensor current;
  {
    tf_shared_lock l(*var->mu());
    if (!var->is_initialized) {
      return errors::FailedPrecondition("broadcast_ of an uninitialized variable '",
                                        VariableName(ctx, i), "'");
    }
    current = *var->tensor();
  }
  TF_RETURN_IF_ERROR(Describe(current, e));
  e->input = std::make_shared<TFTensor>(current);
  if (root) {
    e->output = e->input;  // sent from the variable's buffer, which stays
    return absl::OkStatus();
  }
  // The fresh buffer is allocated where the variable lives (a GPU
  // variable's device, or host memory for a host one).
  Tensor fresh;
  AllocatorAttributes attr;
  attr.set_on_host(!InDeviceMemory(current));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(current.dtype(), current.shape(), &fresh, attr));
  e->output = std::make_shared<TFTensor>(fresh);
  Var* raw = var.release();  // the callback owns this reference
  auto holder = std::shared_ptr<Var>(raw, [](Var* v) { v->Unref(); });
  *commit = [holder, fresh]() {
    mutex_lock l(*holder->mu());
    *holder->tensor() = fresh;
  };
  return absl::OkStatus();
}

REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplace").Device(DEVICE_CPU), BroadcastInplaceRefOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcastInplaceResource").Device(DEVICE_CPU),
                        BroadcastInplaceResourceOp);

}  // namespace tfhvd_kernels
}  // namespace tensorflow
