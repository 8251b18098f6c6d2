// Negotiation messages and their wire format.
//
// Workers send RequestLists to the coordinator; the coordinator answers every
// rank with the same ResponseList, which all ranks then execute in order.
// The format is a flat little-endian byte string written by Writer and read
// by Reader (both sides run the same binary, so no versioning is needed).
#ifndef TFHVD_CORE_MESSAGE_H_
#define TFHVD_CORE_MESSAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace tfhvd {

struct Request {
  int32_t rank = 0;
  std::string name;
  CollectiveParams params;
  std::string error;  // a problem found locally (bad splits, ...)
};

struct RequestList {
  bool shutdown = false;
  std::vector<Request> requests;
  std::vector<int32_t> cached_ids;  // requests the response cache knows
  std::vector<int32_t> cached_sets; // the process set of each cached id
};

enum class ResponseKind : int32_t {
  kCollective = 0,  // run params.type over `names` (several: fused)
  kError = 1,       // fail `names` with `error` on every rank
};

struct Response {
  ResponseKind kind = ResponseKind::kCollective;
  std::vector<std::string> names;
  CollectiveParams params;  // shape is that of names[0]
  std::string error;
  StatusCode error_code = StatusCode::kInvalidArgument;
  // allreduce: element count of each name (joined ranks contribute zeros).
  // allgather: first dimension of each rank.  alltoall: size*size splits,
  // row r = what rank r sends.  reducescatter: unused.
  std::vector<int64_t> sizes;
  int32_t last_joined_rank = -1;
  // Response-cache slot assigned to names[i] (-1: not cached).
  std::vector<int32_t> cache_ids;
  // Ranks that had joined when this response was made.
  std::vector<int32_t> joined_ranks;
};

// Parameters the coordinator's autotune (autotune.h) decided; every rank
// applies them when it executes the list that carries them, so all switch
// at the same round.
struct TunedParams {
  bool present = false;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  bool cache_enabled = true;
  bool active = true;   // false: tuning has ended and these are the best
  int32_t sample = 0;   // the sample these parameters are measured in
};

struct ResponseList {
  bool shutdown = false;
  std::vector<Response> responses;
  TunedParams tuned;
};

std::string Serialize(const RequestList& l);
std::string Serialize(const ResponseList& l);
// Return false on a truncated or corrupt buffer.
bool Parse(const std::string& bytes, RequestList* l);
bool Parse(const std::string& bytes, ResponseList* l);

}  // namespace tfhvd

#endif  // TFHVD_CORE_MESSAGE_H_
