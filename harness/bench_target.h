// What `pdq bench` sends requests to: a pdq router (gRPC) or any
// OpenAI-compatible completions endpoint (HTTP, Server-Sent Events), behind
// one interface so the same load and the same figures apply to both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq {

// One prompt in both forms: token ids (sent to pdq) and the text they
// decode to (sent to an OpenAI-compatible server, which tokenizes itself).
struct BenchPrompt {
  std::vector<int32_t> ids;
  std::string text;
};

// One request as the client saw it.
struct BenchRecord {
  int level = 0;
  bool ok = false;
  // Not ok because the server shed it (gRPC RESOURCE_EXHAUSTED, HTTP 429):
  // admission control at work, counted apart from failures.
  bool refused = false;
  // Why, where the server said (pdq's router: its admission reason, such as
  // "kv_full"; an OpenAI-compatible server: the error's code); else empty.
  std::string refusal;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  double start = 0;  // seconds since the level began
  double ttft = 0, tpot = 0, e2e = 0;
  std::vector<double> gaps;  // between consecutive tokens after the first
  std::string pool;          // the pool that served it (a router's A/B split)
  std::string client_id;     // the client id it was sent with (pdq bench --client-ids)
  // Prompt tokens the server says it took from its prefix cache (0 where it
  // says nothing).
  int cached_tokens = 0;
  std::string output_text;  // the answer, as streamed
  // --workload conversation: the session (from 0) and its turn (from 1);
  // both 0 in the other workloads.
  int session = 0, turn = 0;
};

class BenchTarget {
 public:
  virtual ~BenchTarget() = default;
  // Streams one answer of exactly `output_tokens` tokens (where the server
  // honours ignore_eos), times it and keeps its text; thread-safe. A failure
  // is a record with ok false and its error. `client_id`, when not empty,
  // goes with the request (pdq's client_id, OpenAI's "user").
  virtual BenchRecord Run(const BenchPrompt& prompt, int64_t output_tokens, int64_t timeout_s,
                          const std::string& request_id, const std::string& client_id) = 0;
};

// An OpenAI-compatible server at `base_url` (http://host:port/v1): POST
// {base_url}/completions with stream, ignore_eos (vLLM's and pdq's
// extension) and stream_options.include_usage; the prefix-cache hits come
// from usage.prompt_tokens_details.cached_tokens (or llama-server's
// timings.cache_n) where the server reports them. `model` empty: the first of
// GET {base_url}/models. `api_key`, when given, goes in the Authorization
// header; over https the server's certificate is checked against `ca_path`
// (empty: the system's CAs). Answers are sampled at `temperature` (0:
// greedy; an OpenAI client that sends none gets the API's default of 1).
absl::StatusOr<std::unique_ptr<BenchTarget>> OpenAiBenchTarget(
    const std::string& base_url, const std::string& model, const std::string& api_key,
    const std::string& ca_path, std::string* model_used, double temperature = 0);

}  // namespace pdq
