// `pdq bench-engine`: prefill and decode tokens/s at batch 1 (like
// llama-bench's pp512 and tg128), each against its roofline measured in the
// same run: matmul FLOPs against the FMA peak for prefill, weight bytes
// against the read bandwidth for decode. On a GPU (--device cuda) it reports
// speeds and --baseline ratios; gpu_bench measures the GPU's ceilings.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/host.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"
#include "probes/roofline.h"
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

// One model's pp and tg runs over its own KV cache.
class Runner {
 public:
  Runner(Context& ctx, std::unique_ptr<KvCache> kv, std::vector<int32_t> prompt,
         int64_t decode_context)
      : ctx_(ctx),
        kv_(std::move(kv)),
        prompt_(std::move(prompt)),
        decode_context_(decode_context) {}

  absl::Status Warmup() {
    const SeqId seq = kv_->AddSequence();
    BatchEntry e{seq, {prompt_.data(), std::min<size_t>(prompt_.size(), 32)}, 1};
    absl::Status s = ctx_.ForwardAll(*kv_, {&e, 1}, &logits_);
    PDQ_CHECK(kv_->RemoveSequence(seq).ok());
    return s;
  }

  // Prompt tokens/s for one prefill of the whole prompt.
  absl::StatusOr<double> Prefill() {
    const SeqId seq = kv_->AddSequence();
    BatchEntry e{seq, prompt_, 1};
    const auto t0 = Clock::now();
    absl::Status s = ctx_.ForwardAll(*kv_, {&e, 1}, &logits_);
    const double secs = Seconds(t0);
    PDQ_CHECK(kv_->RemoveSequence(seq).ok());
    if (!s.ok()) return s;
    return (double)prompt_.size() / secs;
  }

  // `batch` sequences decode together, one token each per step, from an
  // empty context (like llama-bench's tg) or from --decode-context tokens;
  // returns total tokens/s.
  absl::StatusOr<double> Decode(int64_t batch, int64_t gen_tokens) {
    const int vocab = ctx_.model().config().vocab_size;
    std::vector<SeqId> seqs(batch);
    std::vector<int32_t> tokens(batch);
    std::vector<BatchEntry> entries(batch);
    for (int64_t b = 0; b < batch; ++b) {
      seqs[b] = kv_->AddSequence();
      tokens[b] = prompt_[b % prompt_.size()];
    }
    absl::Status s;
    // Each sequence first holds decode_context_ tokens of KV (untimed), so
    // the steps read as much KV as a server's do mid-answer.
    std::vector<int32_t> history(decode_context_);
    for (int64_t b = 0; b < batch && s.ok() && decode_context_ > 0; ++b) {
      for (int64_t i = 0; i < decode_context_; ++i) history[i] = prompt_[(b + i) % prompt_.size()];
      BatchEntry e{seqs[b], history, 1};
      s = ctx_.ForwardAll(*kv_, {&e, 1}, &logits_);
    }
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < gen_tokens && s.ok(); ++i) {
      for (int64_t b = 0; b < batch; ++b) entries[b] = BatchEntry{seqs[b], {&tokens[b], 1}, 1};
      s = ctx_.ForwardAll(*kv_, entries, &logits_);
      for (int64_t b = 0; s.ok() && b < batch; ++b) tokens[b] = Argmax(logits_.Row(b, 0), vocab);
    }
    const double secs = Seconds(t0);
    for (SeqId seq : seqs) PDQ_CHECK(kv_->RemoveSequence(seq).ok());
    if (!s.ok()) return s;
    return (double)(gen_tokens * batch) / secs;
  }

 private:
  Context& ctx_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int32_t> prompt_;
  int64_t decode_context_ = 0;
  Logits logits_;
};

// The pp and tg results of one configuration over the repetitions.
struct Series {
  std::vector<double> pp, tg, tg1;  // tg1: batch-1 decode, when the batch is larger
};

// Repetitions alternate between the configurations, so slow phases of a
// shared machine hit both alike.
absl::StatusOr<std::vector<Series>> RunRepetitions(std::vector<Runner>& runners, int64_t reps,
                                                   int64_t batch, int64_t prompt_tokens,
                                                   int64_t gen_tokens) {
  std::vector<Series> series(runners.size());
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < runners.size(); ++i) {
      PDQ_ASSIGN_OR_RETURN(const double p, runners[i].Prefill());
      PDQ_ASSIGN_OR_RETURN(const double t, runners[i].Decode(batch, gen_tokens));
      series[i].pp.push_back(p);
      series[i].tg.push_back(t);
      std::string extra;
      if (batch > 1) {
        PDQ_ASSIGN_OR_RETURN(const double t1, runners[i].Decode(1, gen_tokens));
        series[i].tg1.push_back(t1);
        extra = absl::StrFormat(", batch-1 tg%d %.1f tokens/s", gen_tokens, t1);
      }
      std::fprintf(stderr,
                   "pdq: repetition %lld/%lld%s: pp%lld %.1f tokens/s, tg%lld %.1f tokens/s "
                   "(batch %lld)%s\n",
                   (long long)rep + 1, (long long)reps, i == 1 ? " (baseline)" : "",
                   (long long)prompt_tokens, p, (long long)gen_tokens, t, (long long)batch,
                   extra.c_str());
    }
  }
  return series;
}

// One configuration's speeds, and on a CPU their fractions of the rooflines.
void PrintRun(const nlohmann::json& r, bool on_cpu, int64_t prompt_tokens, int64_t gen_tokens,
              int64_t batch, double flops_per_token) {
  std::printf("%s weights\n", r["precision"].get<std::string>().c_str());
  const double pp = r["prefill_tokens_per_s"], tg = r["decode_tokens_per_s"];
  // W8A8's GEMMs run on integer units (VNNI, AMX tiles) beside the FP32
  // FMAs its FP16 layers and attention use, so its fraction can pass 100%.
  const bool integer_prefill = r["precision"].get<std::string>() == "w8a8";
  const std::string pp_roof =
      on_cpu ? absl::StrFormat(" = %.1f%% of the FMA peak%s",
                               100 * r["prefill_roofline_fraction"].get<double>(),
                               integer_prefill ? " (FLOPs of every kind; int8 GEMMs included)" : "")
             : "";
  const std::string tg_roof =
      on_cpu ? absl::StrFormat(" = %.1f%% of the read bandwidth",
                               100 * r["decode_roofline_fraction"].get<double>())
             : "";
  std::printf("  pp%-6lld %8.1f ± %.1f tokens/s  %6.1f GFLOP/s%s\n", (long long)prompt_tokens, pp,
              r["prefill_tokens_per_s_stddev"].get<double>(), pp * flops_per_token / 1e9,
              pp_roof.c_str());
  std::printf("  tg%-6lld %8.1f ± %.1f tokens/s  %6.1f GB/s%s (batch %lld)\n",
              (long long)gen_tokens, tg, r["decode_tokens_per_s_stddev"].get<double>(),
              tg / (double)batch * r["decode_weight_bytes_per_token"].get<double>() / 1e9,
              tg_roof.c_str(), (long long)batch);
  if (r.contains("batch_speedup")) {
    std::printf("  batch %lld decodes %.2fx the batch-1 rate (%.1f tokens/s)\n", (long long)batch,
                r["batch_speedup"].get<double>(), r["decode_batch1_tokens_per_s"].get<double>());
  }
}

}  // namespace

int BenchEngineCommand(int argc, char** argv) {
  FlagParser flags("bench-engine",
                   "Prefill (pp) and decode (tg) speed at batch 1, with the CPU's read bandwidth\n"
                   "and FMA peak measured in the same run (on a GPU, --device cuda: speeds and\n"
                   "the --baseline ratios only). With --baseline, a second copy of the model at\n"
                   "that precision runs alternately in the same process, so the speed ratios\n"
                   "come from one run.");
  ModelFlags mf;
  mf.Register(flags, /*device_flag=*/true);
  int64_t prompt_tokens = 512, gen_tokens = 128, reps = 3, batch = 1, decode_context = 0;
  bool json = false;
  std::string baseline;
  flags.Int("prompt-tokens", &prompt_tokens, 1, 1 << 20, "prompt length for the prefill test");
  flags.Int("gen-tokens", &gen_tokens, 1, 1 << 20, "tokens generated in the decode test");
  flags.Int("repetitions", &reps, 1, 100, "runs of each test; the mean is reported");
  flags.Int("batch", &batch, 1, 1024,
            "sequences decoding together in the decode test (tokens/s counts all of them);\n"
            "above 1, batch-1 decode is also measured for the batch speedup");
  flags.Int("decode-context", &decode_context, 0, 1 << 20,
            "tokens of KV each decoding sequence holds before the timed steps (0: none,\n"
            "like llama-bench's tg; a server mid-answer reads more)");
  flags.String("baseline", &baseline,
               "also run this precision (fp16, w8a8 or w4a16; no --weights) and report\n"
               "speedups against it");
  flags.Bool("json", &json, "print one JSON object");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (!baseline.empty()) {
    if (absl::StatusOr<Precision> p = ParsePrecision(baseline); !p.ok()) {
      return Fail("bench-engine", p.status());
    }
  }
  auto loaded = mf.Load(/*quiet=*/false);
  if (!loaded.ok()) return Fail("bench-engine", loaded.status());
  Model& model = *loaded->model;
  const ModelConfig& c = model.config();
  if (prompt_tokens > c.max_context || decode_context + gen_tokens > c.max_context) {
    return Fail("bench-engine", absl::OutOfRangeError("test longer than the model's context"));
  }
  const std::vector<int32_t> prompt = BenchTokens(prompt_tokens, c.vocab_size, 0);
  const int64_t kv_tokens =
      std::max(prompt_tokens, (decode_context + gen_tokens) * batch + 16 * batch);
  LoadedModel base;
  std::vector<Runner> runners;  // [0]: the model, [1]: the baseline
  runners.reserve(2);
  {
    auto kv = loaded->ctx->NewKvCache(kv_tokens);
    if (!kv.ok()) return Fail("bench-engine", kv.status());
    runners.emplace_back(*loaded->ctx, std::move(*kv), prompt, decode_context);
  }
  if (!baseline.empty()) {
    ModelFlags bf = mf;
    bf.precision = baseline;
    bf.weights.clear();
    auto b = bf.Load(/*quiet=*/false);
    if (!b.ok()) return Fail("bench-engine", b.status());
    base = std::move(*b);
    auto kv = base.ctx->NewKvCache(kv_tokens);
    if (!kv.ok()) return Fail("bench-engine", kv.status());
    runners.emplace_back(*base.ctx, std::move(*kv), prompt, decode_context);
  }

  std::fprintf(stderr, "pdq: warming up\n");
  for (Runner& r : runners) {
    if (absl::Status s = r.Warmup(); !s.ok()) return Fail("bench-engine", s);
  }
  absl::StatusOr<std::vector<Series>> series =
      RunRepetitions(runners, reps, batch, prompt_tokens, gen_tokens);
  if (!series.ok()) return Fail("bench-engine", series.status());
  // The CPU's rooflines scale CPU runs only; a GPU's are gpu_bench's, and
  // here a GPU run reports speeds and the speedups over --baseline.
  const bool on_cpu = mf.device == "cpu";
  ThreadPool& pool = mf.pool();
  double bandwidth = 0, peak = 0, int8_peak = 0;
  if (on_cpu) {
    std::fprintf(stderr, "pdq: measuring the machine's read bandwidth and FMA peak\n");
    bandwidth = MeasureReadBandwidthGBps(pool);
    peak = MeasureFmaPeakGflops(pool);
    int8_peak = MeasureIntPeakGops(pool, /*int8=*/true);
  }

  // The FLOPs the prefill really does: every layer for every prompt token,
  // attention over the causal triangle, and logits for the last token only.
  const double flops_per_token = c.ForwardFlops(0, prompt_tokens, 1) / (double)prompt_tokens;
  auto report = [&](const Model& m, const Series& s) {
    const Stats pps = Summarize(s.pp), tgs = Summarize(s.tg);
    const double bytes_per_token = (double)m.weight_bytes_per_token();
    nlohmann::json j;
    j["precision"] = PrecisionName(m.precision());
    j["prefill_tokens_per_s"] = pps.mean;
    j["prefill_tokens_per_s_stddev"] = pps.stddev;
    j["decode_tokens_per_s"] = tgs.mean;
    j["decode_tokens_per_s_stddev"] = tgs.stddev;
    j["decode_weight_bytes_per_token"] = bytes_per_token;
    if (on_cpu) {
      j["prefill_roofline_fraction"] = pps.mean * flops_per_token / (peak * 1e9);
      // Each decode step streams the weights once for the whole batch.
      j["decode_roofline_fraction"] =
          tgs.mean / (double)batch * bytes_per_token / (bandwidth * 1e9);
    }
    if (!s.tg1.empty()) {
      const Stats t1 = Summarize(s.tg1);
      j["decode_batch1_tokens_per_s"] = t1.mean;
      j["batch_speedup"] = tgs.mean / t1.mean;
    }
    return j;
  };
  nlohmann::json j = report(model, (*series)[0]);
  j["model"] = c.name;
  j["device"] = loaded->ctx->device();
  j["threads"] = pool.size();
  j["isa"] = KernelIsaName();
  j["cpu"] = CpuModelName();
  j["prompt_tokens"] = prompt_tokens;
  j["gen_tokens"] = gen_tokens;
  j["batch"] = batch;
  j["repetitions"] = reps;
  if (on_cpu) {
    j["read_bandwidth_gbps"] = bandwidth;
    j["fma_peak_gflops"] = peak;
    j["int8_peak_gops"] = int8_peak;  // int8 multiply-adds per second; 0: not measured here
  }
  j["prefill_flops_per_token"] = flops_per_token;
  if (base.model) {
    nlohmann::json b = report(*base.model, (*series)[1]);
    j["prefill_speedup"] =
        j["prefill_tokens_per_s"].get<double>() / b["prefill_tokens_per_s"].get<double>();
    j["decode_speedup"] =
        j["decode_tokens_per_s"].get<double>() / b["decode_tokens_per_s"].get<double>();
    j["baseline"] = b;
  }
  if (json) {
    std::puts(j.dump().c_str());
    return 0;
  }
  if (on_cpu) {
    std::printf(
        "model %s, %d threads, %s kernels; FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s\n",
        c.name.c_str(), pool.size(), KernelIsaName().c_str(), peak, bandwidth);
  } else {
    std::printf("model %s on %s\n", c.name.c_str(), loaded->ctx->device().c_str());
  }
  PrintRun(j, on_cpu, prompt_tokens, gen_tokens, batch, flops_per_token);
  if (base.model) {
    PrintRun(j["baseline"], on_cpu, prompt_tokens, gen_tokens, batch, flops_per_token);
    std::printf("speedup over %s: prefill %.2fx, decode %.2fx\n", baseline.c_str(),
                j["prefill_speedup"].get<double>(), j["decode_speedup"].get<double>());
  }
  return 0;
}

}  // namespace pdq
