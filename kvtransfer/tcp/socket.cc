#include "kvtransfer/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdq::kvtransfer {
namespace {

std::string Errno() { return std::strerror(errno); }

// Waits for `events` on fd until the deadline.
absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("KV peer stalled");
    pollfd p{fd, events, 0};
    const int ms = (int)std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30);
    const int r = poll(&p, 1, ms);
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", Errno()));
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const HostPort& hp, bool passive,
                                                                   int family = AF_UNSPEC) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rc =
      getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", hp.host, "': ", gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  HostPort hp;
  size_t colon;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
    }
    hp.host = address.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "' has no port (want host:port)"));
    }
    hp.host = address.substr(0, colon);
  }
  if (!absl::SimpleAtoi(address.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in address '", address, "'"));
  }
  return hp;
}

absl::StatusOr<Fd> Listen(const std::string& address, int backlog) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto ai = Resolve(*hp, true);
  if (!ai.ok()) return ai.status();
  std::string last = "no address";
  for (addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && listen(fd.get(), backlog) == 0) {
      return fd;
    }
    last = Errno();
  }
  return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", last));
}

std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

int PortOf(const sockaddr_storage& address) {
  return address.ss_family == AF_INET6
             ? ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port)
             : ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

absl::StatusOr<SocketAddress> ResolveAddress(const std::string& address, bool passive, int family) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto ai = Resolve(*hp, passive, family);
  if (!ai.ok()) return ai.status();
  SocketAddress sa;
  std::memcpy(&sa.storage, (*ai)->ai_addr, (*ai)->ai_addrlen);
  sa.length = (*ai)->ai_addrlen;
  return sa;
}

absl::StatusOr<std::string> LocalAddress(int fd, const std::string& host) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", Errno()));
  }
  return JoinHostPort(host, PortOf(ss));
}

absl::StatusOr<Fd> ConnectTo(const std::string& address, absl::Time deadline) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto ai = Resolve(*hp, false);
  if (!ai.ok()) return ai.status();
  std::string last = "no address";
  for (addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) continue;
    int rc = connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      absl::Status w = WaitFor(fd.get(), POLLOUT, deadline);
      if (!w.ok()) return w;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
      SetNoDelay(fd.get());
      return fd;
    }
    last = Errno();
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to KV peer ", address, ": ", last));
}

absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline) {
  iovec one{data, n};
  return ReadFull(fd, &one, 1, deadline);
}

// Moves every byte of the vector through `io` (a recvmsg or sendmsg of the
// message, returning its result), trying first and waiting for `events`
// only when the socket would block: one system call per burst.
template <typename Io>
absl::Status TransferAll(int fd, iovec* iov, int iovcnt, short events, absl::Time deadline, Io io) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)std::min(iovcnt, 1024);
    const ssize_t r = io(msg);
    if (r == 0) return absl::UnavailableError("KV peer disconnected");
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) {
        return absl::UnavailableError(absl::StrCat("KV peer connection: ", Errno()));
      }
      if (absl::Status w = WaitFor(fd, events, deadline); !w.ok()) return w;
      continue;
    }
    size_t done = (size_t)r;
    while (iovcnt > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + done;
      iov->iov_len -= done;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, iovec* iov, int iovcnt, absl::Time deadline) {
  return TransferAll(fd, iov, iovcnt, POLLIN, deadline,
                     [fd](msghdr& m) { return recvmsg(fd, &m, MSG_DONTWAIT); });
}

absl::Status WriteFull(int fd, iovec* iov, int iovcnt, absl::Time deadline) {
  return TransferAll(fd, iov, iovcnt, POLLOUT, deadline,
                     [fd](msghdr& m) { return sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL); });
}

}  // namespace pdq::kvtransfer
