// Google Benchmark suite for the CPU kernels on this model family's shapes.
// Reports GB/s of weights streamed and GFLOP/s; compare them with the
// rooflines `pdq bench-engine` measures in the same run.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace pdq {
namespace {

ThreadPool& Pool() {
  static ThreadPool pool(0);
  return pool;
}

void BM_GemmF16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<fp16_t> w(PackedF16Elements(n, k));
  std::mt19937 rng(1);
  for (auto& v : w) v = Fp32ToFp16(std::uniform_real_distribution<float>(-1, 1)(rng));
  std::vector<float> x(m * k, 0.5f), y(m * n);
  const PackedF16 pw{w.data(), n, k};
  CpuContext ctx{&Pool()};
  for (auto _ : state) {
    GemmF16(ctx, pw, x.data(), m, k, y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GBps"] = benchmark::Counter(
      (double)n * k * 2, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["GFLOPs"] = benchmark::Counter((double)2 * m * n * k,
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

// Decode (m = 1) and batched decode on SmolLM2 shapes, then prefill tiles.
BENCHMARK(BM_GemmF16)
    ->ArgsProduct({{1}, {960, 3072}, {576}})
    ->Args({1, 576, 1536})
    ->Args({1, 49152, 576})
    ->Args({32, 3072, 576})
    ->Args({512, 3072, 576})
    ->Args({512, 576, 1536})
    ->UseRealTime();

void BM_GemmW4A16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int group = (int)state.range(3);
  std::vector<float> w(n * k);
  std::mt19937 rng(1);
  for (auto& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint8_t> q(PackedW4QBytes(n, k));
  std::vector<fp16_t> scale(PackedW4ScaleElements(n, k, group)), mins(scale.size());
  QuantizeW4Rows(w.data(), 0, n, k, group, false, q.data(), scale.data(), mins.data());
  std::vector<float> x(m * k), y(m * n);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint8_t> scratch(GemmW4A16ScratchBytes(m, k, group));
  const PackedW4 pw{q.data(), scale.data(), mins.data(), n, k, group};
  CpuContext ctx{&Pool()};
  for (auto _ : state) {
    GemmW4A16(ctx, pw, x.data(), m, k, y.data(), n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = (double)n * k / 2 + (double)scale.size() * 4;
  state.counters["weight_GBps"] = benchmark::Counter(
      bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["GFLOPs"] = benchmark::Counter((double)2 * m * n * k,
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

BENCHMARK(BM_GemmW4A16)
    ->Args({1, 3072, 576, 128})
    ->Args({1, 49152, 576, 128})
    ->Args({1, 576, 1536, 32})
    ->Args({4, 3072, 576, 128})
    ->Args({32, 3072, 576, 128})
    ->Args({64, 3072, 576, 128})
    ->Args({65, 3072, 576, 128})
    ->Args({512, 3072, 576, 128})
    ->UseRealTime();

void BM_GemmW8A8(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> w(n * k);
  std::mt19937 rng(1);
  for (auto& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<int8_t> q(PackedI8Bytes(n, k));
  std::vector<float> scale(n);
  QuantizeI8Rows(w.data(), 0, n, k, q.data(), scale.data());
  std::vector<float> x(m * k, 0.5f), y(m * n);
  std::vector<uint8_t> scratch(GemmW8A8ScratchBytes(m, k));
  const PackedI8 pw{q.data(), scale.data(), n, k};
  CpuContext ctx{&Pool()};
  for (auto _ : state) {
    GemmW8A8(ctx, pw, x.data(), m, k, y.data(), n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GOPs"] = benchmark::Counter((double)2 * m * n * k,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

BENCHMARK(BM_GemmW8A8)
    ->Args({1, 3072, 576})
    ->Args({32, 3072, 576})
    ->Args({512, 3072, 576})
    ->Args({512, 576, 1536})
    ->UseRealTime();

}  // namespace
}  // namespace pdq

BENCHMARK_MAIN();
