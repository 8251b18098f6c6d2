// tfhvd's allreduces inside XLA-compiled functions (tf.function(jit_compile=
// True)) on the CPU, as Horovod's XLA ops did on the GPU: the op's XLA kernel
// lowers HorovodAllreduce and HorovodGroupedAllreduce to one XLA custom call
// ("tfhvd_allreduce", XLA's typed FFI), and the call hands the compiled
// program's buffers to the runtime as ordinary entries (negotiated, fused and
// reduced like any other) and returns once they are reduced.  A failure is
// the custom call's error, so the function raises it with tfhvd's message.
//
// Names and parameters: read from the op's attributes as the TensorFlow
// kernel reads them (kernels.h ReadOpAttrs, EntryName), so every rank's
// compiled program agrees with the other ranks' kernels.
//
// The kernels are registered for XLA's CPU device only: the custom call has
// a host implementation alone, and XLA:GPU would fail on it.  Python lets a
// collective into a compiled function only where this library has them
// (tfhvd_xla_ops_built), the setting allows it (TFHVD_ENABLE_XLA_OPS) and no
// GPU is visible (tfhvd/tensorflow/xla.py); otherwise it raises its own error.
//
// Built when TensorFlow's XLA headers compile here (CMakeLists.txt: they need
// highwayhash and farmhash, which TensorFlow's wheel leaves out); it links
// libtensorflow_cc, which every TensorFlow process has loaded.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"

namespace tensorflow {
namespace tfhvd_kernels {
namespace {

namespace ffi = ::xla::ffi;

constexpr const char* kTarget = "tfhvd_allreduce";

// A compiled program's buffer as a runtime tensor (borrowed: the program
// owns it until the custom call returns).
class XlaBuffer : public core::Tensor {
 public:
  XlaBuffer(void* data, core::DataType dtype, core::Shape shape)
      : data_(data), dtype_(dtype), shape_(std::move(shape)) {}
  core::DataType dtype() const override { return dtype_; }
  const core::Shape& shape() const override { return shape_; }
  const void* data() const override { return data_; }
  void* mutable_data() override { return data_; }
  int64_t size_bytes() const override {
    return core::NumElements(shape_) * core::DataTypeSize(dtype_);
  }

 private:
  void* data_;
  core::DataType dtype_;
  core::Shape shape_;
};

core::Shape Dims(const ffi::AnyBuffer& b) {
  core::Shape s;
  for (int64_t d : b.dimensions()) s.push_back(d);
  return s;
}

// The custom call: every operand allreduced into its result, as one group.
ffi::Error Allreduce(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                     int32_t dtype, int32_t reduce_op, double prescale, double postscale,
                     int32_t process_set_id) {
  const size_t n = args.size();
  if (n == 0 || rets.size() != n) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "tfhvd: internal error: an XLA allreduce with mismatched buffers");
  }
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    size_t left;
    core::Status first;
    std::atomic<bool> done{false};
  };
  auto wait = std::make_shared<Wait>();
  wait->left = n;
  std::vector<core::TensorTableEntry> entries;
  for (size_t i = 0; i < n; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> in = args.get<ffi::AnyBuffer>(i);
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> out = rets.get<ffi::AnyBuffer>(i);
    if (in.has_error()) return in.error();
    if (out.has_error()) return out.error();
    core::TensorTableEntry e;
    e.name = EntryName(std::string(name), static_cast<int>(i), static_cast<int>(n));
    e.params.type = core::CollectiveType::kAllreduce;
    e.params.dtype = static_cast<core::DataType>(dtype);
    e.params.shape = Dims(*in);
    e.params.reduce_op = static_cast<core::ReduceOp>(reduce_op);
    e.params.prescale = prescale;
    e.params.postscale = postscale;
    e.params.process_set_id = process_set_id;
    e.input = std::make_shared<XlaBuffer>(in->untyped_data(), e.params.dtype, e.params.shape);
    e.output =
        std::make_shared<XlaBuffer>((*out)->untyped_data(), e.params.dtype, e.params.shape);
    e.callback = [wait](const core::Status& st) {
      std::lock_guard<std::mutex> l(wait->mu);
      if (!st.ok() && wait->first.ok()) wait->first = st;
      if (--wait->left == 0) {
        wait->done.store(true);  // sequentially consistent: Runtime::Drive
        wait->cv.notify_all();
      }
    };
    e.group_size = static_cast<int32_t>(n);
    entries.push_back(std::move(e));
  }
  // As the eager kernel does: this thread runs the runtime until its
  // entries are done, where it may (Runtime::Drive), else waits.
  core::Status enqueued;
  core::DriveUntil([&] { enqueued = core::EnqueueEntries(std::move(entries)); }, wait->done);
  core::Status st = enqueued;
  if (st.ok()) {
    std::unique_lock<std::mutex> l(wait->mu);
    wait->cv.wait(l, [&] { return wait->left == 0; });
    st = wait->first;
  }
  if (st.ok()) return ffi::Error::Success();
  const absl::Status tf = ToTF(st);
  return ffi::Error(static_cast<ffi::ErrorCode>(tf.code()), std::string(tf.message()));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllreduceHandler, Allreduce,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int32_t>("dtype")
                                  .Attr<int32_t>("reduce_op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int32_t>("process_set_id"));

// An MLIR string literal (the custom call's attributes are an MLIR
// dictionary).
std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Float(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // MLIR wants a float literal
  return s;
}

// HorovodAllreduce and HorovodGroupedAllreduce under XLA.
class XlaAllreduce : public XlaOpKernel {
 public:
  explicit XlaAllreduce(OpKernelConstruction* c) : XlaOpKernel(c) {
    OP_REQUIRES_OK(c, ReadOpAttrs(c, &name_, &params_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    core::DataType dtype = core::DataType::kFloat32;
    OP_REQUIRES_OK(ctx, ToCore(ctx->input_type(0), &dtype));
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> shapes;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<xla::Shape> shape = ctx->InputXlaShape(i);
      OP_REQUIRES_OK(ctx, shape.status());
      OP_REQUIRES(ctx, shape->is_static(),
                  errors::InvalidArgument("tfhvd allreduce '", name_,
                                          "' under XLA needs a static shape; got ",
                                          shape->ToString()));
      operands.push_back(ctx->Input(i));
      shapes.push_back(*shape);
    }
    const std::string attrs =
        "{name = " + Quoted(name_) + ", dtype = " + std::to_string(static_cast<int>(dtype)) +
        " : i32, reduce_op = " + std::to_string(static_cast<int>(params_.reduce_op)) +
        " : i32, prescale = " + Float(params_.prescale) + " : f64, postscale = " +
        Float(params_.postscale) + " : f64, process_set_id = " +
        std::to_string(params_.process_set_id) + " : i32}";
    const xla::Shape result = n == 1 ? shapes[0] : xla::ShapeUtil::MakeTupleShape(shapes);
    xla::XlaOp call = xla::CustomCall(ctx->builder(), kTarget, operands, result, attrs,
                                      /*has_side_effect=*/true, /*output_operand_aliasing=*/{},
                                      /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
                                      xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    if (n == 1) {
      ctx->SetOutput(0, call);
      return;
    }
    for (int i = 0; i < n; ++i) ctx->SetOutput(i, xla::GetTupleElement(call, i));
  }

 private:
  std::string name_;               // as the TensorFlow kernel names it (ReadOpAttrs)
  core::CollectiveParams params_;  // reduce_op, scale factors, process set
};

REGISTER_XLA_OP(Name("HorovodAllreduce").Device(DEVICE_CPU_XLA_JIT), XlaAllreduce);
REGISTER_XLA_OP(Name("HorovodGroupedAllreduce").Device(DEVICE_CPU_XLA_JIT), XlaAllreduce);

// XLA makes the JIT device's kernels of the ops registered with REGISTER_XLA_OP
// once per process, the first time TensorFlow runs anything (one eager op is
// enough).  A library loaded later, as this one is (hvd.init(), after the
// user's first tensors), would find its XLA ops missing from the compiled
// functions: "No registered 'HorovodAllreduce' OpKernel for XLA_CPU_JIT".  So
// when the library loads after XLA made them (its own Identity has a JIT
// kernel), it registers the JIT kernels of its two ops itself, as XLA would
// have: the op's dtypes, the XLA kernel's factory.
OpKernel* MakeXlaAllreduce(OpKernelConstruction* c) { return new XlaAllreduce(c); }

class LateJitKernels {
 public:
  LateJitKernels() {
    // KernelsRegisteredForOp lists each kernel as "device='...'".
    if (KernelsRegisteredForOp("Identity").find(DEVICE_CPU_XLA_JIT) == std::string::npos) {
      return;  // XLA will make them with its own, this library's included
    }
    for (const char* op : {"HorovodAllreduce", "HorovodGroupedAllreduce"}) {
      const KernelDef* kdef =
          KernelDefBuilder(op)
              .Device(DEVICE_CPU_XLA_JIT)
              .TypeConstraint("T", {DT_UINT8, DT_INT8, DT_UINT16, DT_INT16, DT_INT32, DT_INT64,
                                    DT_HALF, DT_BFLOAT16, DT_FLOAT, DT_DOUBLE})
              .Build();
      // The registrar owns the KernelDef from here.
      registrars_.push_back(std::make_unique<kernel_factory::OpKernelRegistrar>(
          kdef, "XlaAllreduce", &MakeXlaAllreduce));
    }
  }

 private:
  std::vector<std::unique_ptr<kernel_factory::OpKernelRegistrar>> registrars_;
};

LateJitKernels late_jit_kernels;

}  // namespace
}  // namespace tfhvd_kernels
}  // namespace tensorflow

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), tensorflow::tfhvd_kernels::kTarget, "Host",
                         tensorflow::tfhvd_kernels::kAllreduceHandler);

// Present only in a library built with the XLA ops (Python checks for it).
extern "C" int tfhvd_xla_ops_built(void) { return 1; }
