// `pdq bench-engine`: prefill and decode tokens/s at batch 1 (like
// llama-bench's pp512 and tg128), each against its roofline measured in the
// same run: matmul FLOPs against the FMA peak for prefill, weight bytes
// against the read bandwidth for decode.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/roofline.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu_features.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Stats {
  double mean = 0, stddev = 0;
};
Stats Summarize(const std::vector<double>& v) {
  Stats s;
  for (double x : v) s.mean += x;
  s.mean /= (double)v.size();
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / (double)(v.size() - 1)) : 0.0;
  return s;
}

// Deterministic pseudo-random prompt ids spread over the vocabulary.
std::vector<int32_t> BenchTokens(int64_t n, int vocab) {
  std::vector<int32_t> ids(n);
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids[i] = (int32_t)(x % (uint64_t)vocab);
  }
  return ids;
}

}  // namespace

int BenchEngineCommand(int argc, char** argv) {
  FlagParser flags("bench-engine",
                   "Prefill (pp) and decode (tg) speed at batch 1, with the machine's read\n"
                   "bandwidth and FMA peak measured in the same run.");
  ModelFlags mf;
  mf.Register(flags);
  int64_t prompt_tokens = 512, gen_tokens = 128, reps = 3, batch = 1;
  bool json = false;
  flags.Int("prompt-tokens", &prompt_tokens, 1, 1 << 20, "prompt length for the prefill test");
  flags.Int("gen-tokens", &gen_tokens, 1, 1 << 20, "tokens generated in the decode test");
  flags.Int("repetitions", &reps, 1, 100, "runs of each test; the mean is reported");
  flags.Int("batch", &batch, 1, 1024,
            "sequences decoding together in the decode test (tokens/s counts all of them)");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  auto loaded = mf.Load(/*quiet=*/false);
  if (!loaded.ok()) return Fail("bench-engine", loaded.status());
  Model& model = **loaded;
  const ModelConfig& c = model.config();
  if (prompt_tokens > c.max_context || gen_tokens > c.max_context) {
    return Fail("bench-engine", absl::OutOfRangeError("test longer than the model's context"));
  }
  auto kv_or = model.NewKvCache(std::max(prompt_tokens, gen_tokens * batch + 16 * batch));
  if (!kv_or.ok()) return Fail("bench-engine", kv_or.status());
  KvCache& kv = **kv_or;
  const std::vector<int32_t> prompt = BenchTokens(prompt_tokens, c.vocab_size);
  Logits logits;

  auto prefill = [&]() -> absl::StatusOr<double> {
    const SeqId seq = kv.AddSequence();
    BatchEntry e{seq, prompt, 1};
    const auto t0 = Clock::now();
    absl::Status s = model.Forward(kv, {&e, 1}, &logits);
    const double secs = Seconds(t0);
    kv.RemoveSequence(seq);
    if (!s.ok()) return s;
    return (double)prompt_tokens / secs;
  };
  // `batch` sequences decode together, one token each per step, from an
  // empty context (like llama-bench's tg); returns total tokens/s.
  auto decode = [&]() -> absl::StatusOr<double> {
    std::vector<SeqId> seqs(batch);
    std::vector<int32_t> tokens(batch);
    std::vector<BatchEntry> entries(batch);
    for (int64_t b = 0; b < batch; ++b) {
      seqs[b] = kv.AddSequence();
      tokens[b] = prompt[b % prompt.size()];
    }
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < gen_tokens; ++i) {
      for (int64_t b = 0; b < batch; ++b) entries[b] = BatchEntry{seqs[b], {&tokens[b], 1}, 1};
      absl::Status s = model.Forward(kv, entries, &logits);
      if (!s.ok()) return s;
      for (int64_t b = 0; b < batch; ++b) tokens[b] = Argmax(logits.Row(b, 0), c.vocab_size);
    }
    const double secs = Seconds(t0);
    for (SeqId seq : seqs) kv.RemoveSequence(seq);
    return (double)(gen_tokens * batch) / secs;
  };

  std::fprintf(stderr, "pdq: warming up\n");
  {
    const SeqId seq = kv.AddSequence();
    BatchEntry e{seq, {prompt.data(), (size_t)std::min<int64_t>(prompt_tokens, 32)}, 1};
    if (absl::Status s = model.Forward(kv, {&e, 1}, &logits); !s.ok()) return Fail("bench-engine", s);
    kv.RemoveSequence(seq);
  }
  std::vector<double> pp, tg;
  for (int64_t r = 0; r < reps; ++r) {
    auto p = prefill();
    if (!p.ok()) return Fail("bench-engine", p.status());
    pp.push_back(*p);
    auto t = decode();
    if (!t.ok()) return Fail("bench-engine", t.status());
    tg.push_back(*t);
    std::fprintf(stderr, "pdq: repetition %lld/%lld: pp%lld %.1f tokens/s, tg%lld %.1f tokens/s\n",
                 (long long)r + 1, (long long)reps, (long long)prompt_tokens, *p,
                 (long long)gen_tokens, *t);
  }
  std::fprintf(stderr, "pdq: measuring the machine's read bandwidth and FMA peak\n");
  ThreadPool pool(model.num_threads());
  const double bandwidth = MeasureReadBandwidthGBps(pool);
  const double peak = MeasureFmaPeakGflops(pool);

  const Stats pps = Summarize(pp), tgs = Summarize(tg);
  // The FLOPs the prefill really does: every layer for every prompt token,
  // attention over the causal triangle, and logits for the last token only.
  const double flops_per_token = c.ForwardFlops(0, prompt_tokens, 1) / (double)prompt_tokens;
  const double bytes_per_token = (double)model.weight_bytes_per_token();
  const double prefill_fraction = pps.mean * flops_per_token / (peak * 1e9);
  // Each decode step streams the weights once for the whole batch.
  const double decode_fraction = tgs.mean / (double)batch * bytes_per_token / (bandwidth * 1e9);
  if (json) {
    nlohmann::json j;
    j["model"] = c.name;
    j["precision"] = PrecisionName(model.precision());
    j["threads"] = model.num_threads();
    j["isa"] = KernelIsaName();
    j["prompt_tokens"] = prompt_tokens;
    j["gen_tokens"] = gen_tokens;
    j["batch"] = batch;
    j["repetitions"] = reps;
    j["prefill_tokens_per_s"] = pps.mean;
    j["prefill_tokens_per_s_stddev"] = pps.stddev;
    j["decode_tokens_per_s"] = tgs.mean;
    j["decode_tokens_per_s_stddev"] = tgs.stddev;
    j["read_bandwidth_gbps"] = bandwidth;
    j["fma_peak_gflops"] = peak;
    j["prefill_flops_per_token"] = flops_per_token;
    j["decode_weight_bytes_per_token"] = bytes_per_token;
    j["prefill_roofline_fraction"] = prefill_fraction;
    j["decode_roofline_fraction"] = decode_fraction;
    std::puts(j.dump().c_str());
  } else {
    std::printf("model %s, %s weights, %d threads, %s kernels\n", c.name.c_str(),
                PrecisionName(model.precision()), model.num_threads(), KernelIsaName().c_str());
    std::printf("  pp%-6lld %8.1f ± %.1f tokens/s  %6.1f GFLOP/s = %.1f%% of the %.1f GFLOP/s FMA peak\n",
                (long long)prompt_tokens, pps.mean, pps.stddev, pps.mean * flops_per_token / 1e9,
                100 * prefill_fraction, peak);
    std::printf("  tg%-6lld %8.1f ± %.1f tokens/s  %6.1f GB/s   = %.1f%% of the %.1f GB/s read bandwidth"
                " (batch %lld)\n",
                (long long)gen_tokens, tgs.mean, tgs.stddev,
                tgs.mean / (double)batch * bytes_per_token / 1e9, 100 * decode_fraction, bandwidth,
                (long long)batch);
  }
  return 0;
}

}  // namespace pdq
