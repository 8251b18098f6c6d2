// Asks TensorFlow, for every op of a tfhvd library and every dtype the op
// admits, what its placer asks: is there a kernel for that dtype on a GPU
// (FindKernelDef), and in which memory does each argument live there
// (MemoryTypesForNode, the function TensorFlow's placement and executors
// use).  No GPU is needed: both read the kernel registry.
//
//   memory_types_probe LIBRARY [DEVICE]      (DEVICE: GPU unless given)
//
// One line per (op, dtype):
//   OP DTYPE kernel|none in=ARG:H|D,... out=ARG:H|D,...
// where H is host memory and D device memory.  tests/gpu/test_memory_types.py
// checks the lines against the registrations.  Exit 1 when the library does
// not load or registers no Horovod op.
#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/memory_types.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"

namespace {

using tensorflow::AttrValue;
using tensorflow::DataType;
using tensorflow::MemoryTypeVector;
using tensorflow::NodeDef;
using tensorflow::OpDef;

// A NodeDef of `op` with every type attribute set to `dtype` (where it
// admits it), counts at their minimum of 2, and the rest at their defaults.
NodeDef MakeNode(const OpDef& op, DataType dtype) {
  NodeDef node;
  node.set_name("probe");
  node.set_op(op.name());
  for (const auto& attr : op.attr()) {
    if (attr.has_default_value() && attr.type() != "type") continue;
    AttrValue v;
    if (attr.type() == "type") {
      v.set_type(dtype);
    } else if (attr.type() == "int") {
      v.set_i(std::max<int64_t>(2, attr.minimum()));
    } else if (attr.type() == "string") {
      v.set_s("");
    } else if (attr.type() == "list(type)") {
      v.mutable_list()->add_type(dtype);
    } else {
      continue;
    }
    (*node.mutable_attr())[attr.name()] = v;
  }
  tensorflow::AddDefaultsToNodeDef(op, &node);
  return node;
}

// The dtypes `op`'s first type attribute admits (every TF dtype where it
// lists none).
std::vector<DataType> Dtypes(const OpDef& op) {
  for (const auto& attr : op.attr()) {
    if (attr.type() != "type") continue;
    std::vector<DataType> out;
    for (int t : attr.allowed_values().list().type()) out.push_back(static_cast<DataType>(t));
    if (out.empty()) {
      for (DataType t : tensorflow::AllTypes()) out.push_back(t);
    }
    return out;
  }
  return {tensorflow::DT_INVALID};  // no type attribute: one line
}

// "name:H,name:D" for the arguments of `args`, counted out by the node.
std::string Memory(const NodeDef& node, const OpDef& op,
                   const google::protobuf::RepeatedPtrField<OpDef::ArgDef>& args, bool inputs,
                   const MemoryTypeVector& types) {
  tensorflow::NameRangeMap in_ranges, out_ranges;
  std::string out;
  if (!tensorflow::NameRangesForNode(node, op, &in_ranges, &out_ranges).ok()) return "?";
  const auto& ranges = inputs ? in_ranges : out_ranges;
  for (const auto& arg : args) {
    auto it = ranges.find(arg.name());
    if (it == ranges.end()) continue;
    for (int i = it->second.first; i < it->second.second; ++i) {
      if (!out.empty()) out += ",";
      out += arg.name() + ":" +
             (i < static_cast<int>(types.size()) && types[i] == tensorflow::HOST_MEMORY ? "H"
                                                                                         : "D");
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBRARY [DEVICE]\n", argv[0]);
    return 2;
  }
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  const tensorflow::DeviceType device(argc > 2 ? argv[2] : tensorflow::DEVICE_GPU);
  std::vector<OpDef> ops;
  tensorflow::OpRegistry::Global()->GetRegisteredOps(&ops);
  int lines = 0;
  for (const OpDef& op : ops) {
    if (op.name().rfind("Horovod", 0) != 0) continue;
    for (DataType dtype : Dtypes(op)) {
      NodeDef node = MakeNode(op, dtype);
      const tensorflow::KernelDef* kdef = nullptr;
      const bool kernel = tensorflow::FindKernelDef(device, node, &kdef, nullptr).ok();
      MemoryTypeVector in, out;
      auto st = tensorflow::MemoryTypesForNode(tensorflow::OpRegistry::Global(), device, node,
                                               &in, &out);
      std::printf("%s %s %s in=%s out=%s%s\n", op.name().c_str(),
                  dtype == tensorflow::DT_INVALID ? "-"
                                                  : tensorflow::DataTypeString(dtype).c_str(),
                  kernel ? "kernel" : "none", Memory(node, op, op.input_arg(), true, in).c_str(),
                  Memory(node, op, op.output_arg(), false, out).c_str(),
                  st.ok() ? "" : (" error=" + std::string(st.message())).c_str());
      ++lines;
    }
  }
  return lines > 0 ? 0 : 1;
}
