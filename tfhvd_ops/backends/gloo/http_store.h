// Gloo's rendezvous Store over the launcher's HTTP key-value server
// (tfhvd/runner/gloo/rendezvous.py), as Horovod's HTTPStore does.
//
// Protocol (one request per connection, HTTP/1.0):
//   PUT /<scope>/<key>            body = value          -> 200
//   PUT /<scope>/<key>?exclusive=1                      -> 200 | 409 (exists)
//   GET /<scope>/<key>?wait_ms=N  waits up to N ms      -> 200 value | 404
// The server waits for a missing key itself (long poll), so a rank that waits
// for its peers sleeps in recv() instead of polling.
//
// Every request is signed with the job's secret (auth.h): headers
// X-Tfhvd-Auth: <unix time>:<nonce>:<hex HMAC-SHA256 over "tfhvd-http-1",
// method, path, time, nonce and the body's hex SHA-256, one per line> and
// X-Tfhvd-Body-Sha256, as tfhvd/runner/secret.py checks them.  A reply is
// read up to kMaxReplyBytes.  A connection that fails before a reply comes
// (a server busy refusing a flood) is retried until the deadline.
//
// Gloo calls Store methods from connectFullMesh and expects failures as
// exceptions: every failure throws gloo::IoException with the address, the
// key and the reason; GlooContext (gloo_context.h) turns it into a Status.
#ifndef TFHVD_BACKENDS_GLOO_HTTP_STORE_H_
#define TFHVD_BACKENDS_GLOO_HTTP_STORE_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

namespace tfhvd {

class HttpStore : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds every call, connecting included (the server may be
  // unreachable: the error then says so once the time is up).
  HttpStore(std::string host, int port, std::string scope, std::chrono::milliseconds timeout,
            std::string secret);

  static constexpr size_t kMaxReplyBytes = size_t{256} << 20;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Like set(), but false (and nothing written) when the key exists.
  bool SetExclusive(const std::string& key, const std::vector<char>& data);

  std::string Describe() const;

 private:
  // One request; returns the HTTP status and fills `body`.  Throws on
  // transport errors.
  int Request(const std::string& method, const std::string& path, const std::vector<char>& body,
              std::vector<char>* reply, std::chrono::steady_clock::time_point deadline);
  // GET with waiting; false when the key did not appear before `deadline`.
  bool Fetch(const std::string& key, std::vector<char>* value,
             std::chrono::steady_clock::time_point deadline);
  std::string Path(const std::string& key) const;

  std::string host_;
  int port_;
  std::string scope_;
  std::chrono::milliseconds timeout_;
  std::string secret_;
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_GLOO_HTTP_STORE_H_
