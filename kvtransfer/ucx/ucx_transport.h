// The UCX backend of kvtransfer/transport.h: UCP stream endpoints created
// through a sockaddr listener, driven by one progress thread (design and wire
// format in the .cc).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/expected_transfers.h"
#include "kvtransfer/transport.h"

namespace pdq::kvtransfer {

class UcxTransport : public Transport {
 public:
  // Listens on options.listen_address, which must be IPv4 (see the .cc).
  // Unavailable when UCX cannot start or listen there.
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const TransportOptions& options);
  // Fails every transfer in flight (their done callbacks run), waits until
  // UCX holds no request, then stops the progress thread. Every Inbound and
  // Outbound must be destroyed first.
  ~UcxTransport() override;

  std::string name() const override { return "ucx"; }
  std::string address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<Inbound>> Expect(InboundSpec spec) override;
  std::unique_ptr<Outbound> Connect(const std::string& address, const std::string& token,
                                    absl::Time deadline,
                                    std::function<void(absl::Status)> done) override;

 private:
  struct Ucx;  // the UCP context, worker and listener
  struct InboundState;
  class Conn;
  class InConn;
  class OutConn;
  class UcxInbound;
  class UcxOutbound;

  explicit UcxTransport(const TransportOptions& options);
  absl::Status Start();

  // ---- Any thread ----
  // Runs `command` on the progress thread, in submission order.
  void Submit(std::function<void()> command);
  // Aborts the connection `find` returns on the progress thread (none: there
  // is nothing to abort) and waits until UCX holds none of its requests that
  // read or write KV memory, so none is touched after this returns.
  void AbortAndWait(std::function<std::shared_ptr<Conn>()> find);
  // Wakes the AbortAndWait that owns `flag`.
  void SetQuiet(bool* flag);

  // ---- The progress thread ----
  void ProgressLoop();
  void RunCommands();
  void Accept();
  void Settle();  // timeouts, closes, done callbacks, retiring quiet connections
  void Sleep();

  const TransportOptions options_;
  std::unique_ptr<Ucx> ucx_;
  std::string address_;
  std::thread thread_;

  // std::mutex rather than absl::Mutex: ThreadSanitizer sees through it.
  std::mutex mu_;
  std::condition_variable quiet_;
  std::thread::id thread_id_;                    // guarded by mu_
  std::vector<std::function<void()>> commands_;  // guarded by mu_
  ExpectedTransfers<InboundState> expected_;

  // Owned by the progress thread.
  std::vector<std::shared_ptr<Conn>> conns_;
  std::vector<void*> conn_requests_;  // ucp_conn_request_h not yet accepted
  int inbound_conns_ = 0;
  bool stopping_ = false;
};

}  // namespace pdq::kvtransfer
