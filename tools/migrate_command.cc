// `pdq migrate`: asks a router to move the streams it carries on one decode
// worker, with their KV, to other decode workers (live migration), as an
// operator would before maintenance or to rebalance. The worker stays in
// rotation; SIGTERM on a decode worker does the same by itself as it
// drains.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "pdq/v1/worker.grpc.pb.h"
#include "tools/commands.h"

namespace pdq {

int MigrateCommand(int argc, char** argv) {
  std::string router = "127.0.0.1:50051", worker;
  int64_t timeout_s = 10;
  FlagParser flags(
      "migrate",
      "Asks a router to move the streams it carries on a decode worker, each with its KV, to "
      "other decode workers with room (live migration: the clients see a pause, no token lost "
      "or repeated). A stream no other worker can take decodes on where it is. With several "
      "routers, ask each (each moves the streams it carries). `pdq status` lists worker ids.");
  flags.String("router", &router, "the router's gRPC address (host:port)");
  flags.String("worker", &worker, "the decode worker's id (as `pdq status` shows it)");
  flags.Int("timeout", &timeout_s, 1, 3600, "seconds to wait for the router's answer");
  ConnectionFlags connection;
  connection.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (worker.empty()) return Fail("migrate", absl::InvalidArgumentError("--worker is required"));
  absl::StatusOr<server::Dialing> dialing = connection.Dialing();
  if (!dialing.ok()) return Fail("migrate", dialing.status());
  auto stub = v1::Registry::NewStub(server::Dial(router, *dialing));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  v1::MigrateStreamsRequest req;
  req.set_worker_id(worker);
  v1::MigrateStreamsResponse resp;
  if (grpc::Status s = stub->MigrateStreams(&ctx, req, &resp); !s.ok()) {
    return Fail("migrate", absl::UnavailableError(absl::StrCat(
                               "router ", router, ": ", s.error_message(), " (", s.error_code(),
                               ")")));
  }
  std::printf("router %s: moving %d streams off worker %s (its log and "
              "pdq_migrations_total say how each went)\n",
              router.c_str(), resp.migrating(), worker.c_str());
  return 0;
}

}  // namespace pdq
