#include "shm_ring.h"

#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

namespace tfhvd {
namespace {

constexpr uint64_t kMagic = 0x7466687664726e67ULL;  // "tfhvdrng"

// The memfd's layout: this prefix, then the two rings (header + data each).
struct alignas(64) Prefix {
  uint64_t magic;
  uint64_t capacity;
};

size_t LinkBytes(uint64_t capacity) { return sizeof(Prefix) + 2 * ShmRing::Bytes(capacity); }

}  // namespace

ShmRing::ShmRing(void* base, uint64_t capacity)
    : h_(static_cast<Header*>(base)),
      data_(static_cast<char*>(base) + sizeof(Header)),
      cap_(capacity) {}

size_t ShmRing::Write(const char* p, size_t n) {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  n = std::min<uint64_t>(n, cap_ - (head - tail));
  if (n == 0) return 0;
  const uint64_t at = head % cap_;
  const size_t first = std::min<uint64_t>(n, cap_ - at);
  std::memcpy(data_ + at, p, first);
  std::memcpy(data_, p + first, n - first);
  h_->head.store(head + n, std::memory_order_seq_cst);
  return n;
}

bool ShmRing::ReaderMaySleep() const {
  return h_->reader_sleeping.load(std::memory_order_seq_cst) != 0;
}

size_t ShmRing::Read(std::string* out) {
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_relaxed);
  const uint64_t n = head - tail;
  if (n == 0) return 0;
  const uint64_t at = tail % cap_;
  const size_t first = std::min<uint64_t>(n, cap_ - at);
  out->append(data_ + at, first);
  out->append(data_, n - first);
  h_->tail.store(head, std::memory_order_release);
  return n;
}

bool ShmRing::HasData() const {
  return h_->head.load(std::memory_order_acquire) != h_->tail.load(std::memory_order_relaxed);
}

bool ShmRing::PrepareToSleep() {
  h_->reader_sleeping.store(1, std::memory_order_seq_cst);
  if (h_->head.load(std::memory_order_seq_cst) != h_->tail.load(std::memory_order_relaxed)) {
    Awake();
    return false;
  }
  return true;
}

void ShmRing::Awake() { h_->reader_sleeping.store(0, std::memory_order_relaxed); }

ShmLink::~ShmLink() {
  if (map_ != nullptr) munmap(map_, bytes_);
}

static Status MapLink(int fd, size_t bytes, bool create, uint64_t capacity, void** map) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::Internal(std::string("mmap: ") + std::strerror(errno));
  auto* prefix = static_cast<Prefix*>(p);
  if (create) {
    prefix->magic = kMagic;
    prefix->capacity = capacity;
  } else if (prefix->magic != kMagic || LinkBytes(prefix->capacity) != bytes) {
    munmap(p, bytes);
    return Status::Internal("the coordinator's control memory has an unexpected layout");
  }
  *map = p;
  return Status::OK();
}

Status ShmLink::Create(uint64_t capacity, std::unique_ptr<ShmLink>* out, int* fd) {
  capacity = (capacity + 63) / 64 * 64;  // keeps the second ring's header aligned
  const size_t bytes = LinkBytes(capacity);
  *fd = memfd_create("tfhvd-control", MFD_CLOEXEC);
  if (*fd < 0) return Status::Internal(std::string("memfd_create: ") + std::strerror(errno));
  void* p = nullptr;
  Status st = ftruncate(*fd, static_cast<off_t>(bytes)) == 0
                  ? MapLink(*fd, bytes, true, capacity, &p)
                  : Status::Internal(std::string("ftruncate: ") + std::strerror(errno));
  if (!st.ok()) {
    close(*fd);
    *fd = -1;
    return st;
  }
  // A fresh memfd reads as zeros: both rings start empty and awake.
  char* base = static_cast<char*>(p) + sizeof(Prefix);
  new (base) ShmRing::Header();
  new (base + ShmRing::Bytes(capacity)) ShmRing::Header();
  *out = Wrap(p, bytes, capacity);
  return Status::OK();
}

std::unique_ptr<ShmLink> ShmLink::Wrap(void* map, size_t bytes, uint64_t capacity) {
  std::unique_ptr<ShmLink> link(new ShmLink());
  link->map_ = map;
  link->bytes_ = bytes;
  char* base = static_cast<char*>(map) + sizeof(Prefix);
  link->to_worker_ = ShmRing(base, capacity);
  link->to_coordinator_ = ShmRing(base + ShmRing::Bytes(capacity), capacity);
  return link;
}

Status ShmLink::Map(int fd, std::unique_ptr<ShmLink>* out) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Prefix))) {
    return Status::Internal("the coordinator's control memory is missing");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  TFHVD_RETURN_IF_ERROR(MapLink(fd, bytes, false, 0, &p));
  *out = Wrap(p, bytes, static_cast<Prefix*>(p)->capacity);
  return Status::OK();
}

bool SendFd(int sock, int fd, char payload) {
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  struct iovec iov = {&payload, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1;
}

bool RecvFd(int sock, double timeout_s, char* payload, int* fd) {
  *fd = -1;
  struct pollfd pf = {sock, POLLIN, 0};
  if (poll(&pf, 1, static_cast<int>(timeout_s * 1000)) != 1) return false;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  struct iovec iov = {payload, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return false;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  return true;
}

}  // namespace tfhvd
