// `pdq client`: streams one answer from a pdq router.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "pdq/v1/pdq.grpc.pb.h"
#include "tools/commands.h"

namespace pdq {

int ClientCommand(int argc, char** argv) {
  std::string router = "127.0.0.1:50051", prompt, request_id, stop, client_id;
  bool chat = false, ignore_eos = false, quiet = false;
  int64_t max_tokens = 128, top_k = 0, seed = 0, timeout_s = 300;
  double temperature = 0.0, top_p = 1.0;
  FlagParser flags("client", "Streams an answer from a pdq router (pdq.v1.Pdq/Generate).");
  flags.String("router", &router, "the router's gRPC address (host:port)");
  flags.String("prompt", &prompt, "the prompt text");
  flags.Bool("chat", &chat, "send the prompt as one user message in the model's chat template");
  flags.Int("max-tokens", &max_tokens, 1, 1 << 20, "tokens to generate at most");
  flags.Float("temperature", &temperature, 0.0, 100.0, "sampling temperature; 0 is greedy");
  flags.Int("top-k", &top_k, 0, 1 << 20, "sample from the k likeliest tokens; 0: all");
  flags.Float("top-p", &top_p, 0.0, 1.0, "nucleus sampling mass");
  flags.Int("seed", &seed, 0, INT64_MAX, "sampling seed");
  flags.String("stop", &stop, "a stop string (not included in the answer)");
  flags.Bool("ignore-eos", &ignore_eos, "run to --max-tokens");
  flags.String("request-id", &request_id, "this request's id in every log (default: the router's)");
  flags.String("client-id", &client_id,
               "who is asking: a router splitting traffic with --split-sticky sends the same id "
               "to the same pool");
  flags.Int("timeout", &timeout_s, 1, 86400, "deadline in seconds");
  flags.Bool("quiet", &quiet, "print the answer only, no summary");
  ConnectionFlags connection;
  connection.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (prompt.empty()) return Fail("client", absl::InvalidArgumentError("--prompt is required"));

  absl::StatusOr<server::Dialing> dialing = connection.Dialing();
  if (!dialing.ok()) return Fail("client", dialing.status());
  auto stub = pdq::v1::Pdq::NewStub(server::Dial(router, *dialing));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  pdq::v1::GenerateRequest req;
  req.set_request_id(request_id);
  req.set_client_id(client_id);
  if (chat) {
    pdq::v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(prompt);
  } else {
    req.set_text(prompt);
  }
  req.set_max_tokens((int32_t)max_tokens);
  req.mutable_sampling()->set_temperature((float)temperature);
  req.mutable_sampling()->set_top_k((int32_t)top_k);
  req.mutable_sampling()->set_top_p((float)top_p);
  req.mutable_sampling()->set_seed((uint64_t)seed);
  if (!stop.empty()) req.add_stop(stop);
  req.set_ignore_eos(ignore_eos);
  auto reader = stub->Generate(&ctx, req);
  pdq::v1::GenerateResponse msg;
  pdq::v1::GenerateSummary summary;
  while (reader->Read(&msg)) {
    if (msg.has_delta()) {
      std::fwrite(msg.delta().text().data(), 1, msg.delta().text().size(), stdout);
      std::fflush(stdout);
    } else if (msg.has_summary()) {
      summary = msg.summary();
    }
  }
  const grpc::Status s = reader->Finish();
  std::printf("\n");
  std::fflush(stdout);
  if (!s.ok()) {
    std::fprintf(stderr, "pdq client: error: %s (%d)\n", s.error_message().c_str(),
                 (int)s.error_code());
    return 1;
  }
  if (!quiet) {
    std::fprintf(stderr, "[%s] %s: %d prompt + %d output tokens, TTFT %.1f ms, TPOT %.2f ms%s\n",
                 summary.request_id().c_str(),
                 pdq::v1::FinishReason_Name(summary.finish_reason()).c_str(),
                 summary.prompt_tokens(), summary.output_tokens(), summary.ttft_seconds() * 1e3,
                 summary.mean_tpot_seconds() * 1e3,
                 summary.pool().empty() ? "" : (", pool " + summary.pool()).c_str());
  }
  return 0;
}

}  // namespace pdq
