// The 256-bit int16-activation dot-product kernels shared by the AVX2,
// AVX-VNNI and AVX-512 tables, each taking its dot product as a parameter
// (vpmaddwd + vpaddd, or vpdpwssd): the W4A16 decode row (one row of int16
// activations against one panel of 16 weight rows, PackedW4 in
// kernels/kernels.h: per group the exact int32 dot products, two inputs of
// each row at a time, then one scale), the W4A16 tiles of a few rows, which
// round as the row does, and the W8A16 tiles; and the AVX2 and AVX-VNNI
// tables' W4A16 and W8A16 GEMMs built from them. Internal to kernels/cpu: each kernel
// file includes it and compiles its own copy under its own target flags,
// which is why everything here has internal linkage (an unnamed namespace):
// an inline function of external linkage compiled for AVX-512 in one file
// could be the copy the linker keeps for the AVX2 file too.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/cpu/isa.h"

namespace pdq::cpu {
namespace {  // NOLINT(build/namespaces): internal linkage per including file, see above

inline __m256 LoadF16x8(const fp16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// One 16-byte step of a panel (input pair t): the codes of rows 0-7 and of
// rows 8-15 as int16, each adjacent lane pair being one row's inputs 2t and
// 2t + 1.
struct W4Codes {
  __m256i lo, hi;
};
inline W4Codes LoadW4Codes(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_and_si256(v, _mm256_set1_epi16(0x0f)), _mm256_srli_epi16(v, 4)};
}

inline __m256i BroadcastPair(const int16_t* x) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return _mm256_set1_epi32(pair);
}

// Input pairs (16 bytes each) the decode GEMV prefetches ahead: a decode
// step's matrices are small (166 KB to 14 MB) and split in chunks, so the
// hardware prefetcher alone ramps up too late; 1 KiB ahead measured best
// (tg128 +13-30% against none, 32 to 256 tried).
constexpr int64_t kW4PrefetchSteps = 64;

// The row's 16 outputs in *out0 (rows 0-7) and *out1 (rows 8-15), summed
// exactly as the tiles sum them (bit for bit), on kChains independent pairs
// of int32 accumulators: one pair's chain would bound a group by the dot
// product's latency. `dot(acc, codes, x)` adds the int16 pair products of
// `codes` and `x` to `acc` (AVX2: vpmaddwd + vpaddd; AVX-VNNI and AVX-512
// VL: vpdpwssd).
template <int kChains, typename Dot>
inline void W4IntRow(const PackedW4& w, int64_t p, const int16_t* xq, const float* xs,
                     const float* xsum, Dot dot, __m256* out0, __m256* out1) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  const fp16_t* mp = w.min + p * groups * kPanelRows;
  __m256 o0 = _mm256_setzero_ps(), o1 = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * w.group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * w.group) / 2;
    __m256i lo[kChains], hi[kChains];
    for (int c = 0; c < kChains; ++c) lo[c] = hi[c] = _mm256_setzero_si256();
    int64_t t = t0;
    for (; t + kChains <= t1; t += kChains) {
      // Prefetching never faults, so running past the chunk's end is harmless.
      for (int c = 0; c < kChains; c += 4) {
        _mm_prefetch(reinterpret_cast<const char*>(q + (t + c + kW4PrefetchSteps) * kPanelRows),
                     _MM_HINT_T0);
      }
#pragma GCC unroll 8
      for (int c = 0; c < kChains; ++c) {
        const W4Codes codes = LoadW4Codes(q + (t + c) * kPanelRows);
        const __m256i x = BroadcastPair(xq + 2 * (t + c));
        lo[c] = dot(lo[c], codes.lo, x);
        hi[c] = dot(hi[c], codes.hi, x);
      }
    }
    for (int c = 0; t < t1; ++t, ++c) {
      const W4Codes codes = LoadW4Codes(q + t * kPanelRows);
      const __m256i x = BroadcastPair(xq + 2 * t);
      lo[c] = dot(lo[c], codes.lo, x);
      hi[c] = dot(hi[c], codes.hi, x);
    }
    for (int c = 1; c < kChains; ++c) {
      lo[0] = _mm256_add_epi32(lo[0], lo[c]);
      hi[0] = _mm256_add_epi32(hi[0], hi[c]);
    }
    const __m256 xscale = _mm256_set1_ps(xs[g]), xtotal = _mm256_set1_ps(xsum[g]);
    const __m256 s0 = _mm256_mul_ps(LoadF16x8(sp + g * kPanelRows), xscale);
    const __m256 s1 = _mm256_mul_ps(LoadF16x8(sp + g * kPanelRows + 8), xscale);
    o0 = _mm256_fmadd_ps(LoadF16x8(mp + g * kPanelRows), xtotal, o0);
    o1 = _mm256_fmadd_ps(LoadF16x8(mp + g * kPanelRows + 8), xtotal, o1);
    o0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(lo[0]), o0);
    o1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(hi[0]), o1);
  }
  *out0 = o0;
  *out1 = o1;
}

// The 16 outputs of a row (out0: rows 0-7, out1: rows 8-15) as the first
// `cols` floats at y.
inline void StoreRow256(float* y, __m256 out0, __m256 out1, int cols) {
  if (cols == kPanelRows) {
    _mm256_storeu_ps(y, out0);
    _mm256_storeu_ps(y + 8, out1);
    return;
  }
  alignas(32) float tmp[16];
  _mm256_store_ps(tmp, out0);
  _mm256_store_ps(tmp + 8, out1);
  std::memcpy(y, tmp, cols * sizeof(float));
}

// Rows [0, m) in tiles of kMax, then one tile for the rest:
// tile(std::integral_constant<int, MR>{}, r) for tiles of 2 or more rows,
// lone(r) for a tile of one (decode, or the last row of a batch).
template <int kMax, typename Lone, typename Tile>
inline void ForRowTiles(int64_t m, const Lone& lone, const Tile& tile) {
  for (int64_t r = 0; r < m;) {
    const int mr = (int)std::min<int64_t>(kMax, m - r);
    if (mr == 1) {
      lone(r);
    } else {
      [&]<int... I>(std::integer_sequence<int, I...>) {
        ((mr == I + 2 ? tile(std::integral_constant<int, I + 2>{}, r) : void()), ...);
      }
      (std::make_integer_sequence<int, kMax - 1>{});
    }
    r += mr;
  }
}

// Rows [0, MR) of the int16 activations against one panel: per group, the
// exact int32 dot products of 8 rows x 2 inputs per `dot` (as W4IntRow's),
// then one scale, rounded as W4IntRow rounds (AVX2 and AVX-VNNI tiles).
template <int MR, typename Dot>
inline void W4IntTile(const PackedW4& w, int64_t p, const int16_t* xq, const float* xs,
                      const float* xsum, Dot dot, float* y, int64_t ldy, int cols) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  const fp16_t* mp = w.min + p * groups * kPanelRows;
  alignas(32) float out[MR][16];
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(out[r], _mm256_setzero_ps());
    _mm256_store_ps(out[r] + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * w.group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * w.group) / 2;
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t t = t0; t < t1; ++t) {
      const W4Codes c = LoadW4Codes(q + t * kPanelRows);
      for (int r = 0; r < MR; ++r) {
        const __m256i a = BroadcastPair(xq + r * w.k + 2 * t);
        acc[r][0] = dot(acc[r][0], c.lo, a);
        acc[r][1] = dot(acc[r][1], c.hi, a);
      }
    }
    const __m256 s0 = LoadF16x8(sp + g * kPanelRows), s1 = LoadF16x8(sp + g * kPanelRows + 8);
    const __m256 m0 = LoadF16x8(mp + g * kPanelRows), m1 = LoadF16x8(mp + g * kPanelRows + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xscale = _mm256_set1_ps(xs[r * groups + g]);
      const __m256 xtotal = _mm256_set1_ps(xsum[r * groups + g]);
      const __m256 o0 = _mm256_fmadd_ps(m0, xtotal, _mm256_load_ps(out[r]));
      const __m256 o1 = _mm256_fmadd_ps(m1, xtotal, _mm256_load_ps(out[r] + 8));
      _mm256_store_ps(
          out[r], _mm256_fmadd_ps(_mm256_mul_ps(s0, xscale), _mm256_cvtepi32_ps(acc[r][0]), o0));
      _mm256_store_ps(out[r] + 8, _mm256_fmadd_ps(_mm256_mul_ps(s1, xscale),
                                                  _mm256_cvtepi32_ps(acc[r][1]), o1));
    }
  }
  for (int r = 0; r < MR; ++r) std::memcpy(y + r * ldy, out[r], cols * sizeof(float));
}

// Rows [0, MR) of the int16 activations (rows k apart) against one W8 panel:
// per group, the exact int32 dot products of 8 rows x 2 inputs per `dot`
// (each 32-byte step sign-extended as rows 0-7 and 8-15), then one scale. One
// accumulator per row and half: AVX2's vpaddd (latency 1) keeps it fed at any
// MR; AVX-VNNI's vpdpwssd (latency 5) needs several rows.
template <int MR, typename Dot>
inline void W8Tile(const PackedW8& w, int64_t p, const int16_t* xq, const float* xs, Dot dot,
                   float* y, int64_t ldy, int cols) {
  const int64_t groups = PackedW8Groups(w.k);
  const int8_t* q = w.q + p * w.k * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  __m256 out[MR][2];
  for (int r = 0; r < MR; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * kW8Group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * kW8Group) / 2;
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* step = q + t * 2 * kPanelRows;
      // 32 steps (1 KiB) ahead, once per 64-byte line; see kW4PrefetchSteps.
      if (t % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(step + 1024), _MM_HINT_T0);
      const __m256i lo =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
      const __m256i hi =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)));
      for (int r = 0; r < MR; ++r) {
        const __m256i a = BroadcastPair(xq + r * w.k + 2 * t);
        acc[r][0] = dot(acc[r][0], lo, a);
        acc[r][1] = dot(acc[r][1], hi, a);
      }
    }
    const __m256 s0 = LoadF16x8(sp + g * kPanelRows), s1 = LoadF16x8(sp + g * kPanelRows + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xscale = _mm256_set1_ps(xs[r * groups + g]);
      out[r][0] =
          _mm256_fmadd_ps(_mm256_mul_ps(s0, xscale), _mm256_cvtepi32_ps(acc[r][0]), out[r][0]);
      out[r][1] =
          _mm256_fmadd_ps(_mm256_mul_ps(s1, xscale), _mm256_cvtepi32_ps(acc[r][1]), out[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, out[r][0]);
    _mm256_store_ps(tmp + 8, out[r][1]);
    std::memcpy(y + r * ldy, tmp, cols * sizeof(float));
  }
}

// The int16 pair products of a and b added to acc, AVX2's way (vpmaddwd +
// vpaddd). A lambda, as every dot product these kernels take, so that each
// kernel is instantiated for it and inlines it.
constexpr auto kMaddDot = [](__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
};

// W4A16 on int16 activations for panels [p_begin, p_end): tiles of up to 4
// rows (the integer multiplies are the bottleneck, so few narrow tiles
// matter more than spills), a lone row (decode, or the last of a batch) on
// W4IntRow with kRowChains chains. The AVX2 and AVX-VNNI tables' GEMM.
template <int kRowChains, typename Dot>
inline void GemmW4PanelsInt16(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                              const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy,
                              Dot dot) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    float* yp = y + p * kPanelRows;
    ForRowTiles<4>(
        m,
        [&](int64_t r) {
          __m256 out0, out1;
          W4IntRow<kRowChains>(w, p, xq + r * w.k, xs + r * groups, xsum + r * groups, dot, &out0,
                               &out1);
          StoreRow256(yp + r * ldy, out0, out1, cols);
        },
        [&](auto rows, int64_t r) {
          W4IntTile<decltype(rows)::value>(w, p, xq + r * w.k, xs + r * groups, xsum + r * groups,
                                           dot, yp + r * ldy, ldy, cols);
        });
  }
}

// W8A16 on int16 activations for panels [p_begin, p_end): tiles of up to
// kMax rows on `dot`, a lone row on a one-row tile with `lone_dot` (a tile
// keeps one accumulator per half, so a lone row wants a dot product of short
// latency). The AVX2 and AVX-VNNI tables' GEMM.
template <int kMax, typename Dot, typename LoneDot>
inline void GemmW8PanelsInt16(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                              const float* xs, int64_t m, float* y, int64_t ldy, Dot dot,
                              LoneDot lone_dot) {
  const int64_t groups = PackedW8Groups(w.k);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    float* yp = y + p * kPanelRows;
    ForRowTiles<kMax>(
        m,
        [&](int64_t r) {
          W8Tile<1>(w, p, xq + r * w.k, xs + r * groups, lone_dot, yp + r * ldy, ldy, cols);
        },
        [&](auto rows, int64_t r) {
          W8Tile<decltype(rows)::value>(w, p, xq + r * w.k, xs + r * groups, dot, yp + r * ldy, ldy,
                                        cols);
        });
  }
}

}  // namespace
}  // namespace pdq::cpu
