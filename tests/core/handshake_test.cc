// The control channel's admission (backends/tcp/tcp_handshake.h) against
// clients that know nothing of the job, and HMAC-SHA256 (core/auth.h)
// against RFC 4231.  One process, no backend: rank 0's accept loop runs on
// a listening socket of its own while threads play the workers and the
// strangers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../../tfhvd_ops/backends/tcp/tcp_handshake.h"
#include "../../tfhvd_ops/core/auth.h"
#include "check.h"

namespace tfhvd {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int Listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  std::memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<struct sockaddr*>(&a), len);
  listen(fd, 4096);
  getsockname(fd, reinterpret_cast<struct sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  std::memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void Send(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;  // the coordinator closed it: expected for strangers
    off += static_cast<size_t>(n);
  }
}

// Closed by the other end (EOF or reset) within `ms`.
bool ClosedWithin(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

void TestHmac() {
  // RFC 4231, test case 2.
  CHECK(HexEncode(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(HexEncode(Sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(RandomBytes(16).size() == 16 && RandomBytes(16) != RandomBytes(16));
  CHECK(ConstantTimeEqual("abc", "abc") && !ConstantTimeEqual("abc", "abd") &&
        !ConstantTimeEqual("abc", "ab"));
  // The key needs the session key and the job's secret.
  CHECK(ControlKey("s", "k1") != ControlKey("s", "k2"));
  CHECK(ControlKey("s1", "k") != ControlKey("s2", "k"));
}

// Two workers are admitted while strangers send random bytes, a hello under
// another key, a rank out of range, a hello one byte a second, and a flood of
// silent connections; the strangers neither get in nor hold the others up.
void TestStrangersDoNotGetIn() {
  int port = 0;
  const int lfd = Listen(&port);
  const std::string key = ControlKey("job secret", "session key");
  const auto start = Clock::now();
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  // Strangers first, so the coordinator meets them before the workers.
  threads.emplace_back([port] {  // 100 KB of random bytes
    int fd = Connect(port);
    Send(fd, RandomBytes(100 << 10));
    ClosedWithin(fd, 5000);
    close(fd);
  });
  threads.emplace_back([port] {  // a well-formed hello under another key
    int fd = Connect(port);
    Send(fd, MakeHello(ControlKey("wrong secret", "session key"), 1));
    ClosedWithin(fd, 5000);
    close(fd);
  });
  threads.emplace_back([port, &key] {  // the right key, a rank out of range
    int fd = Connect(port);
    Send(fd, MakeHello(key, 7));
    ClosedWithin(fd, 5000);
    close(fd);
  });
  threads.emplace_back([port, &key] {  // a slow client: one byte a second
    int fd = Connect(port);
    const std::string hello = MakeHello(key, 2);
    for (size_t i = 0; i < 8 && fd >= 0; ++i) {
      if (send(fd, &hello[i], 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    close(fd);
  });
  std::vector<int> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(Connect(port));
  // The workers come a second later and must be admitted at once.
  for (int r = 1; r <= 2; ++r) {
    threads.emplace_back([port, r, &key, &admitted] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      int fd = Connect(port);
      Send(fd, MakeHello(key, r));
      char c = 0;
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 10000) == 1 && recv(fd, &c, 1, 0) == 1 && c == 'K') ++admitted;
      close(fd);
    });
  }
  // While the flood waits: no more than 64 connections are kept waiting for
  // their hello, so at least 36 of the 100 are closed at once.
  std::thread counter([&flood] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    int closed = 0;
    for (int fd : flood) closed += ClosedWithin(fd, 0) ? 1 : 0;
    CHECK(closed >= 36);
    if (closed < 36) std::fprintf(stderr, "only %d flood connections were closed\n", closed);
  });
  std::vector<AcceptedPeer> peers;
  std::string why;
  const bool ok = AcceptWorkers(lfd, -1, 3, key, 20.0, &peers, &why);
  const double took = Since(start);
  CHECK(ok);
  CHECK(peers.size() == 2);
  // Admitted in well under the slow client's 8 s or its 5 s hello timeout.
  CHECK(took < 3.0);
  if (took >= 3.0) std::fprintf(stderr, "admission took %.1f s\n", took);
  for (const AcceptedPeer& p : peers) {
    CHECK(p.rank == 1 || p.rank == 2);
    Send(p.fd, "K");  // only a real worker is waiting for this byte
  }
  counter.join();
  for (auto& t : threads) t.join();
  CHECK(admitted == 2);
  for (const AcceptedPeer& p : peers) close(p.fd);
  for (int fd : flood) close(fd);
  close(lfd);
}

// No worker comes: the coordinator gives up at its timeout and names them.
void TestMissingWorkersAreNamed() {
  int port = 0;
  const int lfd = Listen(&port);
  int stranger = Connect(port);
  Send(stranger, "GET / HTTP/1.0\r\n\r\n");
  std::vector<AcceptedPeer> peers;
  std::string why;
  const auto start = Clock::now();
  CHECK(!AcceptWorkers(lfd, -1, 3, ControlKey("", "k"), 1.5, &peers, &why));
  CHECK(Since(start) < 4.0);
  CHECK(peers.empty());
  CHECK(why.find("ranks 1,2 did not connect") != std::string::npos);
  close(stranger);
  close(lfd);
}

}  // namespace
}  // namespace tfhvd

int main() {
  tfhvd::TestHmac();
  tfhvd::TestStrangersDoNotGetIn();
  tfhvd::TestMissingWorkersAreNamed();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
