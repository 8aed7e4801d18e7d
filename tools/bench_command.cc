// `pdq bench`: a streaming load generator against a pdq router. Prompts are
// real text (WikiText-2 by default) cut to exactly --input-tokens tokens by
// the router's own tokenizer; generation runs to exactly --output-tokens
// (ignore_eos). At each concurrency level, that many clients send requests
// back to back; the first --warmup answers of a level are not counted.
//
// Per level: TTFT, TPOT (each request's mean gap after its first token),
// every inter-token gap, end-to-end latency (p50/p90/p99), requests/s,
// output and total tokens/s, and goodput when targets are given. --json
// writes the summaries and every request's record.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "pdq/v1/pdq.grpc.pb.h"
#include "tools/commands.h"

namespace pdq {
namespace {

namespace v1 = pdq::v1;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Record {
  int level = 0;
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  double start = 0;  // seconds since the level began
  double ttft = 0, tpot = 0, e2e = 0;
  std::vector<double> gaps;  // between consecutive tokens after the first
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = (size_t)rank;
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

// Prompts of exactly `tokens` tokens from `text`, starting at spread-out
// offsets, tokenized by the router.
absl::StatusOr<std::vector<std::vector<int32_t>>> MakePrompts(v1::Pdq::Stub& stub,
                                                              const std::string& text,
                                                              int64_t tokens, int count) {
  std::vector<std::vector<int32_t>> prompts;
  size_t chars = (size_t)tokens * 6 + 64;  // English runs about 4 characters per token
  for (int i = 0; i < count; ++i) {
    for (int attempt = 0;; ++attempt) {
      if (chars > text.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the text is too short for ", tokens, "-token prompts"));
      }
      const size_t stride = count > 1 ? (text.size() - chars) / (count - 1) : 0;
      size_t at = std::min(i * stride, text.size() - chars), end = at + chars;
      // Whole UTF-8 characters only: no continuation byte at either edge.
      auto continuation = [&](size_t k) { return k < text.size() && (text[k] & 0xC0) == 0x80; };
      while (continuation(at)) ++at;
      while (end > at && continuation(end)) --end;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::TokenizeRequest req;
      req.set_text(text.substr(at, end - at));
      v1::TokenizeResponse resp;
      const grpc::Status s = stub.Tokenize(&ctx, req, &resp);
      if (!s.ok()) {
        return absl::UnavailableError(absl::StrCat("Tokenize failed: ", s.error_message()));
      }
      if (resp.ids_size() >= tokens) {
        prompts.emplace_back(resp.ids().begin(), resp.ids().begin() + tokens);
        break;
      }
      chars *= 2;
    }
  }
  return prompts;
}

Record RunOne(v1::Pdq::Stub& stub, const std::vector<int32_t>& prompt, int64_t output_tokens,
              int64_t timeout_s, const std::string& id, Clock::time_point level_start) {
  Record r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  v1::GenerateRequest req;
  req.set_request_id(id);
  for (int32_t t : prompt) req.mutable_tokens()->add_ids(t);
  req.set_max_tokens((int32_t)output_tokens);
  req.set_ignore_eos(true);
  const Clock::time_point start = Clock::now();
  r.start = Since(level_start, start);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  Clock::time_point last = start;
  while (reader->Read(&m)) {
    if (!m.has_delta() || m.delta().token_ids_size() == 0) continue;
    const Clock::time_point now = Clock::now();
    if (r.output_tokens == 0) {
      r.ttft = Since(start, now);
    } else {
      // Tokens that arrive together share the gap.
      const int n = m.delta().token_ids_size();
      for (int k = 0; k < n; ++k) r.gaps.push_back(Since(last, now) / n);
    }
    r.output_tokens += m.delta().token_ids_size();
    last = now;
  }
  const grpc::Status s = reader->Finish();
  r.e2e = Since(start, Clock::now());
  r.prompt_tokens = (int)prompt.size();
  r.ok = s.ok();
  if (!s.ok()) r.error = absl::StrCat(s.error_code(), ": ", s.error_message());
  if (r.output_tokens > 1) r.tpot = Since(start, last) - r.ttft, r.tpot /= r.output_tokens - 1;
  return r;
}

struct Targets {
  double ttft = 0, tpot = 0;  // seconds; 0: none
};

nlohmann::json Summarize(int level, const std::vector<Record>& records, double seconds,
                         const Targets& targets) {
  std::vector<double> ttft, tpot, e2e, gaps;
  int64_t ok = 0, failed = 0, out_tokens = 0, in_tokens = 0, good = 0;
  for (const Record& r : records) {
    if (!r.ok) {
      ++failed;
      continue;
    }
    ++ok;
    ttft.push_back(r.ttft);
    if (r.output_tokens > 1) tpot.push_back(r.tpot);
    e2e.push_back(r.e2e);
    gaps.insert(gaps.end(), r.gaps.begin(), r.gaps.end());
    out_tokens += r.output_tokens;
    in_tokens += r.prompt_tokens;
    good += (targets.ttft <= 0 || r.ttft <= targets.ttft) &&
            (targets.tpot <= 0 || r.output_tokens < 2 || r.tpot <= targets.tpot);
  }
  auto pct = [](const std::vector<double>& v) {
    return nlohmann::json{{"p50", Percentile(v, 50)},
                          {"p90", Percentile(v, 90)},
                          {"p99", Percentile(v, 99)},
                          {"mean", v.empty() ? 0.0 : [&] {
                             double s = 0;
                             for (double x : v) s += x;
                             return s / v.size();
                           }()}};
  };
  return {{"concurrency", level},
          {"requests_ok", ok},
          {"requests_failed", failed},
          {"seconds", seconds},
          {"ttft_s", pct(ttft)},
          {"tpot_s", pct(tpot)},
          {"itl_s", pct(gaps)},
          {"e2e_s", pct(e2e)},
          {"requests_per_s", ok / seconds},
          {"output_tokens_per_s", out_tokens / seconds},
          {"total_tokens_per_s", (out_tokens + in_tokens) / seconds},
          {"goodput_requests_per_s", good / seconds}};
}

void PrintSummary(const nlohmann::json& s) {
  auto ms = [&](const char* k, const char* p) { return s[k][p].get<double>() * 1e3; };
  std::printf("%5d %4lld/%-4lld %8.1f %8.1f %8.1f %7.2f %7.2f %7.2f %8.2f %9.1f %9.1f %8.2f\n",
              s["concurrency"].get<int>(), (long long)s["requests_ok"].get<int64_t>(),
              (long long)(s["requests_ok"].get<int64_t>() + s["requests_failed"].get<int64_t>()),
              ms("ttft_s", "p50"), ms("ttft_s", "p90"), ms("ttft_s", "p99"), ms("tpot_s", "p50"),
              ms("tpot_s", "p90"), ms("tpot_s", "p99"), s["requests_per_s"].get<double>(),
              s["output_tokens_per_s"].get<double>(), s["total_tokens_per_s"].get<double>(),
              s["goodput_requests_per_s"].get<double>());
  std::fflush(stdout);
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  std::string router = "127.0.0.1:50051", levels_flag = "1",
              text_path = "../shared/data/wikitext-2-raw/wiki.test.raw", json_path;
  int64_t input_tokens = 128, output_tokens = 128, requests = 0, warmup = 1, timeout_s = 600;
  double ttft_target_ms = 0, tpot_target_ms = 0;
  FlagParser flags("bench",
                   "Load-tests a pdq router with streaming requests of real text at fixed "
                   "input and output lengths, at one or more concurrency levels, and prints "
                   "TTFT, TPOT, throughput and goodput per level.");
  flags.String("router", &router, "the router's gRPC address (host:port)");
  flags.String("concurrency", &levels_flag, "concurrency levels, comma-separated (1,2,4,8)");
  flags.Int("requests", &requests, 0, 1 << 20,
            "requests counted per level (default: 4 x the level, at least 8)");
  flags.Int("warmup", &warmup, 0, 1 << 20, "requests per level run first and not counted");
  flags.Int("input-tokens", &input_tokens, 1, 1 << 20, "prompt length in tokens");
  flags.Int("output-tokens", &output_tokens, 1, 1 << 20, "tokens generated per request");
  flags.String("text", &text_path, "where prompts come from (plain text)");
  flags.Float("ttft-target-ms", &ttft_target_ms, 0, 1e9, "goodput counts requests within this");
  flags.Float("tpot-target-ms", &tpot_target_ms, 0, 1e9, "...and within this TPOT");
  flags.Int("timeout", &timeout_s, 1, 86400, "deadline of each request in seconds");
  flags.String("json", &json_path, "write the summaries and every request's record here");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  std::vector<int> levels;
  for (absl::string_view l : absl::StrSplit(levels_flag, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(l, &n) || n < 1 || n > 4096) {
      return Fail("bench", absl::InvalidArgumentError(absl::StrCat(
                               "--concurrency: '", std::string(l), "' is not a level in 1..4096")));
    }
    levels.push_back(n);
  }
  absl::StatusOr<std::string> text = ReadTextFile(text_path, "--text");
  if (!text.ok()) return Fail("bench", text.status());

  auto stub = v1::Pdq::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo info;
    const grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
    if (!s.ok()) {
      return Fail("bench",
                  absl::UnavailableError(absl::StrCat("router ", router, ": ", s.error_message())));
    }
    if (input_tokens + output_tokens > info.max_context()) {
      return Fail("bench", absl::InvalidArgumentError(absl::StrCat(
                               "--input-tokens + --output-tokens must fit the context of ",
                               info.max_context())));
    }
    std::fprintf(stderr, "pdq bench: %s at %s, %d live workers; %lld in, %lld out\n",
                 info.name().c_str(), router.c_str(), info.live_workers(), (long long)input_tokens,
                 (long long)output_tokens);
  }

  nlohmann::json out = {{"router", router},
                        {"input_tokens", input_tokens},
                        {"output_tokens", output_tokens},
                        {"ttft_target_ms", ttft_target_ms},
                        {"tpot_target_ms", tpot_target_ms},
                        {"levels", nlohmann::json::array()},
                        {"requests", nlohmann::json::array()}};
  std::printf("%5s %9s %8s %8s %8s %7s %7s %7s %8s %9s %9s %8s\n", "conc", "ok/all", "ttft p50",
              "p90", "p99", "tpot50", "p90", "p99", "req/s", "out tok/s", "tot tok/s", "goodput");
  std::printf("%5s %9s %8s %8s %8s %7s %7s %7s\n", "", "", "ms", "ms", "ms", "ms", "ms", "ms");
  int failed_total = 0;
  for (int level : levels) {
    const int counted = requests > 0 ? (int)requests : std::max(8, 4 * level);
    const int total = counted + (int)warmup;
    absl::StatusOr<std::vector<std::vector<int32_t>>> prompts =
        MakePrompts(*stub, *text, input_tokens, std::min(total, 64));
    if (!prompts.ok()) return Fail("bench", prompts.status());
    std::vector<Record> records(total);
    std::atomic<int> next{0}, done{0};
    const Clock::time_point level_start = Clock::now();
    Clock::time_point counted_start = level_start;
    std::mutex mu;
    std::vector<std::thread> clients;
    for (int c = 0; c < level; ++c) {
      clients.emplace_back([&] {
        for (int i; (i = next++) < total;) {
          records[i] = RunOne(*stub, (*prompts)[i % prompts->size()], output_tokens, timeout_s,
                              absl::StrCat("bench-", level, "-", i), level_start);
          records[i].level = level;
          if (++done == (int)warmup) {
            std::lock_guard lock(mu);
            counted_start = Clock::now();
          }
        }
      });
    }
    // Progress on stderr while the level runs: a line rewritten in place on
    // a terminal, a line every 10 s in a log.
    const bool tty = isatty(STDERR_FILENO);
    for (int tick = 1; done.load() < total; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (tty || tick % 20 == 0) {
        std::fprintf(stderr, "%spdq bench: concurrency %d: %d/%d requests%s", tty ? "\r" : "",
                     level, done.load(), total, tty ? "" : "\n");
      }
    }
    if (tty) std::fprintf(stderr, "\n");
    for (std::thread& t : clients) t.join();
    const double seconds = Since(warmup > 0 ? counted_start : level_start, Clock::now());
    // The warm-up requests are the ones that finished first.
    std::vector<Record> kept;
    std::vector<const Record*> by_end;
    for (const Record& r : records) by_end.push_back(&r);
    std::sort(by_end.begin(), by_end.end(), [](const Record* a, const Record* b) {
      return a->start + a->e2e < b->start + b->e2e;
    });
    for (size_t i = warmup; i < by_end.size(); ++i) kept.push_back(*by_end[i]);
    for (const Record& r : kept) {
      if (!r.ok) {
        ++failed_total;
        std::fprintf(stderr, "pdq bench: a request failed: %s\n", r.error.c_str());
      }
      out["requests"].push_back({{"concurrency", r.level},
                                 {"ok", r.ok},
                                 {"error", r.error},
                                 {"start_s", r.start},
                                 {"prompt_tokens", r.prompt_tokens},
                                 {"output_tokens", r.output_tokens},
                                 {"ttft_s", r.ttft},
                                 {"tpot_s", r.tpot},
                                 {"e2e_s", r.e2e},
                                 {"gaps_s", r.gaps}});
    }
    nlohmann::json s =
        Summarize(level, kept, seconds, {ttft_target_ms / 1e3, tpot_target_ms / 1e3});
    PrintSummary(s);
    out["levels"].push_back(std::move(s));
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f) {
      return Fail("bench", absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
    }
  }
  return failed_total == 0 ? 0 : 1;
}

}  // namespace pdq
