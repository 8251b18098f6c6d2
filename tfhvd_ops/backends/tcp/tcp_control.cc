#include "tcp_control.h"

#include "shm_ring.h"
#include "tcp_handshake.h"

#include "../../core/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <unordered_map>

namespace tfhvd {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes of each shared-memory ring; a larger message waits in the sender's
// buffer and streams through.
constexpr uint64_t kShmRingBytes = 1 << 20;

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// IPv4 addresses of this host, non-loopback first; `ifname` restricts them.
std::vector<std::string> LocalAddresses(const std::string& ifname) {
  std::vector<std::string> out;
  struct ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (struct ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP)) continue;
    if (!ifname.empty() && ifname != i->ifa_name) continue;
    if (ifname.empty() && (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<struct sockaddr_in*>(i->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    out.push_back(buf);
  }
  freeifaddrs(ifs);
  return out;
}

// Non-blocking connect with a deadline; returns the connected fd or -1.
int ConnectTo(const std::string& ip, int port, double timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  SetNonBlocking(fd);
  struct sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return -1;
  }
  int rc = connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  if (rc != 0) {
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(timeout_s * 1000)) != 1) {
      close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      close(fd);
      return -1;
    }
  }
  SetNoDelay(fd);
  return fd;
}

// An abstract-namespace Unix socket address (no file; scoped to the network
// namespace, so a peer in another namespace or on another host that happens
// to share the hostname simply fails to connect and falls back to TCP).
socklen_t UnixAddress(const std::string& name, struct sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr->sun_path) - 2);
  std::memcpy(addr->sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int ListenUnix(const std::string& name, int backlog) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_un addr;
  socklen_t len = UnixAddress(name, &addr);
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), len) != 0 || listen(fd, backlog) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectUnix(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_un addr;
  socklen_t len = UnixAddress(name, &addr);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), len) != 0) {
    close(fd);
    return -1;
  }
  SetNonBlocking(fd);
  return fd;
}

// Blocking write of all bytes on a non-blocking fd, with a deadline.
bool WriteAll(int fd, const char* p, size_t n, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() > deadline) return false;
    struct pollfd pf = {fd, POLLOUT, 0};
    poll(&pf, 1, 100);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() > deadline) return false;
    struct pollfd pf = {fd, POLLIN, 0};
    poll(&pf, 1, 100);
  }
  return true;
}

class TcpControl : public ControlChannel {
 public:
  struct Peer {
    int fd = -1;
    int rank = -1;
    bool closed = false;
    std::string in;
    std::string out;
    // Same host: bytes move through shared memory; the socket only carries
    // doorbells and tells when the peer is gone (shm_ring.h).
    std::shared_ptr<ShmLink> link;
    ShmRing* tx = nullptr;
    ShmRing* rx = nullptr;
    bool sock_readable = false;  // poll() saw the socket readable
    unsigned reads = 0;
  };

  explicit TcpControl(std::vector<Peer> peers) : peers_(std::move(peers)) {
    for (size_t i = 0; i < peers_.size(); ++i) by_rank_[peers_[i].rank] = i;
  }
  ~TcpControl() override {
    for (Peer& p : peers_) {
      if (p.fd >= 0) close(p.fd);
    }
  }

  Status SendToCoordinator(std::string bytes) override { return Queue(0, bytes); }
  Status SendToWorker(int rank, std::string bytes) override { return Queue(rank, bytes); }
  Status PollWorkers(std::vector<std::pair<int, std::string>>* out) override { return Read(out); }
  Status PollCoordinator(std::vector<std::string>* out) override {
    std::vector<std::pair<int, std::string>> msgs;
    Status st = Read(&msgs);
    for (auto& m : msgs) out->push_back(std::move(m.second));
    return st;
  }

  // Waits (up to `timeout_s` per peer) until every queued byte is with the
  // transport.  A peer that is gone, or takes nothing for that long, is
  // given up on: the next poll reports it lost.
  Status FlushSends(double timeout_s) override {
    for (Peer& p : peers_) {
      if (p.closed || p.out.empty()) continue;
      bool sent = false;
      if (!p.link) {
        sent = WriteAll(p.fd, p.out.data(), p.out.size(), timeout_s);
      } else {
        const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
        while (!p.out.empty() && Clock::now() < deadline) {
          Flush(p);
          if (p.out.empty()) break;
          struct pollfd pf = {p.fd, POLLIN, 0};
          if (poll(&pf, 1, 1) == 1 && DrainSocket(p)) break;  // the reader died
        }
        sent = p.out.empty();
      }
      p.out.clear();
      if (!sent) p.closed = true;
    }
    return Status::OK();
  }

  std::string Describe() const override {
    int shm = 0;
    for (const Peer& p : peers_) shm += p.link ? 1 : 0;
    std::ostringstream o;
    o << "sockets to " << peers_.size() << (peers_.size() == 1 ? " peer" : " peers") << ", "
      << shm << " of them through shared memory";
    return o.str();
  }

  bool Wait(int wake_fd, std::chrono::microseconds timeout) override {
    std::vector<struct pollfd> fds;
    std::vector<Peer*> polled;
    fds.push_back({wake_fd, POLLIN, 0});
    bool ready = false;  // bytes already in a ring: do not sleep
    for (Peer& p : peers_) {
      if (p.closed) continue;
      short ev = POLLIN;
      if (p.link) {
        ready |= !p.rx->PrepareToSleep();
        // A full ring frees space without a signal: look again soon.
        if (!p.out.empty()) timeout = std::min(timeout, std::chrono::microseconds(1000));
      } else if (!p.out.empty()) {
        ev |= POLLOUT;
      }
      fds.push_back({p.fd, ev, 0});
      polled.push_back(&p);
    }
    if (ready) timeout = std::chrono::microseconds(0);
    struct timespec ts;
    ts.tv_sec = timeout.count() / 1000000;
    ts.tv_nsec = (timeout.count() % 1000000) * 1000;
    ppoll(fds.data(), fds.size(), &ts, nullptr);
    for (size_t i = 0; i < polled.size(); ++i) {
      Peer& p = *polled[i];
      if (p.link) {
        p.rx->Awake();
        p.sock_readable = fds[i + 1].revents != 0;
      }
      Flush(p);
    }
    return true;
  }

 private:
  Status Queue(int rank, const std::string& bytes) {
    auto it = by_rank_.find(rank);
    if (it == by_rank_.end()) return Status::Internal("no control connection to rank " + std::to_string(rank));
    Peer& p = peers_[it->second];
    if (p.closed) return Status::OK();  // the peer is gone; Read reported it
    uint32_t n = static_cast<uint32_t>(bytes.size());
    p.out.append(reinterpret_cast<const char*>(&n), 4);
    p.out.append(bytes);
    Flush(p);
    return Status::OK();
  }

  void Flush(Peer& p) {
    if (p.link) {
      if (p.closed || p.out.empty()) return;
      size_t w = p.tx->Write(p.out.data(), p.out.size());
      p.out.erase(0, w);
      if (w > 0 && p.tx->ReaderMaySleep()) {
        char bell = 0;
        ssize_t r = send(p.fd, &bell, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        // A full socket already holds doorbells; any other error means the
        // peer is gone, which its end-of-file reports.
        (void)r;
      }
      return;
    }
    while (!p.closed && !p.out.empty()) {
      ssize_t w = send(p.fd, p.out.data(), p.out.size(), MSG_NOSIGNAL);
      if (w > 0) {
        p.out.erase(0, static_cast<size_t>(w));
      } else {
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        p.closed = true;  // EPIPE etc.: Read reports the loss
        return;
      }
    }
  }

  // Reads what the socket holds: data for a socket peer, doorbells for a
  // shared-memory peer.  Returns true at end-of-file or on an error.
  bool DrainSocket(Peer& p) {
    char buf[65536];
    while (true) {
      ssize_t r = recv(p.fd, buf, sizeof(buf), 0);
      if (r > 0) {
        if (!p.link) p.in.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return true;
      } else {
        return false;
      }
    }
  }

  Status Read(std::vector<std::pair<int, std::string>>* out) {
    for (Peer& p : peers_) {
      if (p.closed && p.fd < 0) continue;
      bool eof = p.closed;
      if (p.link) {
        p.rx->Read(&p.in);
        // The socket only matters for doorbells and end-of-file: look at it
        // when poll() said so, and now and then while spinning.
        if (!eof && (p.sock_readable || (++p.reads & 1023) == 0)) {
          p.sock_readable = false;
          eof = DrainSocket(p);
          if (eof) p.rx->Read(&p.in);  // bytes written just before it died
        }
      } else if (!eof) {
        eof = DrainSocket(p);
      }
      size_t off = 0;
      while (p.in.size() - off >= 4) {
        uint32_t n;
        std::memcpy(&n, p.in.data() + off, 4);
        if (p.in.size() - off - 4 < n) break;
        out->emplace_back(p.rank, p.in.substr(off + 4, n));
        off += 4 + n;
      }
      p.in.erase(0, off);
      if (eof) {
        close(p.fd);
        p.fd = -1;
        p.closed = true;
        out->emplace_back(p.rank, std::string());  // the peer is gone
      }
    }
    return Status::OK();
  }

  std::vector<Peer> peers_;
  std::unordered_map<int, size_t> by_rank_;
};

}  // namespace

Status CreateTcpControl(int rank, int size, const TcpBootstrap& boot, const TcpOptions& opt,
                        std::unique_ptr<ControlChannel>* out) {
  std::vector<TcpControl::Peer> peers;
  int listen_fd = -1;
  int unix_fd = -1;  // same-host workers connect here: cheaper than TCP loopback
  bool worker_via_unix = false;
  std::vector<bool> via_unix;  // rank 0: per accepted peer
  std::string info;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string session_key;  // hex; rank 0 draws it, the bootstrap carries it
  if (rank == 0 && size > 1) {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    std::vector<std::string> advertised = LocalAddresses(opt.ifname);
    if (opt.loopback_only && opt.ifname.empty()) {
      advertised = {"127.0.0.1"};
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (!opt.ifname.empty() && !advertised.empty()) {
      inet_pton(AF_INET, advertised[0].c_str(), &addr.sin_addr);
    }
    socklen_t len = sizeof(addr);
    session_key = HexEncode(RandomBytes(32));
    if (listen_fd < 0 || session_key.empty() ||
        bind(listen_fd, reinterpret_cast<struct sockaddr*>(&addr), len) != 0 ||
        listen(listen_fd, 4096) != 0 ||
        getsockname(listen_fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
      info = "";  // tells the workers to give up
    } else {
      std::ostringstream name;
      name << "tfhvd." << getpid() << "." << ntohs(addr.sin_port) << "."
           << Clock::now().time_since_epoch().count();
      unix_fd = ListenUnix(name.str(), 4096);
      std::ostringstream o;
      o << host << "|" << ntohs(addr.sin_port) << "|";
      for (const auto& ip : advertised) o << ip << ",";
      o << "|" << (unix_fd >= 0 ? name.str() : "") << "|" << session_key;
      info = o.str();
    }
  }
  TFHVD_RETURN_IF_ERROR(boot.broadcast(&info));
  // What error messages may show: the addresses, not the session key.
  const std::string shown = info.substr(0, info.rfind('|'));
  // Phase 1: workers connect (the kernel queues them on the listening socket)
  // and send their hello.
  int ok = 1;
  if (size > 1 && info.empty()) ok = 0;
  if (rank > 0 && ok) {
    std::istringstream in(info);
    std::string chost, port_s, ips_s, unix_name;
    std::getline(in, chost, '|');
    std::getline(in, port_s, '|');
    std::getline(in, ips_s, '|');
    std::getline(in, unix_name, '|');
    std::getline(in, session_key, '|');
    std::vector<std::string> candidates;
    if (chost == host) candidates.push_back("127.0.0.1");
    std::istringstream ips(ips_s);
    for (std::string ip; std::getline(ips, ip, ',');) {
      if (!ip.empty() && !(chost == host && ip == "127.0.0.1")) candidates.push_back(ip);
    }
    int fd = chost == host && !unix_name.empty() ? ConnectUnix(unix_name) : -1;
    worker_via_unix = fd >= 0;
    for (size_t i = 0; fd < 0 && i < candidates.size(); ++i) {
      fd = ConnectTo(candidates[i], std::stoi(port_s), 2.0);
    }
    const std::string hello = MakeHello(ControlKey(opt.secret, session_key), rank);
    if (fd < 0 || !WriteAll(fd, hello.data(), hello.size(), opt.connect_timeout_s)) {
      if (fd >= 0) close(fd);
      ok = 0;
    } else {
      TcpControl::Peer p;
      p.fd = fd;
      p.rank = 0;
      peers.push_back(std::move(p));
    }
  }
  int all_ok = 0;
  TFHVD_RETURN_IF_ERROR(boot.all_min(ok, &all_ok));
  // Phase 2: the coordinator admits the workers that prove the key
  // (tcp_handshake.h) and learns their ranks.
  std::string refused;
  if (rank == 0 && all_ok) {
    std::vector<AcceptedPeer> accepted;
    if (!AcceptWorkers(listen_fd, unix_fd, size, ControlKey(opt.secret, session_key),
                       opt.connect_timeout_s, &accepted, &refused)) {
      ok = 0;
    }
    for (const AcceptedPeer& a : accepted) {
      TcpControl::Peer p;
      p.fd = a.fd;
      p.rank = a.rank;
      SetNonBlocking(p.fd);
      peers.push_back(std::move(p));
      via_unix.push_back(a.via_unix);
    }
  }
  // Phase 3: shared memory for the workers on this host (shm_ring.h).  Rank
  // 0 decides: it sends every worker that came over the Unix socket one byte,
  // 'L' with the memfd or 'N' without; only an 'L' is answered, 'A' (mapped)
  // or 'N'.  Every rank runs the same bootstrap collectives whatever happens.
  if (all_ok) {
    if (rank == 0 && ok) {
      for (size_t i = 0; i < peers.size(); ++i) {
        if (!via_unix[i]) continue;
        std::unique_ptr<ShmLink> link;
        int memfd = -1;
        const bool made = opt.shared_memory && ShmLink::Create(kShmRingBytes, &link, &memfd).ok();
        if (!SendFd(peers[i].fd, memfd, made ? 'L' : 'N')) {
          ok = 0;
        } else if (made) {
          peers[i].link = std::move(link);
        }
        if (memfd >= 0) close(memfd);
      }
    }
    TFHVD_RETURN_IF_ERROR(boot.all_min(ok, &all_ok));
    if (rank > 0 && all_ok && worker_via_unix) {
      char payload = 0;
      int memfd = -1;
      if (!RecvFd(peers[0].fd, opt.connect_timeout_s, &payload, &memfd)) {
        // The channel is abandoned (every rank learns it below); an answer
        // spares rank 0 its wait for one.
        ok = 0;
        const char nack = 'N';
        WriteAll(peers[0].fd, &nack, 1, 1.0);
      } else if (payload == 'L') {
        std::unique_ptr<ShmLink> link;
        const char ack = memfd >= 0 && ShmLink::Map(memfd, &link).ok() ? 'A' : 'N';
        if (ack == 'A') peers[0].link = std::move(link);
        if (!WriteAll(peers[0].fd, &ack, 1, opt.connect_timeout_s)) ok = 0;
      }
      if (memfd >= 0) close(memfd);
    }
    if (rank == 0 && all_ok) {
      for (size_t i = 0; i < peers.size() && ok; ++i) {
        if (!peers[i].link) continue;
        char ack = 'N';
        if (!ReadAll(peers[i].fd, &ack, 1, opt.connect_timeout_s)) ok = 0;
        if (ack != 'A') peers[i].link.reset();  // the worker could not map it
      }
    }
  }
  for (auto& p : peers) {
    if (!p.link) continue;
    p.tx = rank == 0 ? &p.link->to_worker() : &p.link->to_coordinator();
    p.rx = rank == 0 ? &p.link->to_coordinator() : &p.link->to_worker();
  }
  if (listen_fd >= 0) close(listen_fd);
  if (unix_fd >= 0) close(unix_fd);
  if (all_ok) TFHVD_RETURN_IF_ERROR(boot.all_min(ok, &all_ok));
  if (!all_ok) {
    for (auto& p : peers) close(p.fd);
    return Status::Internal(
        "could not connect every worker to the coordinator over TCP (coordinator advertised '" +
        shown + "')" + (refused.empty() ? "" : ": " + refused));
  }
  *out = std::make_unique<TcpControl>(std::move(peers));
  return Status::OK();
}

}  // namespace tfhvd
