// Op definitions.  The names, inputs, outputs and attrs are Horovod's, so a
// graph or SavedModel that holds Horovod ops loads and runs with tfhvd.  The
// dtype lists are Horovod's plus bfloat16 (and int16/uint16 for reductions,
// which tfhvd's CPU backends reduce with wrapping arithmetic).  `tensor_name` (absent in
// Horovod, defaulted so Horovod graphs still load) carries the user's name in
// eager mode, where TensorFlow drops op names.  Kernels live in kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

#define TFHVD_REDUCE_TYPES \
  "T: {uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64}"
#define TFHVD_ALL_TYPES \
  "T: {uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool}"

// Output i has the shape of input i with the first dimension unknown.
Status FirstDimUnknown(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) {
    ShapeHandle in = c->input(i < c->num_inputs() ? i : 0);
    if (!c->RankKnown(in) || c->Rank(in) == 0) {
      c->set_output(i, c->UnknownShape());
      continue;
    }
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

Status AllUnchanged(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

REGISTER_OP("HorovodAllreduce")
    .Attr(TFHVD_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    .SetShapeFn(shape_inference::UnchangedShape);

REGISTER_OP("HorovodGroupedAllreduce")
    .Attr(TFHVD_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("sum: num_tensors*T")
    .SetShapeFn(AllUnchanged);

REGISTER_OP("HorovodAllgather")
    .Attr(TFHVD_ALL_TYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown);

REGISTER_OP("HorovodGroupedAllgather")
    .Attr(TFHVD_ALL_TYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("outputs: num_tensors*T")
    .SetShapeFn(FirstDimUnknown);

REGISTER_OP("HorovodBroadcast")
    .Attr(TFHVD_ALL_TYPES)
    .Attr("root_rank: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(shape_inference::UnchangedShape);

// In-place broadcasts (hvd.broadcast_): Horovod's two ops, for TF1 reference
// variables and for resource variables.  Kernels: inplace_kernels.cc.
REGISTER_OP("HorovodBroadcastInplace")
    .Attr("T: {uint8, int8, int32, int64, float16, float32, float64, bool}")
    .Attr("root_rank: int")
    .Attr("process_set_id: int = 0")
    .Attr("num_variables: int")
    .Attr("variable_names: list(string)")
    .Attr("tensor_name: string = ''")
    .Input("tensor_refs: Ref(num_variables * T)")
    .Output("output_refs: Ref(num_variables * T)")
    .SetShapeFn(AllUnchanged);

REGISTER_OP("HorovodBroadcastInplaceResource")
    .Attr("root_rank: int")
    .Attr("process_set_id: int = 0")
    .Attr("num_variables: int")
    .Attr("variable_names: list(string)")
    .Attr("tensor_name: string = ''")
    .Input("resources: num_variables * resource")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("HorovodAlltoall")
    .Attr(TFHVD_ALL_TYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in = c->input(0);
      if (c->RankKnown(in) && c->Rank(in) > 0) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
        c->set_output(0, out);
      } else {
        c->set_output(0, c->UnknownShape());
      }
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("HorovodReducescatter")
    .Attr(TFHVD_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(FirstDimUnknown);

REGISTER_OP("HorovodGroupedReducescatter")
    .Attr(TFHVD_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("outputs: num_tensors*T")
    .SetShapeFn(FirstDimUnknown);

REGISTER_OP("HorovodJoin")
    .Output("output: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_OP("HorovodBarrier")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

#define TFHVD_TOPOLOGY_OP(NAME, OUT)      \
  REGISTER_OP(NAME)                       \
      .Output(OUT ": int32")              \
      .SetIsStateful()                    \
      .SetShapeFn(shape_inference::ScalarShape)

REGISTER_OP("HorovodSize")
    .Attr("process_set_id: int = 0")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);
REGISTER_OP("HorovodProcessSetIncluded")
    .Attr("process_set_id: int = 0")
    .Output("included: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);
TFHVD_TOPOLOGY_OP("HorovodLocalSize", "local_size");
// process_set_id is tfhvd's (defaulted, so Horovod graphs load): the rank
// within that set.
REGISTER_OP("HorovodRank")
    .Attr("process_set_id: int = 0")
    .Output("rank: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);
TFHVD_TOPOLOGY_OP("HorovodLocalRank", "local_rank");

// Not Horovod's: a benchmark reference.  An asynchronous kernel with
// HorovodAllreduce's signature (its attrs, defaulted) that returns its input and
// completes at once: what TensorFlow alone charges for running such an op, the
// floor a runtime that cost nothing would measure (examples/graph_benchmark.py
// --floor, examples/allreduce_benchmark.py --eager-breakdown).
REGISTER_OP("TfhvdAsyncIdentity")
    .Attr("T: type")
    .Attr("reduce_op: int = 0")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape);

}  // namespace
}  // namespace tensorflow
