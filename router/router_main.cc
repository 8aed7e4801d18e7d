// The router process: flags, the tokenizer, the server; stops on SIGINT or
// SIGTERM.
#include <cstdio>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "flags/flags.h"
#include "router/router.h"
#include "server/metrics.h"
#include "server/server.h"

namespace pdq::router {
namespace {

bool IsLoopback(const std::string& listen) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
}

}  // namespace

int RouterMain(int argc, char** argv) {
  server::BlockStopSignals();
  LogProcessName() = "pdq-router";
  const char* env_model = std::getenv("PDQ_MODEL");
  std::string listen = "127.0.0.1:0",
              model = env_model ? env_model : "models/SmolLM2-135M-Instruct.Q4_1.gguf",
              address_file, metrics_listen = "127.0.0.1:0", metrics_address_file, http_listen,
              http_address_file, worker_tls_name, api_key_file, split;
  bool split_sticky = false;
  ServerSecurityFlags security;
  int64_t heartbeat_ms = 500, missed = 3, http_connections = 128, drain_seconds = 30,
          local_prefill = RouterOptions().local_prefill_tokens,
          cache_load_tokens = (int64_t)RouterOptions().cache_load_tokens;
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
  security.Register(flags);
  flags.String("worker-tls-name", &worker_tls_name,
               "with TLS, the name workers' certificates must carry (default: the host each worker "
               "registers with)");
  flags.String("api-key-file", &api_key_file,
               "clients must send one of the keys in this file (one per line) as 'authorization: "
               "Bearer KEY' on pdq.v1.Pdq and the HTTP API; empty: no key needed");
  flags.String("split", &split,
               "A/B rollout: POOL=WEIGHT,... sends that share of requests to the workers started "
               "with --pool POOL (e.g. fp16=90,w8a8-w4a16=10) and labels the request metrics by "
               "pool; empty: no split");
  flags.Bool("split-sticky", &split_sticky,
             "with --split, requests carrying a client_id (OpenAI's \"user\") always go to the "
             "same pool");
  flags.Int("local-prefill-tokens", &local_prefill, 0, 1 << 20,
            "when a decode worker's prefix cache holds part of a prompt and all but at most this many "
            "tokens (a conversation's next turn), the decode worker prefills them itself at its "
            "own precision and no prefill worker or KV transfer is involved; 0: never");
  flags.Int("cache-load-tokens", &cache_load_tokens, 0, 1 << 20,
            "cache-aware routing: a request goes to the worker with the lowest (prompt tokens "
            "its KV prefix cache lacks) + (prompt tokens queued there) + this * (requests it is "
            "busy with); 0: requests in flight do not count");
  std::string max_streams = "batch";
  flags.String("max-streams-per-worker", &max_streams,
               "admission: streams the router sends one worker that decodes, at most; more are "
               "refused at once (reason batch_full) and routing avoids full workers. 'batch' "
               "(each worker's own --max-batch: a stream past it only takes turns with the "
               "others, slowing all and adding no tokens a second), N, or 'off'");
  int64_t max_waiting = RouterOptions().admission.max_waiting_requests, ttft_target_ms = 0,
          rate_tokens = 0, rate_burst = 0;
  flags.Int("max-waiting-requests", &max_waiting, 0, 1 << 20,
            "admission: requests admitted and still waiting for their first token, at most; "
            "more are refused at once (RESOURCE_EXHAUSTED; HTTP 429 with Retry-After), batch "
            "requests once half of this waits; 0: no bound");
  flags.Int("ttft-target-ms", &ttft_target_ms, 0, 3600000,
            "admission: refuse a request whose predicted time to first token (the prompt tokens "
            "waiting ahead of it over the workers' measured prefill rate) the queue ahead pushes "
            "over this (a prompt that alone takes longer is taken); a request predicted to miss "
            "its own deadline is refused whatever this is; 0: the deadline only");
  bool admit_past_deadline = false;
  flags.Bool("admit-past-deadline", &admit_past_deadline,
             "admission: take requests predicted to miss their deadline too (they fail with "
             "DEADLINE_EXCEEDED if it passes first); by default they are refused at once");
  flags.Int("rate-limit-tokens", &rate_tokens, 0, int64_t{1} << 40,
            "admission: prompt + max_tokens tokens a second each client may send (a token "
            "bucket per API key, else per client_id / OpenAI \"user\"); 0: no limit");
  flags.Int("rate-limit-burst", &rate_burst, 0, int64_t{1} << 40,
            "admission: the bucket's size, the most tokens a client may send at once (0: ten "
            "seconds of --rate-limit-tokens)");
  flags.Int("heartbeat-ms", &heartbeat_ms, 10, 60000, "how often workers report their load");
  flags.Int("missed-heartbeats", &missed, 1, 100,
            "heartbeats a worker may miss before it leaves rotation");
  if (int rc = ParseOrExit(flags, argc, argv, 1, "pdq-router"); rc >= 0) return rc;
  RouterOptions o;
  if (max_streams == "batch") {
    o.max_streams_per_worker = 0;
  } else if (max_streams == "off") {
    o.max_streams_per_worker = -1;
  } else if (!absl::SimpleAtoi(max_streams, &o.max_streams_per_worker) ||
             o.max_streams_per_worker < 1) {
    std::fprintf(stderr,
                 "pdq-router: error: --max-streams-per-worker must be 'batch', 'off' or a "
                 "positive count, got '%s'\n",
                 max_streams.c_str());
    return 2;
  }
  o.listen = listen;
  o.model = model;
  o.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  o.missed_heartbeats_allowed = (int)missed;
  o.http_listen = http_listen;
  o.http_max_connections = (int)http_connections;
  o.tls = {security.tls_cert, security.tls_key, security.tls_ca};
  o.worker_tls_name = worker_tls_name;
  o.api_key_file = api_key_file;
  o.health_listen = security.health_listen;
  o.split = split;
  o.split_sticky = split_sticky;
  o.local_prefill_tokens = (int)local_prefill;
  o.cache_load_tokens = (double)cache_load_tokens;
  o.admission.max_waiting_requests = max_waiting;
  o.admission.ttft_target = absl::Milliseconds(ttft_target_ms);
  o.admission.refuse_past_deadline = !admit_past_deadline;
  o.admission.rate_tokens_per_second = (double)rate_tokens;
  o.admission.rate_burst_tokens = (double)rate_burst;
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
  const bool secure = !security.tls_cert.empty();
  LogLine(absl::StrCat("serving pdq.v1.Pdq on ", (*router)->address(),
                       secure ? " (TLS; workers need certificates)" : " (plaintext)",
                       api_key_file.empty() ? "" : ", API keys required", ", metrics at http://",
                       (*metrics)->address(), "/metrics",
                       http.empty() ? ""
                                    : absl::StrCat(", OpenAI API at ", secure ? "https" : "http",
                                                   "://", http, "/v1")));
  if (!IsLoopback(listen) && (!secure || api_key_file.empty())) {
    LogLine(absl::StrCat("warning: listening on ", listen, " beyond this machine with ",
                         !secure ? "no TLS (anyone who can reach the port can register a worker)"
                                 : "no API key (anyone who can reach the port can generate)",
                         "; see README \"Who may talk to whom\""));
  }
  server::WriteAddressFiles(
      address_file, (*router)->address(),
      {{metrics_address_file, (*metrics)->address()},
       {http.empty() ? "" : http_address_file, http},
       {(*router)->health_address().empty() ? "" : security.health_address_file,
        (*router)->health_address()}});
  const std::string sig = server::WaitForStopSignal();
  LogLine(absl::StrCat(sig, ": stopping", drain_seconds > 0 ? ", draining first" : ""));
  if (drain_seconds > 0) (*router)->Drain(absl::Seconds(drain_seconds));
  router->reset();
  LogLine("stopped");
  return 0;
}

}  // namespace pdq::router
