// The TCP KV transport: one connection per transfer, a thread per active
// connection on each side (bounded by max_connections), blocking I/O with
// deadlines through poll(). The receiver reads each layer straight into the
// reserved KV blocks and the sender writes straight from its own (writev),
// so no byte is copied in user space.
//
// Wire format (little-endian), after connect:
//   sender   hello: "PDQKVTCP", u32 version, KvLayout (40 bytes),
//            u32 token length, token
//   receiver reply: u32 status code, u32 message length, message
//   sender   frames of 32 bytes: u32 type, i32 layer, i64 count, u64 checksum,
//            i32 first token, u32 zero; a layer frame (count = bytes) is
//            followed by the layer's spans; the done frame carries the notice
//   receiver reply to the done frame, as above
#include "kvtransfer/tcp/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kvtransfer/tcp/socket.h"

namespace pdq::kvtransfer {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

constexpr char kMagic[8] = {'P', 'D', 'Q', 'K', 'V', 'T', 'C', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 8 + 4 + KvLayout::kSerializedBytes + 4;
constexpr uint32_t kMaxToken = 256;
constexpr uint32_t kMaxMessage = 4096;
enum FrameType : uint32_t { kLayerFrame = 1, kDoneFrame = 2 };

struct Frame {
  uint32_t type = 0;
  int32_t layer = 0;
  int64_t count = 0;
  uint64_t checksum = 0;
  int32_t first_token = -1;
  uint32_t zero = 0;
};
static_assert(sizeof(Frame) == 32);

absl::Status SendStatus(int fd, const absl::Status& s, absl::Time deadline) {
  const std::string msg(s.message().substr(0, kMaxMessage));
  uint32_t head[2] = {(uint32_t)s.code(), (uint32_t)msg.size()};
  iovec v[2] = {{head, sizeof head}, {const_cast<char*>(msg.data()), msg.size()}};
  return WriteFull(fd, v, 2, deadline);
}

absl::Status ReadStatus(int fd, absl::Time deadline) {
  uint32_t head[2];
  if (absl::Status r = ReadFull(fd, head, sizeof head, deadline); !r.ok()) return r;
  if (head[0] > (uint32_t)absl::StatusCode::kUnauthenticated || head[1] > kMaxMessage) {
    return absl::DataLossError("malformed reply from the KV peer");
  }
  std::string msg(head[1], '\0');
  if (absl::Status r = ReadFull(fd, msg.data(), msg.size(), deadline); !r.ok()) return r;
  return absl::Status((absl::StatusCode)head[0], msg);
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
    std::lock_guard lock(t_->mu_);
    t_->expected_.erase(s_->spec.token);
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
  if (spec.token.empty() || spec.token.size() > kMaxToken) {
    return absl::InvalidArgumentError("a KV transfer token must have 1 to 256 bytes");
  }
  if ((int)spec.layers.size() != options_.layout.num_layers || spec.tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a KV transfer needs spans for all ",
                                                   options_.layout.num_layers,
                                                   " layers and at least one token"));
  }
  for (const auto& layer : spec.layers) {
    for (const KvSpan& s : layer) {
      if (s.region < 0 || s.region >= (int)options_.regions.size() || s.offset < 0 || s.bytes < 0 ||
          s.offset + s.bytes > options_.regions[s.region].bytes) {
        return absl::InvalidArgumentError("a KV span lies outside the registered regions");
      }
    }
  }
  auto state = std::make_shared<InboundState>();
  state->spec = std::move(spec);
  std::lock_guard lock(mu_);
  if (!expected_.try_emplace(state->spec.token, state).second) {
    return absl::InvalidArgumentError("this KV transfer token is already expected");
  }
  return std::unique_ptr<Inbound>(new TcpInbound(this, state));
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
  // Hello.
  char hello[kHelloBytes];
  if (!ReadFull(fd, hello, sizeof hello, deadline()).ok()) return;
  uint32_t version, token_len;
  std::memcpy(&version, hello + 8, 4);
  std::memcpy(&token_len, hello + 12 + KvLayout::kSerializedBytes, 4);
  if (std::memcmp(hello, kMagic, 8) != 0 || version != kVersion || token_len == 0 ||
      token_len > kMaxToken) {
    (void)SendStatus(fd, absl::InvalidArgumentError("not a pdq KV transfer (tcp, version 1)"),
                     deadline());
    return;
  }
  std::string token(token_len, '\0');
  if (!ReadFull(fd, token.data(), token.size(), deadline()).ok()) return;
  absl::Status layout_ok;
  if (absl::StatusOr<KvLayout> theirs =
          KvLayout::Deserialize(std::string_view(hello + 12, KvLayout::kSerializedBytes));
      !theirs.ok()) {
    layout_ok = theirs.status();
  } else {
    layout_ok = CheckKvCompatible(options_.layout, *theirs);
  }

  // Claim the transfer the token names; a token is good for one connection.
  std::shared_ptr<InboundState> s;
  {
    std::lock_guard lock(mu_);
    if (auto it = expected_.find(token); it != expected_.end()) {
      s = it->second.lock();
      expected_.erase(it);
    }
  }
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
  const InboundSpec& spec = s.spec;
  std::vector<bool> received(spec.layers.size(), false);
  uint64_t checksum = 0;
  for (;;) {
    Frame f;
    PDQ_RETURN_IF_ERROR(ReadFull(fd, &f, sizeof f, absl::Now() + options_.io_timeout));
    if (f.type == kLayerFrame) {
      if (f.layer < 0 || f.layer >= (int)spec.layers.size() || received[f.layer]) {
        return absl::DataLossError(absl::StrCat("KV layer ", f.layer, " unexpected"));
      }
      const std::vector<KvSpan>& spans = spec.layers[f.layer];
      int64_t bytes = 0;
      for (const KvSpan& sp : spans) bytes += sp.bytes;
      if (f.count != bytes) {
        return absl::DataLossError(
            absl::StrCat("KV layer ", f.layer, " has ", f.count, " bytes; ", bytes, " expected"));
      }
      for (const KvSpan& sp : spans) {
        std::byte* dst = options_.regions[sp.region].data + sp.offset;
        PDQ_RETURN_IF_ERROR(ReadFull(fd, dst, (size_t)sp.bytes, absl::Now() + options_.io_timeout));
      }
      checksum = ChecksumSpans(options_.regions, spans, checksum);
      received[f.layer] = true;
    } else if (f.type == kDoneFrame) {
      for (size_t l = 0; l < received.size(); ++l) {
        if (!received[l]) {
          return absl::DataLossError(absl::StrCat("KV done before layer ", l, " arrived"));
        }
      }
      if (f.count != spec.tokens) {
        return absl::DataLossError(
            absl::StrCat("the sender sent ", f.count, " tokens of KV; ", spec.tokens, " expected"));
      }
      if (f.checksum != checksum) return absl::DataLossError("KV checksum mismatch");
      notice->first_token = f.first_token;
      notice->tokens = f.count;
      notice->checksum = checksum;
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
    Post({kLayerFrame, layer, std::move(spans), {}});
  }
  void PostDone(const KvNotice& notice) override { Post({kDoneFrame, 0, {}, notice}); }

 private:
  struct Item {
    FrameType type;
    int layer;
    std::vector<KvSpan> spans;
    KvNotice notice;
  };
  void Post(Item item) {
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
    char hello[kHelloBytes];
    std::memcpy(hello, kMagic, 8);
    std::memcpy(hello + 8, &kVersion, 4);
    const std::string layout = t_.options_.layout.Serialize();
    std::memcpy(hello + 12, layout.data(), layout.size());
    const uint32_t token_len = (uint32_t)token_.size();
    std::memcpy(hello + 12 + layout.size(), &token_len, 4);
    iovec hv[2] = {{hello, sizeof hello}, {token_.data(), token_.size()}};
    PDQ_RETURN_IF_ERROR(WriteFull(fd->get(), hv, 2, io_deadline()));
    PDQ_RETURN_IF_ERROR(ReadStatus(fd->get(), io_deadline()));

    uint64_t checksum = 0;
    std::vector<iovec> iov;
    for (;;) {
      Item item;
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
      Frame f;
      f.type = item.type;
      f.layer = item.layer;
      if (item.type == kLayerFrame) {
        iov.assign(1, iovec{&f, sizeof f});
        for (const KvSpan& sp : item.spans) {
          f.count += sp.bytes;
          iov.push_back({t_.options_.regions[sp.region].data + sp.offset, (size_t)sp.bytes});
        }
        checksum = ChecksumSpans(t_.options_.regions, item.spans, checksum);
        PDQ_RETURN_IF_ERROR(WriteFull(fd->get(), iov.data(), (int)iov.size(), io_deadline()));
      } else {
        f.count = item.notice.tokens;
        f.checksum = checksum;
        f.first_token = item.notice.first_token;
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
  std::deque<Item> queue_;
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
