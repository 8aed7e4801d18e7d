// A receiver's one-time tokens: the transfer each names, from Expect until a
// connection claims it or its Inbound is destroyed. Shared by the backends so
// that every one refuses the same specs and honours a token once.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/check.h"
#include "kvtransfer/transport.h"
#include "kvtransfer/wire.h"

namespace pdq::kvtransfer {

// `Transfer` is the backend's per-transfer state, with an `InboundSpec spec`.
// Safe for concurrent use.
template <typename Transfer>
class ExpectedTransfers {
 public:
  // A new transfer for spec.token. InvalidArgument for a malformed spec
  // (wire::ValidateInboundSpec) or a token already expected.
  absl::StatusOr<std::shared_ptr<Transfer>> Add(InboundSpec spec, const TransportOptions& options) {
    PDQ_RETURN_IF_ERROR(wire::ValidateInboundSpec(spec, options));
    auto t = std::make_shared<Transfer>();
    t->spec = std::move(spec);
    std::lock_guard lock(mu_);
    if (!by_token_.try_emplace(t->spec.token, t).second) {
      return absl::InvalidArgumentError("this KV transfer token is already expected");
    }
    return t;
  }

  // The transfer `token` names; null when none is expected (or it was
  // claimed already: a token is good for one connection).
  std::shared_ptr<Transfer> Claim(const std::string& token) {
    std::lock_guard lock(mu_);
    auto it = by_token_.find(token);
    if (it == by_token_.end()) return nullptr;
    std::shared_ptr<Transfer> t = std::move(it->second);
    by_token_.erase(it);
    return t;
  }

  // Forgets `t` if no connection has claimed it; true when it did, so that
  // no connection ever will.
  bool Forget(const Transfer& t) {
    std::lock_guard lock(mu_);
    auto it = by_token_.find(t.spec.token);
    if (it == by_token_.end() || it->second.get() != &t) return false;
    by_token_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Transfer>> by_token_;  // guarded by mu_
};

}  // namespace pdq::kvtransfer
