// Every fast kernel path against the scalar reference on fresh random inputs,
// odd sizes included, plus the thread pool and the public entry points.
#include "kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"

namespace pdq {
namespace {

using cpu::KernelTable;

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The vectorized tables this CPU can run. Tests comparing them with the
// reference skip (rather than pass vacuously) when there are none.
std::vector<const KernelTable*> FastTables() {
  std::vector<const KernelTable*> tables;
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx2) tables.push_back(&cpu::kAvx2Kernels);
  if (f.avx2 && f.avxvnni) tables.push_back(&cpu::AvxVnniKernels());
  if (f.avx2 && f.avx512_kernels()) tables.push_back(&cpu::kAvx512Kernels);
  if (f.avx2 && f.amx_kernels()) tables.push_back(&cpu::kAvx512AmxKernels);
  return tables;
}
// Why a path's kernels are not here, for skip messages: the CPU flags it
// lacks, as PDQ_ISA (when set) leaves them.
std::string WhyNot(const char* path) {
  std::string why = "CPU lacks " + MissingCpuFlags(path);
  if (const char* forced = std::getenv("PDQ_ISA")) why += std::string(" with PDQ_ISA=") + forced;
  return why;
}

#define SKIP_WITHOUT_FAST_PATHS()                                                       \
  if (FastTables().empty()) GTEST_SKIP() << "no vectorized kernels on this CPU (or PDQ_ISA=scalar)"


struct PackedMatrix {
  std::vector<fp16_t> data;
  PackedF16 view;
};

PackedMatrix Pack(const std::vector<float>& w, int64_t n, int64_t k) {
  PackedMatrix p;
  p.data.assign(PackedF16Elements(n, k), 0);
  PackF16Rows(w.data(), 0, n, k, p.data.data());
  p.view = {p.data.data(), n, k};
  return p;
}

TEST(ThreadPoolTest, RunsEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  for (int round = 0; round < 200; ++round) {
    pool.Run([&](int t) { hits[t].fetch_add(1); });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 200);
}

// A nested call, or a second caller, would corrupt the job in flight; the
// pool refuses loudly instead.
TEST(ThreadPoolDeathTest, ReentryAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        pool.Run([&](int t) {
          if (t == 0) pool.ParallelForEach(4, [](int64_t, int) {});
        });
      },
      "ThreadPool used by two callers at once, or from inside one of its own jobs");
}

TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnceWithAlignment) {
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 16, 17, 1000}) {
    std::vector<int> seen(n, 0);
    pool.ParallelFor(n, 4, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 4, 0);
      for (int64_t i = b; i < e; ++i) ++seen[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "n=" << n << " i=" << i;
  }
}

// Each thread runs its own share of the range first and in order, then what
// is left of the others' shares, each in order: what keeps a decode GEMV's
// weights one stream per thread. Shares here: 3 threads, 1200 indices, four
// chunks of 100 a thread.
TEST(ThreadPoolTest, ParallelForRunsEachThreadsOwnShareFirstAndInOrder) {
  ThreadPool pool(3);
  for (int round = 0; round < 300; ++round) {
    std::vector<std::vector<int64_t>> begins(3);  // each thread's chunks, as it ran them
    std::vector<int> seen(1200, 0);
    pool.ParallelFor(1200, 1, [&](int64_t b, int64_t e, int t) {
      ASSERT_EQ(e - b, 100);
      begins[t].push_back(b);
      for (int64_t i = b; i < e; ++i) ++seen[i];
      // Long enough that the workers take part.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
    for (int i = 0; i < 1200; ++i) ASSERT_EQ(seen[i], 1) << "round " << round << " i " << i;
    for (int t = 0; t < 3; ++t) {
      // (share - t) mod 3 never falls, and within a share begins rise.
      int64_t last_turn = -1, last_begin = -1;
      for (int64_t b : begins[t]) {
        const int64_t turn = (b / 400 - t + 3) % 3;
        ASSERT_GE(turn, last_turn) << "round " << round << ", thread " << t << " at " << b;
        if (turn == last_turn) {
          ASSERT_GT(b, last_begin) << "round " << round << ", thread " << t;
        }
        last_turn = turn;
        last_begin = b;
      }
    }
  }
}

// Many short regions of every kind, back to back, with more threads than
// cores: every index exactly once, and no thread index used by two chunks
// at the same time (kernels key per-thread scratch on it).
TEST(ThreadPoolTest, BackToBackRegionsStayExactUnderOversubscription) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> in_use(4);
  std::atomic<int> overlaps{0};
  auto enter = [&](int t) {
    if (in_use[t].fetch_add(1) != 0) overlaps.fetch_add(1);
  };
  auto leave = [&](int t) { in_use[t].fetch_sub(1); };
  for (int round = 0; round < 3000; ++round) {
    const int64_t n = 1 + round % 37;
    std::vector<std::atomic<int>> seen(n);
    if (round % 3 == 0) {
      pool.ParallelFor(n, 1, [&](int64_t b, int64_t e, int t) {
        enter(t);
        for (int64_t i = b; i < e; ++i) seen[i].fetch_add(1);
        leave(t);
      });
    } else if (round % 3 == 1) {
      pool.ParallelForEach(n, [&](int64_t i, int t) {
        enter(t);
        seen[i].fetch_add(1);
        leave(t);
      });
    } else {
      std::vector<std::atomic<int>> ran(4);
      pool.Run([&](int t) { ran[t].fetch_add(1); });
      for (auto& r : ran) ASSERT_EQ(r.load(), 1) << "round " << round;
      for (auto& v : seen) v.store(1);
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "round " << round << " i " << i;
  }
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(KernelsTest, PackF16RowsRoundTripsThroughReference) {
  std::mt19937 rng(1);
  const int64_t n = 19, k = 7;
  auto w = Random(n * k, rng);
  auto packed = Pack(w, n, k);
  std::vector<float> x(k, 0.0f), y(n);
  for (int64_t kk = 0; kk < k; ++kk) {
    std::fill(x.begin(), x.end(), 0.0f);
    x[kk] = 1.0f;
    cpu::kScalarKernels.gemm_f16_panels(packed.view, 0, 2, x.data(), 1, k, y.data(), n);
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(y[j], Fp16ToFp32(Fp32ToFp16(w[j * k + kk])));
  }
}

TEST(KernelsTest, GemmF16MatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(2);
  for (const KernelTable* kt : FastTables()) {
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 97, 200}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 8}, {35, 77}, {64, 576}, {48, 600}}) {
        auto w = Random(n * k, rng);
        auto x = Random(m * k, rng);
        auto packed = Pack(w, n, k);
        const int64_t panels = (n + 15) / 16;
        std::vector<float> want(m * n), got(m * n, -1.0f);
        cpu::kScalarKernels.gemm_f16_panels(packed.view, 0, panels, x.data(), m, k, want.data(), n);
        kt->gemm_f16_panels(packed.view, 0, panels, x.data(), m, k, got.data(), n);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-4f * std::sqrt((float)k) * (1 + std::abs(want[i])))
              << kt->name << " m=" << m << " n=" << n << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

// A row's FP16 outputs are the same bits whether its batch of 2-4 rows
// takes the direct panel path or more take the blocked GEMM: both sum each
// output over k in order on one chain.
TEST(KernelsTest, GemmF16RowsAreTheSameBitsOnEitherPath) {
  SKIP_WITHOUT_FAST_PATHS();
  // Direct panels (2-4 rows), streamed panel pairs (AVX-512: 5-32 rows, an
  // odd panel last, a partial one) and the blocked GEMM (more).
  std::mt19937 rng(5);
  const int64_t k = 600, most = 40;
  for (int64_t n : {48, 40}) {
    auto w = Random(n * k, rng);
    auto packed = Pack(w, n, k);
    auto x = Random(most * k, rng);
    for (const KernelTable* kt : FastTables()) {
      std::vector<float> blocked(most * n);
      kt->gemm_f16_panels(packed.view, 0, 3, x.data(), most, k, blocked.data(), n);
      for (int64_t m : {2, 5, 8, 9, 16, 24, 32, 33}) {
        std::vector<float> direct(m * n);
        kt->gemm_f16_panels(packed.view, 0, 3, x.data(), m, k, direct.data(), n);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_EQ(direct[i], blocked[i]) << kt->name << " n=" << n << " m=" << m << " i=" << i;
        }
      }
    }
  }
}

TEST(KernelsTest, GemmF16ThreadedEqualsSingleThreaded) {
  std::mt19937 rng(3);
  const int64_t m = 9, n = 200, k = 64;
  auto w = Random(n * k, rng), x = Random(m * k, rng);
  auto packed = Pack(w, n, k);
  std::vector<float> a(m * n), b(m * n);
  ThreadPool pool(2);
  GemmF16(CpuContext{}, packed.view, x.data(), m, k, a.data(), n);
  GemmF16(CpuContext{&pool}, packed.view, x.data(), m, k, b.data(), n);
  EXPECT_EQ(a, b);
}

TEST(KernelsTest, RmsNormSiluAndGeluMatchReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(4);
  for (const KernelTable* kt : FastTables()) {
    for (int64_t d : {1, 7, 8, 576, 1001}) {
      auto x = Random(d, rng, 3.0f), w = Random(d, rng), up = Random(d, rng);
      std::vector<float> want(d), got(d);
      cpu::kScalarKernels.rms_norm_row(x.data(), w.data(), d, 1e-5f, want.data());
      kt->rms_norm_row(x.data(), w.data(), d, 1e-5f, got.data());
      for (int64_t i = 0; i < d; ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i])));
      x[0] = -100.0f;  // saturating tail of the exponential
      cpu::kScalarKernels.silu_mul_row(x.data(), up.data(), d, want.data());
      kt->silu_mul_row(x.data(), up.data(), d, got.data());
      for (int64_t i = 0; i < d; ++i) ASSERT_NEAR(got[i], want[i], 2e-6f * (1 + std::abs(want[i])));
      if (d > 1) x[1] = 100.0f;
      cpu::kScalarKernels.gelu_mul_row(x.data(), up.data(), d, want.data());
      kt->gelu_mul_row(x.data(), up.data(), d, got.data());
      for (int64_t i = 0; i < d; ++i) ASSERT_NEAR(got[i], want[i], 2e-6f * (1 + std::abs(want[i])));
    }
  }
}

TEST(KernelsTest, ArgmaxRowMatchesReferenceOnTiesInfinitiesAndNans) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (const KernelTable* kt : FastTables()) {
    for (int64_t n : {1, 5, 8, 15, 16, 17, 33, 1000, 49152}) {
      for (int trial = 0; trial < 6; ++trial) {
        auto x = Random(n, rng);
        // Ties: the maximum again at a later index (in another lane, and in
        // the same lane), which must not win.
        const int64_t first = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
        x[first] = 9.0f;
        for (int64_t later : {first + 3, first + 16, first + 35}) {
          if (later < n && trial % 2 == 1) x[later] = 9.0f;
        }
        if (trial == 2) x[std::uniform_int_distribution<int64_t>(0, n - 1)(rng)] = nan;
        if (trial == 3) x[0] = nan;
        if (trial == 4) std::fill(x.begin(), x.end(), -inf);
        if (trial == 5) std::fill(x.begin(), x.end(), nan);
        const int64_t want = cpu::kScalarKernels.argmax_row(x.data(), n);
        ASSERT_EQ(kt->argmax_row(x.data(), n), want)
            << kt->name << " n=" << n << " trial " << trial;
        if (trial < 4 && x[first] == 9.0f) {
          ASSERT_EQ(want, first) << "n=" << n << " trial " << trial;
        }
      }
    }
  }
}

TEST(KernelsTest, ExpRowMatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(6);
  for (const KernelTable* kt : FastTables()) {
    for (int64_t n : {1, 7, 8, 16, 17, 1001, 49152}) {
      auto x = Random(n, rng, 8.0f);
      x[0] = -200.0f;  // underflows to 0
      const float max = *std::max_element(x.begin(), x.end());
      for (float scale : {1.0f, 1.0f / 0.7f, 10.0f}) {
        std::vector<float> want(n), got(n);
        const float want_sum = cpu::kScalarKernels.exp_row(x.data(), n, max, scale, want.data());
        const float got_sum = kt->exp_row(x.data(), n, max, scale, got.data());
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(got[i], want[i], 4e-7f * want[i] + 1e-37f) << kt->name;
        if (n > 1) {
          EXPECT_EQ(got[0], 0.0f);
        }
        EXPECT_NEAR(got_sum, want_sum, 1e-5f * want_sum) << kt->name << " n=" << n;
      }
    }
  }
}

TEST(KernelsTest, GeluIsTheTanhApproximation) {
  // gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), evaluated
  // in double precision for these points.
  const float g[] = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  const float want[] = {-0.0036373921f, -0.1588080094f, 0.0f,
                        0.3457140098f,  0.8411919906f,  1.9545976941f};
  const float up[] = {1, 1, 1, 1, 1, 2};
  float got[6];
  cpu::kScalarKernels.gelu_mul_row(g, up, 6, got);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[i], want[i] * up[i], 1e-6f) << g[i];
}

TEST(KernelsTest, ToF16MatchesScalarRoundingExactly) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(5);
  for (const KernelTable* kt : FastTables()) {
    auto x = Random(1003, rng, 100.0f);
    x[0] = 70000.0f;  // overflow to inf
    x[1] = 1e-7f;     // subnormal half
    x[2] = -0.0f;
    std::vector<fp16_t> want(x.size()), got(x.size());
    cpu::kScalarKernels.to_f16(x.data(), x.size(), want.data());
    kt->to_f16(x.data(), x.size(), got.data());
    EXPECT_EQ(got, want);
  }
}

TEST(KernelsTest, HalfConversionRoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32((fp16_t)h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), h) << std::hex << h;
  }
  EXPECT_EQ(Fp16ToFp32(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);
}

// A paged layer with a scrambled block table, so logical order != storage:
// blocks of `bt` tokens (the content depends only on rng, not on bt).
struct PagedLayer {
  std::vector<fp16_t> k, v;
  std::vector<int32_t> table;
  KvLayerView view;
};

PagedLayer MakeLayer(int kv_heads, int head_dim, int64_t positions, std::mt19937& rng,
                     bool bf16 = false, int bt = 16) {
  PagedLayer l;
  const int64_t blocks = (positions + bt - 1) / bt + 3;
  // A stride coprime with the storage's blocks, so no two logical blocks share one.
  int64_t step = 7;
  while (std::gcd(step, blocks) != 1) step += 2;
  // Slots past the written positions hold NaN (a block's free slots hold
  // whatever was there): no kernel may let them into a result.
  const fp16_t nan = bf16 ? 0x7fc0 : 0x7e00;
  l.k.assign(blocks * kv_heads * bt * head_dim, nan);
  l.v.assign(l.k.size(), nan);
  l.view = {l.k.data(), l.v.data(), kv_heads, head_dim, bt, bf16};
  for (int64_t b = 0; b < blocks - 3; ++b) l.table.push_back((int32_t)((b * step + 2) % blocks));
  auto k = Random(positions * kv_heads * head_dim, rng);
  auto v = Random(positions * kv_heads * head_dim, rng);
  std::vector<int32_t> pos(positions);
  for (int64_t i = 0; i < positions; ++i) pos[i] = (int32_t)i;
  KvWrite(l.view, l.table.data(), pos.data(), positions, k.data(), kv_heads * head_dim, v.data(),
          kv_heads * head_dim);
  return l;
}

// For an fp16 and a bf16 cache (the reference reads either exactly). The
// fp32 kernels match it to fp32 rounding; on a bf16 cache the AVX-512
// tables' decode rows of 3 or 4 queries (head_dim 32 or 64) run on
// AVX512_BF16's dot products where the CPU has them, which round the
// queries and the softmax weights to bf16 (2^-9 relative): their outputs
// (weighted means of N(0, 1) values) within 0.03 of it.
TEST(KernelsTest, AttendMatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(6);
  for (const KernelTable* kt : FastTables()) {
    for (bool bf16 : {false, true}) {
      const bool dot_products =
          bf16 && GetCpuFeatures().avx512bf16 && std::string(kt->name).rfind("avx512", 0) == 0;
      // 16 to 128 by 16 reach every P V register count of the AVX-512 kernel.
      for (int head_dim : {8, 16, 24, 32, 48, 64, 96, 128}) {
        // rows * group from 1 to 64: the AVX-512 path runs a decode row of 3
        // or 4 queries (head_dim up to 64) on its decode kernel, transposes K
        // blocks for the other calls of 3 queries or more, and hands fewer to
        // the AVX2 kernel.
        for (int group : {1, 3, 4, 8}) {
          for (int rows : {1, 2, 3, 4, 8}) {
            for (int64_t n_pos : {1, 7, 15, 16, 17, 100}) {
              const int64_t n_max = n_pos + rows - 1;
              auto layer = MakeLayer(2, head_dim, n_max, rng, bf16);
              // Rows padded apart, as the model's q/out rows are.
              const int64_t stride = group * head_dim + 5;
              auto q = Random(rows * stride, rng);
              std::vector<float> want(rows * stride, 0.0f), got(rows * stride, 0.0f);
              std::vector<float> scratch(cpu::AttendScratch(n_max, rows * group, head_dim));
              const float scale = 1.0f / std::sqrt((float)head_dim);
              cpu::kScalarKernels.attend(layer.view, layer.table.data(), n_pos, rows, 1, group,
                                         q.data(), stride, scale, want.data(), stride,
                                         scratch.data());
              kt->attend(layer.view, layer.table.data(), n_pos, rows, 1, group, q.data(), stride,
                         scale, got.data(), stride, scratch.data());
              const bool rounded = dot_products && rows == 1 && (group == 3 || group == 4) &&
                                   (head_dim == 32 || head_dim == 64);
              for (int64_t i = 0; i < rows * stride; ++i) {
                ASSERT_NEAR(got[i], want[i], rounded ? 0.03f : 1e-4f)
                    << kt->name << (bf16 ? " bf16" : " fp16") << " d=" << head_dim
                    << " group=" << group << " rows=" << rows << " n=" << n_pos;
              }
            }
          }
        }
      }
    }
  }
}

// attend_decode_heads (a decode row for every kv head, the kv heads' rows
// of each block read together): bit for bit what attend gives for each kv
// head in turn, on both caches, for the shapes its own kernels take (AVX-512:
// groups of 3 and 4, head_dim 16 to 64; AVX2: up to 16 queries a row) and
// those they hand to attend; and every output written (out starts as NaN).
TEST(KernelsTest, AttendDecodeHeadsMatchesAttendPerKvHead) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(26);
  int tables = 0;
  for (const KernelTable* kt : FastTables()) {
    if (kt->attend_decode_heads == nullptr) continue;
    ++tables;
    for (bool bf16 : {false, true}) {
      for (int kv_heads : {1, 2, 3, 4}) {
        for (int head_dim : {16, 32, 48, 64, 96}) {
          for (int group : {1, 3, 4, 8}) {
            for (int64_t n_pos : {1, 7, 16, 17, 100, 333}) {
              auto layer = MakeLayer(kv_heads, head_dim, n_pos, rng, bf16);
              const int64_t row = (int64_t)group * head_dim, width = kv_heads * row;
              auto q = Random(width, rng);
              std::vector<float> want(width), got(width, NAN);
              const int heads = kv_heads * group;
              std::vector<float> scratch(cpu::AttendScratch(n_pos, heads, head_dim));
              const float scale = 1.0f / std::sqrt((float)head_dim);
              for (int h = 0; h < kv_heads; ++h) {
                kt->attend(layer.view, layer.table.data(), n_pos, 1, h, group, q.data() + h * row,
                           row, scale, want.data() + h * row, row, scratch.data());
              }
              kt->attend_decode_heads(layer.view, layer.table.data(), n_pos, group, q.data(), scale,
                                      got.data(), scratch.data(), nullptr);
              for (int64_t i = 0; i < width; ++i) {
                ASSERT_EQ(got[i], want[i])
                    << kt->name << (bf16 ? " bf16" : " fp16") << " kv_heads=" << kv_heads
                    << " d=" << head_dim << " group=" << group << " n=" << n_pos << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
  if (tables == 0) GTEST_SKIP() << "no path here has attend_decode_heads (AVX2 or AVX-512)";
}

// Element e of kv head h's row at position j, as the cache holds it.
float CachedKv(const PagedLayer& l, const std::vector<fp16_t>& base, int64_t j, int h, int e) {
  const KvLayerView& v = l.view;
  const int64_t off =
      ((l.table[j / v.block_tokens] * v.kv_heads + h) * v.block_tokens + j % v.block_tokens) *
          v.head_dim +
      e;
  return v.bf16 ? cpu::Bf16ToFp32(base[off]) : Fp16ToFp32(base[off]);
}

// attend_decode_heads' log-sum-exp, where attend_decode_heads_lse says it
// writes one: asking for it changes no output bit; it is each query's
// log-sum-exp of its scores (a double recomputation from the cache); and
// the outputs of a row's positions taken in parts at block boundaries (the
// block table advanced, as Attention splits a long row), weighted by
// exp(lse), are the whole row's. Tolerances: fp32 rounding, or on a bf16
// cache with AVX512_BF16 the 0.03 of AttendMatchesReference.
TEST(KernelsTest, AttendDecodeHeadsLogSumExpJoinsParts) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(31);
  int covered = 0;
  for (const KernelTable* kt : FastTables()) {
    if (kt->attend_decode_heads_lse == nullptr) continue;
    for (bool bf16 : {false, true}) {
      for (int kv_heads : {1, 3, 4}) {
        for (int head_dim : {32, 64}) {
          for (int group : {3, 4}) {
            for (int64_t n_pos : {100, 333, 1040}) {
              auto layer = MakeLayer(kv_heads, head_dim, n_pos, rng, bf16);
              if (!kt->attend_decode_heads_lse(layer.view, group)) continue;
              ++covered;
              SCOPED_TRACE(std::string(kt->name) + (bf16 ? " bf16" : " fp16") + " kv_heads=" +
                           std::to_string(kv_heads) + " d=" + std::to_string(head_dim) +
                           " group=" + std::to_string(group) + " n=" + std::to_string(n_pos));
              const int nq = kv_heads * group;
              const int64_t width = (int64_t)nq * head_dim;
              const float scale = 1.0f / std::sqrt((float)head_dim);
              const float tol = bf16 ? 0.03f : 2e-5f;
              auto q = Random(width, rng);
              std::vector<float> scratch(cpu::AttendScratch(n_pos, nq, head_dim));
              std::vector<float> plain(width, NAN), whole(width, NAN), lse(nq, NAN);
              kt->attend_decode_heads(layer.view, layer.table.data(), n_pos, group, q.data(), scale,
                                      plain.data(), scratch.data(), nullptr);
              kt->attend_decode_heads(layer.view, layer.table.data(), n_pos, group, q.data(), scale,
                                      whole.data(), scratch.data(), lse.data());
              ASSERT_EQ(plain, whole);
              for (int r = 0; r < nq; ++r) {
                std::vector<double> sc(n_pos);
                double top = -1e300, sum = 0;
                for (int64_t j = 0; j < n_pos; ++j) {
                  double dot = 0;
                  for (int e = 0; e < head_dim; ++e)
                    dot += (double)q[r * head_dim + e] * CachedKv(layer, layer.k, j, r / group, e);
                  top = std::max(top, sc[j] = dot * scale);
                }
                for (double x : sc) sum += std::exp(x - top);
                EXPECT_NEAR(lse[r], top + std::log(sum), bf16 ? 0.03 : 1e-4) << "query " << r;
              }
              // Two and three parts at block boundaries.
              for (int parts : {2, 3}) {
                const int64_t blocks = (n_pos + 15) / 16;
                std::vector<std::vector<float>> outs(parts, std::vector<float>(width, NAN));
                std::vector<std::vector<float>> lses(parts, std::vector<float>(nq, NAN));
                for (int i = 0; i < parts; ++i) {
                  const int64_t b0 = blocks * i / parts, b1 = blocks * (i + 1) / parts;
                  const int64_t len = std::min(n_pos, b1 * 16) - b0 * 16;
                  kt->attend_decode_heads(layer.view, layer.table.data() + b0, len, group, q.data(),
                                          scale, outs[i].data(), scratch.data(), lses[i].data());
                }
                for (int r = 0; r < nq; ++r) {
                  double top = -1e300, sum = 0;
                  for (int i = 0; i < parts; ++i) top = std::max(top, (double)lses[i][r]);
                  for (int i = 0; i < parts; ++i) sum += std::exp(lses[i][r] - top);
                  EXPECT_NEAR(lse[r], top + std::log(sum), bf16 ? 0.03 : 1e-4) << "query " << r;
                  for (int e = 0; e < head_dim; ++e) {
                    double o = 0;
                    for (int i = 0; i < parts; ++i)
                      o += std::exp(lses[i][r] - top) / sum * outs[i][r * head_dim + e];
                    ASSERT_NEAR(o, whole[r * head_dim + e], tol)
                        << parts << " parts, query " << r << " e=" << e;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  if (covered == 0) GTEST_SKIP() << "no path here writes attend_decode_heads' log-sum-exp";
}

// Blocks of 32, 48 or 64 tokens change where the vector kernels find a
// chunk of 16 positions, nothing else: attend and attend_decode_heads give
// bit for bit what they give on 16-token blocks of the same rows (the
// scalar reference, which other sizes took until 2026-12-05, differs in the
// last bits), hence within AttendMatchesReference's bounds of it. A size
// that is not a multiple of 16 still takes the reference.
TEST(KernelsTest, AttentionOnLargerBlocksIsTheSameArithmetic) {
  SKIP_WITHOUT_FAST_PATHS();
  int compared = 0, differing_from_reference = 0;
  for (const KernelTable* kt : FastTables()) {
    for (bool bf16 : {false, true}) {
      for (int head_dim : {32, 64, 96}) {
        for (int group : {1, 3, 4, 8}) {
          for (int rows : {1, 3}) {
            for (int64_t n_pos : {1, 17, 100, 333}) {
              const int64_t n_max = n_pos + rows - 1;
              const int64_t stride = group * head_dim + 5;
              std::mt19937 rng(n_pos * 131 + head_dim * 7 + group);
              // (Also the two kv heads' query rows of attend_decode_heads.)
              auto q = Random(std::max<int64_t>(rows * stride, 2 * group * head_dim), rng);
              const std::mt19937 content = rng;
              const float scale = 1.0f / std::sqrt((float)head_dim);
              std::vector<float> scratch(cpu::AttendScratch(n_max, 2 * rows * group, head_dim));
              auto attend = [&](const KernelTable& table, int bt) {
                std::mt19937 r = content;
                auto layer = MakeLayer(2, head_dim, n_max, r, bf16, bt);
                std::vector<float> out(rows * stride, 0.0f);
                table.attend(layer.view, layer.table.data(), n_pos, rows, 1, group, q.data(),
                             stride, scale, out.data(), stride, scratch.data());
                return out;
              };
              const std::vector<float> want = attend(*kt, 16);
              const std::vector<float> reference = attend(cpu::kScalarKernels, 16);
              differing_from_reference += want != reference;
              for (int bt : {32, 48, 64}) {
                const std::vector<float> got = attend(*kt, bt);
                for (int64_t i = 0; i < rows * stride; ++i) {
                  ASSERT_EQ(got[i], want[i])
                      << kt->name << (bf16 ? " bf16" : " fp16") << " block_tokens=" << bt
                      << " d=" << head_dim << " group=" << group << " rows=" << rows
                      << " n=" << n_pos << " i=" << i;
                }
                ++compared;
              }
              // Not a multiple of 16: the reference's numbers exactly.
              EXPECT_EQ(attend(*kt, 24), attend(cpu::kScalarKernels, 24)) << kt->name;
              if (kt->attend_decode_heads == nullptr || rows != 1) continue;
              auto heads = [&](int bt) {
                std::mt19937 r = content;
                auto layer = MakeLayer(2, head_dim, n_pos, r, bf16, bt);
                std::vector<float> out(2 * group * head_dim, NAN);
                kt->attend_decode_heads(layer.view, layer.table.data(), n_pos, group, q.data(),
                                        scale, out.data(), scratch.data(), nullptr);
                return out;
              };
              const std::vector<float> heads16 = heads(16);
              for (int bt : {32, 48, 64}) {
                const std::vector<float> got = heads(bt);
                for (size_t i = 0; i < got.size(); ++i) {
                  ASSERT_EQ(got[i], heads16[i])
                      << kt->name << (bf16 ? " bf16" : " fp16") << " heads, block_tokens=" << bt
                      << " d=" << head_dim << " group=" << group << " n=" << n_pos << " i=" << i;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 0);
  // Were larger blocks still on the reference, they could not match the
  // vector kernels wherever those differ from it.
  EXPECT_GT(differing_from_reference, 0);
}

// Prompt attention on AMX-BF16 tiles (attend_bf16): within the rounding of
// the softmax weights and V to bf16 (about 2^-8 of the largest |v|) of
// attention computed in double (Q and K are split in two bf16 parts each,
// so scores keep about 16 bits; a bf16 cache's K and V go in exactly); and
// each query's output bit for bit the same whatever rows share its call.
// On an fp16 cache and a bf16 one.
TEST(KernelsTest, Bf16PromptAttentionMatchesABf16Reference) {
  if (!Bf16AttentionSupported()) {
    GTEST_SKIP() << "no AMX-BF16 on this CPU (amx_bf16 with the OS's tile permission)";
  }
  const auto attend = cpu::ActiveKernels().attend_bf16;
  std::mt19937 rng(16);
  const int d = 64;
  for (bool bf16_cache : {false, true}) {
    for (int group : {1, 3, 4, 8}) {
      for (int rows : {1, 2, 3, 5, 8, 16}) {
        if (rows * group > 64) continue;
        for (int64_t n_pos : {1, 15, 16, 17, 100, 700}) {
          const int64_t n_max = n_pos + rows - 1;
          auto layer = MakeLayer(2, d, n_max, rng, bf16_cache);
          const int64_t stride = group * d + 5;
          auto q = Random(rows * stride, rng);
          for (float& x : q) x *= 4;  // scores of a few units: a softmax with peaks
          // A few large components, as trained models have: one bf16 part of
          // Q alone would move such scores by tenths.
          for (int r = 0; r < rows; ++r) {
            for (int g = 0; g < group; ++g) q[r * stride + g * d] *= 16;
          }
          std::vector<float> got(rows * stride, 0.0f);
          std::vector<float> scratch(cpu::AttendScratch(n_max, rows * group, d));
          const float scale = 0.125f;
          attend(layer.view, layer.table.data(), n_pos, rows, 1, group, q.data(), stride, scale,
                 got.data(), stride, scratch.data());
          auto kv_at = [&](const std::vector<fp16_t>& base, int64_t j, int i) {
            const int64_t block = layer.table[j / 16];
            const uint16_t x = base[((block * 2 + 1) * 16 + j % 16) * d + i];
            return bf16_cache ? cpu::Bf16ToFp32(x) : Fp16ToFp32(x);
          };
          for (int r = 0; r < rows; ++r) {
            for (int g = 0; g < group; ++g) {
              const float* qh = q.data() + r * stride + g * d;
              const int64_t n = n_pos + r;
              std::vector<double> sc(n);
              double mx = -1e300;
              for (int64_t j = 0; j < n; ++j) {
                double s = 0;
                for (int i = 0; i < d; ++i) s += (double)(qh[i] * scale) * kv_at(layer.k, j, i);
                sc[j] = s;
                mx = std::max(mx, s);
              }
              double sum = 0;
              std::vector<double> p(n);
              for (int64_t j = 0; j < n; ++j) {
                p[j] = std::exp(sc[j] - mx);
                sum += p[j];
              }
              for (int i = 0; i < d; ++i) {
                double o = 0, vmax = 0;
                for (int64_t j = 0; j < n; ++j) {
                  o += p[j] * kv_at(layer.v, j, i);
                  vmax = std::max(vmax, (double)std::fabs(kv_at(layer.v, j, i)));
                }
                // The weights' rounding (2^-9 each) and V's (2^-9): at most
                // about 2^-8 of the largest |v| the query averages.
                // (A bf16 cache's V goes in exactly: only the weights' rounding.)
                const double bound = (bf16_cache ? 0.75 : 1.5) * vmax / 256 + 1e-6;
                ASSERT_NEAR(got[r * stride + g * d + i], o / sum, bound)
                    << (bf16_cache ? "bf16" : "fp16") << " cache, group=" << group
                    << " rows=" << rows << " n=" << n_pos << " row " << r << " head " << g
                    << " output " << i;
              }
            }
          }
          // The same rows two at a time (a prompt chunked otherwise): the
          // same bits.
          if (rows % 2 == 0) {
            std::vector<float> pairs(rows * stride, 0.0f);
            for (int r = 0; r < rows; r += 2) {
              attend(layer.view, layer.table.data(), n_pos + r, 2, 1, group, q.data() + r * stride,
                     stride, scale, pairs.data() + r * stride, stride, scratch.data());
            }
            for (int r = 0; r < rows; ++r) {
              for (int i = 0; i < group * d; ++i) {
                ASSERT_EQ(pairs[r * stride + i], got[r * stride + i])
                    << (bf16_cache ? "bf16" : "fp16") << " cache, group=" << group
                    << " rows=" << rows << " n=" << n_pos << " row " << r;
              }
            }
          }
        }
      }
    }
  }
}

// The full public Attention (GQA, causal, threaded) against a dense
// recomputation written independently of the paged layout.
TEST(KernelsTest, CausalGqaAttentionMatchesDenseComputation) {
  std::mt19937 rng(7);
  const int heads = 6, kv_heads = 2, d = 16;
  const int64_t first = 5, m = 20, total = first + m;
  PagedLayer l;
  const int64_t blocks = 4;
  l.k.assign(blocks * kv_heads * 16 * d, 0);
  l.v.assign(l.k.size(), 0);
  l.view = {l.k.data(), l.v.data(), kv_heads, d, 16};
  l.table = {3, 0};
  auto k = Random(total * kv_heads * d, rng), v = Random(total * kv_heads * d, rng);
  std::vector<int32_t> pos(total);
  for (int64_t i = 0; i < total; ++i) pos[i] = (int32_t)i;
  KvWrite(l.view, l.table.data(), pos.data(), total, k.data(), kv_heads * d, v.data(), kv_heads * d);
  auto q = Random(m * heads * d, rng);
  ThreadPool pool(2);
  CpuContext ctx{&pool};
  std::vector<float> out(m * heads * d), scratch(AttentionScratchFloats(ctx, total, heads, d));
  Attention(ctx, l.view, l.table.data(), first, m, q.data(), heads * d, heads, 0.25f, out.data(),
            heads * d, scratch.data());
  for (int64_t i = 0; i < m; ++i) {
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      std::vector<double> s(first + i + 1);
      double mx = -1e30, sum = 0;
      for (int64_t j = 0; j <= first + i; ++j) {
        double dot = 0;
        for (int e = 0; e < d; ++e) {
          dot += q[(i * heads + h) * d + e] *
                 Fp16ToFp32(Fp32ToFp16(k[(j * kv_heads + g) * d + e]));
        }
        s[j] = dot * 0.25;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int e = 0; e < d; ++e) {
        double o = 0;
        for (int64_t j = 0; j <= first + i; ++j) {
          o += s[j] / sum * Fp16ToFp32(Fp32ToFp16(v[(j * kv_heads + g) * d + e]));
        }
        ASSERT_NEAR(out[(i * heads + h) * d + e], o, 1e-4) << "i=" << i << " h=" << h;
      }
    }
  }
}

// Sequences of `shapes` (first position, query rows) over their own blocks
// of one fp16 cache of 16-token blocks, handed out from the top (so
// interleaved), each with its written K and V rows (as given, before
// rounding) and its query rows.
struct SeqShape {
  int64_t first, m;
};
struct SeqCache {
  std::vector<fp16_t> k, v;
  KvLayerView layer;
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<float>> qs, ks, vs;
};
SeqCache MakeSeqCache(const std::vector<SeqShape>& shapes, int heads, int kv_heads, int d,
                      std::mt19937& rng) {
  const int bt = 16;
  int64_t blocks = 0;
  for (const SeqShape& s : shapes) blocks += (s.first + s.m + bt - 1) / bt;
  SeqCache c;
  c.k.resize(blocks * kv_heads * bt * d);
  c.v.resize(c.k.size());
  c.layer = {c.k.data(), c.v.data(), kv_heads, d, bt};
  int32_t next = (int32_t)blocks - 1;
  for (const SeqShape& s : shapes) {
    const int64_t n = s.first + s.m;
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (n + bt - 1) / bt; ++b) table.push_back(next--);
    c.ks.push_back(Random(n * kv_heads * d, rng));
    c.vs.push_back(Random(n * kv_heads * d, rng));
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = (int32_t)i;
    KvWrite(c.layer, table.data(), pos.data(), n, c.ks.back().data(), kv_heads * d,
            c.vs.back().data(), kv_heads * d);
    c.tables.push_back(table);
    c.qs.push_back(Random(s.m * heads * d, rng));
  }
  return c;
}

// Several sequences in one Attention call (a batched step: decode rows and
// prompt chunks of different lengths over their own blocks of one cache)
// give each sequence exactly what a call of its own gives.
TEST(KernelsTest, BatchedAttentionEqualsOneCallPerSequence) {
  std::mt19937 rng(8);
  const int heads = 6, kv_heads = 2, d = 64;
  const std::vector<SeqShape> shapes = {{40, 1}, {0, 20}, {300, 1}, {100, 7}, {15, 1}, {211, 1}};
  const SeqCache cache = MakeSeqCache(shapes, heads, kv_heads, d, rng);
  const KvLayerView& layer = cache.layer;
  const auto& tables = cache.tables;
  const auto& qs = cache.qs;
  ThreadPool pool(2);
  for (bool bf16 : {false, true}) {
    if (bf16 && !Bf16AttentionSupported()) continue;
    SCOPED_TRACE(bf16 ? "bf16 prompt attention" : "fp32 attention");
    CpuContext ctx{&pool, bf16};
    std::vector<float> scratch(AttentionScratchFloats(ctx, 320, heads, d));
    std::vector<std::vector<float>> alone, together;
    std::vector<AttentionSeq> seqs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      alone.emplace_back(shapes[i].m * heads * d, 0.0f);
      together.emplace_back(shapes[i].m * heads * d, -1.0f);
      Attention(ctx, layer, tables[i].data(), shapes[i].first, shapes[i].m, qs[i].data(), heads * d,
                heads, 0.125f, alone[i].data(), heads * d, scratch.data());
      seqs.push_back(
          {tables[i].data(), shapes[i].first, shapes[i].m, qs[i].data(), together[i].data()});
    }
    Attention(ctx, layer, seqs.data(), (int64_t)seqs.size(), heads * d, heads, 0.125f, heads * d,
              scratch.data());
    for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(alone[i], together[i]) << "sequence " << i;
  }
}

// Decode rows long enough to be split into parts (2 x 512 positions and
// more, threads taking the parts apart) among short rows and a prompt
// chunk: each sequence's numbers are the same alone on one thread, batched
// on 2 threads and batched on 3, bit for bit; and the long rows' are a
// dense double recomputation's within fp32 rounding.
TEST(KernelsTest, LongDecodeRowsInPartsAreTheSameAloneBatchedAndOnAnyThreads) {
  std::mt19937 rng(9);
  const int heads = 9, kv_heads = 3, d = 64;
  const std::vector<SeqShape> shapes = {{2099, 1}, {40, 1},   {1023, 1},
                                        {0, 20},   {1500, 1}, {1022, 1}};
  const SeqCache cache = MakeSeqCache(shapes, heads, kv_heads, d, rng);
  const KvLayerView& layer = cache.layer;
  const auto& tables = cache.tables;
  const auto &qs = cache.qs, &ks = cache.ks, &vs = cache.vs;
  auto run = [&](ThreadPool* pool, bool batched) {
    const CpuContext ctx{pool};
    std::vector<float> scratch(AttentionScratchFloats(ctx, 2100, heads, d));
    std::vector<std::vector<float>> outs;
    std::vector<AttentionSeq> seqs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      outs.emplace_back(shapes[i].m * heads * d, NAN);
      seqs.push_back(
          {tables[i].data(), shapes[i].first, shapes[i].m, qs[i].data(), outs[i].data()});
    }
    for (size_t i = 0; i < shapes.size() && !batched; ++i) {
      Attention(ctx, layer, &seqs[i], 1, heads * d, heads, 0.125f, heads * d, scratch.data());
    }
    if (batched) {
      Attention(ctx, layer, seqs.data(), (int64_t)seqs.size(), heads * d, heads, 0.125f, heads * d,
                scratch.data());
    }
    return outs;
  };
  ThreadPool two(2), three(3);
  const auto alone = run(nullptr, false);
  EXPECT_EQ(run(&two, true), alone);
  EXPECT_EQ(run(&three, true), alone);
  EXPECT_EQ(run(&two, false), alone);
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i].m != 1 || shapes[i].first + 1 < 1024) continue;
    const int64_t n = shapes[i].first + 1;
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      std::vector<double> sc(n);
      double top = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int e = 0; e < d; ++e) {
          dot += qs[i][h * d + e] * Fp16ToFp32(Fp32ToFp16(ks[i][(j * kv_heads + g) * d + e]));
        }
        top = std::max(top, sc[j] = dot * 0.125);
      }
      for (double& x : sc) sum += (x = std::exp(x - top));
      for (int e = 0; e < d; ++e) {
        double o = 0;
        for (int64_t j = 0; j < n; ++j)
          o += sc[j] / sum * Fp16ToFp32(Fp32ToFp16(vs[i][(j * kv_heads + g) * d + e]));
        ASSERT_NEAR(alone[i][h * d + e], o, 1e-5) << "sequence " << i << " h=" << h << " e=" << e;
      }
    }
  }
}

TEST(KernelsTest, RopeStylesRotateTheDocumentedPairs) {
  const int d = 4;
  std::vector<float> inv_freq = {1.0f, 0.5f};
  std::vector<int32_t> pos = {3};
  std::vector<float> a = {1, 2, 3, 4}, b = a;
  Rope(CpuContext{}, a.data(), 1, d, 1, d, pos.data(), inv_freq.data(), RopeStyle::kInterleaved);
  Rope(CpuContext{}, b.data(), 1, d, 1, d, pos.data(), inv_freq.data(), RopeStyle::kHalfSplit);
  const float c0 = std::cos(3.0f), s0 = std::sin(3.0f), c1 = std::cos(1.5f), s1 = std::sin(1.5f);
  EXPECT_NEAR(a[0], 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(a[1], 1 * s0 + 2 * c0, 1e-6);
  EXPECT_NEAR(a[2], 3 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(a[3], 3 * s1 + 4 * c1, 1e-6);
  EXPECT_NEAR(b[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(b[2], 1 * s0 + 3 * c0, 1e-6);
  EXPECT_NEAR(b[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(b[3], 2 * s1 + 4 * c1, 1e-6);
}

// A forward pass computes each row's rotations once for all its layers:
// Rope from RopeAngles' table gives Rope's numbers, bit for bit.
TEST(KernelsTest, RopeFromPrecomputedAnglesEqualsRope) {
  std::mt19937 rng(8);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const int64_t m = 37, heads = 12, d = 64, stride = heads * d + 5;
    std::vector<float> inv_freq(d / 2);
    for (int t = 0; t < d / 2; ++t) inv_freq[t] = std::pow(10000.0f, -2.0f * t / d);
    std::vector<int32_t> pos(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = (int32_t)(i * 977 % 8192);
    const std::vector<float> x = Random(m * stride, rng);
    std::vector<float> want = x, got = x, table(m * d);
    Rope(ctx, want.data(), m, stride, heads, d, pos.data(), inv_freq.data(), style);
    RopeAngles(ctx, pos.data(), m, inv_freq.data(), d, table.data());
    Rope(ctx, got.data(), m, stride, heads, d, table.data(), style);
    EXPECT_EQ(got, want);
    EXPECT_NE(got, x);
  }
}

TEST(KernelsTest, DispatchPicksTheFastestPathTheCpuHas) {
  if (std::getenv("PDQ_ISA") != nullptr) GTEST_SKIP() << "PDQ_ISA overrides dispatch";
  if (!GetCpuFeatures().avx2) GTEST_SKIP() << "CPU has no AVX2; scalar path in use";
  const std::string isa = KernelIsaName();
  EXPECT_STREQ(cpu::ActiveKernels().name, isa.c_str());
  for (const char* path : {"avx512+amx", "avx512", "avx2+vnni", "avx2"}) {
    if (MissingCpuFlags(path).empty()) {
      EXPECT_EQ(isa, path) << "the CPU has every flag " << path << " needs";
      break;
    }
  }
}

// The AVX-512 tables are tested wherever the CPU has them; elsewhere these
// say which flags are missing, so a skip is never mistaken for a pass.
TEST(KernelsTest, Avx512TablesRunHere) {
  if (!MissingCpuFlags("avx512").empty()) GTEST_SKIP() << "AVX-512 kernels not tested: " << WhyNot("avx512");
  const auto tables = FastTables();
  EXPECT_NE(std::find(tables.begin(), tables.end(), &cpu::kAvx512Kernels), tables.end());
}

TEST(KernelsTest, AvxVnniTableRunsHere) {
  if (!MissingCpuFlags("avx2+vnni").empty()) {
    GTEST_SKIP() << "AVX-VNNI kernels not tested: " << WhyNot("avx2+vnni");
  }
  const auto tables = FastTables();
  EXPECT_NE(std::find(tables.begin(), tables.end(), &cpu::AvxVnniKernels()), tables.end());
}

TEST(KernelsTest, AmxTableRunsHere) {
  if (!MissingCpuFlags("avx512+amx").empty()) {
    GTEST_SKIP() << "AMX W8A8 kernel not tested: " << WhyNot("avx512+amx");
  }
  const auto tables = FastTables();
  EXPECT_NE(std::find(tables.begin(), tables.end(), &cpu::kAvx512AmxKernels), tables.end());
}

}  // namespace
}  // namespace pdq

namespace pdq {
namespace {

struct PackedW4Matrix {
  std::vector<uint8_t> q;
  std::vector<fp16_t> scale, min;
  PackedW4 view;
};

PackedW4Matrix PackW4(const std::vector<float>& w, int64_t n, int64_t k, int group, bool sym) {
  PackedW4Matrix p;
  p.q.assign(PackedW4QBytes(n, k), 0);
  p.scale.assign(PackedW4ScaleElements(n, k, group), 0);
  p.min.assign(p.scale.size(), 0);
  QuantizeW4Rows(w.data(), 0, n, k, group, sym, p.q.data(), p.scale.data(), p.min.data());
  p.view = {p.q.data(), p.scale.data(), p.min.data(), n, k, group};
  return p;
}

// m rows of k activations quantized per `group` inputs to int16 by the
// scalar reference, as the int16 GEMMs read them: the codes (rows k apart),
// and per group the scale and scale * the sum of the codes.
struct Int16Activations {
  std::vector<int16_t> q;
  std::vector<float> scale, sum;
};
Int16Activations QuantizeInt16Rows(const std::vector<float>& x, int64_t m, int64_t k, int group) {
  const int64_t groups = (k + group - 1) / group;
  Int16Activations a{std::vector<int16_t>(m * k), std::vector<float>(m * groups),
                     std::vector<float>(m * groups)};
  for (int64_t r = 0; r < m; ++r) {
    cpu::kScalarKernels.quantize_row_i16(x.data() + r * k, k, group, a.q.data() + r * k,
                                         a.scale.data() + r * groups, a.sum.data() + r * groups);
  }
  return a;
}

// Asymmetric groups err by at most half a step; symmetric ones (8 steps one
// side of zero, 7 the other) by at most one.
TEST(W4Test, QuantizationErrorIsBoundedByTheStep) {
  std::mt19937 rng(11);
  for (bool sym : {false, true}) {
    const int64_t n = 21, k = 96;
    const int group = 32;
    auto w = Random(n * k, rng);
    auto p = PackW4(w, n, k, group, sym);
    // Read back each weight through the reference GEMM with one-hot inputs.
    std::vector<float> x(k), y(n);
    for (int64_t kk = 0; kk < k; ++kk) {
      std::fill(x.begin(), x.end(), 0.0f);
      x[kk] = 1.0f;
      cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, 2, x.data(), 1, k, y.data(), n);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t g = (j / 16 * PackedW4Groups(k, group) + kk / group) * 16 + j % 16;
        const float step = std::abs(Fp16ToFp32(p.view.scale[g]));
        ASSERT_LE(std::abs(y[j] - w[j * k + kk]), (sym ? 1.0f : 0.5f) * step * 1.01f + 1e-6f)
            << "sym=" << sym << " row " << j << " k " << kk;
      }
    }
  }
}

TEST(W4Test, ConstantGroupsAreExact) {
  const int64_t n = 16, k = 64;
  std::vector<float> w(n * k, 0.25f);
  auto p = PackW4(w, n, k, 32, false);
  std::vector<float> x(k, 1.0f), y(n);
  cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, 1, x.data(), 1, k, y.data(), n);
  for (float v : y) EXPECT_FLOAT_EQ(v, 16.0f);
}

TEST(W4Test, PackedCodesReadBackPerRowAndInput) {
  std::mt19937 rng(13);
  const int64_t n = 37, k = 70;
  const int group = 32;
  const int64_t groups = PackedW4Groups(k, group);
  std::vector<uint8_t> codes(n * k);
  for (auto& c : codes) c = (uint8_t)(rng() % 16);
  std::vector<fp16_t> scales(n * groups, Fp32ToFp16(1.0f)), mins(n * groups, Fp32ToFp16(0.0f));
  std::vector<uint8_t> q(PackedW4QBytes(n, k), 0);
  std::vector<fp16_t> s(PackedW4ScaleElements(n, k, group)), m(s.size());
  PackW4Rows(codes.data(), scales.data(), mins.data(), 0, n, k, group, q.data(), s.data(),
             m.data());
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t kk = 0; kk < k; ++kk) {
      ASSERT_EQ(PackedW4Code(q.data() + row / 16 * (k / 2) * 16, kk, row % 16),
                codes[row * k + kk])
          << "row " << row << " input " << kk;
    }
  }
}

TEST(W4Test, ActivationQuantizationMatchesReferenceExactly) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(14);
  for (const KernelTable* kt : FastTables()) {
    for (int group : {32, 64, 128}) {
      for (int64_t k : {2, 30, 64, 200, 578}) {
        auto x = Random(k, rng, 3.0f);
        x[k / 2] = 0.0f;
        const int64_t groups = PackedW4Groups(k, group);
        std::vector<int16_t> qa(k), qb(k);
        std::vector<float> sa(groups), sb(groups), ta(groups), tb(groups);
        cpu::kScalarKernels.quantize_row_i16(x.data(), k, group, qa.data(), sa.data(), ta.data());
        kt->quantize_row_i16(x.data(), k, group, qb.data(), sb.data(), tb.data());
        EXPECT_EQ(qa, qb) << kt->name << " k=" << k << " group=" << group;
        EXPECT_EQ(sa, sb);
        EXPECT_EQ(ta, tb);
        // Each value is within half a step of the input.
        for (int64_t i = 0; i < k; ++i) {
          ASSERT_LE(std::abs(qa[i] * sa[i / group] - x[i]), 0.5f * sa[i / group] + 1e-6f * std::abs(x[i]));
        }
      }
    }
  }
}

TEST(W4Test, GemmMatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(12);
  for (const KernelTable* kt : FastTables()) {
    for (int group : {32, 64, 128}) {
      // 16 and 24 rows: two tiles of 8 and of 12 on the AVX-512 path.
      for (int64_t m : {1, 2, 3, 4, 5, 9, 16, 24, 33, 100}) {
        // k = 202 ends in a group of 5 input pairs (an odd run).
        for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 64}, {35, 576}, {48, 200}, {20, 202}}) {
          auto w = Random(n * k, rng), x = Random(m * k, rng);
          auto p = PackW4(w, n, k, group, m % 2 == 0);
          const int64_t panels = (n + 15) / 16;
          // fp32 activations (the many-row path).
          std::vector<float> want(m * n), got(m * n, -1.0f);
          cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, panels, x.data(), m, k, want.data(), n);
          kt->gemm_w4_panels_f32(p.view, 0, panels, x.data(), m, k, got.data(), n);
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-4f * std::sqrt((float)k) * (1 + std::abs(want[i])))
                << kt->name << " f32 group=" << group << " m=" << m << " n=" << n << " k=" << k;
          }
          // int16 activations: both kernels read the same quantized rows.
          const Int16Activations a = QuantizeInt16Rows(x, m, k, group);
          std::vector<float> want_i(m * n), got_i(m * n, -1.0f);
          cpu::kScalarKernels.gemm_w4_panels(p.view, 0, panels, a.q.data(), a.scale.data(),
                                             a.sum.data(), m, want_i.data(), n);
          kt->gemm_w4_panels(p.view, 0, panels, a.q.data(), a.scale.data(), a.sum.data(), m,
                             got_i.data(), n);
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_NEAR(got_i[i], want_i[i], 2e-5f * std::sqrt((float)k) * (1 + std::abs(want_i[i])))
                << kt->name << " int16 group=" << group << " m=" << m << " n=" << n << " k=" << k;
            // 16-bit activations cost almost nothing against fp32 ones.
            ASSERT_NEAR(want_i[i], want[i], 2e-4f * std::sqrt((float)k) * (1 + std::abs(want[i])))
                << "int16 against fp32 activations, group=" << group << " m=" << m;
          }
        }
      }
    }
  }
}

// W4A8 (batched decode): int8 activations per weight group on the paths
// that have u8 x s8 products, against the scalar reference on the same rows.
std::vector<const KernelTable*> W4A8Tables() {
  std::vector<const KernelTable*> tables;
  for (const KernelTable* kt : FastTables()) {
    if (kt->gemm_w4a8_panels != nullptr) tables.push_back(kt);
  }
  return tables;
}

TEST(W4A8Test, ActivationQuantizationMatchesReferenceExactly) {
  if (W4A8Tables().empty()) GTEST_SKIP() << "no W4A8 kernels here: " << WhyNot("avx512");
  std::mt19937 rng(31);
  for (const KernelTable* kt : W4A8Tables()) {
    for (int group : {32, 64, 128}) {
      for (int64_t k : {2, 30, 64, 202, 578}) {
        auto x = Random(k, rng, 3.0f);
        x[k / 2] = 0.0f;
        const int64_t groups = PackedW4Groups(k, group), row = cpu::W4A8RowBytes(k);
        std::vector<int8_t> qa(row, 99), qb(row, 99);
        std::vector<float> sa(groups), sb(groups), ta(groups), tb(groups);
        cpu::kScalarKernels.quantize_row_i8_groups(x.data(), k, group, qa.data(), sa.data(), ta.data());
        kt->quantize_row_i8_groups(x.data(), k, group, qb.data(), sb.data(), tb.data());
        EXPECT_EQ(qa, qb) << kt->name << " k=" << k << " group=" << group;
        EXPECT_EQ(sa, sb);
        EXPECT_EQ(ta, tb);
        for (int64_t i = k; i < row; ++i) ASSERT_EQ(qa[i], 0) << "padding past k";
        for (int64_t i = 0; i < k; ++i) {
          ASSERT_LE(std::abs(qa[i] * sa[i / group] - x[i]), 0.5f * sa[i / group] + 1e-6f * std::abs(x[i]));
        }
      }
    }
  }
}

TEST(W4A8Test, GemmMatchesReferenceAndStaysNearFloat) {
  if (W4A8Tables().empty()) GTEST_SKIP() << "no W4A8 kernels here: " << WhyNot("avx512");
  std::mt19937 rng(32);
  for (const KernelTable* kt : W4A8Tables()) {
    for (int group : {32, 64, 128}) {
      // Every tile height (1 to 8 rows) and tails of 1, 2 and 3 input pairs:
      // k = 202 ends in a group of 5 pairs, 70 (group 64) in 3, 68 (group 32) in 2.
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 64}, {35, 576}, {20, 202}, {48, 70},
                            {17, 68}}) {
          auto w = Random(n * k, rng), x = Random(m * k, rng);
          auto p = PackW4(w, n, k, group, m % 2 == 0);
          const int64_t panels = (n + 15) / 16, groups = PackedW4Groups(k, group);
          const int64_t row = cpu::W4A8RowBytes(k);
          std::vector<int8_t> xq(m * row);
          std::vector<float> xs(m * groups), xsum(m * groups);
          for (int64_t r = 0; r < m; ++r) {
            cpu::kScalarKernels.quantize_row_i8_groups(x.data() + r * k, k, group, xq.data() + r * row,
                                                       xs.data() + r * groups, xsum.data() + r * groups);
          }
          std::vector<float> want(m * n), got(m * n, -1.0f), exact(m * n);
          cpu::kScalarKernels.gemm_w4a8_panels(p.view, 0, panels, xq.data(), xs.data(), xsum.data(), m,
                                               want.data(), n);
          kt->gemm_w4a8_panels(p.view, 0, panels, xq.data(), xs.data(), xsum.data(), m, got.data(), n);
          cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, panels, x.data(), m, k, exact.data(), n);
          double err = 0, norm = 0;
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-5f * std::sqrt((float)k) * (1 + std::abs(want[i])))
                << kt->name << " group=" << group << " m=" << m << " n=" << n << " k=" << k;
            err += (want[i] - exact[i]) * (want[i] - exact[i]);
            norm += exact[i] * exact[i];
          }
          // int8 activations per group: about 1% of the product's RMS.
          EXPECT_LT(std::sqrt(err / norm), 0.02) << "group=" << group << " m=" << m << " k=" << k;
        }
      }
    }
  }
}

// The public entry point takes the W4A8 path from a8_min_rows up (and only
// there), threaded, with and without an input scale.
TEST(W4A8Test, PublicGemmSwitchesAtMinRows) {
  if (W4A8Tables().empty()) GTEST_SKIP() << "no W4A8 kernels here: " << WhyNot("avx512");
  if (cpu::ActiveKernels().gemm_w4a8_panels == nullptr) GTEST_SKIP() << "PDQ_ISA forces a path without W4A8";
  std::mt19937 rng(33);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  const int64_t n = 40, k = 130;
  auto w = Random(n * k, rng), s = Random(k, rng);
  auto p = PackW4(w, n, k, 32, false);
  PackedW4 a8 = p.view;
  a8.a8_min_rows = 8;
  for (int64_t m : {int64_t{7}, int64_t{8}, int64_t{33}, kW4IntMaxRows, kW4IntMaxRows + 1}) {
    auto x = Random(m * k, rng);
    std::vector<float> plain(m * n), mixed(m * n), scaled_in(m * k), prescaled(m * n), scaled(m * n);
    std::vector<uint8_t> scratch(GemmW4A16ScratchBytes(m, k, 32));
    GemmW4A16(ctx, p.view, x.data(), m, k, plain.data(), n, scratch.data());
    GemmW4A16(ctx, a8, x.data(), m, k, mixed.data(), n, scratch.data());
    const bool int8 = m >= 8 && m <= kW4IntMaxRows;
    if (int8) {
      const int64_t groups = PackedW4Groups(k, 32), row = cpu::W4A8RowBytes(k);
      std::vector<int8_t> xq(m * row);
      std::vector<float> xs(m * groups), xsum(m * groups), want(m * n);
      for (int64_t r = 0; r < m; ++r) {
        cpu::kScalarKernels.quantize_row_i8_groups(x.data() + r * k, k, 32, xq.data() + r * row,
                                                   xs.data() + r * groups, xsum.data() + r * groups);
      }
      cpu::kScalarKernels.gemm_w4a8_panels(p.view, 0, (n + 15) / 16, xq.data(), xs.data(),
                                           xsum.data(), m, want.data(), n);
      for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(mixed[i], want[i], 1e-4f * (1 + std::abs(want[i])));
      EXPECT_NE(mixed, plain) << "m=" << m << " should have run with int8 activations";
    } else {
      EXPECT_EQ(mixed, plain) << "m=" << m << " is outside the W4A8 range";
    }
    for (int64_t i = 0; i < m * k; ++i) scaled_in[i] = x[i] * s[i % k];
    GemmW4A16(ctx, a8, x.data(), m, k, scaled.data(), n, scratch.data(), s.data());
    GemmW4A16(ctx, a8, scaled_in.data(), m, k, prescaled.data(), n, scratch.data());
    EXPECT_EQ(scaled, prescaled) << "m=" << m;
  }
}

// AWQ's input scaling inside the GEMM equals scaling the rows first, on both
// the int16 and the fp32-tile paths.
TEST(W4Test, InputScaleEqualsPrescaledActivations) {
  std::mt19937 rng(16);
  const int64_t n = 32, k = 192;
  for (int64_t m : {int64_t{1}, int64_t{5}, kW4IntMaxRows + 3}) {
    auto w = Random(n * k, rng), x = Random(m * k, rng), s = Random(k, rng);
    auto p = PackW4(w, n, k, 64, false);
    std::vector<float> scaled(m * k);
    for (int64_t i = 0; i < m * k; ++i) scaled[i] = x[i] * s[i % k];
    std::vector<float> a(m * n), b(m * n);
    std::vector<uint8_t> scratch(GemmW4A16ScratchBytes(m, k, 64));
    GemmW4A16(CpuContext{}, p.view, x.data(), m, k, a.data(), n, scratch.data(), s.data());
    GemmW4A16(CpuContext{}, p.view, scaled.data(), m, k, b.data(), n, scratch.data());
    EXPECT_EQ(a, b) << "m=" << m;
  }
}

// The int16-activation GEMMs (W4A16 and W8A16, up to kW4IntMaxRows rows: decode
// and batched decode) give every row bit for bit what it gets alone, on every
// path: their group sums are exact integers and the scales follow in the same
// order whichever row tile (or the single-row GEMV) a row lands in. So a
// sequence's greedy answer does not depend on how many others decode beside
// it while decode steps stay on these kernels (--batch-invariant; by default
// steps of 16 rows or more take the bf16 tiles on AMX-BF16 CPUs); ServingTest
// checks it end to end, this says which kernels keep it. A
// kernel that adds rows in tiles of its own must keep it too: the AMX table
// equals the AVX-512 one here, and the AVX-VNNI table (its own tiles and
// row kernel on vpdpwssd) the AVX2 one.
// `gemm(kt, p_begin, p_end, q, scale, sum, rows, y)` runs one table's GEMM
// on rows of `a` (n outputs a row, groups scales a row).
template <typename Gemm>
void ExpectRowsAsAloneOnEveryPath(const char* what, int64_t m, int64_t n, int64_t k, int64_t groups,
                                  const Int16Activations& a, const Gemm& gemm) {
  std::vector<const KernelTable*> tables = FastTables();
  tables.insert(tables.begin(), &cpu::kScalarKernels);
  const int64_t panels = (n + 15) / 16;
  std::vector<float> avx2, avx512;
  for (const KernelTable* kt : tables) {
    std::vector<float> batch(m * n, -1.0f), alone(n);
    gemm(*kt, 0, panels, a.q.data(), a.scale.data(), a.sum.data(), m, batch.data());
    for (int64_t r = 0; r < m; ++r) {
      gemm(*kt, 0, panels, a.q.data() + r * k, a.scale.data() + r * groups,
           a.sum.data() + r * groups, 1, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + r * n, n * sizeof(float)))
          << what << " on " << kt->name << ": row " << r << " of " << m
          << " differs from alone (k=" << k << ")";
    }
    if (kt == &cpu::kAvx2Kernels) avx2 = batch;
    if (kt == &cpu::AvxVnniKernels()) {
      EXPECT_EQ(avx2, batch) << what << ": the AVX-VNNI table differs from the AVX2 one, m=" << m
                             << " k=" << k << " groups=" << groups;
    }
    if (kt == &cpu::kAvx512Kernels) avx512 = batch;
    if (kt == &cpu::kAvx512AmxKernels) {
      EXPECT_EQ(avx512, batch) << what << ": the AMX table differs from the AVX-512 one, m=" << m
                               << " k=" << k << " groups=" << groups;
    }
  }
}

TEST(W4Test, Int16RowsAnswerAsAloneOnEveryPath) {
  std::mt19937 rng(17);
  // 1152 = 9 groups of 128; 1158 ends in a group of 3 input pairs (the
  // GEMVs' tail steps, fewer than their chains).
  for (int64_t k : {1152, 1158}) {
    for (int group : {32, 64, 128}) {
      for (int64_t m : {4, 5, 16, 17, 18, 20, 31, 32, 48, 64}) {
        const int64_t n = 35;
        auto w = Random(n * k, rng), x = Random(m * k, rng);
        auto p = PackW4(w, n, k, group, m % 2 == 0);
        ExpectRowsAsAloneOnEveryPath(
            "W4A16", m, n, k, PackedW4Groups(k, group), QuantizeInt16Rows(x, m, k, group),
            [&](const KernelTable& kt, int64_t pb, int64_t pe, const int16_t* q, const float* s,
                const float* sum, int64_t rows,
                float* y) { kt.gemm_w4_panels(p.view, pb, pe, q, s, sum, rows, y, n); });
      }
    }
  }
}

// The public entry point on both sides of kW4IntMaxRows, threaded, against
// the scalar fp32-activation reference.
TEST(W4Test, PublicGemmTracksFloatResultAcrossPaths) {
  std::mt19937 rng(15);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  const int64_t n = 50, k = 320;
  for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{20}, kW4IntMaxRows, kW4IntMaxRows + 1}) {
    auto w = Random(n * k, rng), x = Random(m * k, rng);
    auto p = PackW4(w, n, k, 64, false);
    // From 16 rows on bf16 tiles where the CPU has them (looser: bf16).
    p.view.bf16_min_rows = 16;
    const float tol = m >= 16 && Bf16TilesSupported() ? 1.6e-2f : 2e-4f;
    std::vector<float> want(m * n), got(m * n, -1.0f);
    cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, (n + 15) / 16, x.data(), m, k, want.data(),
                                           n);
    std::vector<uint8_t> scratch(GemmW4A16ScratchBytes(m, k, 64));
    GemmW4A16(ctx, p.view, x.data(), m, k, got.data(), n, scratch.data());
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(got[i], want[i], tol * std::sqrt((float)k) * (1 + std::abs(want[i])))
          << "m=" << m;
    }
  }
}

// The bf16 tile path (AMX) against its reference on the same bf16 rows, and
// within bf16's rounding of the fp32 many-row path.
TEST(W4Bf16Test, RowConversionRoundsToNearestEven) {
  EXPECT_EQ(cpu::Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(cpu::Fp32ToBf16(1.0f + 1.0f / 256), 0x3f80);  // a tie: to even
  EXPECT_EQ(cpu::Fp32ToBf16(1.0f + 3.0f / 256), 0x3f82);  // a tie: to even, upwards
  EXPECT_EQ(cpu::Fp32ToBf16(-2.5f), 0xc020);
  EXPECT_EQ(cpu::Bf16ToFp32(0x3f81), 1.0f + 1.0f / 128);
  const KernelTable& amx = cpu::kAvx512AmxKernels;
  if (!GetCpuFeatures().amx_kernels()) GTEST_SKIP() << "bf16 tiles not tested: " << WhyNot("avx512+amx");
  std::mt19937 rng(41);
  for (int64_t k : {1, 31, 32, 33, 100, 576}) {
    auto x = Random(k, rng, 3.0f);
    std::vector<uint16_t> want(cpu::Bf16RowElements(k), 7), got(want.size(), 9);
    cpu::QuantizeRowBf16Ref(x.data(), k, want.data());
    amx.quantize_row_bf16(x.data(), k, got.data());
    EXPECT_EQ(got, want) << "k=" << k;
  }
}

TEST(W4Bf16Test, GemmMatchesReference) {
  if (!GetCpuFeatures().amx_kernels()) GTEST_SKIP() << "bf16 tiles not tested: " << WhyNot("avx512+amx");
  const KernelTable& amx = cpu::kAvx512AmxKernels;
  std::mt19937 rng(42);
  for (int group : {32, 128}) {
    for (int64_t m : {1, 5, 16, 17, 32, 33, 70}) {
      // k = 202 pads to 224; n = 35 ends in a partial panel, 20 in an odd panel count.
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 64}, {35, 576}, {20, 202}, {48, 96}}) {
        auto w = Random(n * k, rng), x = Random(m * k, rng);
        auto p = PackW4(w, n, k, group, m % 2 == 0);
        const int64_t panels = (n + 15) / 16, row = cpu::Bf16RowElements(k);
        std::vector<uint16_t> xb(cpu::Bf16Rows(m) * row, 0);
        for (int64_t r = 0; r < m; ++r) cpu::QuantizeRowBf16Ref(x.data() + r * k, k, xb.data() + r * row);
        const int64_t ldy = n + 2;
        std::vector<float> want(m * ldy, -1.0f), got(m * ldy, -1.0f), f32(m * ldy, -1.0f);
        cpu::GemmW4PanelsBf16Ref(p.view, 0, panels, xb.data(), m, want.data(), ldy);
        amx.gemm_w4_panels_bf16(p.view, 0, panels, xb.data(), m, got.data(), ldy);
        cpu::kScalarKernels.gemm_w4_panels_f32(p.view, 0, panels, x.data(), m, k, f32.data(), ldy);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldy; ++j) {
            const int64_t at = i * ldy + j;
            if (j >= n) {
              ASSERT_EQ(got[at], -1.0f) << "wrote past n: m=" << m << " n=" << n;
              continue;
            }
            ASSERT_NEAR(got[at], want[at], 1e-5f * std::sqrt((float)k) * (1 + std::abs(want[at])))
                << "group=" << group << " m=" << m << " n=" << n << " k=" << k << " at " << i << "," << j;
            // bf16 keeps 8 bits: each product is off by up to 2^-7 relative
            // (about 0.003 standard deviation), so 5 deviations of the sum.
            ASSERT_NEAR(want[at], f32[at], 1.6e-2f * std::sqrt((float)k) * (1 + std::abs(f32[at])))
                << "bf16 against fp32, m=" << m << " k=" << k;
          }
        }
      }
    }
  }
}

struct PackedW8Matrix {
  std::vector<int8_t> q;
  std::vector<fp16_t> scale;
  PackedW8 view;
};

PackedW8Matrix PackW8(const std::vector<float>& w, int64_t n, int64_t k) {
  PackedW8Matrix p;
  p.q.assign(PackedW8QBytes(n, k), 0);
  p.scale.assign(PackedW8ScaleElements(n, k), 0);
  QuantizeW8Rows(w.data(), 0, n, k, p.q.data(), p.scale.data());
  p.view = {p.q.data(), p.scale.data(), n, k};
  return p;
}

// A GGUF Q8_0 tensor (w = d q per 32 inputs, d an fp16, the group's extreme
// at |q| = 127) comes back code for code and value for value.
TEST(W8Test, QuantizationReFindsAQ8Grid) {
  std::mt19937 rng(31);
  const int64_t n = 37, k = 202;  // a partial panel, a last group of 10
  std::uniform_int_distribution<int> code(-127, 127), pos(0, kW8Group - 1);
  std::uniform_real_distribution<float> mag(1e-4f, 0.1f);
  std::vector<float> w(n * k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < PackedW8Groups(k); ++g) {
      const int64_t k0 = g * kW8Group, len = std::min<int64_t>(kW8Group, k - k0);
      const float d = Fp16ToFp32(Fp32ToFp16(mag(rng)));
      std::vector<int> q(len);
      for (int& c : q) c = code(rng);
      q[pos(rng) % len] = rng() % 2 ? 127 : -127;
      for (int64_t i = 0; i < len; ++i) w[r * k + k0 + i] = d * (float)q[i];
    }
  }
  const PackedW8Matrix p = PackW8(w, n, k);
  std::vector<float> back(n * k);
  DequantizeW8Rows(p.view, 0, n, back.data());
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(back[i], w[i]) << "element " << i;
}

TEST(W8Test, QuantizationErrorIsHalfAStep) {
  std::mt19937 rng(32);
  const int64_t n = 20, k = 100;
  auto w = Random(n * k, rng);
  w[5] = 0.0f;
  for (int64_t i = 2 * k; i < 2 * k + kW8Group; ++i) w[i] = 0.0f;  // an all-zero group
  const PackedW8Matrix p = PackW8(w, n, k);
  std::vector<float> back(n * k);
  DequantizeW8Rows(p.view, 3, n - 3, back.data() + 3 * k);
  DequantizeW8Rows(p.view, 0, 3, back.data());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const float step = Fp16ToFp32(p.scale[(r / 16 * PackedW8Groups(k) + i / kW8Group) * 16 + r % 16]);
      ASSERT_LE(std::abs(back[r * k + i] - w[r * k + i]), 0.5f * step * 1.001f + 1e-7f)
          << "row " << r << " input " << i;
      EXPECT_EQ(PackedW8Code(p.q.data() + r / 16 * k * 16, i, r % 16),
                (int)std::nearbyint(back[r * k + i] / (step == 0.0f ? 1.0f : step)));
    }
  }
  EXPECT_EQ(back[2 * k + 3], 0.0f);
}

TEST(W8Test, GemmMatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(33);
  for (const KernelTable* kt : FastTables()) {
    for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 17, 33}) {
      // k = 202: a last group of 5 input pairs; k = 70: 3 of them.
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 64}, {35, 576}, {48, 200}, {20, 202},
                          {3, 70}}) {
        auto w = Random(n * k, rng), x = Random(m * k, rng);
        const PackedW8Matrix p = PackW8(w, n, k);
        const int64_t panels = (n + 15) / 16;
        const Int16Activations a = QuantizeInt16Rows(x, m, k, kW8Group);
        // Outputs past n (in the row stride n + 3) stay untouched.
        const int64_t ldy = n + 3;
        std::vector<float> want(m * ldy, -1.0f), got(m * ldy, -1.0f);
        cpu::kScalarKernels.gemm_w8_panels(p.view, 0, panels, a.q.data(), a.scale.data(), m,
                                           want.data(), ldy);
        kt->gemm_w8_panels(p.view, 0, panels, a.q.data(), a.scale.data(), m, got.data(), ldy);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldy; ++j) {
            const float a = got[i * ldy + j], b = want[i * ldy + j];
            ASSERT_NEAR(a, b, 2e-5f * std::sqrt((float)k) * (1 + std::abs(b)))
                << kt->name << " m=" << m << " n=" << n << " k=" << k << " at " << i << "," << j;
            if (j >= n) {
              ASSERT_EQ(a, -1.0f) << kt->name << " wrote past n";
            }
          }
        }
      }
    }
  }
}

TEST(W8Test, Int16RowsAnswerAsAloneOnEveryPath) {
  std::mt19937 rng(37);
  for (int64_t m : {4, 7, 16, 17, 18, 19, 32, 33, 64}) {
    for (int64_t k : {64, 70, 576}) {
      const int64_t n = 37;
      auto w = Random(n * k, rng), x = Random(m * k, rng);
      const PackedW8Matrix p = PackW8(w, n, k);
      ExpectRowsAsAloneOnEveryPath(
          "W8A16", m, n, k, PackedW8Groups(k), QuantizeInt16Rows(x, m, k, kW8Group),
          [&](const KernelTable& kt, int64_t pb, int64_t pe, const int16_t* q, const float* s,
              const float*, int64_t rows,
              float* y) { kt.gemm_w8_panels(p.view, pb, pe, q, s, rows, y, n); });
    }
  }
}

TEST(W8Test, Bf16GemmMatchesReference) {
  if (!GetCpuFeatures().amx_kernels()) GTEST_SKIP() << "bf16 tiles not tested: " << WhyNot("avx512+amx");
  const KernelTable& amx = cpu::kAvx512AmxKernels;
  std::mt19937 rng(35);
  for (int64_t m : {1, 16, 17, 33}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{35, 576}, {20, 202}, {48, 64}}) {
      auto w = Random(n * k, rng), x = Random(m * k, rng);
      const PackedW8Matrix p = PackW8(w, n, k);
      const int64_t panels = (n + 15) / 16, row = cpu::Bf16RowElements(k);
      std::vector<uint16_t> xb(cpu::Bf16Rows(m) * row, 0);
      for (int64_t r = 0; r < m; ++r) cpu::QuantizeRowBf16Ref(x.data() + r * k, k, xb.data() + r * row);
      const int64_t ldy = n + 1;
      std::vector<float> want(m * ldy, -1.0f), got(m * ldy, -1.0f);
      cpu::GemmW8PanelsBf16Ref(p.view, 0, panels, xb.data(), m, want.data(), ldy);
      amx.gemm_w8_panels_bf16(p.view, 0, panels, xb.data(), m, got.data(), ldy);
      for (int64_t i = 0; i < m * ldy; ++i) {
        if (i % ldy >= n) {
          ASSERT_EQ(got[i], -1.0f) << "wrote past n";
        } else {
          ASSERT_NEAR(got[i], want[i], 1e-5f * std::sqrt((float)k) * (1 + std::abs(want[i])))
              << "m=" << m << " n=" << n << " k=" << k << " at " << i;
        }
      }
    }
  }
}

// The public entry point on every path (threads, the quantization included)
// against the float product with the dequantized weights; from 16 rows on
// bf16 tiles where the CPU has them.
TEST(W8Test, PublicGemmTracksFloatResult) {
  std::mt19937 rng(34);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  const int64_t n = 50, k = 320;
  for (int64_t m : {1, 7, 64, 100}) {
    auto w = Random(n * k, rng), x = Random(m * k, rng);
    PackedW8Matrix p = PackW8(w, n, k);
    p.view.bf16_min_rows = 16;
    const double tol = m >= 16 && Bf16TilesSupported() ? 1.6e-2 : 1e-4;
    std::vector<float> wd(n * k);
    DequantizeW8Rows(p.view, 0, n, wd.data());
    std::vector<float> got(m * n, -1.0f);
    std::vector<uint8_t> scratch(GemmW8A16ScratchBytes(m, k));
    GemmW8A16(ctx, p.view, x.data(), m, k, got.data(), n, scratch.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t kk = 0; kk < k; ++kk) want += (double)x[i * k + kk] * wd[j * k + kk];
        ASSERT_NEAR(got[i * n + j], want, tol * std::sqrt((double)k) * (1 + std::abs(want)))
            << "m=" << m << " at " << i << "," << j;
      }
    }
  }
}

}  // namespace
}  // namespace pdq

namespace pdq {
namespace {

struct PackedI8Matrix {
  std::vector<int8_t> q;
  std::vector<float> scale;
  PackedI8 view;
};

PackedI8Matrix PackI8(const std::vector<float>& w, int64_t n, int64_t k) {
  PackedI8Matrix p;
  p.q.assign(PackedI8Bytes(n, k), 0);
  p.scale.assign(n, 0.0f);
  QuantizeI8Rows(w.data(), 0, n, k, p.q.data(), p.scale.data());
  p.view = {p.q.data(), p.scale.data(), n, k};
  return p;
}

TEST(W8A8Test, ActivationQuantizationMatchesReferenceExactly) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(21);
  for (const KernelTable* kt : FastTables()) {
    for (int64_t k : {1, 5, 8, 33, 576}) {
      auto x = Random(k, rng, 3.0f);
      std::vector<int8_t> want(PackedI8K4(k) * 4, 99), got(want.size(), 99);
      const float sw = cpu::kScalarKernels.quantize_row_i8(x.data(), k, want.data());
      const float sg = kt->quantize_row_i8(x.data(), k, got.data());
      EXPECT_EQ(sw, sg);
      EXPECT_EQ(want, got) << "k=" << k;
    }
  }
}

TEST(W8A8Test, GemmMatchesReference) {
  SKIP_WITHOUT_FAST_PATHS();
  std::mt19937 rng(22);
  for (const KernelTable* kt : FastTables()) {
    // Row counts around AMX's 16-row tiles and the 6-row VNNI tiles; k below,
    // at and past whole 64-input tiles; odd and even panel counts.
    for (int64_t m : {1, 2, 3, 4, 5, 7, 16, 17, 33, 64, 95}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 4}, {35, 577}, {48, 1536}, {80, 64},
                          {17, 130}}) {
        auto w = Random(n * k, rng), x = Random(m * k, rng);
        auto p = PackI8(w, n, k);
        const int64_t row = PackedI8K4(k) * 4;
        std::vector<int8_t> xq(m * row);
        std::vector<float> xs(m);
        for (int64_t i = 0; i < m; ++i) {
          xs[i] = cpu::kScalarKernels.quantize_row_i8(x.data() + i * k, k, xq.data() + i * row);
        }
        const int64_t panels = (n + 15) / 16;
        std::vector<float> want(m * n), got(m * n, -1.0f);
        cpu::kScalarKernels.gemm_i8_panels(p.view, 0, panels, xq.data(), xs.data(), m, want.data(), n);
        kt->gemm_i8_panels(p.view, 0, panels, xq.data(), xs.data(), m, got.data(), n);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i])))
              << kt->name << " m=" << m << " n=" << n << " k=" << k;
        }
      }
    }
  }
}

TEST(W8A8Test, InputScaleEqualsPrescaledActivations) {
  std::mt19937 rng(24);
  const int64_t m = 5, n = 32, k = 70;
  auto w = Random(n * k, rng), x = Random(m * k, rng), s = Random(k, rng);
  auto p = PackI8(w, n, k);
  std::vector<float> scaled(m * k);
  for (int64_t i = 0; i < m * k; ++i) scaled[i] = x[i] * s[i % k];
  std::vector<float> a(m * n), b(m * n);
  std::vector<uint8_t> scratch(GemmW8A8ScratchBytes(m, k));
  GemmW8A8(CpuContext{}, p.view, x.data(), m, k, a.data(), n, scratch.data(), s.data());
  GemmW8A8(CpuContext{}, p.view, scaled.data(), m, k, b.data(), n, scratch.data());
  EXPECT_EQ(a, b);
}

// Int8 weights and activations stay within a few percent of the float result.
TEST(W8A8Test, PublicGemmTracksFloatResult) {
  std::mt19937 rng(23);
  const int64_t m = 9, n = 40, k = 300;
  auto w = Random(n * k, rng), x = Random(m * k, rng);
  auto p = PackI8(w, n, k);
  ThreadPool pool(2);
  std::vector<float> y(m * n);
  std::vector<uint8_t> scratch(GemmW8A8ScratchBytes(m, k));
  GemmW8A8(CpuContext{&pool}, p.view, x.data(), m, k, y.data(), n, scratch.data());
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (int64_t kk = 0; kk < k; ++kk) exact += (double)x[i * k + kk] * w[j * k + kk];
      err += (y[i * n + j] - exact) * (y[i * n + j] - exact);
      norm += exact * exact;
    }
  }
  EXPECT_LT(std::sqrt(err / norm), 0.03);
}

// Prompt rows (CpuContext::prompt_rows) take one path at any count: a
// row's outputs are the same bits whether it is computed alone, among a
// few or among many, on the FP16, W4A16 (the serving default: bf16 tiles
// from 65 decode rows) and W8A16 GEMMs, with the calls threaded; and decode
// rows of 65 or more, which take other paths, stay within the paths'
// rounding of them.
TEST(PromptRowsTest, ARowsOutputsDoNotDependOnTheRowsBesideIt) {
  std::mt19937 rng(61);
  ThreadPool pool(2);
  const CpuContext prompt{&pool, false, true}, decode{&pool};
  const int64_t n = 50, k = 320, m = 100;
  const auto w = Random(n * k, rng), x = Random(m * k, rng);
  const PackedMatrix f16 = Pack(w, n, k);
  auto w4 = PackW4(w, n, k, 32, false);
  w4.view.bf16_min_rows = kW4IntMaxRows + 1;
  PackedW8Matrix w8 = PackW8(w, n, k);
  w8.view.bf16_min_rows = kW4IntMaxRows + 1;
  std::vector<uint8_t> scratch;
  // Rows [r0, r0 + rows) of x through layer `which` with `ctx`.
  auto run = [&](int which, const CpuContext& ctx, int64_t r0, int64_t rows) {
    std::vector<float> y(rows * n);
    const float* xr = x.data() + r0 * k;
    if (which == 0) {
      GemmF16(ctx, f16.view, xr, rows, k, y.data(), n);
    } else if (which == 1) {
      scratch.resize(GemmW4A16ScratchBytes(rows, k, 32));
      GemmW4A16(ctx, w4.view, xr, rows, k, y.data(), n, scratch.data());
    } else {
      scratch.resize(GemmW8A16ScratchBytes(rows, k));
      GemmW8A16(ctx, w8.view, xr, rows, k, y.data(), n, scratch.data());
    }
    return y;
  };
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(which == 0 ? "FP16" : which == 1 ? "W4A16" : "W8A16");
    const std::vector<float> all = run(which, prompt, 0, m);
    for (auto [r0, rows] :
         {std::pair<int64_t, int64_t>{0, 1}, {37, 1}, {3, 2}, {10, 5}, {20, 64}, {99, 1}}) {
      const std::vector<float> part = run(which, prompt, r0, rows);
      for (int64_t i = 0; i < rows * n; ++i) {
        ASSERT_EQ(part[i], all[r0 * n + i]) << rows << " rows from " << r0 << ", output " << i;
      }
    }
    const std::vector<float> as_decode = run(which, decode, 0, m);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(as_decode[i], all[i], 2e-2f * (1 + std::abs(all[i]))) << "output " << i;
    }
  }
}

}  // namespace
}  // namespace pdq
