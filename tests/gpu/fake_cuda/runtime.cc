// The CUDA runtime functions the backend and the harness call, on host
// memory and the streams of stream.cc (fake_gpu.h says what is real).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "fake_gpu.h"

namespace fakegpu {
namespace {

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // the latest record that its stream reached
};

// Live handles and allocations: an unknown one is an error, not a crash.
struct Registry {
  std::mutex mu;
  std::set<Stream*> streams;
  std::set<Event*> events;
  std::map<void*, size_t> device_memory;
  std::map<void*, size_t> host_memory;
  std::vector<Stream*> defaults;  // the legacy default stream per device
};

Registry& Reg() {
  static Registry* r = new Registry;  // never destroyed: workers may outlive exit
  return *r;
}

cudaError_t Ret(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// Every entry point starts here: a sticky error answers everything.
#define FAKE_CHECK_STICKY() \
  do {                      \
    if (Sticky() != cudaSuccess) return Ret(Sticky()); \
  } while (0)

Event* EventOf(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(Reg().mu);
  Event* ev = reinterpret_cast<Event*>(e);
  return Reg().events.count(ev) ? ev : nullptr;
}

void* Aligned(size_t bytes) {
  const size_t a = 256;
  return std::aligned_alloc(a, (bytes + a - 1) / a * a);
}

// A copy or memset on a stream: counted (faults, delays) and then done.
cudaError_t Enqueue(cudaStream_t s, std::function<void()> work, bool wait, bool slow = false) {
  FAKE_CHECK_STICKY();
  if (!ValidStream(s)) return Ret(cudaErrorInvalidResourceHandle);
  Stream* stream = StreamOf(s);
  const uint64_t id = stream->Push([work, slow] {
    if (BeginStreamOp(slow)) work();
  });
  if (wait) {
    stream->Wait(id);
    FAKE_CHECK_STICKY();
  }
  return cudaSuccess;
}

bool ValidKind(cudaMemcpyKind k) { return k >= cudaMemcpyHostToHost && k <= cudaMemcpyDefault; }

}  // namespace

bool ValidStream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> l(Reg().mu);
  return Reg().streams.count(reinterpret_cast<Stream*>(s)) > 0;
}

Stream* StreamOf(cudaStream_t s) {
  if (s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread) {
    return reinterpret_cast<Stream*>(s);
  }
  const int d = current_device;
  std::lock_guard<std::mutex> l(Reg().mu);
  auto& defaults = Reg().defaults;
  if (static_cast<int>(defaults.size()) <= d) defaults.resize(d + 1, nullptr);
  if (defaults[d] == nullptr) defaults[d] = new Stream(d);
  return defaults[d];
}

}  // namespace fakegpu

using fakegpu::Ret;
using fakegpu::Reg;
using fakegpu::Sticky;

extern "C" {

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unrecognized error code";
  }
}

cudaError_t cudaGetLastError(void) {
  if (Sticky() != cudaSuccess) return Sticky();
  cudaError_t e = fakegpu::last_error;
  fakegpu::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return Sticky() != cudaSuccess ? Sticky() : fakegpu::last_error;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return Ret(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return Ret(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Ret(cudaErrorInvalidValue);
  *count = fakegpu::GetConfig().gpu_count;
  return *count > 0 ? cudaSuccess : Ret(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Ret(cudaErrorInvalidValue);
  *device = fakegpu::current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  FAKE_CHECK_STICKY();
  if (device < 0 || device >= fakegpu::GetConfig().gpu_count) return Ret(cudaErrorInvalidDevice);
  fakegpu::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  FAKE_CHECK_STICKY();
  const fakegpu::Config& c = fakegpu::GetConfig();
  if (value == nullptr) return Ret(cudaErrorInvalidValue);
  if (device < 0 || device >= c.gpu_count) return Ret(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = c.cc / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = c.cc % 10; break;
    case cudaDevAttrMultiProcessorCount: *value = c.sms; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* out, int len, int device) {
  FAKE_CHECK_STICKY();
  const fakegpu::Config& c = fakegpu::GetConfig();
  if (out == nullptr || len <= 0) return Ret(cudaErrorInvalidValue);
  if (device < 0 || device >= c.gpu_count) return Ret(cudaErrorInvalidDevice);
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(c.bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
    // Not a PCI id: taken as it is (device i gets "/i").
    std::snprintf(out, len, "%s%s%s", c.bus_id.c_str(), device ? "/" : "",
                  device ? std::to_string(device).c_str() : "");
    return cudaSuccess;
  }
  std::snprintf(out, len, "%04X:%02X:%02X.%X", domain, bus + device, dev, fn);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  FAKE_CHECK_STICKY();
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  FAKE_CHECK_STICKY();
  const int d = fakegpu::current_device;
  std::vector<fakegpu::Stream*> all;
  {
    std::lock_guard<std::mutex> l(Reg().mu);
    for (fakegpu::Stream* s : Reg().streams) {
      if (s->device() == d) all.push_back(s);
    }
  }
  all.push_back(fakegpu::StreamOf(nullptr));
  for (fakegpu::Stream* s : all) s->Wait();
  FAKE_CHECK_STICKY();
  return cudaSuccess;
}

// Memory.  cudaFree does not wait for the device: the backend frees only
// what its stream is done with, and a stream that hangs (a fault) must not
// hang every free.

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  FAKE_CHECK_STICKY();
  if (ptr == nullptr) return Ret(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* p = fakegpu::Aligned(bytes);
  if (p == nullptr) return Ret(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> l(Reg().mu);
  Reg().device_memory[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  FAKE_CHECK_STICKY();
  if (p == nullptr) return cudaSuccess;  // makes the context current: nothing to do
  {
    std::lock_guard<std::mutex> l(Reg().mu);
    if (Reg().device_memory.erase(p) == 0) return Ret(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  FAKE_CHECK_STICKY();
  if (ptr == nullptr) return Ret(cudaErrorInvalidValue);
  void* p = fakegpu::Aligned(bytes == 0 ? 1 : bytes);
  if (p == nullptr) return Ret(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> l(Reg().mu);
  Reg().host_memory[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  FAKE_CHECK_STICKY();
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> l(Reg().mu);
    if (Reg().host_memory.erase(p) == 0) return Ret(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!fakegpu::ValidKind(kind) || (n > 0 && (dst == nullptr || src == nullptr))) {
    return Ret(cudaErrorInvalidValue);
  }
  return fakegpu::Enqueue(stream, [=] { std::memmove(dst, src, n); }, false,
                         kind == cudaMemcpyHostToDevice);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (!fakegpu::ValidKind(kind) || (n > 0 && (dst == nullptr || src == nullptr))) {
    return Ret(cudaErrorInvalidValue);
  }
  return fakegpu::Enqueue(nullptr, [=] { std::memmove(dst, src, n); }, true);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
  if (n > 0 && dst == nullptr) return Ret(cudaErrorInvalidValue);
  return fakegpu::Enqueue(stream, [=] { std::memset(dst, value, n); }, false);
}

cudaError_t cudaMemset(void* dst, int value, size_t n) {
  if (n > 0 && dst == nullptr) return Ret(cudaErrorInvalidValue);
  return fakegpu::Enqueue(nullptr, [=] { std::memset(dst, value, n); }, true);
}

// Streams.

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  FAKE_CHECK_STICKY();
  (void)flags;
  (void)priority;
  if (s == nullptr) return Ret(cudaErrorInvalidValue);
  auto* stream = new fakegpu::Stream(fakegpu::current_device);
  std::lock_guard<std::mutex> l(Reg().mu);
  Reg().streams.insert(stream);
  *s = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  // Like CUDA: returns at once; the queued work still runs.
  auto* stream = reinterpret_cast<fakegpu::Stream*>(s);
  {
    std::lock_guard<std::mutex> l(Reg().mu);
    if (Reg().streams.erase(stream) == 0) return Ret(cudaErrorInvalidResourceHandle);
  }
  stream->Release();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  FAKE_CHECK_STICKY();
  if (!fakegpu::ValidStream(s)) return Ret(cudaErrorInvalidResourceHandle);
  return fakegpu::StreamOf(s)->Idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  FAKE_CHECK_STICKY();
  if (!fakegpu::ValidStream(s)) return Ret(cudaErrorInvalidResourceHandle);
  fakegpu::StreamOf(s)->Wait();
  FAKE_CHECK_STICKY();
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  FAKE_CHECK_STICKY();
  if (fn == nullptr || !fakegpu::ValidStream(s)) return Ret(cudaErrorInvalidValue);
  fakegpu::StreamOf(s)->Push([fn, data] {
    if (Sticky() == cudaSuccess) fn(data);
  });
  return cudaSuccess;
}

// Events.

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  FAKE_CHECK_STICKY();
  (void)flags;  // timing and blocking sync: every wait here sleeps
  if (e == nullptr) return Ret(cudaErrorInvalidValue);
  auto* ev = new fakegpu::Event;
  std::lock_guard<std::mutex> l(Reg().mu);
  Reg().events.insert(ev);
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  auto* ev = reinterpret_cast<fakegpu::Event*>(e);
  {
    std::lock_guard<std::mutex> l(Reg().mu);
    if (Reg().events.erase(ev) == 0) return Ret(cudaErrorInvalidResourceHandle);
  }
  // A record still queued may complete later: the event's memory stays
  // (one small leak per destroyed event, as a test fake may).
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  FAKE_CHECK_STICKY();
  fakegpu::Event* ev = fakegpu::EventOf(e);
  if (ev == nullptr || !fakegpu::ValidStream(s)) return Ret(cudaErrorInvalidResourceHandle);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(ev->mu);
    gen = ++ev->recorded;
  }
  fakegpu::StreamOf(s)->Push([ev, gen] {
    std::lock_guard<std::mutex> l(ev->mu);
    if (gen > ev->completed) ev->completed = gen;
    ev->cv.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  FAKE_CHECK_STICKY();
  fakegpu::Event* ev = fakegpu::EventOf(e);
  if (ev == nullptr) return Ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(ev->mu);
  return ev->completed >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  FAKE_CHECK_STICKY();
  fakegpu::Event* ev = fakegpu::EventOf(e);
  if (ev == nullptr) return Ret(cudaErrorInvalidResourceHandle);
  {
    std::unique_lock<std::mutex> l(ev->mu);
    const uint64_t target = ev->recorded;
    ev->cv.wait(l, [&] { return ev->completed >= target; });
  }
  FAKE_CHECK_STICKY();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  FAKE_CHECK_STICKY();
  (void)flags;
  fakegpu::Event* ev = fakegpu::EventOf(e);
  if (ev == nullptr || !fakegpu::ValidStream(s)) return Ret(cudaErrorInvalidResourceHandle);
  uint64_t target;
  {
    std::lock_guard<std::mutex> l(ev->mu);
    target = ev->recorded;  // the record this call sees; later ones do not count
    if (ev->completed >= target) return cudaSuccess;
  }
  fakegpu::StreamOf(s)->Push([ev, target] {
    std::unique_lock<std::mutex> l(ev->mu);
    ev->cv.wait(l, [&] { return ev->completed >= target; });
  });
  return cudaSuccess;
}

}  // extern "C"
