// The load generator behind `pdq bench`: streaming requests of real text at
// fixed lengths against a BenchTarget (a pdq router, or any OpenAI-compatible
// server: harness/bench_target.h), measured per request and summarized per
// level into a BenchResult (harness/bench_result.h).
//
// Three loads: a sweep over concurrency levels or an open-loop Poisson rate
// (RunSweep); high and low concurrency in turn, checking the deployment
// recovers after each burst (Alternate, a pdq router only); and multi-turn
// conversations that resend the whole conversation each turn
// (RunConversationBench). Against a pdq router, each level also records what
// every worker did (its /metrics before and after). Progress goes to stderr,
// a table row per level to stdout.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "harness/bench_result.h"
#include "harness/bench_target.h"
#include "pdq/v1/pdq.grpc.pb.h"

namespace pdq {

using Tokenize = std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)>;
using Detokenize = std::function<absl::StatusOr<std::string>(const std::vector<int32_t>&)>;

// The lengths of a named workload.
struct WorkloadShape {
  const char* name;
  int64_t input, output;  // tokens
};
// chat (128 in, 512 out), summarize (2048, 32), analysis (2048, 512); null
// for any other name.
const WorkloadShape* StandardWorkload(const std::string& name);

// Prompts of exactly `tokens` tokens from `text`, starting at spread-out
// offsets, with the text of those tokens. `seed` > 0 shifts every offset by
// a fraction of the spacing that differs from seed to seed, so two runs of
// two seeds against one server (two workloads of pdq eval) send no prompt
// that starts like one of the other's, which its prefix cache would answer
// (of one length; prompts of two lengths start apart anyway but for the
// first, which a seed moves); 0 keeps the offsets where they always were.
// With `shared_prefix` > 0 every
// prompt's first `shared_prefix` tokens are the same (a system prompt, cut
// from the text's middle) and only the rest is its own: the load a chat
// service sees, which a prefix cache should serve from the shared blocks.
absl::StatusOr<std::vector<BenchPrompt>> MakePrompts(const Tokenize& tokenize,
                                                     const Detokenize& detokenize,
                                                     const std::string& text, int64_t tokens,
                                                     int count, int64_t shared_prefix = 0,
                                                     int64_t seed = 0);

// pdq's own API as a target: token-id prompts over gRPC (`stub` outlives
// it), answers sampled at `temperature` (0: greedy).
std::unique_ptr<BenchTarget> PdqBenchTarget(v1::Pdq::Stub& stub, double temperature = 0);

// Requests against one target, the prompts taken in turn.
class Driver {
 public:
  Driver(BenchTarget& target, std::vector<BenchPrompt> prompts, int64_t output_tokens,
         int64_t timeout_s)
      : target_(target),
        prompts_(std::move(prompts)),
        output_tokens_(output_tokens),
        timeout_s_(timeout_s) {}

  // `total` requests from `concurrency` clients sending back to back (rate
  // 0), or arriving as a Poisson process of `rate` per second: the first at
  // once, then gaps drawn from mt19937_64 seeded `arrival_seed` plus the
  // requests this driver sent before (the arrivals `pdq sim --seed` draws
  // for the same seed). The first `warmup` to finish are dropped; `seconds`
  // is the counted span: from the first counted request's start to the last
  // one's answer (a span from the warm-up's end was near zero when every
  // request ran at once).
  std::vector<BenchRecord> Run(int concurrency, double rate, int total, int warmup,
                               const char* label, double* seconds, uint64_t arrival_seed = 1);
  // With `on`, closed-loop client c (from 0) sends BenchClientId(c) with
  // each of its requests (common/arrivals.h), so a router splitting an A/B
  // rollout sticky per client keeps each client in one pool; open-loop
  // arrivals send none.
  void set_client_ids(bool on) { client_ids_ = on; }

 private:
  BenchTarget& target_;
  const std::vector<BenchPrompt> prompts_;
  const int64_t output_tokens_, timeout_s_;
  int serial_ = 0;
  bool client_ids_ = false;
};

// Goodput counts the requests within both (seconds; 0: no target).
struct LatencyTargets {
  double ttft = 0, tpot = 0;
};

struct SweepOptions {
  std::vector<int> levels;  // concurrency levels (ignored with a rate)
  double rate = 0;          // > 0: one open-loop level at this many arrivals per second
  int64_t requests = 0;     // counted per level; 0: 4 x the level, at least 8 (a rate: 32)
  int64_t per_client = 0;   // instead of `requests`: this many per concurrent client
  int64_t warmup = 1;       // per level, run first and not counted
  LatencyTargets targets;
  // > 0: after `levels`, twice the top level in turn while output tokens/s
  // has not stopped rising (FlatLevelAfter), up to this many clients.
  int until_flat = 0;
  uint64_t arrival_seed = 1;  // with a rate: Driver::Run's
};
// The requests RunSweep sends, counted and warm-up, over every level (with
// until_flat, the most it may send).
int64_t SweepRequests(const SweepOptions& o);
// The level a sweep with `until_flat` runs after those in `so_far`: twice
// its top level while that top is still where output tokens/s saturates
// (FindSaturation at 0.95: the lowest level within 5% of the most, the
// evaluation report's rule), so the sweep ends one level past that point;
// 0 when it has gone past it, or a level had requests refused (the
// deployment's admission bound: more clients would only be refused), or
// twice the top would exceed until_flat, or no level has output tokens. One
// level is not yet a judgement: twice it (unless it refused requests).
int FlatLevelAfter(const BenchResult& so_far, int until_flat);
// Whether until_flat can extend `levels` (non-empty): they end at their
// highest and until_flat is at least twice it (pdq bench --until-flat and an
// eval workload's until_flat both require it).
bool UntilFlatExtends(const std::vector<int>& levels, int until_flat);
// The table's header for RunSweep's and Alternate's rows.
void PrintLevelHeader();
// Each level in turn, appended to `out` (its summary and every request's
// record). `stub`: a pdq router's, for its workers' figures (null for other
// targets). False when a request failed (a refusal by admission control is
// counted apart, not a failure).
bool RunSweep(Driver& driver, v1::Pdq::Stub* stub, const SweepOptions& o, BenchResult* out);

struct AlternateOptions {
  int cycles = 3, high = 8, low = 1;
  double max_rss_growth_mib = 256;
  int64_t timeout_s = 600;
};
// High and low concurrency in turn; after every low phase, every worker's
// KV blocks are back, resident memory has not grown past the bound, nothing
// hung, and a greedy probe answers as in the first cycle. "" when all held,
// else the first reason it did not. Levels and cycles go to `out`.
std::string Alternate(v1::Pdq::Stub& stub, Driver& driver, const AlternateOptions& o,
                      const LatencyTargets& targets, BenchResult* out);

struct ConversationOptions {
  int sessions = 4, turns = 8;
  int64_t first_tokens = 512, turn_tokens = 64, output_tokens = 64, timeout_s = 600;
  bool warmup = true;  // one untimed request before the sessions
  // Where in the text the messages start (pdq bench --prompt-seed): another
  // seed cuts every message a quarter to three quarters of the spacing
  // between messages away from seed 0's, so a second run against the same
  // server does not find its conversations in the prefix cache.
  int64_t prompt_seed = 0;
};
// --sessions conversations at once: turn 1 sends a first message cut from
// `text`; every later turn the previous prompt, its answer and a new message.
// The summary and every turn's record go to `out`. False when a turn failed
// (its session ends there); an error when the messages or the warm-up could
// not be made.
absl::StatusOr<bool> RunConversationBench(BenchTarget& target, const Tokenize& tokenize,
                                          v1::Pdq::Stub* stub, const std::string& text,
                                          const ConversationOptions& o, BenchResult* out);

}  // namespace pdq
