#include <cstdio>
#include <sstream>

#include "common.h"
#include "logging.h"

namespace tfhvd {

int64_t DataTypeSize(DataType dt) {
  switch (dt) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dt) {
  static const char* kNames[] = {"uint8", "int8", "uint16", "int16", "int32", "int64",
                                 "float16", "bfloat16", "float32", "float64", "bool"};
  int i = static_cast<int>(dt);
  return (i >= 0 && i <= 10) ? kNames[i] : "unknown";
}

bool IsFloatingPoint(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 ||
         dt == DataType::kFloat32 || dt == DataType::kFloat64;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* CollectiveName(CollectiveType t) {
  switch (t) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kReducescatter: return "reducescatter";
    case CollectiveType::kJoin: return "join";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kAddProcessSet: return "add_process_set";
    case CollectiveType::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown";
}

int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string ShapeString(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

void Logger::Log(LogLevel l, const std::string& msg) const {
  static const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  std::fprintf(stderr, "[tfhvd %s rank %d] %s\n", kNames[static_cast<int>(l)], rank_,
               msg.c_str());
  std::fflush(stderr);
}

}  // namespace tfhvd
