// Blocking TCP sockets with deadlines, for the TCP KV transport: every wait
// goes through poll() with the time left, so a stalled peer is an error and
// shutdown() from another thread wakes the waiter at once.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdq::kvtransfer {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port", "[v6]:port". InvalidArgument naming the address otherwise.
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

// "host:port", the host in brackets when it is an IPv6 address.
std::string JoinHostPort(const std::string& host, int port);
// The port of an IPv4 or IPv6 socket address.
int PortOf(const sockaddr_storage& address);
// The first socket address of `family` (AF_UNSPEC: any) that `address`
// ("host:port") resolves to; passive: an address to listen on (an empty host
// is any). Unavailable naming the host.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
absl::StatusOr<SocketAddress> ResolveAddress(const std::string& address, bool passive,
                                             int family = AF_UNSPEC);

// A listening socket bound to `address` (port 0: any free port).
absl::StatusOr<Fd> Listen(const std::string& address, int backlog);
// "host:port" the socket is bound to.
absl::StatusOr<std::string> LocalAddress(int fd, const std::string& host);
// Connects by `deadline`. Unavailable naming the address on failure.
absl::StatusOr<Fd> ConnectTo(const std::string& address, absl::Time deadline);

// Reads exactly n bytes by `deadline`: Unavailable when the peer closed,
// DeadlineExceeded when it stalled.
absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline);
// The same into every buffer of the vector in order (modifies `iov`).
absl::Status ReadFull(int fd, iovec* iov, int iovcnt, absl::Time deadline);
// Writes every byte of the vector by `deadline` (modifies `iov`).
absl::Status WriteFull(int fd, iovec* iov, int iovcnt, absl::Time deadline);
inline absl::Status WriteFull(int fd, const void* data, size_t n, absl::Time deadline) {
  iovec v{const_cast<void*>(data), n};
  return WriteFull(fd, &v, 1, deadline);
}

}  // namespace pdq::kvtransfer
