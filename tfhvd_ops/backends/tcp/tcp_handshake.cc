#include "tcp_handshake.h"

#include "../../core/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>

namespace tfhvd {
namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  int fd = -1;
  bool via_unix = false;
  std::string peer;
  std::string bytes;
  Clock::time_point deadline;
};

std::string PeerName(int fd, bool via_unix) {
  if (via_unix) return "a local Unix socket";
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  char buf[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&a), &len) == 0 &&
      a.sin_family == AF_INET) {
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
  }
  return buf;
}

class Refusals {
 public:
  void Refuse(const Pending& p, const std::string& why) {
    if (count_++ == 0) {
      std::fprintf(stderr,
                   "[tfhvd WARNING rank 0] the control channel refused a connection from %s "
                   "(%s); further refusals are counted, not logged\n",
                   p.peer.c_str(), why.c_str());
    }
    close(p.fd);
  }
  ~Refusals() {
    if (count_ > 1) {
      std::fprintf(stderr, "[tfhvd WARNING rank 0] the control channel refused %d connections\n",
                   count_);
    }
  }

 private:
  int count_ = 0;
};

std::string RankBytes(int rank) {
  const uint32_t r = static_cast<uint32_t>(rank);
  char b[4] = {static_cast<char>(r & 255), static_cast<char>((r >> 8) & 255),
               static_cast<char>((r >> 16) & 255), static_cast<char>((r >> 24) & 255)};
  return std::string(b, 4);
}

}  // namespace

std::string ControlKey(const std::string& secret, const std::string& session_key) {
  return HmacSha256(secret, "tfhvd-control-1|" + session_key);
}

std::string MakeHello(const std::string& key, int rank) {
  return "TFHC" + RankBytes(rank) + HmacSha256(key, "hello|" + RankBytes(rank));
}

bool AcceptWorkers(int listen_fd, int unix_fd, int size, const std::string& key,
                   double timeout_s, std::vector<AcceptedPeer>* out, std::string* why) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::vector<bool> have(size, false);
  int missing = size - 1;
  std::deque<Pending> pending;
  Refusals refusals;
  while (missing > 0 && Clock::now() < deadline) {
    std::vector<struct pollfd> fds = {{listen_fd, POLLIN, 0}, {unix_fd, POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    // New connections: each waits for its hello without blocking the others.
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & POLLIN)) continue;
      int fd = accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;
      if (pending.size() >= kMaxPending) {
        refusals.Refuse(pending.front(), "more than 64 connections waiting for their hello");
        pending.pop_front();
      }
      Pending p;
      p.fd = fd;
      p.via_unix = i == 1;
      p.peer = PeerName(fd, p.via_unix);
      p.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(kHelloTimeoutS * 1000));
      pending.push_back(std::move(p));
    }
    for (auto it = pending.begin(); it != pending.end();) {
      Pending& p = *it;
      char buf[kHelloBytes];
      ssize_t n = recv(p.fd, buf, kHelloBytes - p.bytes.size(), 0);
      if (n > 0) p.bytes.append(buf, static_cast<size_t>(n));
      std::string bad;
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        bad = "closed before its hello";
      } else if (p.bytes.size() >= 4 && p.bytes.compare(0, 4, "TFHC") != 0) {
        bad = "not a tfhvd hello";
      } else if (p.bytes.size() < kHelloBytes) {
        if (Clock::now() < p.deadline) {
          ++it;
          continue;
        }
        bad = "no hello within 5 s";
      } else {
        uint32_t r = 0;
        for (int b = 3; b >= 0; --b) r = (r << 8) | static_cast<unsigned char>(p.bytes[4 + b]);
        const int rank = static_cast<int>(r);
        if (rank <= 0 || rank >= size) {
          bad = "a rank out of range";
        } else if (!ConstantTimeEqual(p.bytes, MakeHello(key, rank))) {
          bad = "a hello without the job's key";
        } else if (have[rank]) {
          bad = "rank " + std::to_string(rank) + " twice";
        } else {
          have[rank] = true;
          --missing;
          int one = 1;
          if (!p.via_unix) setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          out->push_back({p.fd, rank, p.via_unix});
          it = pending.erase(it);
          continue;
        }
      }
      refusals.Refuse(p, bad);
      it = pending.erase(it);
    }
  }
  for (const Pending& p : pending) close(p.fd);
  if (missing == 0) return true;
  std::string ranks;
  for (int r = 1; r < size; ++r) {
    if (!have[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  }
  *why = "ranks " + ranks + " did not connect with the job's key within " +
         std::to_string(static_cast<int>(timeout_s)) + " s";
  for (const AcceptedPeer& p : *out) close(p.fd);
  out->clear();
  return false;
}

}  // namespace tfhvd
