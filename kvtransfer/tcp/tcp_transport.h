// The TCP backend of kvtransfer/transport.h (wire format in the .cc).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "kvtransfer/expected_transfers.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"

namespace pdq::kvtransfer {

class TcpTransport : public Transport {
 public:
  // Listens on options.listen_address. Unavailable when it cannot.
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const TransportOptions& options);
  // Closes every connection (transfers in flight fail) and waits for their
  // threads.
  ~TcpTransport() override;

  std::string name() const override { return "tcp"; }
  std::string address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<Inbound>> Expect(InboundSpec spec) override;
  std::unique_ptr<Outbound> Connect(const std::string& address, const std::string& token,
                                    absl::Time deadline,
                                    std::function<void(absl::Status)> done) override;

 private:
  struct InboundState;
  class TcpInbound;
  class TcpOutbound;
  TcpTransport(const TransportOptions& options, Fd listener, std::string address);
  void AcceptLoop();
  void ServeConnection(int fd);
  absl::Status ReceiveFrames(int fd, InboundState& s, KvNotice* notice);

  const TransportOptions options_;
  Fd listen_, wake_read_, wake_write_;
  const std::string address_;
  std::thread listener_;
  std::mutex mu_;
  std::condition_variable connections_done_;
  ExpectedTransfers<InboundState> expected_;
  absl::flat_hash_set<int> connection_fds_;  // guarded by mu_
  int connections_ = 0;                      // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace pdq::kvtransfer
