// The TCP KV transport: one connection per transfer, a thread per active
// connection on each side (bounded by max_connections), blocking I/O with
// deadlines through poll(). The receiver reads each layer straight into the
// reserved KV blocks and the sender writes straight from its own (writev),
// so no byte is copied in user space. The bytes on the wire are
// kvtransfer/wire.h's, with the magic "PDQKVTCP".
#include "kvtransfer/tcp/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/wire.h"

namespace pdq::kvtransfer {
namespace {

using wire::Frame;
constexpr std::string_view kMagic = "PDQKVTCP";

absl::Status SendStatus(int fd, const absl::Status& s, absl::Time deadline) {
  const std::string bytes = wire::EncodeStatus(s);
  return WriteFull(fd, bytes.data(), bytes.size(), deadline);
}

absl::Status ReadStatus(int fd, absl::Time deadline) {
  char head[wire::kStatusHeadBytes];
  PDQ_RETURN_IF_ERROR(ReadFull(fd, head, sizeof head, deadline));
  PDQ_ASSIGN_OR_RETURN(const uint32_t message_bytes, wire::StatusMessageBytes(head));
  std::string message(message_bytes, '\0');
  PDQ_RETURN_IF_ERROR(ReadFull(fd, message.data(), message.size(), deadline));
  return wire::DecodeStatus(head, std::move(message));
}

}  // namespace

// ---- Receiving side ---------------------------------------------------------

struct TcpTransport::InboundState {
  InboundSpec spec;
  std::mutex mu;
  std::condition_variable cv;
  int fd = -1;          // while a connection thread serves it
  bool active = false;  // a connection thread may touch the spans
  bool aborted = false;
};

class TcpTransport::TcpInbound : public Inbound {
 public:
  TcpInbound(TcpTransport* t, std::shared_ptr<InboundState> s) : t_(t), s_(std::move(s)) {}
  ~TcpInbound() override {
    {
      std::unique_lock lock(s_->mu);
      s_->aborted = true;
      if (s_->fd >= 0) shutdown(s_->fd, SHUT_RDWR);
      s_->cv.wait(lock, [&] { return !s_->active; });
    }
    t_->expected_.Forget(*s_);
  }

 private:
  TcpTransport* t_;
  std::shared_ptr<InboundState> s_;
};

absl::StatusOr<std::unique_ptr<Transport>> TcpTransport::Create(const TransportOptions& options) {
  absl::StatusOr<Fd> fd = Listen(options.listen_address, 128);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<HostPort> hp = ParseHostPort(options.listen_address);
  absl::StatusOr<std::string> address = LocalAddress(fd->get(), hp->host);
  if (!address.ok()) return address.status();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  auto t = std::unique_ptr<TcpTransport>(new TcpTransport(options, std::move(*fd), *address));
  t->wake_read_ = Fd(pipe_fds[0]);
  t->wake_write_ = Fd(pipe_fds[1]);
  t->listener_ = std::thread([p = t.get()] { p->AcceptLoop(); });
  return t;
}

TcpTransport::TcpTransport(const TransportOptions& options, Fd listener, std::string address)
    : options_(options), listen_(std::move(listener)), address_(std::move(address)) {}

TcpTransport::~TcpTransport() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (int fd : connection_fds_) shutdown(fd, SHUT_RDWR);
  }
  const char byte = 1;
  (void)!write(wake_write_.get(), &byte, 1);
  listener_.join();
  std::unique_lock lock(mu_);
  connections_done_.wait(lock, [&] { return connections_ == 0; });
}

absl::StatusOr<std::unique_ptr<Inbound>> TcpTransport::Expect(InboundSpec spec) {
  PDQ_ASSIGN_OR_RETURN(std::shared_ptr<InboundState> state,
                       expected_.Add(std::move(spec), options_));
  return std::unique_ptr<Inbound>(new TcpInbound(this, std::move(state)));
}

void TcpTransport::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    Fd conn(accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    std::lock_guard lock(mu_);
    if (stopping_ || connections_ >= options_.max_connections) continue;  // closes it
    ++connections_;
    connection_fds_.insert(conn.get());
    std::thread([this, fd = std::move(conn)]() mutable {
      ServeConnection(fd.get());
      std::lock_guard lock(mu_);
      connection_fds_.erase(fd.get());
      fd.Reset();
      if (--connections_ == 0) connections_done_.notify_all();
    }).detach();
  }
}

void TcpTransport::ServeConnection(int fd) {
  auto deadline = [&] { return absl::Now() + options_.io_timeout; };
  char hello_bytes[wire::kHelloBytes];
  if (!ReadFull(fd, hello_bytes, sizeof hello_bytes, deadline()).ok()) return;
  absl::StatusOr<wire::Hello> hello = wire::ParseHello(kMagic, "tcp", hello_bytes, options_.layout);
  if (!hello.ok()) {
    (void)SendStatus(fd, hello.status(), deadline());
    return;
  }
  std::string token(hello->token_bytes, '\0');
  if (!ReadFull(fd, token.data(), token.size(), deadline()).ok()) return;
  const absl::Status layout_ok = hello->layout;

  // Claim the transfer the token names; a token is good for one connection.
  std::shared_ptr<InboundState> s = expected_.Claim(token);
  if (s == nullptr) {
    (void)SendStatus(fd, absl::PermissionDeniedError("no KV transfer is expected for this token"),
                     deadline());
    return;
  }
  {
    std::lock_guard lock(s->mu);
    if (s->aborted) {
      (void)SendStatus(fd, absl::CancelledError("the KV transfer was cancelled"), deadline());
      return;
    }
    s->fd = fd;
    s->active = true;
  }
  // The handshake's answer, then the frames and the answer to the notice.
  KvNotice notice;
  absl::Status status = SendStatus(fd, layout_ok, deadline());
  if (status.ok() && layout_ok.ok()) {
    if (s->spec.connected) s->spec.connected();
    status = ReceiveFrames(fd, *s, &notice);
    if (status.ok() || status.code() == absl::StatusCode::kDataLoss) {
      (void)SendStatus(fd, status, deadline());
    }
  } else if (status.ok()) {
    status = layout_ok;
  }
  std::unique_lock lock(s->mu);
  if (!s->aborted) {
    lock.unlock();
    s->spec.done(status, notice);
    lock.lock();
  }
  s->fd = -1;
  s->active = false;
  s->cv.notify_all();
}

absl::Status TcpTransport::ReceiveFrames(int fd, InboundState& s, KvNotice* notice) {
  wire::FrameChecker checker(s.spec, options_.regions);
  for (bool first = true;; first = false) {
    Frame f;
    // The first frame may wait for the sender's queued prompt.
    const absl::Time by = absl::Now() + options_.io_timeout;
    PDQ_RETURN_IF_ERROR(
        ReadFull(fd, &f, sizeof f, first ? std::max(by, s.spec.first_layer_deadline) : by));
    if (f.type == wire::kLayerFrame) {
      PDQ_ASSIGN_OR_RETURN(const std::vector<KvSpan>* spans, checker.BeginLayer(f));
      // The whole layer in as few reads as the socket allows, straight into
      // the blocks (one recv per 6 KiB span capped loopback near 1 GB/s).
      std::vector<iovec> iov;
      iov.reserve(spans->size());
      for (const KvSpan& sp : *spans) {
        iov.push_back({options_.regions[sp.region].data + sp.offset, (size_t)sp.bytes});
      }
      PDQ_RETURN_IF_ERROR(
          ReadFull(fd, iov.data(), (int)iov.size(), absl::Now() + options_.io_timeout));
      checker.Landed(f.layer);
    } else if (f.type == wire::kDoneFrame) {
      PDQ_ASSIGN_OR_RETURN(*notice, checker.Done(f));
      return absl::OkStatus();
    } else {
      return absl::DataLossError("malformed KV frame");
    }
  }
}

// ---- Sending side -----------------------------------------------------------

class TcpTransport::TcpOutbound : public Outbound {
 public:
  TcpOutbound(const TcpTransport& t, std::string address, std::string token, absl::Time deadline,
              std::function<void(absl::Status)> done)
      : t_(t),
        address_(std::move(address)),
        token_(std::move(token)),
        deadline_(deadline),
        done_(std::move(done)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~TcpOutbound() override {
    {
      std::lock_guard lock(mu_);
      aborted_ = true;
      if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    }
    cv_.notify_all();
    thread_.join();
  }
  void PostLayer(int layer, std::vector<KvSpan> spans) override {
    Post({wire::kLayerFrame, layer, std::move(spans), {}});
  }
  void PostDone(const KvNotice& notice) override { Post({wire::kDoneFrame, 0, {}, notice}); }

 private:
  void Post(wire::Posted item) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
  }

  void Run() {
    absl::Status s = Transfer();
    bool aborted;
    {
      std::lock_guard lock(mu_);
      aborted = aborted_;
      fd_ = -1;
    }
    if (!aborted && done_) done_(s);
  }

  absl::Status Transfer() {
    absl::StatusOr<Fd> fd =
        ConnectTo(address_, std::min(deadline_, absl::Now() + t_.options_.io_timeout));
    if (!fd.ok()) return fd.status();
    {
      std::lock_guard lock(mu_);
      if (aborted_) return absl::CancelledError("KV transfer cancelled");
      fd_ = fd->get();
    }
    auto io_deadline = [&] { return std::min(deadline_, absl::Now() + t_.options_.io_timeout); };
    const std::string hello = wire::EncodeHello(kMagic, t_.options_.layout, token_);
    PDQ_RETURN_IF_ERROR(WriteFull(fd->get(), hello.data(), hello.size(), io_deadline()));
    PDQ_RETURN_IF_ERROR(ReadStatus(fd->get(), io_deadline()));

    wire::FrameMaker frames(t_.options_.regions);
    std::vector<iovec> iov;
    for (;;) {
      wire::Posted item;
      {
        std::unique_lock lock(mu_);
        // The sender's own compute paces the posts, so this wait is bounded
        // by the deadline rather than the I/O timeout.
        if (!cv_.wait_until(lock, absl::ToChronoTime(deadline_),
                            [&] { return aborted_ || !queue_.empty(); })) {
          return absl::DeadlineExceededError("KV transfer deadline passed");
        }
        if (aborted_) return absl::CancelledError("KV transfer cancelled");
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (item.type == wire::kLayerFrame) {
        Frame f = frames.Layer(item.layer, item.spans);
        iov.assign(1, iovec{&f, sizeof f});
        for (const KvSpan& sp : item.spans) {
          iov.push_back({t_.options_.regions[sp.region].data + sp.offset, (size_t)sp.bytes});
        }
        PDQ_RETURN_IF_ERROR(WriteFull(fd->get(), iov.data(), (int)iov.size(), io_deadline()));
      } else {
        const Frame f = frames.Done(item.notice);
        PDQ_RETURN_IF_ERROR(WriteFull(fd->get(), &f, sizeof f, io_deadline()));
        return ReadStatus(fd->get(), io_deadline());
      }
    }
  }

  const TcpTransport& t_;
  const std::string address_;
  std::string token_;
  const absl::Time deadline_;
  std::function<void(absl::Status)> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<wire::Posted> queue_;
  bool aborted_ = false;
  int fd_ = -1;
  std::thread thread_;
};

std::unique_ptr<Outbound> TcpTransport::Connect(const std::string& address,
                                                const std::string& token, absl::Time deadline,
                                                std::function<void(absl::Status)> done) {
  return std::make_unique<TcpOutbound>(*this, address, token, deadline, std::move(done));
}

}  // namespace pdq::kvtransfer
