// `pdq status`: what a router knows of its workers, one line each.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/kv_layout.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "tools/commands.h"

namespace pdq {
namespace {

// The worker's own grpc.health.v1 answer for the whole server ("serving",
// "not serving", or why there is none), not only the router's view.
std::string Health(const std::string& address, const server::Dialing& dialing, int64_t timeout_s) {
  grpc::GenericStub stub(server::Dial(address, dialing));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  grpc::Slice no_bytes("", 0);  // HealthCheckRequest{service: ""} encodes as nothing
  const grpc::ByteBuffer request(&no_bytes, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status s = done.get_future().get();
  if (!s.ok()) return "down";
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& sl : slices) bytes.append((const char*)sl.begin(), sl.size());
  }
  // HealthCheckResponse{status: SERVING} is field 1, varint 1.
  return bytes == std::string("\x08\x01", 2) ? "serving" : "not serving";
}

}  // namespace

int StatusCommand(int argc, char** argv) {
  std::string router = "127.0.0.1:50051";
  int64_t timeout_s = 10;
  FlagParser flags("status",
                   "Shows the model a pdq router serves and each live worker: role, precision, "
                   "health, queued prompt tokens, free KV blocks, active sequences, addresses.");
  flags.String("router", &router, "the router's gRPC address (host:port)");
  flags.Int("timeout", &timeout_s, 1, 3600, "seconds to wait for each answer");
  ConnectionFlags connection;
  connection.Register(flags);
  std::string worker_tls_name;
  flags.String("worker-tls-name", &worker_tls_name,
               "with TLS, the name the workers' certificates carry (default: each one's host); "
               "asking a worker for its health takes --tls-cert and --tls-key, since workers "
               "answer only holders of a certificate");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  absl::StatusOr<server::Dialing> dialing = connection.Dialing();
  if (!dialing.ok()) return Fail("status", dialing.status());
  server::Dialing to_workers = *dialing;
  to_workers.server_name = worker_tls_name;
  to_workers.api_key.clear();  // a worker has no use for it
  auto stub = v1::Pdq::NewStub(server::Dial(router, *dialing));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  v1::ModelInfo info;
  if (grpc::Status s = stub->GetModelInfo(&ctx, {}, &info); !s.ok()) {
    return Fail("status",
                absl::UnavailableError(absl::StrCat("router ", router, ": ", s.error_message(),
                                                    " (", s.error_code(), ")")));
  }
  // The KV cache's element type every worker shares (--kv-dtype).
  const absl::StatusOr<KvLayout> layout = KvLayout::Deserialize(info.kv_layout());
  const std::string kv = layout.ok() ? absl::StrCat(", KV cache ", KvDtypeName(layout->dtype)) : "";
  std::printf(
      "router %s: %s, vocabulary %d, context %d%s, %d live workers (load as of each one's last "
      "heartbeat; health asked now)\n",
      router.c_str(), info.name().c_str(), info.vocab_size(), info.max_context(), kv.c_str(),
      info.live_workers());
  std::printf("%-22s %-8s %-6s %-9s %8s %15s %7s %25s  %-21s %s\n", "worker", "role", "prec",
              "health", "queued", "KV free/total", "active", "MiB weights/KV/ws/RSS", "address",
              "metrics");
  int unhealthy = 0;
  for (const v1::WorkerStatus& w : info.workers()) {
    const std::string health = Health(w.address(), to_workers, timeout_s);
    unhealthy += health != "serving";
    auto mib = [](int64_t b) { return (long long)((b + (1 << 19)) >> 20); };
    const std::string memory =
        absl::StrFormat("%d/%d/%d/%d", mib(w.weight_bytes()), mib(w.kv_used_bytes()),
                        mib(w.workspace_bytes()), mib(w.resident_bytes()));
    std::printf("%-22s %-8s %-6s %-9s %8lld %7lld/%-7lld %7d %25s  %-21s %s%s\n",
                w.worker_id().c_str(), w.role().c_str(), w.precision().c_str(), health.c_str(),
                (long long)w.queued_prompt_tokens(), (long long)w.kv_blocks_free(),
                (long long)w.kv_blocks_total(), w.active_sequences(), memory.c_str(),
                w.address().c_str(),
                w.metrics_address().c_str(),
                w.pool().empty() ? "" : absl::StrCat("  pool ", w.pool()).c_str());
  }
  return unhealthy == 0 ? 0 : 1;
}

}  // namespace pdq
