// The router process: flags, the tokenizer, the server; stops on SIGINT or
// SIGTERM.
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "router/router.h"
#include "server/metrics.h"
#include "server/server.h"
#include "tools/flags.h"

namespace pdq::router {

int RouterMain(int argc, char** argv) {
  server::BlockStopSignals();
  LogProcessName() = "pdq-router";
  const char* env_model = std::getenv("PDQ_MODEL");
  std::string listen = "127.0.0.1:0",
              model = env_model ? env_model : "models/SmolLM2-135M-Instruct.Q4_1.gguf",
              address_file, metrics_listen = "127.0.0.1:0", metrics_address_file, http_listen,
              http_address_file;
  int64_t heartbeat_ms = 500, missed = 3, http_connections = 128, drain_seconds = 30;
  FlagParser flags("pdq-router",
                   "The pdq router: serves pdq.v1.Pdq (Generate, Tokenize, GetModelInfo) and the "
                   "worker Registry, with health and reflection.",
                   /*program=*/true);
  flags.String("listen", &listen, "gRPC host:port; port 0 picks a free one");
  flags.String("model", &model, "GGUF file the workers serve (the router reads its tokenizer)");
  flags.String("address-file", &address_file, "write the gRPC address here once serving");
  flags.String("metrics-listen", &metrics_listen,
               "host:port for Prometheus /metrics over HTTP; port 0 picks a free one");
  flags.String("metrics-address-file", &metrics_address_file,
               "write the /metrics address here once serving");
  flags.String("http-listen", &http_listen,
               "host:port for the OpenAI-compatible HTTP API (/v1/completions, "
               "/v1/chat/completions, /v1/models); port 0 picks a free one; empty: none");
  flags.String("http-address-file", &http_address_file,
               "write the HTTP API's address here once serving");
  flags.Int("http-max-connections", &http_connections, 1, 4096,
            "HTTP connections served at once (one thread each; streamed answers hold one)");
  flags.Int("drain-seconds", &drain_seconds, 0, 3600,
            "on SIGTERM, report NOT_SERVING and let requests in flight finish for up to this "
            "long before ending them (0: end them at once)");
  flags.Int("heartbeat-ms", &heartbeat_ms, 10, 60000, "how often workers report their load");
  flags.Int("missed-heartbeats", &missed, 1, 100,
            "heartbeats a worker may miss before it leaves rotation");
  if (int rc = ParseOrExit(flags, argc, argv, 1, "pdq-router"); rc >= 0) return rc;
  RouterOptions o;
  o.listen = listen;
  o.model = model;
  o.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  o.missed_heartbeats_allowed = (int)missed;
  o.http_listen = http_listen;
  o.http_max_connections = (int)http_connections;
  absl::StatusOr<std::unique_ptr<Router>> router = Router::Start(o);
  if (!router.ok()) {
    std::fprintf(stderr, "pdq-router: error: %s\n", std::string(router.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<server::MetricsServer>> metrics =
      server::ServeMetrics(metrics_listen);
  if (!metrics.ok()) {
    std::fprintf(stderr, "pdq-router: error: --metrics-listen: %s\n",
                 std::string(metrics.status().message()).c_str());
    return 1;
  }
  const std::string& http = (*router)->http_address();
  LogLine(absl::StrCat("serving pdq.v1.Pdq on ", (*router)->address(), ", metrics at http://",
                       (*metrics)->address(), "/metrics",
                       http.empty() ? "" : absl::StrCat(", OpenAI API at http://", http, "/v1")));
  server::WriteAddressFiles(address_file, (*router)->address(),
                            {{metrics_address_file, (*metrics)->address()},
                             {http.empty() ? "" : http_address_file, http}});
  const std::string sig = server::WaitForStopSignal();
  LogLine(absl::StrCat(sig, ": stopping", drain_seconds > 0 ? ", draining first" : ""));
  if (drain_seconds > 0) (*router)->Drain(absl::Seconds(drain_seconds));
  router->reset();
  LogLine("stopped");
  return 0;
}

}  // namespace pdq::router
