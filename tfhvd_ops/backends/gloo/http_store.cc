#include "http_store.h"

#include "../../core/auth.h"

#include <gloo/common/error.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace tfhvd {
namespace {

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1 << 30)));
}

// Closes the fd when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// Connects to host:port before `deadline`; -1 with `why` set on failure.
int Connect(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *why = std::string("cannot resolve the host: ") + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (struct addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      if (poll(&p, 1, MsLeft(deadline)) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
        rc = err == 0 ? 0 : -1;
        errno = err != 0 ? err : ETIMEDOUT;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc != 0) {
      *why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

bool SendAll(int fd, const std::string& bytes, Clock::time_point deadline) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, MsLeft(deadline)) != 1) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Reads until the server closes the connection (at most `cap` bytes).
bool RecvAll(int fd, std::string* out, Clock::time_point deadline, size_t cap) {
  char buf[65536];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      if (out->size() + static_cast<size_t>(n) > cap) {
        errno = EMSGSIZE;
        return false;
      }
      out->append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return true;
    } else if (errno == EAGAIN || errno == EINTR) {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, MsLeft(deadline)) != 1) return false;
    } else {
      return false;
    }
  }
}

std::string Escape(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// What an HTTP status from the server means for the user.
std::string Refusal(int code) {
  if (code != 403) return "";
  return "; the server refused this rank's signature: the rank's TFHVD_SECRET_KEY (or "
         "HOROVOD_SECRET_KEY) must be the one its launcher gave it";
}

}  // namespace

HttpStore::HttpStore(std::string host, int port, std::string scope,
                     std::chrono::milliseconds timeout, std::string secret)
    : host_(std::move(host)),
      port_(port),
      scope_(std::move(scope)),
      timeout_(timeout),
      secret_(std::move(secret)) {}

std::string HttpStore::Describe() const {
  return "the rendezvous server at " + host_ + ":" + std::to_string(port_);
}

std::string HttpStore::Path(const std::string& key) const {
  return "/" + Escape(scope_) + "/" + Escape(key);
}

int HttpStore::Request(const std::string& method, const std::string& path,
                       const std::vector<char>& body, std::vector<char>* reply,
                       Clock::time_point deadline) {
  const std::string body_hash = HexEncode(Sha256(std::string(body.begin(), body.end())));
  std::string resp;
  std::string why;
  bool reached = false;  // a connection was made at least once
  // The server may not be listening yet, not be reachable at all, or drop
  // the connection while it sheds a flood of strangers: retry until the
  // deadline, then say which.
  while (true) {
    Fd fd;
    if ((fd.fd = Connect(host_, port_, deadline, &why)) >= 0) {
      reached = true;
      const std::string stamp = std::to_string(
          std::chrono::duration_cast<std::chrono::seconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count());
      const std::string nonce = HexEncode(RandomBytes(16));
      const std::string mac = HexEncode(HmacSha256(
          secret_, "tfhvd-http-1\n" + method + "\n" + path + "\n" + stamp + "\n" + nonce +
                       "\n" + body_hash));
      std::string req = method + " " + path + " HTTP/1.0\r\nHost: " + host_ +
                        "\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nX-Tfhvd-Auth: " + stamp + ":" + nonce + ":" + mac +
                        "\r\nX-Tfhvd-Body-Sha256: " + body_hash + "\r\n\r\n";
      req.append(body.begin(), body.end());
      resp.clear();
      if (SendAll(fd.fd, req, deadline) && RecvAll(fd.fd, &resp, deadline, kMaxReplyBytes) &&
          !resp.empty()) {
        break;
      }
      why = resp.size() >= kMaxReplyBytes ? "a reply over 256 MiB" : std::strerror(errno);
    }
    if (Clock::now() + std::chrono::milliseconds(200) >= deadline) {
      const std::string within = " within " + std::to_string(timeout_.count() / 1000) + " s (" +
                                 why + "); check HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, or raise "
                                       "--start-timeout";
      if (!reached) GLOO_THROW_IO_EXCEPTION("tfhvd: cannot reach " + Describe() + within);
      GLOO_THROW_IO_EXCEPTION("tfhvd: " + method + " " + path + " to " + Describe() +
                              " got no answer" + within);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  size_t head = resp.find("\r\n\r\n");
  int code = 0;
  if (resp.compare(0, 5, "HTTP/") != 0 || head == std::string::npos ||
      std::sscanf(resp.c_str(), "HTTP/%*s %d", &code) != 1) {
    GLOO_THROW_IO_EXCEPTION("tfhvd: " + Describe() + " sent a malformed reply to " + method +
                            " " + path);
  }
  reply->assign(resp.begin() + head + 4, resp.end());
  return code;
}

void HttpStore::set(const std::string& key, const std::vector<char>& data) {
  std::vector<char> reply;
  int code = Request("PUT", Path(key), data, &reply, Clock::now() + timeout_);
  if (code != 200) {
    GLOO_THROW_IO_EXCEPTION("tfhvd: " + Describe() + " refused key " + key + " (HTTP " +
                            std::to_string(code) + Refusal(code) + ")");
  }
}

bool HttpStore::SetExclusive(const std::string& key, const std::vector<char>& data) {
  std::vector<char> reply;
  int code = Request("PUT", Path(key) + "?exclusive=1", data, &reply, Clock::now() + timeout_);
  if (code == 409) return false;
  if (code != 200) {
    GLOO_THROW_IO_EXCEPTION("tfhvd: " + Describe() + " refused key " + key + " (HTTP " +
                            std::to_string(code) + Refusal(code) + ")");
  }
  return true;
}

bool HttpStore::Fetch(const std::string& key, std::vector<char>* value,
                      Clock::time_point deadline) {
  while (true) {
    // Long poll: the server holds the request until the key exists, for at
    // most wait_ms (kept short of our deadline so the reply can arrive).
    int wait_ms = std::max(0, std::min(MsLeft(deadline) - 500, 10000));
    int code = Request("GET", Path(key) + "?wait_ms=" + std::to_string(wait_ms), {}, value,
                       deadline);
    if (code == 200) return true;
    if (code != 404) {
      GLOO_THROW_IO_EXCEPTION("tfhvd: " + Describe() + " answered HTTP " +
                              std::to_string(code) + " for key " + key + Refusal(code));
    }
    if (MsLeft(deadline) <= 500) return false;
  }
}

std::vector<char> HttpStore::get(const std::string& key) {
  std::vector<char> value;
  if (!Fetch(key, &value, Clock::now() + timeout_)) {
    GLOO_THROW_IO_EXCEPTION("tfhvd: key " + key + " did not appear on " + Describe() +
                            " within " + std::to_string(timeout_.count() / 1000) + " s");
  }
  return value;
}

void HttpStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(1000));
  std::vector<char> ignored;
  for (const std::string& key : keys) {
    if (!Fetch(key, &ignored, deadline)) {
      GLOO_THROW_IO_EXCEPTION("tfhvd: timed out after " + std::to_string(timeout.count() / 1000) +
                              " s waiting for key " + key + " on " + Describe() +
                              ": a rank did not start or cannot reach the server");
    }
  }
}

}  // namespace tfhvd
