// The pause a live migration costs a stream, against the time to
// re-prefill the same sequence (what a move by recomputation, or a retry
// elsewhere, would cost at least). Runs against a router with one prefill
// and two decode workers (bench/migration_bench.sh starts them): for each
// context length, each round streams a prompt of that many tokens, moves
// the stream to the other decode worker after --tokens-before tokens (the
// router's MigrateStreams, as `pdq migrate` calls it), and measures the
// client's longest gap between tokens around the move (the source decodes
// until the suspension reaches it between two steps, so the next 8 tokens);
// then a fresh request for the same sequence (prompt + the tokens before,
// under its own cache salt so nothing is reused) and its time to first
// token. Greedy; the moved stream's tokens are checked against an unmoved
// stream's, once per context.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "flags/flags.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "pdq/v1/worker.grpc.pb.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, (size_t)(p / 100.0 * (double)(v.size() - 1) + 0.5));
  return v[i];
}

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<Clock::time_point> arrivals;  // one per token
  grpc::Status status;
};

// Streams `req` to its end; at `move_after` tokens (0: never) calls `move`
// and records when in `*moved_at`.
template <typename Move>
Stream Run(v1::Pdq::Stub& stub, const v1::GenerateRequest& req, int move_after, Move move,
           Clock::time_point* moved_at) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  auto reader = stub.Generate(&ctx, req);
  Stream s;
  v1::GenerateResponse m;
  bool moved = false;
  while (reader->Read(&m)) {
    const Clock::time_point now = Clock::now();
    for (int32_t t : m.delta().token_ids()) {
      s.tokens.push_back(t);
      s.arrivals.push_back(now);
    }
    if (!moved && move_after > 0 && (int)s.tokens.size() >= move_after) {
      moved = true;
      *moved_at = Clock::now();
      move();
    }
  }
  s.status = reader->Finish();
  return s;
}

int Main(int argc, char** argv) {
  std::string router = "127.0.0.1:50051", contexts = "512,2048";
  int64_t rounds = 20, before = 16, max_tokens = 48;
  FlagParser flags("migration_bench",
                   "The pause of a live migration against re-prefilling the sequence, per context "
                   "length (p50 and p99), against a router with one prefill and two decode "
                   "workers.",
                   /*program=*/true);
  flags.String("router", &router, "the router's gRPC address");
  flags.String("context", &contexts, "prompt lengths in tokens, comma-separated");
  flags.Int("rounds", &rounds, 1, 10000, "moves per context length");
  flags.Int("tokens-before", &before, 1, 100000, "tokens streamed before the move");
  flags.Int("max-tokens", &max_tokens, 2, 100000, "tokens per stream");
  if (int rc = ParseOrExit(flags, argc, argv, 1, "migration_bench"); rc >= 0) return rc;
  if (before >= max_tokens) {
    std::fprintf(stderr, "migration_bench: error: --tokens-before must be below --max-tokens\n");
    return 2;
  }
  auto channel = grpc::CreateChannel(router, grpc::InsecureChannelCredentials());
  auto pdq = v1::Pdq::NewStub(channel);
  auto registry = v1::Registry::NewStub(channel);

  // The decode workers, and a text to cut prompts from.
  std::vector<std::string> decoders;
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    if (grpc::Status s = pdq->GetModelInfo(&ctx, {}, &info); !s.ok()) {
      std::fprintf(stderr, "migration_bench: error: router %s: %s\n", router.c_str(),
                   s.error_message().c_str());
      return 1;
    }
    for (const v1::WorkerStatus& w : info.workers()) {
      if (w.role() == "decode") decoders.push_back(w.worker_id());
    }
    if (decoders.size() < 2) {
      std::fprintf(stderr, "migration_bench: error: the router has %zu decode workers; want 2\n",
                   decoders.size());
      return 1;
    }
  }
  std::vector<int32_t> text;
  {
    std::string words;
    for (int i = 0; i < 2000; ++i) {
      absl::StrAppend(&words, "The quick brown fox jumps over the lazy dog number ", i, ". ");
    }
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text(words);
    v1::TokenizeResponse resp;
    if (grpc::Status s = pdq->Tokenize(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "migration_bench: error: Tokenize: %s\n", s.error_message().c_str());
      return 1;
    }
    text.assign(resp.ids().begin(), resp.ids().end());
  }
  auto move = [&] {
    int moving = 0;
    for (const std::string& id : decoders) {
      grpc::ClientContext ctx;
      v1::MigrateStreamsRequest req;
      req.set_worker_id(id);
      v1::MigrateStreamsResponse resp;
      if (registry->MigrateStreams(&ctx, req, &resp).ok()) moving += resp.migrating();
    }
    return moving;
  };

  std::printf("| context | rounds | migration pause p50 | p99 | re-prefill TTFT p50 | p99 | "
              "pause / re-prefill (p50) | decode TPOT p50 |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int failures = 0;
  absl::StatusOr<std::vector<int64_t>> context_list =
      IntList("context", contexts, 1, (int64_t)text.size());
  if (!context_list.ok()) {
    std::fprintf(stderr, "migration_bench: error: %s\n",
                 std::string(context_list.status().message()).c_str());
    return 2;
  }
  for (int64_t context : *context_list) {
    std::vector<double> pauses, reprefills, gaps;
    std::vector<int32_t> reference;
    for (int64_t r = -1; r < rounds; ++r) {
      // Round -1 warms up and is the unmoved reference.
      v1::GenerateRequest req;
      req.mutable_tokens()->mutable_ids()->Add(text.begin(), text.begin() + context);
      req.set_max_tokens((int32_t)max_tokens);
      req.set_ignore_eos(true);
      req.set_cache_salt(absl::StrCat("migration-bench-", context, "-", r));
      Clock::time_point moved_at{};
      const Stream s = Run(*pdq, req, r < 0 ? 0 : (int)before, move, &moved_at);
      if (!s.status.ok() || (int64_t)s.tokens.size() != max_tokens) {
        std::fprintf(stderr, "migration_bench: context %lld round %lld: %s (%zu tokens)\n",
                     (long long)context, (long long)r, s.status.error_message().c_str(),
                     s.tokens.size());
        ++failures;
        continue;
      }
      if (r < 0) {
        reference = s.tokens;
        continue;
      }
      if (s.tokens != reference) {
        std::fprintf(stderr, "migration_bench: context %lld round %lld: the moved stream's tokens "
                     "differ from the unmoved one's\n", (long long)context, (long long)r);
        ++failures;
      }
      // The gap the move made: the source decodes until the suspension
      // reaches it between two steps, so the pause is the longest gap among
      // the next kWindow tokens after the call; the gaps elsewhere (not the
      // first, which is the time to first token) are the stream's TPOT.
      constexpr size_t kWindow = 8;
      size_t after = 0;
      double pause = 0;
      for (size_t i = 1; i < s.arrivals.size(); ++i) {
        const double gap = Ms(s.arrivals[i] - s.arrivals[i - 1]);
        if (s.arrivals[i] > moved_at && after < kWindow) {
          pause = std::max(pause, gap);
          ++after;
        } else if (i > 1) {
          gaps.push_back(gap);
        }
      }
      pauses.push_back(pause);
      // Re-prefilling the same sequence: prompt + the tokens before the
      // move, nothing cached.
      v1::GenerateRequest again;
      again.mutable_tokens()->mutable_ids()->Add(text.begin(), text.begin() + context);
      again.mutable_tokens()->mutable_ids()->Add(s.tokens.begin(), s.tokens.begin() + before);
      again.set_max_tokens(1);
      again.set_cache_salt(absl::StrCat("migration-bench-again-", context, "-", r));
      const Clock::time_point t0 = Clock::now();
      Clock::time_point unused;
      const Stream p = Run(*pdq, again, 0, move, &unused);
      if (!p.status.ok() || p.arrivals.empty()) {
        ++failures;
        continue;
      }
      reprefills.push_back(Ms(p.arrivals[0] - t0));
    }
    if (pauses.empty() || reprefills.empty()) continue;
    std::printf("| %lld | %zu | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.2f | %.1f ms |\n",
                (long long)context, pauses.size(), Percentile(pauses, 50), Percentile(pauses, 99),
                Percentile(reprefills, 50), Percentile(reprefills, 99),
                Percentile(pauses, 50) / Percentile(reprefills, 50), Percentile(gaps, 50));
    std::fflush(stdout);
  }
  if (failures > 0) std::fprintf(stderr, "migration_bench: %d rounds failed\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pdq

int main(int argc, char** argv) { return pdq::Main(argc, argv); }
