// The UCX KV transport: one UCP context and worker per transport, owned by
// one progress thread (UCS_THREAD_MODE_SINGLE); every other thread talks to
// it through a command queue and wakes it with ucp_worker_signal. It sleeps
// in poll() on ucp_worker_get_efd after ucp_worker_arm, with the nearest
// connection deadline as the timeout.
//
// Connections: the receiver listens with ucp_listener_create (sockaddr, so
// the listener is a TCP port any host can reach; IPv4 only, see ResolveIpv4);
// a sender creates one client-server endpoint per transfer. Both ends use
// UCP_ERR_HANDLING_MODE_PEER, so a dead or departed peer fails the endpoint
// (err_handler) and its requests rather than leaving them pending. UCX picks
// the transports itself (UCX_TLS, default all): RDMA where there is some,
// else TCP. UCX 1.13 does not pick shared memory for endpoints in PEER mode,
// so two processes on one host without RDMA talk over TCP loopback.
//
// Bytes: UCP streams (ucp_stream_send_nbx / ucp_stream_recv_nbx with
// UCP_STREAM_RECV_FLAG_WAITALL), in exactly kvtransfer/wire.h's format with
// the magic "PDQKVUCX": hello, status, frames, status. A layer's spans travel
// as one UCP_DATATYPE_IOV send straight from the sender's KV regions, and are
// received by an IOV receive whose buffers are the receiver's KV spans, so
// pdq stages nothing. Why streams rather than tags or RMA: a stream belongs
// to its endpoint, so forcing the endpoint closed cancels every receive at
// once (ucp_stream_ep_cleanup) and drops whatever the peer still sends; tags
// match worker-wide, so the unexpected messages of an aborted transfer would
// stay in the worker; and a put needs the cache registered (ucp_mem_map) with
// its key in the peer's hands, which lets the peer write any block and cannot
// be taken back from one request when its handle is destroyed. The cost:
// streams are eager-only, so on RDMA hardware UCX copies through its receive
// buffers instead of a zero-copy rendezvous.
//
// Aborts: destroying a handle runs an abort on the progress thread; a
// transfer still under way force-closes its endpoint (UCP_EP_CLOSE_FLAG_FORCE),
// and the destructor returns once UCX holds no request that reads or writes
// the transfer's KV memory. done callbacks run on the progress thread,
// outside UCX callbacks, and only once that is so too.
//
// Timeouts: each connection keeps its own deadline (io_timeout after its last
// completed request, or the sender's deadline while it waits for the caller's
// next layer); a layer is one receive, so it must land within io_timeout.
// Whoever sends the last status (the receiver's answer) lingers until the
// peer closes, so the answer is not lost to a forced close.
#include "kvtransfer/ucx/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/wire.h"

namespace pdq::kvtransfer {
namespace {

using wire::Frame;
constexpr std::string_view kMagic = "PDQKVUCX";
constexpr int kMaxProgressRounds = 64;

std::string UcsMessage(ucs_status_t s) { return ucs_status_string(s); }

// IPv4 only: UCX 1.13's TCP transport writes an IPv6 peer address into room
// for an IPv4 one when the connection manager's address is IPv6
// (uct_tcp_ep_connect_to_ep), corrupting the heap.
absl::StatusOr<SocketAddress> ResolveIpv4(const std::string& address, bool passive) {
  PDQ_ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(address));
  if (hp.host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ucx KV transport takes IPv4 addresses; '", address, "' is IPv6"));
  }
  return ResolveAddress(address, passive, AF_INET);
}

struct ContextDeleter {
  void operator()(ucp_context_h c) const { ucp_cleanup(c); }
};
struct WorkerDeleter {
  void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
};
struct ListenerDeleter {
  void operator()(ucp_listener_h l) const { ucp_listener_destroy(l); }
};

}  // namespace

struct UcxTransport::Ucx {
  std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter> context;
  std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter> worker;
  std::unique_ptr<std::remove_pointer_t<ucp_listener_h>, ListenerDeleter> listener;
  int efd = -1;  // the worker's, not owned
};

struct UcxTransport::InboundState {
  InboundSpec spec;
  std::weak_ptr<Conn> conn;  // progress thread: the connection that claimed it
};

// ---- One connection (one transfer) ------------------------------------------

// Lives on the progress thread. UCX callbacks only record what happened and
// post the next receive; Settle() acts on the outcome outside them.
class UcxTransport::Conn : public std::enable_shared_from_this<Conn> {
 public:
  explicit Conn(UcxTransport& t) : t_(t), last_activity_(absl::Now()) {}
  virtual ~Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  virtual bool inbound() const = 0;

  // The handle is gone: no done callback, and KV memory is off limits. A
  // transfer still under way closes now; one that was decided lingers on,
  // as it touches no KV memory, so that its last status still reaches the
  // peer.
  void Abort() {
    aborted_ = true;
    Finish(absl::CancelledError("KV transfer cancelled"), false);
    if (state_ == State::kClosing) Close();
  }
  // The transport is stopping.
  void Shutdown() {
    Finish(absl::UnavailableError("the KV transport is shutting down"), false);
    if (state_ == State::kLingering) state_ = State::kClosing;
  }

  // Timeouts, the close, the done callback, in that order.
  void Settle(absl::Time now) {
    if (state_ == State::kActive && now >= Deadline()) OnTimeout(now);
    if (state_ == State::kLingering && now >= last_activity_ + t_.options_.io_timeout) {
      state_ = State::kClosing;
    }
    if (state_ == State::kClosing) Close();
    if (kv_quiet() && !reported_) {
      reported_ = true;
      if (!aborted_) Report();
    }
  }
  // When Settle has something to do without any event from UCX.
  absl::Time WakeAt() const {
    switch (state_) {
      case State::kActive:
        return Deadline();
      case State::kLingering:
        return last_activity_ + t_.options_.io_timeout;
      case State::kClosed:
        // UCX completes the requests of a closed endpoint as it discards
        // its lanes; look again soon in case that raises no event.
        return quiet() ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(10);
      default:
        return absl::InfiniteFuture();
    }
  }
  // Decided, and UCX holds no request that reads or writes KV memory: the
  // transfer will not touch it again.
  bool kv_quiet() const { return state_ != State::kActive && kv_requests_ == 0; }
  // Closed, reported, and UCX holds none of its requests: it may go.
  bool quiet() const { return state_ == State::kClosed && requests_ == 0 && reported_; }
  void AddKvQuietWaiter(bool* flag) { kv_quiet_waiters_.push_back(flag); }
  void NotifyKvQuiet() {
    if (!kv_quiet()) return;
    for (bool* flag : kv_quiet_waiters_) t_.SetQuiet(flag);
    kv_quiet_waiters_.clear();
  }

 protected:
  enum class State {
    kActive,     // the transfer is under way
    kLingering,  // decided; the last status is on its way, the peer closes
    kClosing,    // decided; close the endpoint at the next Settle
    kClosed,
  };

  virtual absl::Time Deadline() const = 0;  // while active
  virtual void OnTimeout(absl::Time now) = 0;
  virtual void OnReceived() = 0;  // the receive posted last has landed
  virtual absl::Status PeerError(ucs_status_t s) const = 0;
  virtual void Report() = 0;  // the done callback with result_

  bool active() const { return state_ == State::kActive; }
  bool busy() const { return requests_ > 0; }

  // Decides the transfer. A lingering connection lets the status just sent
  // reach the peer, which closes its end; otherwise the endpoint closes now.
  void Finish(absl::Status result, bool linger) {
    if (state_ != State::kActive) return;
    result_ = std::move(result);
    state_ = linger ? State::kLingering : State::kClosing;
    last_activity_ = absl::Now();
  }

  void Fail(ucs_status_t s) {
    if (state_ == State::kActive) {
      Finish(PeerError(s), false);
    } else if (state_ == State::kLingering) {
      state_ = State::kClosing;  // the peer closed: all is said
    }
  }

  ucp_ep_params_t EndpointParams() {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &OnEndpointError;
    p.err_handler.arg = this;
    return p;
  }

  // ---- Stream I/O; every send and receive completes through Completed ----
  void SendBytes(std::string bytes) {
    SendBuffer& b = send_buffers_.emplace_back();
    b.bytes = std::move(bytes);
    Send(b.bytes.data(), b.bytes.size(), ucp_dt_make_contig(1), false);
  }
  // The frame, then the spans straight from the KV regions.
  void SendLayer(const Frame& frame, const std::vector<KvSpan>& spans) {
    SendBuffer& b = send_buffers_.emplace_back();
    b.frame = frame;
    b.iov.push_back({&b.frame, sizeof b.frame});
    for (const KvSpan& s : spans) {
      if (s.bytes > 0)
        b.iov.push_back({t_.options_.regions[s.region].data + s.offset, (size_t)s.bytes});
    }
    Send(b.iov.data(), b.iov.size(), UCP_DATATYPE_IOV, true);
  }
  void Receive(void* data, size_t bytes) { Receive(data, bytes, ucp_dt_make_contig(1), false); }
  // Into the spans themselves.
  void ReceiveSpans(const std::vector<KvSpan>& spans) {
    recv_iov_.clear();
    for (const KvSpan& s : spans) {
      if (s.bytes > 0) {
        recv_iov_.push_back({t_.options_.regions[s.region].data + s.offset, (size_t)s.bytes});
      }
    }
    if (recv_iov_.empty()) {
      received_ = true;
      return;
    }
    Receive(recv_iov_.data(), recv_iov_.size(), UCP_DATATYPE_IOV, true);
  }
  // Hands each landed receive to OnReceived; a receive that completes at
  // once is handled here in turn rather than recursively.
  void Pump() {
    if (pumping_) return;
    pumping_ = true;
    while (received_ && active()) {
      received_ = false;
      OnReceived();
    }
    pumping_ = false;
  }

  UcxTransport& t_;
  ucp_ep_h ep_ = nullptr;
  absl::Status result_;
  absl::Time last_activity_;

 private:
  struct SendBuffer {
    std::string bytes;
    Frame frame;
    std::vector<ucp_dt_iov_t> iov;
  };

  void Send(const void* data, size_t count, ucp_datatype_t type, bool kv) {
    if (ep_ == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = type;
    p.user_data = this;
    p.cb.send = kv ? &OnKvSent : &OnSent;
    last_activity_ = absl::Now();
    Track(ucp_stream_send_nbx(ep_, data, count, &p), kv);
  }

  void Receive(void* data, size_t count, ucp_datatype_t type, bool kv) {
    if (ep_ == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
    p.datatype = type;
    p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
    p.user_data = this;
    p.cb.recv_stream = kv ? &OnKvReceived : &OnReceivedCallback;
    size_t length = 0;
    ucs_status_ptr_t r = ucp_stream_recv_nbx(ep_, data, count, &length, &p);
    if (r == nullptr) {
      received_ = true;  // it was already here
      last_activity_ = absl::Now();
    } else {
      Track(r, kv);
    }
  }

  // UCX's callbacks; `c` is the connection.
  static void OnEndpointError(void* c, ucp_ep_h, ucs_status_t s) { static_cast<Conn*>(c)->Fail(s); }
  static void OnSent(void* r, ucs_status_t s, void* c) {
    static_cast<Conn*>(c)->Completed(r, s, false);
  }
  static void OnKvSent(void* r, ucs_status_t s, void* c) {
    static_cast<Conn*>(c)->Completed(r, s, true);
  }
  static void OnReceivedCallback(void* r, ucs_status_t s, size_t, void* c) {
    static_cast<Conn*>(c)->Received(r, s, false);
  }
  static void OnKvReceived(void* r, ucs_status_t s, size_t, void* c) {
    static_cast<Conn*>(c)->Received(r, s, true);
  }

  void Track(ucs_status_ptr_t r, bool kv) {
    if (UCS_PTR_IS_PTR(r)) {
      ++requests_;
      if (kv) ++kv_requests_;
    } else if (UCS_PTR_IS_ERR(r)) {
      Fail(UCS_PTR_STATUS(r));
    }
  }

  void Completed(void* request, ucs_status_t s, bool kv) {
    ucp_request_free(request);
    --requests_;
    if (kv) --kv_requests_;
    last_activity_ = absl::Now();
    if (s != UCS_OK) Fail(s);
  }

  void Received(void* request, ucs_status_t s, bool kv) {
    Completed(request, s, kv);
    if (s == UCS_OK && active()) {
      received_ = true;
      Pump();
    }
  }

  // Forcing the endpoint closed completes its pending receives at once and
  // its sends once UCX has discarded the lanes (UCS_ERR_CANCELED).
  void Close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    received_ = false;
    if (ep_ == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(std::exchange(ep_, nullptr), &p);
    if (UCS_PTR_IS_PTR(r)) {
      // Not expected for a forced close; wait for it all the same.
      while (ucp_request_check_status(r) == UCS_INPROGRESS)
        ucp_worker_progress(t_.ucx_->worker.get());
      ucp_request_free(r);
    }
  }

  State state_ = State::kActive;
  int requests_ = 0;     // UCX requests not yet completed
  int kv_requests_ = 0;  // those that read or write KV memory
  bool received_ = false;
  bool pumping_ = false;
  bool reported_ = false;
  bool aborted_ = false;
  std::deque<SendBuffer> send_buffers_;  // until the connection goes
  std::vector<ucp_dt_iov_t> recv_iov_;
  std::vector<bool*> kv_quiet_waiters_;  // AbortAndWait's
};

// ---- Receiving side ---------------------------------------------------------

class UcxTransport::InConn : public Conn {
 public:
  using Conn::Conn;
  bool inbound() const override { return true; }

  // Accepts the connection and waits for the hello. False when UCX refused.
  bool Open(ucp_conn_request_h request) {
    ucp_ep_params_t p = EndpointParams();
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = request;
    if (ucp_ep_create(t_.ucx_->worker.get(), &p, &ep_) != UCS_OK) {
      ep_ = nullptr;
      Finish(absl::UnavailableError("cannot accept the KV connection"), false);
      return false;
    }
    Receive(hello_, sizeof hello_);
    Pump();
    return true;
  }

 private:
  enum class Step { kHello, kToken, kFrame, kLayer };

  absl::Time Deadline() const override {
    const absl::Time idle = last_activity_ + t_.options_.io_timeout;
    // Before the first frame the sender's prompt may still be queued.
    if (step_ == Step::kFrame && !framed_ && transfer_ != nullptr) {
      return std::max(idle, transfer_->spec.first_layer_deadline);
    }
    return idle;
  }
  void OnTimeout(absl::Time) override {
    Finish(absl::DeadlineExceededError("KV peer stalled"), false);
  }
  absl::Status PeerError(ucs_status_t s) const override {
    return absl::UnavailableError(absl::StrCat("KV peer disconnected (", UcsMessage(s), ")"));
  }
  void Report() override {
    if (transfer_ != nullptr) transfer_->spec.done(result_, notice_);
  }

  void OnReceived() override {
    switch (step_) {
      case Step::kHello:
        return OnHello();
      case Step::kToken:
        return OnToken();
      case Step::kFrame:
        return OnFrame();
      case Step::kLayer:
        checker_->Landed(frame_.layer);
        return ReceiveFrame();
    }
  }

  void OnHello() {
    absl::StatusOr<wire::Hello> hello = wire::ParseHello(kMagic, "ucx", hello_, t_.options_.layout);
    if (!hello.ok()) return Answer(hello.status());
    layout_ = hello->layout;
    token_.resize(hello->token_bytes);
    step_ = Step::kToken;
    Receive(token_.data(), token_.size());
  }

  // Claims the transfer the token names (a token is good for one
  // connection), then answers the handshake.
  void OnToken() {
    transfer_ = t_.expected_.Claim(token_);
    if (transfer_ == nullptr) {
      return Answer(absl::PermissionDeniedError("no KV transfer is expected for this token"));
    }
    transfer_->conn = weak_from_this();
    if (!layout_.ok()) return Answer(layout_);
    SendBytes(wire::EncodeStatus(absl::OkStatus()));
    checker_.emplace(transfer_->spec, t_.options_.regions);
    if (transfer_->spec.connected) transfer_->spec.connected();
    ReceiveFrame();
  }

  void ReceiveFrame() {
    step_ = Step::kFrame;
    Receive(&frame_, sizeof frame_);
  }

  void OnFrame() {
    framed_ = true;
    if (frame_.type == wire::kLayerFrame) {
      absl::StatusOr<const std::vector<KvSpan>*> spans = checker_->BeginLayer(frame_);
      if (!spans.ok()) return Answer(spans.status());
      step_ = Step::kLayer;
      ReceiveSpans(**spans);
    } else if (frame_.type == wire::kDoneFrame) {
      absl::StatusOr<KvNotice> notice = checker_->Done(frame_);
      if (notice.ok()) notice_ = *notice;
      Answer(notice.status());
    } else {
      Answer(absl::DataLossError("malformed KV frame"));
    }
  }

  // Tells the sender how it ended and lets the answer reach it.
  void Answer(const absl::Status& s) {
    SendBytes(wire::EncodeStatus(s));
    Finish(s, true);
  }

  Step step_ = Step::kHello;
  bool framed_ = false;  // a frame has arrived
  char hello_[wire::kHelloBytes];
  std::string token_;
  absl::Status layout_;
  std::shared_ptr<InboundState> transfer_;  // once claimed
  std::optional<wire::FrameChecker> checker_;
  Frame frame_;
  KvNotice notice_;
};

class UcxTransport::UcxInbound : public Inbound {
 public:
  UcxInbound(UcxTransport& t, std::shared_ptr<InboundState> s) : t_(t), s_(std::move(s)) {}
  ~UcxInbound() override {
    if (t_.expected_.Forget(*s_)) return;  // never claimed: no connection touches it
    t_.AbortAndWait([s = s_] { return s->conn.lock(); });
  }

 private:
  UcxTransport& t_;
  std::shared_ptr<InboundState> s_;
};

// ---- Sending side -----------------------------------------------------------

class UcxTransport::OutConn : public Conn {
 public:
  OutConn(UcxTransport& t, std::string address, std::string token, absl::Time deadline,
          std::function<void(absl::Status)> done)
      : Conn(t),
        address_(std::move(address)),
        token_(std::move(token)),
        deadline_(deadline),
        done_(std::move(done)),
        frames_(t.options_.regions) {}
  bool inbound() const override { return false; }

  // Connects and sends the hello; the layers wait for the answer.
  void Open() {
    absl::StatusOr<SocketAddress> to = ResolveIpv4(address_, false);
    if (!to.ok()) return Finish(to.status(), false);
    ucp_ep_params_t p = EndpointParams();
    p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&to->storage);
    p.sockaddr.addrlen = to->length;
    if (ucs_status_t s = ucp_ep_create(t_.ucx_->worker.get(), &p, &ep_); s != UCS_OK) {
      ep_ = nullptr;
      return Finish(PeerError(s), false);
    }
    SendBytes(wire::EncodeHello(kMagic, t_.options_.layout, token_));
    ReceiveStatus();
  }

  void Post(wire::Posted item) {
    queue_.push_back(std::move(item));
    SendQueued();
  }

 private:
  enum class Step { kHandshake, kSending, kAnswer };

  // Waiting on the network is bounded by the I/O timeout; waiting for the
  // caller's next layer (its compute) only by the deadline.
  absl::Time Deadline() const override {
    return busy() || step_ != Step::kSending
               ? std::min(deadline_, last_activity_ + t_.options_.io_timeout)
               : deadline_;
  }
  void OnTimeout(absl::Time now) override {
    Finish(absl::DeadlineExceededError(now >= deadline_ ? "KV transfer deadline passed"
                                                        : "KV peer stalled"),
           false);
  }
  absl::Status PeerError(ucs_status_t s) const override {
    return absl::UnavailableError(
        step_ == Step::kHandshake
            ? absl::StrCat("cannot connect to KV peer ", address_, ": ", UcsMessage(s))
            : absl::StrCat("KV peer ", address_, " disconnected (", UcsMessage(s), ")"));
  }
  void Report() override {
    if (done_) done_(result_);
  }

  void SendQueued() {
    while (active() && step_ == Step::kSending && !queue_.empty()) {
      wire::Posted item = std::move(queue_.front());
      queue_.pop_front();
      if (item.type == wire::kLayerFrame) {
        SendLayer(frames_.Layer(item.layer, item.spans), item.spans);
      } else {
        const Frame f = frames_.Done(item.notice);
        SendBytes(std::string(reinterpret_cast<const char*>(&f), sizeof f));
        step_ = Step::kAnswer;
        ReceiveStatus();
      }
    }
  }

  void ReceiveStatus() {
    message_.clear();
    Receive(status_head_, sizeof status_head_);
    Pump();
  }

  void OnReceived() override {
    if (message_.empty()) {
      absl::StatusOr<uint32_t> bytes = wire::StatusMessageBytes(status_head_);
      if (!bytes.ok()) return Finish(bytes.status(), false);
      if (*bytes > 0) {
        message_.resize(*bytes);
        return Receive(message_.data(), message_.size());
      }
    }
    const absl::Status s = wire::DecodeStatus(status_head_, message_);
    if (step_ == Step::kHandshake && s.ok()) {
      step_ = Step::kSending;
      return SendQueued();
    }
    Finish(s, false);  // refused, or the receiver's answer to the notice
  }

  const std::string address_;
  const std::string token_;
  const absl::Time deadline_;
  std::function<void(absl::Status)> done_;
  wire::FrameMaker frames_;
  std::deque<wire::Posted> queue_;
  Step step_ = Step::kHandshake;
  char status_head_[wire::kStatusHeadBytes];
  std::string message_;
};

class UcxTransport::UcxOutbound : public Outbound {
 public:
  UcxOutbound(UcxTransport& t, std::shared_ptr<OutConn> c) : t_(t), c_(std::move(c)) {}
  ~UcxOutbound() override {
    t_.AbortAndWait([c = c_]() -> std::shared_ptr<Conn> { return c; });
  }
  void PostLayer(int layer, std::vector<KvSpan> spans) override {
    Post({wire::kLayerFrame, layer, std::move(spans), {}});
  }
  void PostDone(const KvNotice& notice) override { Post({wire::kDoneFrame, 0, {}, notice}); }

 private:
  void Post(wire::Posted item) {
    t_.Submit([c = c_, item = std::move(item)]() mutable { c->Post(std::move(item)); });
  }

  UcxTransport& t_;
  std::shared_ptr<OutConn> c_;
};

// ---- The transport ----------------------------------------------------------

absl::StatusOr<std::unique_ptr<Transport>> UcxTransport::Create(const TransportOptions& options) {
  auto t = std::unique_ptr<UcxTransport>(new UcxTransport(options));
  PDQ_RETURN_IF_ERROR(t->Start());
  return t;
}

UcxTransport::UcxTransport(const TransportOptions& options) : options_(options) {}

absl::Status UcxTransport::Start() {
  PDQ_ASSIGN_OR_RETURN(const HostPort host_port, ParseHostPort(options_.listen_address));
  PDQ_ASSIGN_OR_RETURN(const SocketAddress listen, ResolveIpv4(options_.listen_address, true));
  auto fail = [](const std::string& what, ucs_status_t s) {
    return absl::UnavailableError(absl::StrCat("UCX: ", what, ": ", UcsMessage(s)));
  };
  ucx_ = std::make_unique<Ucx>();

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  params.name = "pdq-kv";
  ucp_context_h context;
  if (ucs_status_t s = ucp_init(&params, nullptr, &context); s != UCS_OK) {
    return fail("cannot initialise", s);
  }
  ucx_->context.reset(context);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker;
  if (ucs_status_t s = ucp_worker_create(context, &worker_params, &worker); s != UCS_OK) {
    return fail("cannot create a worker", s);
  }
  ucx_->worker.reset(worker);
  if (ucs_status_t s = ucp_worker_get_efd(worker, &ucx_->efd); s != UCS_OK) {
    return fail("no event file descriptor", s);
  }

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&listen.storage);
  lp.sockaddr.addrlen = listen.length;
  lp.conn_handler.cb = [](ucp_conn_request_h r, void* t) {
    static_cast<UcxTransport*>(t)->conn_requests_.push_back(r);  // accepted outside UCX
  };
  lp.conn_handler.arg = this;
  ucp_listener_h listener;
  if (ucs_status_t s = ucp_listener_create(worker, &lp, &listener); s != UCS_OK) {
    return fail(absl::StrCat("cannot listen on ", options_.listen_address,
                             s == UCS_ERR_BUSY ? " (address in use)" : ""),
                s);
  }
  ucx_->listener.reset(listener);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t s = ucp_listener_query(listener, &attr); s != UCS_OK) {
    return fail("cannot query the listener", s);
  }
  address_ = JoinHostPort(host_port.host, PortOf(attr.sockaddr));

  thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    Submit([this] { stopping_ = true; });
    thread_.join();
  }
  // The listener, the worker and the context go in that order (Ucx).
}

absl::StatusOr<std::unique_ptr<Inbound>> UcxTransport::Expect(InboundSpec spec) {
  PDQ_ASSIGN_OR_RETURN(std::shared_ptr<InboundState> state,
                       expected_.Add(std::move(spec), options_));
  return std::unique_ptr<Inbound>(new UcxInbound(*this, std::move(state)));
}

std::unique_ptr<Outbound> UcxTransport::Connect(const std::string& address,
                                                const std::string& token, absl::Time deadline,
                                                std::function<void(absl::Status)> done) {
  auto c = std::make_shared<OutConn>(*this, address, token, deadline, std::move(done));
  Submit([this, c] {
    conns_.push_back(c);
    c->Open();
  });
  return std::make_unique<UcxOutbound>(*this, c);
}

void UcxTransport::Submit(std::function<void()> command) {
  {
    std::lock_guard lock(mu_);
    commands_.push_back(std::move(command));
  }
  ucp_worker_signal(ucx_->worker.get());
}

void UcxTransport::AbortAndWait(std::function<std::shared_ptr<Conn>()> find) {
  bool on_progress_thread;
  {
    std::lock_guard lock(mu_);
    on_progress_thread = std::this_thread::get_id() == thread_id_;
  }
  if (on_progress_thread) {
    // From a done callback: its transfer holds no KV request by now, and
    // this thread cannot wait for itself.
    if (std::shared_ptr<Conn> c = find()) c->Abort();
    return;
  }
  bool quiet = false;  // guarded by mu_
  Submit([&] {
    std::shared_ptr<Conn> c = find();
    if (c != nullptr) c->Abort();
    // A connection that still touches KV memory is not quiet, so it is in
    // conns_, and Settle will wake the waiter.
    if (c == nullptr || c->kv_quiet()) {
      SetQuiet(&quiet);
    } else {
      c->AddKvQuietWaiter(&quiet);
    }
  });
  std::unique_lock lock(mu_);
  quiet_.wait(lock, [&] { return quiet; });
}

void UcxTransport::SetQuiet(bool* flag) {
  {
    std::lock_guard lock(mu_);
    *flag = true;
  }
  quiet_.notify_all();
}

void UcxTransport::ProgressLoop() {
  {
    std::lock_guard lock(mu_);
    thread_id_ = std::this_thread::get_id();
  }
  for (;;) {
    RunCommands();
    // Bounded, so that commands (an abort waiting in a destructor) and
    // timeouts are seen under a steady stream too; Sleep does not sleep
    // while events remain (ucp_worker_arm answers UCS_ERR_BUSY).
    for (int i = 0; i < kMaxProgressRounds; ++i) {
      if (ucp_worker_progress(ucx_->worker.get()) == 0) break;
    }
    if (stopping_ && ucx_->listener != nullptr) {
      for (const std::shared_ptr<Conn>& c : conns_) c->Shutdown();
    }
    Accept();
    if (stopping_) ucx_->listener.reset();
    Settle();
    if (stopping_ && conns_.empty()) return;
    Sleep();
  }
}

void UcxTransport::RunCommands() {
  std::vector<std::function<void()>> commands;
  {
    std::lock_guard lock(mu_);
    commands.swap(commands_);
  }
  for (std::function<void()>& c : commands) c();
}

void UcxTransport::Accept() {
  for (void* r : conn_requests_) {
    auto request = static_cast<ucp_conn_request_h>(r);
    if (stopping_ || inbound_conns_ >= options_.max_connections) {
      ucp_listener_reject(ucx_->listener.get(), request);
      continue;
    }
    auto c = std::make_shared<InConn>(*this);
    if (c->Open(request)) {
      conns_.push_back(c);
      ++inbound_conns_;
    }
  }
  conn_requests_.clear();
}

void UcxTransport::Settle() {
  const absl::Time now = absl::Now();
  // By index: a done callback may submit, but never adds here directly.
  for (size_t i = 0; i < conns_.size(); ++i) conns_[i]->Settle(now);
  size_t kept = 0;
  for (std::shared_ptr<Conn>& c : conns_) {
    c->NotifyKvQuiet();
    if (c->quiet()) {
      if (c->inbound()) --inbound_conns_;
    } else {
      conns_[kept++] = std::move(c);
    }
  }
  conns_.resize(kept);
}

void UcxTransport::Sleep() {
  {
    std::lock_guard lock(mu_);
    if (!commands_.empty()) return;
  }
  if (ucp_worker_arm(ucx_->worker.get()) == UCS_ERR_BUSY) return;  // more to progress
  absl::Time wake = absl::InfiniteFuture();
  for (const std::shared_ptr<Conn>& c : conns_) wake = std::min(wake, c->WakeAt());
  int timeout_ms = -1;
  if (wake != absl::InfiniteFuture()) {
    timeout_ms = (int)std::clamp<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(wake - absl::Now(), absl::Milliseconds(1))), 0,
        1 << 30);
  }
  pollfd p{ucx_->efd, POLLIN, 0};
  (void)poll(&p, 1, timeout_ms);
}

}  // namespace pdq::kvtransfer
