// Roofline probes. The AVX2, AVX-512 and AMX loops carry target attributes and
// run only after the CPU check (each probes the instructions of the kernel
// path dispatch chose); the scalar fallbacks keep the tool working anywhere.
#include "probes/roofline.h"

#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/amx_config.h"
#include "kernels/cpu/cpu_features.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target("avx2"))) float SumAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

float SumScalar(const float* p, int64_t n) {
  float a[8] = {};
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  }
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

constexpr int kChains = 12;

// Returns FLOPs done: iters * chains * 8 lanes * 2.
__attribute__((target("avx2,fma"))) double FmaLoopAvx2(int64_t iters, float* sink) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  *sink += t[0];
  return (double)iters * kChains * 8 * 2;
}

double FmaLoopScalar(int64_t iters, float* sink) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = 1.0f + i * 1e-3f;
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  }
  for (int i = 0; i < kChains; ++i) *sink += acc[i];
  return (double)iters * kChains * 2;
}

// Integer multiply-add chains in registers, as the int16 (vpmaddwd: 16
// products per instruction) and int8 (vpmaddubsw: 32) kernels use them.
// Returns operations done (2 per product).
template <bool kInt8>
__attribute__((target("avx2"))) double IntLoopAvx2(int64_t iters, float* sink) {
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi16((short)(i + 1));
  const __m256i b = _mm256_set1_epi16(3);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) {
      acc[i] = kInt8 ? _mm256_maddubs_epi16(acc[i], b) : _mm256_madd_epi16(acc[i], b);
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_xor_si256(s, acc[i]);
  *sink += (float)_mm256_extract_epi32(s, 0);
  return (double)iters * kChains * (kInt8 ? 32 : 16) * 2;
}

// The same on the AVX-512 path: 16 lanes an FMA.
__attribute__((target("avx512f"))) double FmaLoopAvx512(int64_t iters, float* sink) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  *sink += t[0];
  return (double)iters * kChains * 16 * 2;
}

// VNNI chains as the AVX-512 kernels use them: vpdpbusd (64 u8 x s8
// products an instruction) or vpdpwssd (32 int16 products).
template <bool kInt8>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double IntLoopAvx512(int64_t iters,
                                                                            float* sink) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i + 1);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) {
      // asm with the accumulator tied, as the kernels write it: GCC 12's
      // intrinsics copy each accumulator to a fresh register and back.
      __m512i x = acc[i];
      if constexpr (kInt8) {
        asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(x) : "v"(a), "v"(b));
      } else {
        asm("%{evex%} vpdpwssd %2, %1, %0" : "+v"(x) : "v"(a), "v"(b));
      }
      acc[i] = x;
    }
  }
  __m512i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_xor_si512(s, acc[i]);
  alignas(64) int32_t t[16];
  _mm512_store_si512(t, s);
  *sink += (float)t[0];
  return (double)iters * kChains * (kInt8 ? 64 : 32) * 2;
}

// The same in 256 bits with AVX-VNNI (the "avx2+vnni" path's integer
// GEMMs), the VEX encoding, as avx_vnni.cc's helpers write it.
template <bool kInt8>
__attribute__((target("avx2,avxvnni"))) double IntLoopAvxVnni(int64_t iters, float* sink) {
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi32(i + 1);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) {
      __m256i x = acc[i];
      if constexpr (kInt8) {
        asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(x) : "x"(a), "x"(b));
      } else {
        asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(x) : "x"(a), "x"(b));
      }
      acc[i] = x;
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_xor_si256(s, acc[i]);
  *sink += (float)_mm256_extract_epi32(s, 0);
  return (double)iters * kChains * (kInt8 ? 32 : 16) * 2;
}

// AMX int8 tiles as the W8A8 GEMM uses them: tdpbssd on full 16 x 64-byte
// tiles (16 * 16 * 64 products an instruction), four accumulators.
__attribute__((target("amx-tile,amx-int8"))) double AmxLoop(int64_t iters, float* sink) {
  const cpu::AmxTileConfig cfg = cpu::FullAmxTiles();
  alignas(64) int8_t src[16 * 64];
  std::memset(src, 3, sizeof(src));
  alignas(64) int32_t out[16 * 16];
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  *sink += (float)out[0];
  return (double)iters * 4 * 16 * 16 * 64 * 2;
}

bool Avx512Path() { return KernelIsaName().rfind("avx512", 0) == 0; }

}  // namespace

double MeasureReadBandwidthGBps(ThreadPool& pool, int64_t buffer_bytes) {
  const int64_t n = buffer_bytes / 4 / 64 * 64;
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * 4));
  if (buf == nullptr) return 0.0;
  // First touch from the pool, so pages are spread like the kernels' reads.
  pool.ParallelFor(n, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = 1.0f;
  });
  const bool avx2 = GetCpuFeatures().avx2;
  std::vector<float> sinks(pool.size());
  double best = 0.0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    pool.ParallelFor(n, 64, [&](int64_t b, int64_t e, int t) {
      sinks[t] += avx2 ? SumAvx2(buf + b, e - b) : SumScalar(buf + b, e - b);
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, (double)n * 4 / s / 1e9);
  }
  std::free(buf);
  return best;
}

// Best of three passes of `loop(thread)` (returning the work it did) on every
// thread, in units of 1e9 per second.
template <typename Loop>
double BestRate(ThreadPool& pool, Loop loop) {
  std::vector<double> work(pool.size());
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    pool.Run([&](int t) { work[t] = loop(t); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    double total = 0.0;
    for (double w : work) total += w;
    best = std::max(best, total / s / 1e9);
  }
  return best;
}

double MeasureFmaPeakGflops(ThreadPool& pool) {
  const bool avx2 = GetCpuFeatures().avx2, avx512 = Avx512Path();
  const int64_t iters = avx2 ? 20'000'000 : 2'000'000;
  std::vector<float> sinks(pool.size());
  return BestRate(pool, [&](int t) {
    if (avx512) return FmaLoopAvx512(iters, &sinks[t]);
    return avx2 ? FmaLoopAvx2(iters, &sinks[t]) : FmaLoopScalar(iters, &sinks[t]);
  });
}

double MeasureIntPeakGops(ThreadPool& pool, bool int8) {
  if (!GetCpuFeatures().avx2) return 0.0;
  const std::string isa = KernelIsaName();
  std::vector<float> sinks(pool.size());
  if (int8 && isa == "avx512+amx") {
    return BestRate(pool, [&](int t) { return AmxLoop(2'000'000, &sinks[t]); });
  }
  const int64_t iters = 10'000'000;
  if (isa == "avx2+vnni") {
    return BestRate(pool, [&](int t) {
      return int8 ? IntLoopAvxVnni<true>(iters, &sinks[t])
                  : IntLoopAvxVnni<false>(iters, &sinks[t]);
    });
  }
  if (Avx512Path()) {
    return BestRate(pool, [&](int t) {
      return int8 ? IntLoopAvx512<true>(iters, &sinks[t]) : IntLoopAvx512<false>(iters, &sinks[t]);
    });
  }
  return BestRate(pool, [&](int t) {
    return int8 ? IntLoopAvx2<true>(iters, &sinks[t]) : IntLoopAvx2<false>(iters, &sinks[t]);
  });
}

}  // namespace pdq
