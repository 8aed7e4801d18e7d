// Google Benchmark suite for the CPU kernels on this model family's shapes.
// Reports GB/s of weights streamed and GFLOP/s (GOP/s for integer kernels),
// and each as a fraction of the roofline measured at start-up in the same
// run: read bandwidth for single-row (decode) calls, else the FMA peak, or
// the peak of the integer multiply instruction the kernel is built on.
// Single-row shapes whose weights fit in cache can exceed 1 of the DRAM read
// bandwidth: repeated calls find them in L2/L3. The 131072-row W4A16 shape
// (38 MB) is larger than this machine's 32 MB L3, so it streams from DRAM.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"
#include "probes/roofline.h"

namespace pdq {
namespace {

struct Rooflines {
  double read_gbps = 0, fma_gflops = 0, int16_gops = 0, int8_gops = 0;
};
Rooflines& Roof() {
  static Rooflines r;
  return r;
}

using Clock = std::chrono::steady_clock;

// Adds `name`: the fraction of `peak` (units of 1e9 per second) sustained by
// `work` per iteration over the timed loop that started at t0.
void AddFraction(benchmark::State& state, const char* name, double work, double peak,
                 Clock::time_point t0) {
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (peak > 0 && secs > 0) {
    state.counters[name] = work * (double)state.iterations() / secs / (peak * 1e9);
  }
}

// Weight GB/s (bytes of weights a call reads) and GFLOP/s per call, as
// rates over the measured time.
void AddRates(benchmark::State& state, double weight_bytes, double flops) {
  state.counters["weight_GBps"] = benchmark::Counter(
      weight_bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["GFLOPs"] = benchmark::Counter(
      flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

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
  const auto t0 = Clock::now();
  for (auto _ : state) {
    GemmF16(ctx, pw, x.data(), m, k, y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  AddRates(state, (double)n * k * 2, (double)2 * m * n * k);
  if (m == 1) {
    AddFraction(state, "of_read_bw", (double)n * k * 2, Roof().read_gbps, t0);
  } else {
    AddFraction(state, "of_fma_peak", (double)2 * m * n * k, Roof().fma_gflops, t0);
  }
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

// Args: m, n, k, group, W4A8's a8_min_rows (0: int16 activations
// throughout) and the bf16 tiles' bf16_min_rows (0: never; AMX only).
void BM_GemmW4A16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int group = (int)state.range(3);
  const int a8_min_rows = (int)state.range(4);
  const int bf16_min_rows = (int)state.range(5);
  std::vector<float> w(n * k);
  std::mt19937 rng(1);
  for (auto& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint8_t> q(PackedW4QBytes(n, k));
  std::vector<fp16_t> scale(PackedW4ScaleElements(n, k, group)), mins(scale.size());
  QuantizeW4Rows(w.data(), 0, n, k, group, false, q.data(), scale.data(), mins.data());
  std::vector<float> x(m * k), y(m * n);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint8_t> scratch(GemmW4A16ScratchBytes(m, k, group));
  const PackedW4 pw{q.data(), scale.data(), mins.data(), n, k, group, a8_min_rows, bf16_min_rows};
  CpuContext ctx{&Pool()};
  const auto t0 = Clock::now();
  for (auto _ : state) {
    GemmW4A16(ctx, pw, x.data(), m, k, y.data(), n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = (double)n * k / 2 + (double)scale.size() * 4;
  AddRates(state, bytes, (double)2 * m * n * k);
  if (m == 1) {
    AddFraction(state, "of_read_bw", bytes, Roof().read_gbps, t0);
  } else if (Bf16TilesTake(bf16_min_rows, m, k)) {
    // No bf16 tile probe: the fraction would be of another unit's peak.
  } else if (m <= kW4IntMaxRows && a8_min_rows > 0 && m >= a8_min_rows) {
    // W4A8 runs on vpdpbusd; on "avx512+amx" the int8 peak is AMX's, not its.
    if (KernelIsaName() != "avx512+amx") {
      AddFraction(state, "of_int8_peak", (double)2 * m * n * k, Roof().int8_gops, t0);
    }
  } else if (m <= kW4IntMaxRows) {
    AddFraction(state, "of_int16_peak", (double)2 * m * n * k, Roof().int16_gops, t0);
  } else {
    AddFraction(state, "of_fma_peak", (double)2 * m * n * k, Roof().fma_gflops, t0);
  }
}

BENCHMARK(BM_GemmW4A16)
    ->Args({1, 3072, 576, 128, 0, 0})
    ->Args({1, 49152, 576, 128, 0, 0})
    ->Args({1, 131072, 576, 128, 0, 0})  // 38 MB: larger than a 32 MB L3
    ->Args({1, 576, 1536, 32, 0, 0})
    ->Args({4, 3072, 576, 128, 0, 0})
    ->Args({32, 3072, 576, 128, 0, 0})
    ->Args({64, 3072, 576, 128, 0, 0})
    ->Args({8, 3072, 576, 128, 8, 0})  // W4A8 where the CPU has VNNI
    ->Args({32, 3072, 576, 128, 8, 0})
    ->Args({32, 3072, 576, 32, 8, 0})
    ->Args({64, 3072, 576, 128, 8, 0})
    ->Args({65, 3072, 576, 128, 0, 0})
    ->Args({512, 3072, 576, 128, 0, 0})
    ->Args({2, 3072, 576, 32, 0, 0})
    ->Args({4, 3072, 576, 32, 0, 0})
    ->Args({8, 3072, 576, 32, 0, 8})  // bf16 tiles where the CPU has AMX
    ->Args({8, 3072, 576, 32, 0, 0})
    ->Args({16, 3072, 576, 32, 0, 16})
    ->Args({16, 3072, 576, 32, 0, 0})
    ->Args({32, 3072, 576, 32, 0, 16})
    ->Args({32, 576, 1536, 32, 0, 16})
    ->Args({32, 576, 1536, 32, 0, 0})  // the down projection's shape on int16
    ->Args({32, 3072, 576, 32, 0, 0})
    ->Args({512, 3072, 576, 32, 0, 16})
    ->Args({512, 3072, 576, 32, 0, 0})
    ->UseRealTime();

// W8A16 (int8 weight groups, int16 activations): the output projection's
// format, so the shapes are its (vocabulary x d_model) beside BM_GemmF16's.
// Args: m, n, k and bf16_min_rows (0: never; AMX only).
void BM_GemmW8A16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> w(n * k);
  std::mt19937 rng(1);
  for (auto& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<int8_t> q(PackedW8QBytes(n, k));
  std::vector<fp16_t> scale(PackedW8ScaleElements(n, k));
  QuantizeW8Rows(w.data(), 0, n, k, q.data(), scale.data());
  std::vector<float> x(m * k), y(m * n);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint8_t> scratch(GemmW8A16ScratchBytes(m, k));
  const PackedW8 pw{q.data(), scale.data(), n, k, (int)state.range(3)};
  CpuContext ctx{&Pool()};
  const auto t0 = Clock::now();
  for (auto _ : state) {
    GemmW8A16(ctx, pw, x.data(), m, k, y.data(), n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = (double)n * k + (double)scale.size() * 2;
  AddRates(state, bytes, (double)2 * m * n * k);
  if (m == 1) {
    AddFraction(state, "of_read_bw", bytes, Roof().read_gbps, t0);
  } else if (!Bf16TilesTake(pw.bf16_min_rows, m, k)) {
    AddFraction(state, "of_int16_peak", (double)2 * m * n * k, Roof().int16_gops, t0);
  }
}

BENCHMARK(BM_GemmW8A16)
    ->Args({1, 49152, 576, 0})
    ->Args({4, 49152, 576, 0})
    ->Args({8, 49152, 576, 0})
    ->Args({16, 49152, 576, 0})
    ->Args({32, 49152, 576, 0})
    ->Args({32, 49152, 576, 16})  // bf16 tiles where the CPU has AMX
    ->Args({1, 3072, 576, 0})
    ->Args({512, 576, 1536, 0})  // a prompt's down projections (W8A8's default)
    ->UseRealTime();

// One kv head's K and V for n positions in 16-token blocks, uniform in
// [-1, 1], the blocks in order.
struct RandomKv {
  RandomKv(int64_t n, int d, std::mt19937& rng, bool bf16 = false) {
    const int64_t blocks = (n + 15) / 16;
    std::uniform_real_distribution<float> u(-1, 1);
    k.resize(blocks * 16 * d);
    v.resize(k.size());
    const auto element = [&] { return bf16 ? cpu::Fp32ToBf16(u(rng)) : Fp32ToFp16(u(rng)); };
    for (auto& x : k) x = element();
    for (auto& x : v) x = element();
    for (int64_t b = 0; b < blocks; ++b) table.push_back((int32_t)b);
    layer = KvLayerView{k.data(), v.data(), 1, d, 16, bf16};
  }
  RandomKv(const RandomKv&) = delete;
  std::vector<fp16_t> k, v;
  std::vector<int32_t> table;
  KvLayerView layer;
};

// One decode row's attention for one kv head and its `group` query heads
// (SmolLM2-135M: group 3, head_dim 64) over n_pos cached positions, on the
// active path's attend or (table 0) the AVX2 body it falls back to below
// its query threshold: the same-run comparison behind that threshold.
// Args: n_pos, group, table (0: AVX2 body, 1: active path), cache (0:
// fp16, 1: bf16, on AVX512_BF16's dot products where the path has them).
void BM_AttendDecodeRow(benchmark::State& state) {
  const int64_t n_pos = state.range(0);
  const int group = (int)state.range(1), d = 64;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const RandomKv kv(n_pos, d, rng, state.range(3) == 1);
  const KvLayerView& layer = kv.layer;
  const std::vector<int32_t>& table = kv.table;
  std::vector<float> q(group * d), out(group * d);
  for (auto& x : q) x = u(rng);
  std::vector<float> scratch(cpu::AttendScratch(n_pos, group, d));
  const auto& kt = state.range(2) == 0 ? cpu::kAvx2Kernels : cpu::ActiveKernels();
  if (state.range(2) == 0 && !GetCpuFeatures().avx2) {
    state.SkipWithError("no AVX2 on this CPU");
    return;
  }
  for (auto _ : state) {
    kt.attend(layer, table.data(), n_pos, 1, 0, group, q.data(), group * d, 0.125f, out.data(),
              group * d, scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_AttendDecodeRow)->ArgsProduct({{128, 512, 2048}, {1, 2, 3}, {0, 1}, {0, 1}});

// A 128-token prompt chunk's attention for one kv head and its 3 query
// heads (SmolLM2-135M: head_dim 64) after `context` cached positions, in
// the row blocks the engine's Attention takes (cpu::AttendRowsFor): what a
// conversation's later turn, or a long prompt's later chunks, cost per kv
// head and layer. Args: context, table (0: AVX2, 1: active path, 2: the
// active path's bf16 tiles, attend_bf16: AMX only).
void BM_AttendPromptChunk(benchmark::State& state) {
  const int64_t context = state.range(0), chunk = 128, n = context + chunk;
  const int group = 3, d = 64;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const RandomKv kv(n, d, rng);
  const KvLayerView& layer = kv.layer;
  const std::vector<int32_t>& table = kv.table;
  std::vector<float> q(chunk * group * d), out(q.size());
  for (auto& x : q) x = u(rng);
  const int rows_per_call = cpu::AttendRowsFor(n, group);
  std::vector<float> scratch(cpu::AttendScratch(n, rows_per_call * group, d));
  const auto& kt = state.range(1) == 0 ? cpu::kAvx2Kernels : cpu::ActiveKernels();
  if (state.range(1) == 0 && !GetCpuFeatures().avx2) {
    state.SkipWithError("no AVX2 on this CPU");
    return;
  }
  if (state.range(1) == 2 && !Bf16AttentionSupported()) {
    state.SkipWithError("no AMX-BF16 on this CPU");
    return;
  }
  const auto attend = state.range(1) == 2 ? kt.attend_bf16 : kt.attend;
  for (auto _ : state) {
    for (int64_t i = 0; i < chunk; i += rows_per_call) {
      const int rows = (int)std::min<int64_t>(rows_per_call, chunk - i);
      attend(layer, table.data(), context + i + 1, rows, 0, group, q.data() + i * group * d,
             group * d, 0.125f, out.data() + i * group * d, group * d, scratch.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  // Query-key pairs a second (each row sees its context and the chunk's
  // rows before it).
  state.counters["pairs"] =
      benchmark::Counter((double)group * (chunk * context + chunk * (chunk + 1) / 2),
                         benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_AttendPromptChunk)->ArgsProduct({{0, 512, 1408, 2944}, {0, 1, 2}});

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
  const auto t0 = Clock::now();
  for (auto _ : state) {
    GemmW8A8(ctx, pw, x.data(), m, k, y.data(), n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GOPs"] = benchmark::Counter((double)2 * m * n * k,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  if (m == 1) {
    AddFraction(state, "of_read_bw", (double)n * k, Roof().read_gbps, t0);
  } else {
    AddFraction(state, "of_int8_peak", (double)2 * m * n * k, Roof().int8_gops, t0);
  }
}

BENCHMARK(BM_GemmW8A8)
    ->Args({1, 3072, 576})
    ->Args({32, 3072, 576})
    ->Args({512, 3072, 576})
    ->Args({512, 576, 1536})
    ->UseRealTime();

// Decode rows over a cache that lives in memory, not in the caches: 120
// sequence-layers of 1,024 positions, 3 kv heads of head_dim 64 (SmolLM2-135M
// at 1,024 tokens of context for 4 sequences, 94 MB), one decode row of each
// for every kv head, one thread, on the active path. Args: block order (0: each
// sequence's blocks consecutive in the pool, 1: shuffled over the pool, 2:
// consecutive but in descending order, as blocks evicted from the prefix
// cache's LRU would come without KvCache::Reserve's sort); how (0: attend for
// each kv head on the cache's layout, where each block holds all kv heads'
// rows, so at 16 tokens a kv head's rows are 2 KB runs 6 KB apart; 1: attend_decode_heads,
// the kv heads of each block together, where the path has it; 2: attend for
// each kv head on what a head-major pool would give, each kv head's blocks on
// their own); block_tokens (16, the default, or 64: runs four times as
// long). GBps: K and V bytes read a second. The question it answers: how
// much of a decode step's attention time is the memory layout's, not the
// arithmetic's.
void BM_AttendDecodeFromMemory(benchmark::State& state) {
  constexpr int64_t kPositions = 1024, kSeqLayers = 120;
  constexpr int d = 64, kv_heads = 3, group = 3;
  const int bt = (int)state.range(2);
  const bool shuffled = state.range(0) == 1, head_major = state.range(1) == 2;
  const auto& kt = cpu::ActiveKernels();
  const bool heads_together = state.range(1) == 1;
  if (heads_together && kt.attend_decode_heads == nullptr) {
    state.SkipWithError("this path has no attend_decode_heads");
    return;
  }
  const int64_t blocks = kPositions / bt;                      // a kv head's, per sequence-layer
  const int64_t pool_blocks = blocks * kSeqLayers * kv_heads;  // bt rows of one kv head
  std::vector<fp16_t> k(pool_blocks * bt * d), v(k.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : k) x = Fp32ToFp16(u(rng));
  for (auto& x : v) x = Fp32ToFp16(u(rng));
  // Head-major: every (sequence-layer, kv head) its own table over blocks of
  // one kv head (2 KB at 16 tokens); else a table per sequence-layer over
  // blocks of 3 heads (6 KB).
  const int64_t tables = head_major ? kSeqLayers * kv_heads : kSeqLayers;
  std::vector<int32_t> ids(tables * blocks);
  for (int64_t i = 0; i < (int64_t)ids.size(); ++i) ids[i] = (int32_t)i;
  if (shuffled) std::shuffle(ids.begin(), ids.end(), rng);
  if (state.range(0) == 2) {
    for (int64_t t = 0; t < tables; ++t)
      std::reverse(ids.begin() + t * blocks, ids.begin() + (t + 1) * blocks);
  }
  const KvLayerView layer{k.data(), v.data(), head_major ? 1 : kv_heads, d, bt, false};
  std::vector<float> q(kv_heads * group * d), out(q.size());
  for (auto& x : q) x = u(rng);
  std::vector<float> scratch(cpu::AttendScratch(kPositions, kv_heads * group, d));
  for (auto _ : state) {
    for (int64_t s = 0; s < kSeqLayers; ++s) {
      if (heads_together) {
        kt.attend_decode_heads(layer, ids.data() + s * blocks, kPositions, group, q.data(), 0.125f,
                               out.data(), scratch.data(), nullptr);
        continue;
      }
      for (int h = 0; h < kv_heads; ++h) {
        const int32_t* table = ids.data() + (head_major ? s * kv_heads + h : s) * blocks;
        kt.attend(layer, table, kPositions, 1, head_major ? 0 : h, group, q.data() + h * group * d,
                  group * d, 0.125f, out.data() + h * group * d, group * d, scratch.data());
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GBps"] = benchmark::Counter(2.0 * k.size() * sizeof(fp16_t) * state.iterations(),
                                              benchmark::Counter::kIsRate);
}

BENCHMARK(BM_AttendDecodeFromMemory)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {16, 64}})
    ->Unit(benchmark::kMillisecond);

// A decode step's attention through Attention() on the pool: `rows` decode
// rows of SmolLM2-135M's shape (3 kv heads, groups of 3, head_dim 64, fp16
// cache in 16-token blocks), each over `positions`, for 30 layers, every
// sequence-layer's blocks its own (from memory, as in a step). The question
// it answers: what a long row's split into parts (kDecodeSplitPositions)
// buys with fewer rows than threads and costs with many.
void BM_AttentionDecodeStep(benchmark::State& state) {
  const int64_t rows = state.range(0), positions = state.range(1);
  constexpr int64_t kLayers = 30;
  constexpr int d = 64, kv_heads = 3, heads = 9, bt = 16;
  const int64_t blocks = (positions + bt - 1) / bt;
  std::vector<fp16_t> k(kLayers * rows * blocks * kv_heads * bt * d), v(k.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : k) x = Fp32ToFp16(u(rng));
  for (auto& x : v) x = Fp32ToFp16(u(rng));
  std::vector<int32_t> ids(kLayers * rows * blocks);
  for (int64_t i = 0; i < (int64_t)ids.size(); ++i) ids[i] = (int32_t)i;
  const KvLayerView layer{k.data(), v.data(), kv_heads, d, bt, false};
  std::vector<float> q(rows * heads * d), out(q.size());
  for (auto& x : q) x = u(rng);
  CpuContext ctx{&Pool()};
  std::vector<float> scratch(AttentionScratchFloats(ctx, positions, heads, d));
  std::vector<AttentionSeq> seqs(rows);
  for (auto _ : state) {
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t r = 0; r < rows; ++r) {
        seqs[r] = {ids.data() + (l * rows + r) * blocks, positions - 1, 1, q.data() + r * heads * d,
                   out.data() + r * heads * d};
      }
      Attention(ctx, layer, seqs.data(), rows, heads * d, heads, 0.125f, heads * d, scratch.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GBps"] = benchmark::Counter(2.0 * k.size() * sizeof(fp16_t) * state.iterations(),
                                              benchmark::Counter::kIsRate);
}

BENCHMARK(BM_AttentionDecodeStep)
    ->ArgsProduct({{1, 2, 4, 16}, {256, 512, 768, 1024, 2048}})
    ->Unit(benchmark::kMicrosecond);

// One fork-join round trip of the pool, as each GEMV of a one-row decode
// step makes (four a layer): Run of an empty function, which returns once
// every thread has run it, so an iteration is the publish, the workers'
// wake-up and the join alone.
void BM_ThreadPoolHandOff(benchmark::State& state) {
  for (auto _ : state) Pool().Run([](int) {});
}

BENCHMARK(BM_ThreadPoolHandOff)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pdq

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  pdq::Rooflines& r = pdq::Roof();
  r.read_gbps = pdq::MeasureReadBandwidthGBps(pdq::Pool());
  r.fma_gflops = pdq::MeasureFmaPeakGflops(pdq::Pool());
  r.int16_gops = pdq::MeasureIntPeakGops(pdq::Pool(), /*int8=*/false);
  r.int8_gops = pdq::MeasureIntPeakGops(pdq::Pool(), /*int8=*/true);
  // The integer peaks probe the instructions of the dispatched path: vpmaddwd
  // and vpmaddubsw (AVX2), vpdpwssd and vpdpbusd (AVX-VNNI, AVX-512), AMX
  // tdpbssd for int8 on "avx512+amx".
  const std::string isa = pdq::KernelIsaName();
  const bool avx512 = isa.rfind("avx512", 0) == 0;
  std::printf(
      "rooflines, %d threads, %s kernels: read %.1f GB/s, fp32 FMA %.1f GFLOP/s, "
      "int16 %s %.1f GOP/s, int8 %s %.1f GOP/s\n",
      pdq::Pool().size(), isa.c_str(), r.read_gbps, r.fma_gflops,
      avx512 || isa == "avx2+vnni" ? "vpdpwssd" : "vpmaddwd", r.int16_gops,
      isa == "avx512+amx"            ? "AMX tdpbssd"
      : avx512 || isa == "avx2+vnni" ? "vpdpbusd"
                                     : "vpmaddubsw",
      r.int8_gops);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
