// The fake's configuration, sticky error and streams (fake_gpu.h).
#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fake_gpu.h"

namespace fakegpu {
namespace {

long EnvLong(const char* name, long def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atol(v) : def;
}

std::string EnvString(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : def;
}

std::atomic<int> sticky{cudaSuccess};
std::atomic<long> stream_ops{0};

}  // namespace

const Config& GetConfig() {
  static const Config config = [] {
    Config c;
    c.gpu_count = static_cast<int>(EnvLong("TFHVD_FAKE_GPU_COUNT", c.gpu_count));
    c.bus_id = EnvString("TFHVD_FAKE_GPU_BUS_ID", c.bus_id);
    c.cc = static_cast<int>(EnvLong("TFHVD_FAKE_GPU_CC", c.cc));
    c.sms = static_cast<int>(EnvLong("TFHVD_FAKE_GPU_SMS", c.sms));
    c.sticky_after = EnvLong("TFHVD_FAKE_CUDA_STICKY_ERROR_AFTER", -1);
    c.module_load_error = EnvLong("TFHVD_FAKE_CU_MODULE_LOAD_ERROR", 0) != 0;
    c.report_loads = EnvLong("TFHVD_FAKE_REPORT_MODULE_LOADS", 0) != 0;
    c.op_delay_ms = static_cast<int>(EnvLong("TFHVD_FAKE_OP_DELAY_MS", 0));
    c.nccl_async_after = EnvLong("TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER", -1);
    c.nccl_hang_after = EnvLong("TFHVD_FAKE_NCCL_HANG_AFTER", -1);
    c.nccl_init_error = EnvLong("TFHVD_FAKE_NCCL_INIT_ERROR", 0) != 0;
    c.shm_tag = EnvString("TFHVD_FAKE_SHM_TAG", c.shm_tag);
    // Only what is safe in a file name.
    for (char& ch : c.shm_tag) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = '_';
    }
    if (c.shm_tag.size() > 40) c.shm_tag.resize(40);
    return c;
  }();
  return config;
}

cudaError_t Sticky() { return static_cast<cudaError_t>(sticky.load()); }

void SetSticky(cudaError_t e) {
  int expected = cudaSuccess;
  sticky.compare_exchange_strong(expected, e);
}

bool BeginStreamOp(bool slow) {
  if (Sticky() != cudaSuccess) return false;
  const Config& c = GetConfig();
  const long n = ++stream_ops;
  if (c.sticky_after >= 0 && n > c.sticky_after) {
    SetSticky(cudaErrorIllegalAddress);
    return false;
  }
  if (slow && c.op_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(c.op_delay_ms));
  }
  return true;
}

Stream::Stream(int device) : device_(device), worker_([this] { Run(); }) {}

Stream::~Stream() {
  if (worker_.joinable()) worker_.detach();
}

uint64_t Stream::Push(std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  queue_.push_back(std::move(fn));
  cv_.notify_all();
  return ++pushed_;
}

bool Stream::Idle() {
  std::lock_guard<std::mutex> l(mu_);
  return done_ == pushed_;
}

void Stream::Wait(uint64_t upto) {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t target = upto == 0 ? pushed_ : upto;
  cv_.wait(l, [&] { return done_ >= target; });
}

void Stream::Release() {
  std::lock_guard<std::mutex> l(mu_);
  released_ = true;
  cv_.notify_all();
}

void Stream::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return !queue_.empty() || released_; });
    if (queue_.empty()) break;  // released and drained
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    fn();  // each operation checks the sticky error itself
    l.lock();
    ++done_;
    cv_.notify_all();
  }
  // Released: nobody holds the handle any more.
  l.unlock();
  worker_.detach();
  delete this;
}

}  // namespace fakegpu
