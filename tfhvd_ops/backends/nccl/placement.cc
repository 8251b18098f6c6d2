#include "placement.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "cuda_check.h"

namespace tfhvd {
namespace {

constexpr size_t kSeatBytes = 256;

std::string Encode(const GpuSeat& s) {
  if (s.rank < 0) return std::string();
  return std::to_string(s.rank) + "\t" + std::to_string(s.device) + "\t" + s.host + "\t" +
         s.bus_id;
}

bool Decode(const char* text, GpuSeat* out) {
  std::istringstream in(std::string(text, strnlen(text, kSeatBytes)));
  std::string rank, device;
  if (!std::getline(in, rank, '\t') || !std::getline(in, device, '\t') ||
      !std::getline(in, out->host, '\t') || !std::getline(in, out->bus_id)) {
    return false;
  }
  out->rank = std::atoi(rank.c_str());
  out->device = std::atoi(device.c_str());
  return true;
}

}  // namespace

Status LocalGpuSeat(int rank, int device, GpuSeat* out) {
  char bus[64] = {0};
  TFHVD_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetPCIBusId(bus, sizeof(bus), device),
                                   "cudaDeviceGetPCIBusId", rank, device));
  const char* hostid = std::getenv("NCCL_HOSTID");
  char name[128] = {0};
  if (hostid == nullptr || hostid[0] == '\0') {
    if (gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "this host");
    hostid = name;
  }
  out->rank = rank;
  out->device = device;
  out->host = hostid;
  out->bus_id = bus;
  return Status::OK();
}

Status CheckOneRankPerGpu(const std::vector<GpuSeat>& seats, const char* what) {
  std::map<std::pair<std::string, std::string>, std::vector<const GpuSeat*>> by_gpu;
  for (const GpuSeat& s : seats) {
    if (s.rank >= 0) by_gpu[{s.host, s.bus_id}].push_back(&s);
  }
  std::string shared;
  for (const auto& kv : by_gpu) {
    if (kv.second.size() < 2) continue;
    std::string ranks;
    for (const GpuSeat* s : kv.second) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(s->rank) + " (CUDA device " +
               std::to_string(s->device) + ")";
    }
    shared += (shared.empty() ? "" : "; ") + std::string("ranks ") + ranks +
              " all use the GPU at PCI " + kv.first.second + " of host " + kv.first.first;
  }
  if (shared.empty()) return Status::OK();
  return Status::InvalidArgument(
      std::string("tfhvd: one GPU per rank is required for GPU collectives (") + what +
      "): " + shared +
      ". Pin each rank's GPU right after hvd.init(): gpus = "
      "tf.config.list_physical_devices('GPU'); "
      "tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU') (or start each rank "
      "with CUDA_VISIBLE_DEVICES set to its local rank)");
}

Status AgreeOneRankPerGpu(Collectives* over, int nranks, const GpuSeat& mine, const char* what) {
  char buf[kSeatBytes] = {0};
  std::strncpy(buf, Encode(mine).c_str(), kSeatBytes - 1);
  std::vector<char> all(static_cast<size_t>(nranks) * kSeatBytes, 0);
  TFHVD_RETURN_IF_ERROR(over->Allgatherv(buf, kSeatBytes, all.data(),
                                         std::vector<int64_t>(nranks, kSeatBytes)));
  std::vector<GpuSeat> seats;
  for (int r = 0; r < nranks; ++r) {
    GpuSeat s;
    if (Decode(&all[static_cast<size_t>(r) * kSeatBytes], &s)) seats.push_back(s);
  }
  return CheckOneRankPerGpu(seats, what);
}

}  // namespace tfhvd
