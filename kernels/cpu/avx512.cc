// AVX-512 kernels (F, DQ, BW, VL and VNNI: Ice Lake, Zen 4 and later), and the
// AMX-INT8 W8A8 GEMM for CPUs with tiles (Sapphire Rapids and later).
// Compiled with those flags and reached only through the dispatch table when
// the CPU (and, for AMX, the OS) has them; nothing here may be called from a
// header-inline path.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/cpu/amx_config.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/int16_dots.h"
#include "kernels/cpu/isa.h"

namespace pdq::cpu {
namespace {

inline __m512 LoadF16x16(const fp16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 cached K or V elements as fp32: fp16, or bf16 (KvLayerView::bf16:
// the upper half of an fp32, widened and shifted).
template <bool kBf16>
inline __m512 LoadKv16(const fp16_t* p) {
  if constexpr (kBf16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  } else {
    return LoadF16x16(p);
  }
}

inline int32_t LoadQuad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc + the VNNI dot products of a and b, written as asm: GCC 12's
// intrinsics for these accumulate into a fresh register and copy it back (in
// the 6 x 4 W8A8 tile, 24 register copies and 24 stack stores a quad step;
// kernels_bench's W8A8 GEMM of 512 x 3072 x 576 ran at 0.38-0.42 of the int8
// peak on Zen 4, 0.92 with these). "+v" ties the accumulator, as the
// instruction does; {evex} keeps the AVX-512 encoding for 256-bit operands
// too (the VEX one is AVX-VNNI, which AVX-512 CPUs such as Zen 4 lack).
inline __m512i Dpbusd(__m512i acc, __m512i a_u8, __m512i b_s8) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a_u8), "vm"(b_s8));
  return acc;
}
inline __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("%{evex%} vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
}

// Stores the first `cols` floats of v (a panel row) at y.
inline void StoreCols(float* y, __m512 v, int cols) {
  if (cols == kPanelRows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << cols) - 1), v);
  }
}

// exp(x) to about 2 ulp for x in [-87, 88]; smaller x flush to 0 (the AVX2
// kernel's polynomial, 16 lanes).
inline __m512 Exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.3f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(~underflow, p, _mm512_castsi512_ps(e));
}

// ---- FP32 tiles over 16-row panels (FP16 weights, W4 with many rows) --------

// Rows [0, MR) of x against one fp16 panel, converting weights in registers
// (the few-row, decode case): one 16-wide load per input covers the panel.
template <int MR>
inline void PanelDirect(const float* x, int64_t ldx, const fp16_t* panel, int64_t k, float* y,
                        int64_t ldy, int cols) {
  constexpr int kChains = MR == 1 ? 4 : 1;  // independent sums hide the FMA latency
  __m512 acc[MR][kChains];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kChains; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + kChains <= k; kk += kChains) {
#pragma GCC unroll 4
    for (int c = 0; c < kChains; ++c) {
      const __m512 b = LoadF16x16(panel + (kk + c) * kPanelRows);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk + c]), b, acc[r][c]);
      }
    }
  }
  for (; kk < k; ++kk) {
    const __m512 b = LoadF16x16(panel + kk * kPanelRows);
    for (int r = 0; r < MR; ++r) {
      acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk]), b, acc[r][0]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    __m512 sum = acc[r][0];
    for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[r][c]);
    StoreCols(y + r * ldy, sum, cols);
  }
}

// An MR x (16 NP) register tile over fp32 k-blocks of NP panels (b: NP
// slices of kc x 16, `b_stride` floats apart); c rows are ldc floats apart.
// Two panels a tile halve the broadcasts per FMA (8 rows: 10 loads for 16
// FMAs), which is what bounds the one-panel tile.
template <int MR, int NP>
inline void Tile(const float* x, int64_t ldx, const float* b, int64_t b_stride, int64_t kc,
                 float* c, int64_t ldc, bool load_c) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NP; ++j) {
      acc[r][j] = load_c ? _mm512_loadu_ps(c + r * ldc + 16 * j) : _mm512_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m512 bv[NP];
    for (int j = 0; j < NP; ++j) bv[j] = _mm512_load_ps(b + j * b_stride + kk * 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + kk]);
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(a, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(c + r * ldc + 16 * j, acc[r][j]);
  }
}

// k-block: two 8 KiB fp32 panel slices stay in L1; a multiple of every W4
// group size (32, 64, 128), so a group never straddles two slices.
constexpr int64_t kKc = 128;
constexpr int kMr = 8;        // 8 x 2 accumulators, two weight vectors, broadcasts
constexpr int64_t kMc = 96;   // rows per accumulator block (12 KiB of c)

template <int NP>
void TileAny(int mr, const float* x, int64_t ldx, const float* b, int64_t b_stride, int64_t kc,
             float* c, int64_t ldc, bool load_c) {
  switch (mr) {
    case 8: Tile<8, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 7: Tile<7, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 6: Tile<6, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 5: Tile<5, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 4: Tile<4, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 3: Tile<3, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    case 2: Tile<2, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
    default: Tile<1, NP>(x, ldx, b, b_stride, kc, c, ldc, load_c); break;
  }
}

// Blocked GEMM for many rows over panels [p_begin, p_end), as in the AVX2
// kernel but two panels at a time: a block of x rows stays in L2 while every
// panel pair passes; each pair's fp32 k-slices, made by fill(p, k0, kc, b),
// sit in L1 while the 8 x 32 tiles accumulate into a small local C block.
template <typename FillB>
void BlockedGemm(int64_t n, int64_t k, int64_t p_begin, int64_t p_end, const float* x,
                 int64_t m, int64_t ldx, float* y, int64_t ldy, const FillB& fill) {
  constexpr int64_t kSlice = kKc * kPanelRows;
  alignas(64) float b[2 * kSlice];
  alignas(64) float c[kMc * 2 * kPanelRows];
  const int64_t rows_in_l2 = std::max<int64_t>(kMr, (256 << 10) / (4 * k) / kMr * kMr);
  const int64_t block = std::min(kMc, rows_in_l2);
  for (int64_t m0 = 0; m0 < m; m0 += block) {
    const int64_t mc = std::min(block, m - m0);
    for (int64_t p = p_begin; p < p_end; p += 2) {
      const int np = (int)std::min<int64_t>(2, p_end - p);
      const int64_t ldc = np * kPanelRows;
      for (int64_t k0 = 0; k0 < k; k0 += kKc) {
        const int64_t kc = std::min(kKc, k - k0);
        for (int j = 0; j < np; ++j) fill(p + j, k0, kc, b + j * kSlice);
        for (int64_t r = 0; r < mc; r += kMr) {
          const int mr = (int)std::min<int64_t>(kMr, mc - r);
          const float* xr = x + (m0 + r) * ldx + k0;
          if (np == 2) {
            TileAny<2>(mr, xr, ldx, b, kSlice, kc, c + r * ldc, ldc, k0 != 0);
          } else {
            TileAny<1>(mr, xr, ldx, b, kSlice, kc, c + r * ldc, ldc, k0 != 0);
          }
        }
      }
      const int cols = (int)std::min<int64_t>(ldc, n - p * kPanelRows);
      for (int64_t r = 0; r < mc; ++r) {
        std::memcpy(y + (m0 + r) * ldy + p * kPanelRows, c + r * ldc, cols * sizeof(float));
      }
    }
  }
}

// Calls tile(std::integral_constant<int, MR>{}, r) over rows [0, m): tiles
// of kMax rows, then one of the rows left.
template <int kMax, typename Tile>
inline void ForEachTile(int64_t m, const Tile& tile) {
  int64_t r = 0;
  for (; r + kMax <= m; r += kMax) tile(std::integral_constant<int, kMax>{}, r);
  const int64_t left = m - r;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((left == I + 1 ? tile(std::integral_constant<int, I + 1>{}, r) : void()), ...);
  }
  (std::make_integer_sequence<int, kMax - 1>{});
}

// Rows [0, MR) of x against NP fp16 panels (`panel`, w.k x 16 each, one
// after the other), converting the weights in registers over the whole k:
// for a decode batch of a few rows the weights stream from memory while the
// FMAs run, with no fp32 copy of them to make first (the blocked GEMM's
// fill, which waited on memory: 36% of a batch-8 decode's samples in perf).
// Each output sums over k in order on one chain, as the other paths do, so
// a row's bits do not depend on the path.
template <int MR, int NP>
inline void PanelsF16(const float* x, int64_t ldx, const fp16_t* panel, int64_t k, float* y,
                      int64_t ldy, int cols) {
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 bv[NP];
    for (int j = 0; j < NP; ++j) bv[j] = LoadF16x16(panel + (j * k + kk) * kPanelRows);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + kk]);
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(a, bv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NP; ++j) {
      const int c = std::min(cols - 16 * j, (int)kPanelRows);
      if (c > 0) StoreCols(y + r * ldy + 16 * j, acc[r][j], c);
    }
  }
}

constexpr int64_t kStreamRows = 32;  // the most rows PanelsF16 takes

void GemmF16PanelsAvx512(const PackedF16& w, int64_t p_begin, int64_t p_end, const float* x,
                         int64_t m, int64_t ldx, float* y, int64_t ldy) {
  // 5 to 32 rows stream the weights (PanelsF16); measured on Zen 4 against
  // the blocked GEMM below, FP16 decode at batch 8 / 16 / 24 / 32: +52% /
  // +29% / +19% / +13% tokens/s, at 64 the same (bench/RESULTS.md).
  if (m > 4 && m <= kStreamRows) {
    for (int64_t p = p_begin; p < p_end; p += 2) {
      const int np = (int)std::min<int64_t>(2, p_end - p);
      const fp16_t* panel = w.data + p * w.k * kPanelRows;
      const int cols = (int)std::min<int64_t>(np * kPanelRows, w.n - p * kPanelRows);
      float* yp = y + p * kPanelRows;
      ForEachTile<8>(m, [&](auto mr, int64_t r) {
        if (np == 2) {
          PanelsF16<mr, 2>(x + r * ldx, ldx, panel, w.k, yp + r * ldy, ldy, cols);
        } else {
          PanelsF16<mr, 1>(x + r * ldx, ldx, panel, w.k, yp + r * ldy, ldy, cols);
        }
      });
    }
    return;
  }
  if (m <= 4) {
    for (int64_t p = p_begin; p < p_end; ++p) {
      const fp16_t* panel = w.data + p * w.k * kPanelRows;
      const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
      float* yp = y + p * kPanelRows;
      switch (m) {
        case 1: PanelDirect<1>(x, ldx, panel, w.k, yp, ldy, cols); break;
        case 2: PanelDirect<2>(x, ldx, panel, w.k, yp, ldy, cols); break;
        case 3: PanelDirect<3>(x, ldx, panel, w.k, yp, ldy, cols); break;
        default: PanelDirect<4>(x, ldx, panel, w.k, yp, ldy, cols); break;
      }
    }
    return;
  }
  BlockedGemm(w.n, w.k, p_begin, p_end, x, m, ldx, y, ldy,
              [&](int64_t p, int64_t k0, int64_t kc, float* b) {
                const fp16_t* src = w.data + (p * w.k + k0) * kPanelRows;
                for (int64_t i = 0; i < kc * kPanelRows; i += 16) {
                  _mm512_store_ps(b + i, LoadF16x16(src + i));
                }
              });
}

// ---- W4A16 --------------------------------------------------------------------

// A panel's codes for W4A8's vpdpbusd (LoadW4Codes4, below): int32 lane
// 2i + h of `lo` holds panel row i's codes, of `hi` row 8 + i's, so each
// row's sum is split over two lanes (FoldRows).
struct W4Codes2 {
  __m512i lo, hi;
};

// Sums the two lanes of each row (2i, 2i + 1) of lo (rows 0-7) and hi (rows
// 8-15) into one int32 per panel row.
inline __m512i FoldRows(__m512i lo, __m512i hi) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_epi32(_mm512_add_epi32(lo, _mm512_srli_epi64(lo, 32)), even,
                                   _mm512_add_epi32(hi, _mm512_srli_epi64(hi, 32)));
}

// One group's share of a row's 16 outputs: min * xsum + (scale * xs) * dot,
// with dot folded from lo (rows 0-7) and hi (rows 8-15); as the reference
// sums it, in fused steps.
inline __m512 AddGroup(__m512 out, __m512 scale, __m512 min, __m512i lo, __m512i hi, float xs,
                       float xsum) {
  const __m512 dot = _mm512_cvtepi32_ps(FoldRows(lo, hi));
  out = _mm512_fmadd_ps(min, _mm512_set1_ps(xsum), out);
  return _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(xs)), dot, out);
}

// One panel of a PackedW4: its codes, and per group the input pairs it
// spans and its 16 scales and mins.
struct W4Panel {
  W4Panel(const PackedW4& w, int64_t p)
      : w(w),
        groups(PackedW4Groups(w.k, w.group)),
        q(w.q + p * (w.k / 2) * kPanelRows),
        scale(w.scale + p * groups * kPanelRows),
        min(w.min + p * groups * kPanelRows) {}
  int64_t PairsBegin(int64_t g) const { return g * w.group / 2; }
  int64_t PairsEnd(int64_t g) const { return std::min<int64_t>(w.k, (g + 1) * w.group) / 2; }
  __m512 Scale(int64_t g) const { return LoadF16x16(scale + g * kPanelRows); }
  __m512 Min(int64_t g) const { return LoadF16x16(min + g * kPanelRows); }
  const PackedW4& w;
  int64_t groups;
  const uint8_t* q;
  const fp16_t* scale;
  const fp16_t* min;
};

// Rows [0, MR) of W4A8's Int8Rows (below) against one panel: per group the
// rows' exact int32 sums, then one scale per group.
template <int MR, typename Rows>
void W4Tile(const PackedW4& w, int64_t p, const Rows& rows, const float* xs, const float* xsum,
            float* y, int64_t ldy, int cols) {
  const W4Panel panel(w, p);
  const int64_t groups = panel.groups;
  __m512 out[MR];
  for (int r = 0; r < MR; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i lo[MR], hi[MR];
    for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    rows.template Accumulate<MR>(panel.q, panel.PairsBegin(g), panel.PairsEnd(g), lo, hi);
    const __m512 s = panel.Scale(g), mn = panel.Min(g);
    for (int r = 0; r < MR; ++r) {
      out[r] = AddGroup(out[r], s, mn, lo[r], hi[r], xs[r * groups + g], xsum[r * groups + g]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreCols(y + r * ldy, out[r], cols);
}

// One input pair t of a panel (16 bytes at q + 16t; see PackedW4) as the 16
// rows' two codes in int16, panel row i in int32 lane i: the 16 bytes
// widened twice over, the upper copy shifted to its high nibbles. A 32-bit
// broadcast of an activation row's pair then meets every panel row in one
// vpdpwssd, and the sums need no folding across lanes.
inline __m512i LoadW4Pair(const uint8_t* p) {
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m256i b =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_and_si512(_mm512_srlv_epi16(_mm512_cvtepu8_epi16(b), shifts),
                          _mm512_set1_epi16(0x0f));
}

// W4A16's int16 activation rows [0, MR) (`stride` values apart) against one
// panel: per group, exact int32 dot products with vpdpwssd (one input pair of
// 16 panel rows an instruction, as the W8 tile's), then the group's scale and
// min as the reference applies them. Up to 12 rows: 12 sums and 12 outputs in
// registers. (The tile this replaced paired two input pairs in alternate
// lanes: 8 rows, and a fold across lanes per row and group that cost about a
// third of its instructions at groups of 32.)
template <int MR>
void W4PairTile(const PackedW4& w, int64_t p, const int16_t* x, int64_t stride, const float* xs,
                const float* xsum, float* y, int64_t ldy, int cols) {
  const W4Panel panel(w, p);
  const int64_t groups = panel.groups;
  const uint8_t* q = panel.q;
  __m512 out[MR];
  for (int r = 0; r < MR; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    for (int64_t t = panel.PairsBegin(g); t < panel.PairsEnd(g); ++t) {
      // A 64-byte line (4 pairs) 32 pairs ahead, as the W8 tile's.
      if ((t & 3) == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(q + (t + 32) * kPanelRows), _MM_HINT_T0);
      }
      const __m512i c = LoadW4Pair(q + t * kPanelRows);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * stride + 2 * t, 4);
        acc[r] = Dpwssd(acc[r], c, _mm512_set1_epi32(pair));
      }
    }
    const __m512 s = panel.Scale(g), mn = panel.Min(g);
    for (int r = 0; r < MR; ++r) {
      out[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[r * groups + g]), out[r]);
      out[r] = _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(xs[r * groups + g])),
                               _mm512_cvtepi32_ps(acc[r]), out[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreCols(y + r * ldy, out[r], cols);
}

// Calls tile(std::integral_constant<int, MR>{}, r) over rows [0, m) in the
// fewest tiles of at most kMax rows, their sizes as even as can be (16 rows
// at kMax 12: 8 + 8, not 12 + 4).
template <int kMax, typename Tile>
inline void ForEvenTiles(int64_t m, const Tile& tile) {
  const int64_t tiles = (m + kMax - 1) / kMax;
  int64_t r = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t rows = m / tiles + (i < m % tiles ? 1 : 0);
    [&]<int... I>(std::integer_sequence<int, I...>) {
      ((rows == I + 1 ? tile(std::integral_constant<int, I + 1>{}, r) : void()), ...);
    }
    (std::make_integer_sequence<int, kMax>{});
    r += rows;
  }
}

inline __m256i Dpwssd256(__m256i acc, __m256i a, __m256i b) {
  asm("%{evex%} vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
}

// One activation row (decode) against one panel in 256-bit registers
// (kernels/cpu/int16_dots.h, with AVX-512 VL's vpdpwssd): W4PairTile<1>'s sums and
// rounding in the AVX2 kernel's layout (input pair t: 16 bytes widened to
// rows 0-7's and rows 8-15's pairs, no permute), on four independent pairs
// of accumulators, since one pair's chain (latency 5, one step per input
// pair) would bound a group of 32 inputs at 80 cycles. A 512-bit row kernel
// (two input pairs widened and permuted across lanes per step) was slower
// than the AVX2 kernel on Zen 4, which executes 512-bit operations as two
// 256-bit halves: kernels_bench's 3072 x 576 GEMV 23.4 us against 21.1;
// this one 15.4-16.1 us (AVX2's 22.4-23.9 in the same run). Not measured on
// an Intel CPU.
void W4IntRowAvx512(const PackedW4& w, int64_t p, const int16_t* xq, const float* xs,
                    const float* xsum, float* y, int cols) {
  __m256 out0, out1;
  W4IntRow<4>(
      w, p, xq, xs, xsum, [](__m256i acc, __m256i a, __m256i b) { return Dpwssd256(acc, a, b); },
      &out0, &out1);
  StoreCols(y, _mm512_insertf32x8(_mm512_castps256_ps512(out0), out1, 1), cols);
}

void GemmW4PanelsAvx512(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                        const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    float* yp = y + p * kPanelRows;
    // Tiles of up to 12 rows; a single row (decode) on W4IntRowAvx512.
    ForEvenTiles<12>(m, [&](auto mr, int64_t r) {
      if constexpr (decltype(mr)::value == 1) {
        W4IntRowAvx512(w, p, xq + r * w.k, xs + r * groups, xsum + r * groups, yp + r * ldy, cols);
      } else {
        W4PairTile<decltype(mr)::value>(w, p, xq + r * w.k, w.k, xs + r * groups, xsum + r * groups,
                                        yp + r * ldy, ldy, cols);
      }
    });
  }
}

// ---- W8A16: int8 weight groups, int16 activations ----------------------------

// One input pair of a W8 panel (32 bytes): 16 rows' two weights as int16.
inline __m512i LoadW8Step(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Rows [0, MR) of the int16 activations (rows k apart) against one W8 panel:
// per group, exact int32 sums with vpdpwssd (16 rows x 2 inputs each), on C
// independent chains per row, since one chain (latency 5, one step per input
// pair) would bound a single row's group of 32 inputs at 80 cycles instead of
// the 16 its loads need; then one scale per group.
template <int MR, int C>
void W8Tile512(const PackedW8& w, int64_t p, const int16_t* xq, const float* xs, float* y,
               int64_t ldy, int cols) {
  const int64_t groups = PackedW8Groups(w.k);
  const int8_t* q = w.q + p * w.k * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  __m512 out[MR];
  for (int r = 0; r < MR; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * kW8Group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * kW8Group) / 2;
    __m512i acc[MR][C];
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
    }
    auto step = [&](int64_t t, int c) {
      const __m512i wv = LoadW8Step(q + t * 2 * kPanelRows);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        int32_t pair;
        std::memcpy(&pair, xq + r * w.k + 2 * t, 4);
        acc[r][c] = Dpwssd(acc[r][c], wv, _mm512_set1_epi32(pair));
      }
    };
    int64_t t = t0;
    for (; t + C <= t1; t += C) {
      // 32 steps (1 KiB) ahead, a 64-byte line per two steps; see
      // kW4PrefetchSteps.
      for (int c = 0; c < C; c += 2) {
        _mm_prefetch(reinterpret_cast<const char*>(q + (t + c + 32) * 2 * kPanelRows), _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) step(t + c, c);
    }
    for (int c = 0; t < t1; ++t, ++c) step(t, c);  // fewer than C steps left
    const __m512 s = LoadF16x16(sp + g * kPanelRows);
    for (int r = 0; r < MR; ++r) {
      __m512i sum = acc[r][0];
      for (int c = 1; c < C; ++c) sum = _mm512_add_epi32(sum, acc[r][c]);
      out[r] = _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(xs[r * groups + g])),
                               _mm512_cvtepi32_ps(sum), out[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreCols(y + r * ldy, out[r], cols);
}

void GemmW8PanelsAvx512(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                        const float* xs, int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW8Groups(w.k);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    float* yp = y + p * kPanelRows;
    // Tiles of 8 rows (one weight load feeds 8 vpdpwssd); fewer rows take
    // more chains each.
    ForEachTile<8>(m, [&](auto mr, int64_t r) {
      constexpr int kMr = decltype(mr)::value;
      constexpr int kChains = kMr == 1 ? 4 : kMr <= 4 ? 2 : 1;
      W8Tile512<kMr, kChains>(w, p, xq + r * w.k, xs + r * groups, yp + r * ldy, ldy, cols);
    });
  }
}

// ---- W4A8 (batched decode): int8 activations, vpdpbusd ------------------------

// Four input pairs of a panel (64 bytes; fewer zero the rest), permuted so
// that int32 lane 2i + h holds row i's codes for inputs 2t + 4h .. 2t + 4h + 3
// as bytes: `lo` rows 0-7, `hi` rows 8-15, each ready for vpdpbusd against
// an 8-byte broadcast of x[2t .. 2t + 8).
inline W4Codes2 LoadW4Codes4(const uint8_t* p, int pairs) {
  // Output word 4i + 2h + j takes input pair 2h + j's word i.
  alignas(64) static constexpr int16_t kIdx[32] = {
      0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
      4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};
  const __m512i idx = _mm512_load_si512(kIdx);
  const __m512i raw = pairs == 4 ? _mm512_loadu_si512(p)
                                 : _mm512_maskz_loadu_epi8((__mmask64)((1ull << (16 * pairs)) - 1), p);
  const __m512i v = _mm512_permutexvar_epi16(idx, raw);
  const __m512i mask = _mm512_set1_epi8(0x0f);
  return {_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask)};
}

// W4A8's int8 activation rows (`stride` bytes apart, W4A8RowBytes): four
// input pairs a pair of vpdpbusd; the sums W4Tile scales as Int16Rows'.
struct Int8Rows {
  const int8_t* x;
  int64_t stride;
  Int8Rows At(int64_t r) const { return {x + r * stride, stride}; }
  template <int MR>
  void Accumulate(const uint8_t* q, int64_t t0, int64_t t1, __m512i* lo, __m512i* hi) const {
    for (int64_t t = t0; t < t1; t += 4) {
      const W4Codes2 c = LoadW4Codes4(q + t * kPanelRows, (int)std::min<int64_t>(4, t1 - t));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        int64_t x8;  // within the row's padding: 2t is a multiple of 8
        std::memcpy(&x8, x + r * stride + 2 * t, 8);
        const __m512i a = _mm512_set1_epi64(x8);
        lo[r] = Dpbusd(lo[r], c.lo, a);
        hi[r] = Dpbusd(hi[r], c.hi, a);
      }
    }
  }
};

void GemmW4A8PanelsAvx512(const PackedW4& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                          const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const Int8Rows rows{xq, W4A8RowBytes(w.k)};
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    float* yp = y + p * kPanelRows;
    ForEachTile<8>(m, [&](auto mr, int64_t r) {
      W4Tile<decltype(mr)::value>(w, p, rows.At(r), xs + r * groups, xsum + r * groups,
                                  yp + r * ldy, ldy, cols);
    });
  }
}

// Per group of `group` inputs: codes of x * (kMax / absmax) rounded to
// nearest even (vcvtps2dq, as the reference's nearbyint), the group's scale
// and scale * the exact sum of its codes. kMax 32767 writes int16 (W4A16),
// 127 int8 (W4A8, zero-padded to W4A8RowBytes).
template <typename T>
void QuantizeRowGroups(const float* x, int64_t k, int group, T* q, float* scale, float* sum) {
  constexpr float kMax = sizeof(T) == 1 ? 127.0f : 32767.0f;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t g = 0; g * group < k; ++g) {
    const int64_t k0 = g * group, k1 = std::min<int64_t>(k, k0 + group);
    __m512 vmax = _mm512_setzero_ps();
    int64_t i = k0;
    for (; i + 16 <= k1; i += 16) vmax = _mm512_max_ps(vmax, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)));
    float absmax = _mm512_reduce_max_ps(vmax);
    for (; i < k1; ++i) absmax = std::max(absmax, std::abs(x[i]));
    const float inv = absmax > 0.0f ? kMax / absmax : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    __m512i total = _mm512_setzero_si512();
    for (i = k0; i + 16 <= k1; i += 16) {
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
      total = _mm512_add_epi32(total, v);
      if constexpr (sizeof(T) == 1) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtsepi32_epi8(v));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm512_cvtsepi32_epi16(v));
      }
    }
    int32_t acc = _mm512_reduce_add_epi32(total);
    for (; i < k1; ++i) {
      q[i] = (T)std::nearbyint(x[i] * inv);
      acc += q[i];
    }
    scale[g] = absmax / kMax;
    sum[g] = scale[g] * (float)acc;
  }
  if constexpr (sizeof(T) == 1) {
    for (int64_t i = k; i < W4A8RowBytes(k); ++i) q[i] = 0;
  }
}

// The many-row path dequantizes each panel k-slice to fp32 once per row
// block: nibbles become fp16 1024 + q by OR-ing in the exponent byte 0x64,
// and vcvtph2ps turns 16 of them into floats (bias = min - 1024 * scale).
void GemmW4PanelsF32Avx512(const PackedW4& w, int64_t p_begin, int64_t p_end, const float* x,
                           int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const __m512 k1024 = _mm512_set1_ps(1024.0f);
  // Bytes 2i + e -> input e: [rows 0-7 of input 2t | rows 8-15 of 2t] from the
  // low and high nibbles, then the same for input 2t + 1.
  const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i mask = _mm_set1_epi8(0x0f), magic = _mm_set1_epi8(0x64);
  BlockedGemm(w.n, w.k, p_begin, p_end, x, m, ldx, y, ldy,
              [&](int64_t p, int64_t k0, int64_t kc, float* b) {
                const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
                const fp16_t* sp = w.scale + p * groups * kPanelRows;
                const fp16_t* mp = w.min + p * groups * kPanelRows;
                for (int64_t g0 = k0; g0 < k0 + kc; g0 += w.group) {
                  const int64_t g = g0 / w.group, g1 = std::min<int64_t>(k0 + kc, g0 + w.group);
                  const __m512 s = LoadF16x16(sp + g * kPanelRows);
                  const __m512 bias = _mm512_fnmadd_ps(k1024, s, LoadF16x16(mp + g * kPanelRows));
                  for (int64_t t = g0 / 2; t < g1 / 2; ++t) {
                    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + t * kPanelRows));
                    const __m128i lo = _mm_and_si128(v, mask);
                    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                    // 16 codes of one input (rows 0-15) as bytes, then fp16 1024 + q.
                    const __m128i e = _mm_unpacklo_epi64(_mm_shuffle_epi8(lo, even), _mm_shuffle_epi8(hi, even));
                    const __m128i o = _mm_unpacklo_epi64(_mm_shuffle_epi8(lo, odd), _mm_shuffle_epi8(hi, odd));
                    const __m256i eh = _mm256_set_m128i(_mm_unpackhi_epi8(e, magic), _mm_unpacklo_epi8(e, magic));
                    const __m256i oh = _mm256_set_m128i(_mm_unpackhi_epi8(o, magic), _mm_unpacklo_epi8(o, magic));
                    float* dst = b + (2 * t - k0) * kPanelRows;
                    _mm512_store_ps(dst, _mm512_fmadd_ps(s, _mm512_cvtph_ps(eh), bias));
                    _mm512_store_ps(dst + 16, _mm512_fmadd_ps(s, _mm512_cvtph_ps(oh), bias));
                  }
                }
              });
}

// ---- W8A8 ---------------------------------------------------------------------

// vpdpbusd multiplies unsigned by signed bytes. The activations are signed,
// so each is offset by 128 (x ^ 0x80 as an unsigned byte) and the offset's
// share, 128 * the sum of each weight row, is subtracted: exact in int32. A
// panel's quad step is one 64-byte vector (16 rows x 4 inputs).
inline __m512i PanelQuads(const int8_t* panel, int64_t t) {
  return _mm512_loadu_si512(panel + t * 64);
}

// 128 * sum of each panel row over quads [t0, t1).
inline __m512i OffsetShare(const int8_t* panel, int64_t t0, int64_t t1) {
  const __m512i k128 = _mm512_set1_epi8((char)0x80);
  __m512i acc = _mm512_setzero_si512();
  for (int64_t t = t0; t < t1; ++t) acc = Dpbusd(acc, k128, PanelQuads(panel, t));
  return acc;
}

// y = (float)dot * xs * ws in the reference's order, for one output row.
inline void StoreI8(float* y, __m512i dot, float xs, __m512 ws, int cols) {
  StoreCols(y, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs)), ws), cols);
}

// MR activation rows against NP consecutive panels: MR * NP accumulators,
// one weight vector per panel and one broadcast per row each quad step.
template <int MR, int NP>
void I8VnniTile(const int8_t* panel0, int64_t panel_bytes, int64_t k4, const int8_t* xq,
                int64_t row_bytes, const float* xs, const __m512i* offset, const __m512* ws,
                float* y, int64_t ldy, const int* cols) {
  __m512i acc[MR][NP];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_si512();
  }
  const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
  for (int64_t t = 0; t < k4; ++t) {
    __m512i wv[NP];
    for (int j = 0; j < NP; ++j) wv[j] = PanelQuads(panel0 + j * panel_bytes, t);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_xor_si512(_mm512_set1_epi32(LoadQuad(xq + r * row_bytes + 4 * t)), flip);
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) acc[r][j] = Dpbusd(acc[r][j], a, wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      StoreI8(y + r * ldy + j * kPanelRows, _mm512_sub_epi32(acc[r][j], offset[j]), xs[r], ws[j],
              cols[j]);
    }
  }
}

template <int MR>
void I8VnniTileNp(int np, const int8_t* panel0, int64_t panel_bytes, int64_t k4, const int8_t* xq,
                  int64_t row_bytes, const float* xs, const __m512i* offset, const __m512* ws,
                  float* y, int64_t ldy, const int* cols) {
  switch (np) {
    case 4: I8VnniTile<MR, 4>(panel0, panel_bytes, k4, xq, row_bytes, xs, offset, ws, y, ldy, cols); break;
    case 3: I8VnniTile<MR, 3>(panel0, panel_bytes, k4, xq, row_bytes, xs, offset, ws, y, ldy, cols); break;
    case 2: I8VnniTile<MR, 2>(panel0, panel_bytes, k4, xq, row_bytes, xs, offset, ws, y, ldy, cols); break;
    default: I8VnniTile<MR, 1>(panel0, panel_bytes, k4, xq, row_bytes, xs, offset, ws, y, ldy, cols); break;
  }
}

// The weight scales of panel p (zero past n: padding rows have no scale).
inline __m512 PanelScales(const PackedI8& w, int64_t p, int* cols) {
  *cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
  return _mm512_maskz_loadu_ps((__mmask16)((1u << *cols) - 1), w.scale + p * kPanelRows);
}

constexpr int kI8Mr = 6, kI8Np = 4;  // 24 accumulators

// Rows [r_begin, r_end) against panels [p_begin, p_end) with VNNI.
void GemmI8Vnni(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                const float* xs, int64_t r_begin, int64_t r_end, float* y, int64_t ldy) {
  const int64_t k4 = PackedI8K4(w.k), row_bytes = k4 * 4, panel_bytes = k4 * 64;
  const int64_t block = std::max<int64_t>(kI8Mr, (256 << 10) / row_bytes / kI8Mr * kI8Mr);
  for (int64_t m0 = r_begin; m0 < r_end; m0 += block) {
    const int64_t mc = std::min(block, r_end - m0);
    for (int64_t p = p_begin; p < p_end; p += kI8Np) {
      const int np = (int)std::min<int64_t>(kI8Np, p_end - p);
      const int8_t* panel0 = w.q + p * panel_bytes;
      __m512i offset[kI8Np];
      __m512 ws[kI8Np];
      int cols[kI8Np];
      for (int j = 0; j < np; ++j) {
        offset[j] = OffsetShare(panel0 + j * panel_bytes, 0, k4);
        ws[j] = PanelScales(w, p + j, &cols[j]);
      }
      for (int64_t r = m0; r < m0 + mc;) {
        const int64_t left = m0 + mc - r;
        const int8_t* a = xq + r * row_bytes;
        float* yr = y + r * ldy + p * kPanelRows;
        const int mr = (int)std::min<int64_t>(kI8Mr, left);
        switch (mr) {
          case 6: I8VnniTileNp<6>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 5: I8VnniTileNp<5>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 4: I8VnniTileNp<4>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 3: I8VnniTileNp<3>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 2: I8VnniTileNp<2>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          default: I8VnniTileNp<1>(np, panel0, panel_bytes, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
        }
        r += mr;
      }
    }
  }
}

void GemmI8PanelsAvx512(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                        const float* xs, int64_t m, float* y, int64_t ldy) {
  GemmI8Vnni(w, p_begin, p_end, xq, xs, 0, m, y, ldy);
}

// AMX: tiles of 16 rows x 64 bytes. The panel layout is already AMX's
// "VNNI" B layout: 16 consecutive quad steps of a panel (1 KiB, rows 64 bytes
// apart) are one B tile of 64 inputs x 16 outputs. A tiles are 16
// activation rows x 64 inputs, read in place from the quantized rows.
// tdpbssd multiplies signed by signed bytes, so no offset is needed.
// Tiles 0-3 accumulate C (2 row tiles x 2 panels), 4-5 hold A, 6-7 B
// (FullAmxTiles).

// What the epilogue of one panel needs, the same for every row block: the
// panel, its weight scales and, for the inputs past the last whole 64, the
// offset share of VNNI's unsigned activations.
struct AmxPanel {
  const int8_t* q = nullptr;
  __m512 scales = _mm512_setzero_ps();
  __m512i offset = _mm512_setzero_si512();
  int cols = 0;
};
inline AmxPanel PrepareAmxPanel(const PackedI8& w, int64_t p, int64_t full_quads) {
  AmxPanel panel;
  const int64_t k4 = PackedI8K4(w.k);
  panel.q = w.q + p * k4 * 64;
  panel.scales = PanelScales(w, p, &panel.cols);
  panel.offset = OffsetShare(panel.q, full_quads, k4);
  return panel;
}

// 16 x 16 int32 C tiles, plus inputs past the last full 64 (AMX covers
// whole tiles; the rest, under 64 inputs, runs on VNNI), scaled and stored
// at y (the panel's first column).
void FinishAmxBlock(const int32_t* c, const AmxPanel& panel, int64_t full_quads, int64_t k4,
                    const int8_t* xq, int64_t row_bytes, const float* xs, float* y, int64_t ldy) {
  const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
  for (int r = 0; r < 16; ++r) {
    __m512i acc = _mm512_load_si512(c + r * 16);
    if (full_quads < k4) {
      for (int64_t t = full_quads; t < k4; ++t) {
        const __m512i a = _mm512_xor_si512(_mm512_set1_epi32(LoadQuad(xq + r * row_bytes + 4 * t)), flip);
        acc = Dpbusd(acc, a, PanelQuads(panel.q, t));
      }
      acc = _mm512_sub_epi32(acc, panel.offset);
    }
    StoreI8(y + r * ldy, acc, xs[r], panel.scales, panel.cols);
  }
}

__attribute__((target("amx-tile,amx-int8"))) void GemmI8PanelsAmx(
    const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq, const float* xs,
    int64_t m, float* y, int64_t ldy) {
  const int64_t k4 = PackedI8K4(w.k), row_bytes = k4 * 4, panel_bytes = k4 * 64;
  const int64_t ktiles = k4 / 16, full_quads = ktiles * 16;
  const int64_t m16 = m / 16 * 16;
  if (ktiles == 0 || m16 == 0) {  // nothing fills a tile: VNNI for all of it
    GemmI8Vnni(w, p_begin, p_end, xq, xs, 0, m, y, ldy);
    return;
  }
  const AmxTileConfig cfg = FullAmxTiles();
  _tile_loadconfig(&cfg);
  alignas(64) int32_t c[4][256];
  // Row blocks of about 256 KiB of activations stay in L2 while the panels
  // pass; each pair of panels (2 x 16 outputs) meets the block 32 rows at a
  // time, all k in the tiles.
  const int64_t block = std::max<int64_t>(32, (256 << 10) / row_bytes / 32 * 32);
  for (int64_t m0 = 0; m0 < m16; m0 += block) {
    const int64_t m1 = std::min(m16, m0 + block);
    for (int64_t p = p_begin; p < p_end; p += 2) {
      const bool two_panels = p + 1 < p_end;
      const AmxPanel panels[2] = {PrepareAmxPanel(w, p, full_quads),
                                  two_panels ? PrepareAmxPanel(w, p + 1, full_quads) : AmxPanel{}};
      const int8_t* b0 = panels[0].q;
      const int8_t* b1 = b0 + panel_bytes;
      // C tile `c` of panel j for the 16 rows from `row`, finished.
      auto finish = [&](const int32_t* c, int j, int64_t row) {
        FinishAmxBlock(c, panels[j], full_quads, k4, xq + row * row_bytes, row_bytes, xs + row,
                       y + row * ldy + (p + j) * kPanelRows, ldy);
      };
      for (int64_t r = m0; r < m1; r += 32) {
        const bool two_rows = r + 16 < m1;
        const int8_t* a0 = xq + r * row_bytes;
        const int8_t* a1 = a0 + 16 * row_bytes;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kt = 0; kt < ktiles; ++kt) {
          _tile_loadd(4, a0 + kt * 64, row_bytes);
          _tile_loadd(6, b0 + kt * 1024, 64);
          _tile_dpbssd(0, 4, 6);
          if (two_panels) {
            _tile_loadd(7, b1 + kt * 1024, 64);
            _tile_dpbssd(1, 4, 7);
          }
          if (two_rows) {
            _tile_loadd(5, a1 + kt * 64, row_bytes);
            _tile_dpbssd(2, 5, 6);
            if (two_panels) _tile_dpbssd(3, 5, 7);
          }
        }
        _tile_stored(0, c[0], 64);
        finish(c[0], 0, r);
        if (two_panels) {
          _tile_stored(1, c[1], 64);
          finish(c[1], 1, r);
        }
        if (two_rows) {
          _tile_stored(2, c[2], 64);
          finish(c[2], 0, r + 16);
          if (two_panels) {
            _tile_stored(3, c[3], 64);
            finish(c[3], 1, r + 16);
          }
        }
      }
    }
  }
  _tile_release();
  if (m16 < m) GemmI8Vnni(w, p_begin, p_end, xq, xs, m16, m, y, ldy);
}

// ---- W4A16 on AMX-BF16 (batched decode, prefill) ------------------------------

// Steps (input pairs) of one panel the bf16 GEMM dequantizes at once: k up to
// 4096 (larger k takes the other paths). Two panels of them are 256 KiB of
// the calling thread's stack (pdq's threads have the default 8 MiB).
constexpr int64_t kBf16MaxSteps = kBf16MaxK / 2;

// Panel p's codes as bf16 B tiles: step t (16 outputs x inputs 2t, 2t + 1,
// the pairs tdpbf16ps reads per B row) becomes the 64 bytes at dst + 32 t,
// scale * q + min fused and rounded to nearest even; steps past k / 2 up
// to whole tiles are zero. The low nibbles of a step's 16 bytes are rows
// 0-7's pairs and the high ones rows 8-15's, already in B-row order.
__attribute__((target("avx512bf16"))) void DequantizeW4PanelBf16(const PackedW4& w, int64_t p,
                                                                  uint16_t* dst) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  const fp16_t* mp = w.min + p * groups * kPanelRows;
  const __m512i lo_rows = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i hi_rows = _mm512_add_epi32(lo_rows, _mm512_set1_epi32(8));
  const __m512i nibble = _mm512_set1_epi32(0xf);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * w.group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * w.group) / 2;
    const __m512 s = LoadF16x16(sp + g * kPanelRows), mn = LoadF16x16(mp + g * kPanelRows);
    const __m512 s_lo = _mm512_permutexvar_ps(lo_rows, s), s_hi = _mm512_permutexvar_ps(hi_rows, s);
    const __m512 m_lo = _mm512_permutexvar_ps(lo_rows, mn), m_hi = _mm512_permutexvar_ps(hi_rows, mn);
    for (int64_t t = t0; t < t1; ++t) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + t * kPanelRows)));
      const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, nibble)), s_lo, m_lo);
      const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), s_hi, m_hi);
      _mm512_store_si512(dst + 32 * t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  for (int64_t t = w.k / 2; t < Bf16RowElements(w.k) / 2; ++t) {
    _mm512_store_si512(dst + 32 * t, _mm512_setzero_si512());
  }
}

// Panel p of a W8A16 matrix as bf16 B tiles, as DequantizeW4PanelBf16: a
// step's first 16 bytes are rows 0-7's pairs, the next 16 rows 8-15's.
__attribute__((target("avx512bf16"))) void DequantizeW8PanelBf16(const PackedW8& w, int64_t p,
                                                                  uint16_t* dst) {
  const int64_t groups = PackedW8Groups(w.k);
  const int8_t* q = w.q + p * w.k * kPanelRows;
  const fp16_t* sp = w.scale + p * groups * kPanelRows;
  const __m512i lo_rows = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i hi_rows = _mm512_add_epi32(lo_rows, _mm512_set1_epi32(8));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * kW8Group / 2, t1 = std::min<int64_t>(w.k, (g + 1) * kW8Group) / 2;
    const __m512 s = LoadF16x16(sp + g * kPanelRows);
    const __m512 s_lo = _mm512_permutexvar_ps(lo_rows, s), s_hi = _mm512_permutexvar_ps(hi_rows, s);
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* step = q + t * 2 * kPanelRows;
      const __m512 lo = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)))), s_lo);
      const __m512 hi = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)))), s_hi);
      _mm512_store_si512(dst + 32 * t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  for (int64_t t = w.k / 2; t < Bf16RowElements(w.k) / 2; ++t) {
    _mm512_store_si512(dst + 32 * t, _mm512_setzero_si512());
  }
}

// y = x W^T for output panels [p_begin, p_end) of an n x k matrix whose
// panels `dequantize(p, dst)` writes as bf16 B tiles: pairs of panels (32
// outputs) against the activation rows 32 at a time, four C tiles (2 row
// tiles x 2 panels), all of k in the tiles.
template <typename Dequantize>
__attribute__((target("amx-tile,amx-bf16,avx512bf16"))) void GemmPanelsBf16Amx(
    int64_t n, int64_t k, int64_t p_begin, int64_t p_end, const uint16_t* xb, int64_t m,
    float* y, int64_t ldy, const Dequantize& dequantize) {
  const int64_t kpad = Bf16RowElements(k), ktiles = kpad / 32, mpad = Bf16Rows(m);
  const int64_t row_bytes = kpad * 2;
  alignas(64) uint16_t b[2][kBf16MaxSteps * 32];
  alignas(64) float c[256];
  const AmxTileConfig cfg = FullAmxTiles();
  _tile_loadconfig(&cfg);
  for (int64_t p = p_begin; p < p_end; p += 2) {
    const bool two_panels = p + 1 < p_end;
    dequantize(p, b[0]);
    if (two_panels) dequantize(p + 1, b[1]);
    // A C tile (rows from `row`, panel p + j; `store` runs its tilestored)
    // into y: straight there when whole, else through c.
    auto finish = [&](int j, int64_t row, auto store) {
      const int cols = (int)std::min<int64_t>(kPanelRows, n - (p + j) * kPanelRows);
      float* yp = y + row * ldy + (p + j) * kPanelRows;
      if (cols == kPanelRows && row + 16 <= m) {
        store(yp, ldy * (int64_t)sizeof(float));
        return;
      }
      store(c, 64);
      for (int64_t r = 0; r < 16 && row + r < m; ++r) {
        StoreCols(yp + r * ldy, _mm512_load_ps(c + r * 16), cols);
      }
    };
    for (int64_t r = 0; r < mpad; r += 32) {
      const bool two_rows = r + 16 < mpad;
      const uint16_t* a0 = xb + r * kpad;
      const uint16_t* a1 = a0 + 16 * kpad;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kt = 0; kt < ktiles; ++kt) {
        _tile_loadd(4, a0 + kt * 32, row_bytes);
        _tile_loadd(6, b[0] + kt * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_panels) {
          _tile_loadd(7, b[1] + kt * 512, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_rows) {
          _tile_loadd(5, a1 + kt * 32, row_bytes);
          _tile_dpbf16ps(2, 5, 6);
          if (two_panels) _tile_dpbf16ps(3, 5, 7);
        }
      }
      // (_tile_stored takes its tile number as a literal.)
      finish(0, r, [](void* d, int64_t stride) { _tile_stored(0, d, stride); });
      if (two_panels) finish(1, r, [](void* d, int64_t stride) { _tile_stored(1, d, stride); });
      if (two_rows) {
        finish(0, r + 16, [](void* d, int64_t stride) { _tile_stored(2, d, stride); });
        if (two_panels) {
          finish(1, r + 16, [](void* d, int64_t stride) { _tile_stored(3, d, stride); });
        }
      }
    }
  }
  _tile_release();
}

void GemmW4PanelsBf16Amx(const PackedW4& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy) {
  GemmPanelsBf16Amx(w.n, w.k, p_begin, p_end, xb, m, y, ldy,
                    [&](int64_t p, uint16_t* dst) { DequantizeW4PanelBf16(w, p, dst); });
}

void GemmW8PanelsBf16Amx(const PackedW8& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy) {
  GemmPanelsBf16Amx(w.n, w.k, p_begin, p_end, xb, m, y, ldy,
                    [&](int64_t p, uint16_t* dst) { DequantizeW8PanelBf16(w, p, dst); });
}

__attribute__((target("avx512bf16"))) void QuantizeRowBf16Avx512(const float* x, int64_t k,
                                                                  uint16_t* dst) {
  const int64_t kpad = Bf16RowElements(k);
  for (int64_t i = 0; i < kpad; i += 16) {
    const __m512 v = i + 16 <= k ? _mm512_loadu_ps(x + i)
                                 : _mm512_maskz_loadu_ps((__mmask16)((1u << std::max<int64_t>(0, k - i)) - 1), x + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(v));
  }
}

float QuantizeRowI8Avx512(const float* x, int64_t k, int8_t* q) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 vmax = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) vmax = _mm512_max_ps(vmax, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)));
  float absmax = _mm512_reduce_max_ps(vmax);
  for (; i < k; ++i) absmax = std::max(absmax, std::abs(x[i]));
  const float s = absmax / 127.0f;
  const float inv = s != 0.0f ? 127.0f / absmax : 0.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  for (i = 0; i + 16 <= k; i += 16) {
    // Round to nearest even, as the reference's nearbyint does; |v| <= 127.
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtsepi32_epi8(v));
  }
  for (; i < PackedI8K4(k) * 4; ++i) {
    q[i] = i < k ? (int8_t)std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f) : 0;
  }
  return s;
}

// ---- Elementwise ------------------------------------------------------------

void RmsNormRowAvx512(const float* x, const float* weight, int64_t d, float eps, float* out) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  float ss = _mm512_reduce_add_ps(acc);
  for (; i < d; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / (float)d + eps);
  const __m512 vs = _mm512_set1_ps(scale);
  for (i = 0; i + 16 <= d; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs),
                                            _mm512_loadu_ps(weight + i)));
  }
  for (; i < d; ++i) out[i] = x[i] * scale * weight[i];
}

// out = g / (1 + exp(-arg(g))) * up: SiLU (arg = g) and GELU's tanh form
// (arg = 2 sqrt(2/pi) (g + 0.044715 g^3)).
template <bool kGelu>
void GatedRow(const float* gate, const float* up, int64_t f, float* out) {
  const float k2 = 2.0f * 0.7978845608028654f;
  const __m512 one = _mm512_set1_ps(1.0f), vk = _mm512_set1_ps(-k2), vc = _mm512_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 16 <= f; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 arg = kGelu ? _mm512_mul_ps(vk, _mm512_fmadd_ps(_mm512_mul_ps(vc, g), _mm512_mul_ps(g, g), g))
                             : _mm512_sub_ps(_mm512_setzero_ps(), g);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, Exp(arg)));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  for (; i < f; ++i) {
    const float g = gate[i];
    const float arg = kGelu ? -k2 * (g + 0.044715f * g * g * g) : -g;
    out[i] = g / (1.0f + std::exp(arg)) * up[i];
  }
}

void ToF16Avx512(const float* src, int64_t n, fp16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(tail, src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_mask_storeu_epi16(dst + i, tail, h);
  }
}

// ---- Sampling rows ---------------------------------------------------------------

// Each lane keeps the largest value it saw and where (strictly larger only,
// so the lowest index among equals; NaN never compares larger); then the
// lowest index among the lanes holding the maximum.
int64_t ArgmaxRowAvx512(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __m512i where = _mm512_set1_epi32(-1),
          at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + i);
    const __mmask16 larger = _mm512_mask_cmp_ps_mask(valid, v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, larger, v);
    where = _mm512_mask_mov_epi32(where, larger, at);
    at = _mm512_add_epi32(at, _mm512_set1_epi32(16));
  }
  const __mmask16 seen = _mm512_cmpge_epi32_mask(where, _mm512_setzero_si512());
  // Nothing above -inf (every value -inf or NaN): the reference's answer.
  if (seen == 0) return kScalarKernels.argmax_row(x, n);
  const float top = _mm512_mask_reduce_max_ps(seen, best);
  const __mmask16 holders = _mm512_mask_cmp_ps_mask(seen, best, _mm512_set1_ps(top), _CMP_EQ_OQ);
  return _mm512_mask_reduce_min_epi32(holders, where);
}

float ExpRowAvx512(const float* x, int64_t n, float max, float scale, float* out) {
  const __m512 vmax = _mm512_set1_ps(max), vscale = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + i);
    const __m512 e = _mm512_maskz_mov_ps(valid, Exp(_mm512_mul_ps(_mm512_sub_ps(v, vmax), vscale)));
    _mm512_mask_storeu_ps(out + i, valid, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// ---- Attention ----------------------------------------------------------------

// Transposes a 16 x 16 block of floats: rows r[0..16) in, columns out.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Per 128-bit lane L, r[i + c] becomes column 4 L + c of rows i .. i + 3.
  for (int i = 0; i < 16; i += 4) {
    for (int j = 0; j < 2; ++j) {
      const __m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + 2 + j]);
      r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  }
  // Each 128-bit lane now holds 4 x 4 sub-blocks; gather them across lanes.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// out[0, 16 NV) += sum_j p[j] * v[j][0, 16 NV) over nj rows of v (d apart).
template <int NV>
inline void AccumulatePv(const float* p, int64_t nj, const float* v, int d, float* out) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_loadu_ps(out + 16 * i);
  for (int64_t j = 0; j < nj; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(pj, _mm512_load_ps(v + j * d + 16 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

// Scores sh[0, n) (lanes of vmax: their running maximum) become exp(s -
// max) in place, zeros past n within the row's 16 floats of slack; returns
// 1 / their sum, and writes max + log(sum) to lse where it is not null.
inline float ExpScores(float* sh, int64_t n, __m512 vmax, float* lse = nullptr) {
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 valid = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(valid, Exp(_mm512_sub_ps(_mm512_loadu_ps(sh + j), m)));
    _mm512_storeu_ps(sh + j, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  if (lse != nullptr) *lse = _mm512_cvtss_f32(m) + std::log(sum);
  return 1.0f / sum;
}

// Lane t of the result: the sum of a[t]'s 16 lanes, for 16 vectors, in 45
// instructions (pairs, then quads within 128-bit lanes, then across them).
// Sum8 is its first half: two vectors, u[0] with a[0..4)'s and u[1] with
// a[4..8)'s partial sums per 128-bit lane (element k of lane L: a[4i + k]
// summed over lane L); Sum16Of finishes two such halves.
inline void Sum8(const __m512 a[8], __m512 u[2]) {
  __m512 s[4];
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
}
inline __m512 Sum16Of(const __m512 lo[2], const __m512 hi[2]) {
  const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(lo[0], lo[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(lo[0], lo[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(hi[0], hi[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(hi[0], hi[1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Where an attend call's rows live: this kv head's chunk of 16 K or V rows
// from position j0 (a multiple of 16; KvChunks), query h's q and out rows
// (the `group` query heads of a row contiguous), and how many positions
// query h sees.
struct AttendRows {
  KvChunks chunks;
  int64_t head_offset;
  int64_t n_pos;
  int group, d;
  const float* q;
  int64_t q_stride;
  float* out;
  int64_t out_stride;
  AttendRows(const KvLayerView& layer, const int32_t* table, int64_t n_pos, int kv_head, int group,
             const float* q, int64_t q_stride, float* out, int64_t out_stride)
      : chunks(layer, table),
        head_offset(kv_head * chunks.head_stride),
        n_pos(n_pos),
        group(group),
        d(layer.head_dim),
        q(q),
        q_stride(q_stride),
        out(out),
        out_stride(out_stride) {}
  const fp16_t* Block(const fp16_t* base, int64_t j0) const {
    return base + chunks.Offset(j0) + head_offset;
  }
  const float* Q(int h) const { return q + (h / group) * q_stride + (h % group) * d; }
  float* Out(int h) const { return out + (h / group) * out_stride + (h % group) * d; }
  int64_t Visible(int h) const { return n_pos + h / group; }
};

// One decode row (rows == 1) of NQ = 3 or 4 queries (a GQA group) over
// head_dim 16 DV: every cached position is read once from memory, so the
// kernel touches each K and V row once, in registers. Scores: per 8 keys,
// NQ x 8 dot products accumulated lane-wise straight from the fp16 rows,
// then summed across lanes 16 keys at a time (Sum8, Sum16Of) instead of
// transposing K through memory; P V: the NQ outputs stay in registers over
// all positions. K and V blocks are prefetched as the AVX2 tiles' are
// (KvRowPrefetch). Same contract as AttendAvx512.
// The scores of one 16-key block (rows src, nj of them in the cache) for
// NQ queries (q rows 16 DV apart): query h's into scores[h * stride + j0,
// + 16) (zeros past nj), their running maximum into vmax[h].
template <bool kBf16, int NQ, int DV>
__attribute__((always_inline)) inline void ScoreBlockRow(const fp16_t* src, int64_t nj,
                                                         const float* q, __m512 vscale,
                                                         float* scores, int64_t stride, int64_t j0,
                                                         __m512* vmax) {
  constexpr int d = 16 * DV;
  // A full 8-key part takes the query vectors outside the key loop, loaded
  // once per 8 keys, where NQ x 8 accumulators, the NQ queries and a K
  // vector fit the 32 registers (NQ 3): with the queries as memory operands
  // of every FMA, the loads outnumbered the FMAs.
  constexpr bool kQueriesOuter = NQ * 8 + NQ + 1 <= 32;
  __m512 half[NQ][2][2];  // [query][keys 0-7, 8-15][Sum8 halves]
  for (int part = 0; part < 2; ++part) {
    __m512 acc[NQ][8];
    // (Unrolled in full, so that the accumulators live in registers.)
#pragma GCC unroll 8
    for (int h = 0; h < NQ; ++h)
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) acc[h][t] = _mm512_setzero_ps();
    const fp16_t* rows = src + 8 * part * d;
    if (kQueriesOuter && 8 * part + 8 <= nj) {
#pragma GCC unroll 8
      for (int c = 0; c < DV; ++c) {
        __m512 qc[NQ];
#pragma GCC unroll 8
        for (int h = 0; h < NQ; ++h) qc[h] = _mm512_loadu_ps(q + h * d + 16 * c);
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          const __m512 k = LoadKv16<kBf16>(rows + t * d + 16 * c);
#pragma GCC unroll 8
          for (int h = 0; h < NQ; ++h) acc[h][t] = _mm512_fmadd_ps(k, qc[h], acc[h][t]);
        }
      }
    } else {
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        if (8 * part + t >= nj) continue;  // past the cache: zero scores, masked below
#pragma GCC unroll 8
        for (int c = 0; c < DV; ++c) {
          const __m512 k = LoadKv16<kBf16>(rows + t * d + 16 * c);
#pragma GCC unroll 8
          for (int h = 0; h < NQ; ++h) {
            acc[h][t] = _mm512_fmadd_ps(k, _mm512_loadu_ps(q + h * d + 16 * c), acc[h][t]);
          }
        }
      }
    }
    for (int h = 0; h < NQ; ++h) Sum8(acc[h], half[h][part]);
  }
  const __mmask16 valid = (__mmask16)((1u << nj) - 1);
  for (int h = 0; h < NQ; ++h) {
    const __m512 sc = _mm512_mul_ps(Sum16Of(half[h][0], half[h][1]), vscale);
    _mm512_storeu_ps(scores + h * stride + j0, sc);  // the row has 16 floats of slack
    vmax[h] = _mm512_mask_max_ps(vmax[h], valid, vmax[h], sc);
  }
}

// o[h] += the softmax weights p[h * stride + t] times V row t of the block
// at src, for its nj rows in order.
template <bool kBf16, int NQ, int DV>
__attribute__((always_inline)) inline void WeighBlockRow(const fp16_t* src, int64_t nj,
                                                         const float* p, int64_t stride,
                                                         __m512 (*o)[DV]) {
  constexpr int d = 16 * DV;
  for (int64_t t = 0; t < nj; ++t) {
    __m512 v[DV];
    for (int c = 0; c < DV; ++c) v[c] = LoadKv16<kBf16>(src + t * d + 16 * c);
    for (int h = 0; h < NQ; ++h) {
      const __m512 pt = _mm512_set1_ps(p[h * stride + t]);
      for (int c = 0; c < DV; ++c) o[h][c] = _mm512_fmadd_ps(pt, v[c], o[h][c]);
    }
  }
}

template <bool kBf16, int NQ, int DV>
void AttendDecodeRowAvx512(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                           int kv_head, const float* q, float scale, float* out, float* scratch) {
  constexpr int d = 16 * DV;
  const int64_t stride = n_pos + 16;
  float* scores = scratch;  // [NQ][stride]
  const AttendRows at(layer, block_table, n_pos, kv_head, NQ, q, 0, out, 0);
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax[NQ];
  for (int h = 0; h < NQ; ++h) vmax[h] = _mm512_set1_ps(-INFINITY);
  const KvRowPrefetch prefetch(layer, block_table, n_pos, kv_head);
  prefetch.FirstKeys();
  for (int64_t j0 = 0; j0 < n_pos; j0 += 16) {
    prefetch.KeysAt(j0);
    ScoreBlockRow<kBf16, NQ, DV>(at.Block(layer.k, j0), std::min<int64_t>(16, n_pos - j0), q,
                                 vscale, scores, stride, j0, vmax);
  }
  float inv_sum[NQ];
  for (int h = 0; h < NQ; ++h) inv_sum[h] = ExpScores(scores + h * stride, n_pos, vmax[h]);
  __m512 o[NQ][DV];
  for (int h = 0; h < NQ; ++h) {
    for (int c = 0; c < DV; ++c) o[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j0 = 0; j0 < n_pos; j0 += 16) {
    prefetch.ValuesAt(j0);
    WeighBlockRow<kBf16, NQ, DV>(at.Block(layer.v, j0), std::min<int64_t>(16, n_pos - j0),
                                 scores + j0, stride, o);
  }
  for (int h = 0; h < NQ; ++h) {
    const __m512 inv = _mm512_set1_ps(inv_sum[h]);
    for (int c = 0; c < DV; ++c)
      _mm512_storeu_ps(out + h * d + 16 * c, _mm512_mul_ps(o[h][c], inv));
  }
}

// AttendDecodeRowAvx512 for every kv head of the layer at once, with the
// same numbers: block by block, each kv head's rows in turn, so that a
// block's rows of all kv heads (one run in the cache) are read together
// and consecutive blocks stream; read one kv head at a time, a kv head's
// rows are runs of block_tokens rows far apart, which the hardware
// prefetchers lose
// (kernels_bench BM_AttendDecodeFromMemory). The outputs accumulate in
// scratch between blocks (kv_heads x NQ x DV vectors do not fit the
// registers). q and out: the kv heads' NQ query rows each, in order.
// Needs kv_heads * NQ <= kDecodeHeadsMaxQueries.
constexpr int kDecodeHeadsMaxQueries = 16;
template <bool kBf16, int NQ, int DV>
void AttendDecodeHeadsAvx512(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                             const float* q, float scale, float* out, float* scratch, float* lse) {
  constexpr int d = 16 * DV;
  const int heads = layer.kv_heads;
  const int64_t stride = n_pos + 16;
  const int64_t run = (int64_t)layer.block_tokens * d;  // a kv head's rows in a block
  float* scores = scratch;                              // [heads * NQ][stride]
  auto* o = reinterpret_cast<__m512(*)[DV]>(Align64(scratch + heads * NQ * stride));
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax[kDecodeHeadsMaxQueries];
  for (int r = 0; r < heads * NQ; ++r) vmax[r] = _mm512_set1_ps(-INFINITY);
  const KvRowPrefetch prefetch(layer, block_table, n_pos, 0, heads);
  // Kv head 0's chunk at j0: the other kv heads' follow it, run elements apart.
  const AttendRows at(layer, block_table, n_pos, 0, NQ, q, 0, out, 0);
  const int64_t bt = layer.block_tokens;
  // Block by block, each kv head's chunks of it in order (its rows in the
  // block are one run, read in order at any block size).
  prefetch.FirstKeys();
  for (int64_t b0 = 0; b0 < n_pos; b0 += bt) {
    prefetch.KeysAt(b0);
    const int64_t end = std::min(b0 + bt, n_pos);
    const fp16_t* block = at.Block(layer.k, b0);
    for (int h = 0; h < heads; ++h) {
      for (int64_t j0 = b0; j0 < end; j0 += 16) {
        ScoreBlockRow<kBf16, NQ, DV>(block + h * run + (j0 - b0) * d,
                                     std::min<int64_t>(16, n_pos - j0), q + h * NQ * d, vscale,
                                     scores + h * NQ * stride, stride, j0, vmax + h * NQ);
      }
    }
  }
  float inv_sum[kDecodeHeadsMaxQueries];
  for (int r = 0; r < heads * NQ; ++r) {
    inv_sum[r] = ExpScores(scores + r * stride, n_pos, vmax[r], lse ? lse + r : nullptr);
    for (int c = 0; c < DV; ++c) o[r][c] = _mm512_setzero_ps();
  }
  for (int64_t b0 = 0; b0 < n_pos; b0 += bt) {
    prefetch.ValuesAt(b0);
    const int64_t end = std::min(b0 + bt, n_pos);
    const fp16_t* block = at.Block(layer.v, b0);
    for (int h = 0; h < heads; ++h) {
      __m512 oh[NQ][DV];
      for (int i = 0; i < NQ; ++i)
        for (int c = 0; c < DV; ++c) oh[i][c] = o[h * NQ + i][c];
      for (int64_t j0 = b0; j0 < end; j0 += 16) {
        WeighBlockRow<kBf16, NQ, DV>(block + h * run + (j0 - b0) * d,
                                     std::min<int64_t>(16, n_pos - j0),
                                     scores + h * NQ * stride + j0, stride, oh);
      }
      for (int i = 0; i < NQ; ++i)
        for (int c = 0; c < DV; ++c) o[h * NQ + i][c] = oh[i][c];
    }
  }
  for (int r = 0; r < heads * NQ; ++r) {
    const __m512 inv = _mm512_set1_ps(inv_sum[r]);
    for (int c = 0; c < DV; ++c)
      _mm512_storeu_ps(out + r * d + 16 * c, _mm512_mul_ps(o[r][c], inv));
  }
}

// AttendDecodeRowAvx512 for a bf16 cache (KvLayerView::bf16) on
// AVX512_BF16's dot products: each vdpbf16ps multiplies 32 bf16 pairs into
// 16 fp32 sums, where the fp32 kernel spends a conversion and an FMA per 16.
// Scores: the group's queries rounded to bf16 once, against each K row as
// it lies (a lane sums two neighbouring dimensions; the lanes are summed as
// above). P V: the weights rounded to bf16 (the sum taken over the rounded
// values), and two V rows interleaved in registers (vpunpck[lh]wd: lane
// pairs (v[t][i], v[t+1][i])) against the broadcast pair (p[t], p[t+1]);
// the interleave leaves the dimensions of each 128-bit lane in two halves,
// put back in order once at the end. Same contract as AttendAvx512.
// AttendDecodeRowBf16Avx512's steps, each for one 16-key block (rows src,
// nj of them in the cache) or one query row. Scores: query h's into
// scores[h * stride + j0, + 16) (zeros past nj), their running maximum into
// vmax[h].
template <int NQ, int D32>
__attribute__((target("avx512bf16"), always_inline)) inline void ScoreBlockBf16(
    const fp16_t* src, int64_t nj, const __m512bh (*qb)[D32], __m512 vscale, float* scores,
    int64_t stride, int64_t j0, __m512* vmax) {
  constexpr int d = 32 * D32;
  __m512 half[NQ][2][2];
  for (int part = 0; part < 2; ++part) {
    __m512 acc[NQ][8];
    for (int t = 0; t < 8; ++t) {
      for (int h = 0; h < NQ; ++h) acc[h][t] = _mm512_setzero_ps();
      if (8 * part + t >= nj) continue;
      const fp16_t* row = src + (8 * part + t) * d;
      for (int c = 0; c < D32; ++c) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(row + 32 * c);
        for (int h = 0; h < NQ; ++h) acc[h][t] = _mm512_dpbf16_ps(acc[h][t], k, qb[h][c]);
      }
    }
    for (int h = 0; h < NQ; ++h) Sum8(acc[h], half[h][part]);
  }
  const __mmask16 valid = (__mmask16)((1u << nj) - 1);
  for (int h = 0; h < NQ; ++h) {
    const __m512 sc = _mm512_mul_ps(Sum16Of(half[h][0], half[h][1]), vscale);
    _mm512_storeu_ps(scores + h * stride + j0, sc);
    vmax[h] = _mm512_mask_max_ps(vmax[h], valid, vmax[h], sc);
  }
}

// exp(s - max) of the scores sh[0, n) rounded to bf16 in place (bf16 j at
// byte 2 j: written behind the floats still to read), zero past n; returns
// 1 / the rounded sum, and writes max + log(that sum) to lse where it is
// not null.
__attribute__((target("avx512bf16"))) inline float ExpScoresBf16(float* sh, int64_t n, __m512 vmax,
                                                                 float* lse = nullptr) {
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 valid = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(valid, Exp(_mm512_sub_ps(_mm512_loadu_ps(sh + j), m)));
    const __m256bh eb = _mm512_cvtneps_pbh(e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<uint16_t*>(sh) + j),
                        (__m256i)eb);
    vsum = _mm512_add_ps(vsum, _mm512_cvtpbh_ps(eb));
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  if (lse != nullptr) *lse = _mm512_cvtss_f32(m) + std::log(sum);
  return 1.0f / sum;
}

// P V for one block: lo/hi[h] += the bf16 weights of query h (row h of
// scores, stride floats apart, as ExpScoresBf16 left them; block j0's from
// bf16 j0 on) times the block's V rows, two rows a step, interleaved.
template <int NQ, int D32>
__attribute__((target("avx512bf16"), always_inline)) inline void WeighBlockBf16(
    const fp16_t* src, int64_t nj, const float* scores, int64_t stride, int64_t j0,
    __m512 (*lo)[D32], __m512 (*hi)[D32]) {
  constexpr int d = 32 * D32;
  for (int64_t t = 0; t < nj; t += 2) {
    __m512bh pair[NQ];
    for (int h = 0; h < NQ; ++h) {
      int32_t w;  // p[t] and p[t + 1] (zero past n_pos)
      std::memcpy(&w, reinterpret_cast<const uint16_t*>(scores + h * stride) + j0 + t, 4);
      pair[h] = (__m512bh)_mm512_set1_epi32(w);
    }
    for (int c = 0; c < D32; ++c) {
      const __m512i r0 = _mm512_loadu_si512(src + t * d + 32 * c);
      // An odd count's last row pairs with zeros (the slot past it may
      // hold anything, NaN included).
      const __m512i r1 =
          t + 1 < nj ? _mm512_loadu_si512(src + (t + 1) * d + 32 * c) : _mm512_setzero_si512();
      const __m512bh vlo = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
      const __m512bh vhi = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
      for (int h = 0; h < NQ; ++h) {
        lo[h][c] = _mm512_dpbf16_ps(lo[h][c], vlo, pair[h]);
        hi[h][c] = _mm512_dpbf16_ps(hi[h][c], vhi, pair[h]);
      }
    }
  }
}

// out[0, 32 D32) = the sums in lo and hi, in order, times inv: lane 4 L + i
// of lo holds dimension 8 L + i, of hi 8 L + 4 + i (L the 128-bit lane); the
// first 16 dimensions are lanes 0-1's, the next 2-3's.
template <int D32>
__attribute__((target("avx512bf16"), always_inline)) inline void StoreWeighedBf16(const __m512* lo,
                                                                                  const __m512* hi,
                                                                                  float inv_sum,
                                                                                  float* out) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 inv = _mm512_set1_ps(inv_sum);
  for (int c = 0; c < D32; ++c) {
    float* o = out + 32 * c;
    _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_permutex2var_ps(lo[c], first, hi[c]), inv));
    _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo[c], second, hi[c]), inv));
  }
}

// The queries rounded to bf16, 32 dimensions a vector.
template <int D32>
__attribute__((target("avx512bf16"), always_inline)) inline void QueryBf16(const float* q,
                                                                           __m512bh* qb) {
  for (int c = 0; c < D32; ++c) {
    qb[c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * c + 16), _mm512_loadu_ps(q + 32 * c));
  }
}

template <int NQ, int D32>
__attribute__((target("avx512bf16"))) void AttendDecodeRowBf16Avx512(const KvLayerView& layer,
                                                                     const int32_t* block_table,
                                                                     int64_t n_pos, int kv_head,
                                                                     const float* q, float scale,
                                                                     float* out, float* scratch) {
  constexpr int d = 32 * D32;
  const int64_t stride = n_pos + 16;
  float* scores = scratch;  // [NQ][stride]; each row later its bf16 weights
  const AttendRows at(layer, block_table, n_pos, kv_head, NQ, q, 0, out, 0);
  __m512bh qb[NQ][D32];
  for (int h = 0; h < NQ; ++h) QueryBf16<D32>(q + h * d, qb[h]);
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax[NQ];
  for (int h = 0; h < NQ; ++h) vmax[h] = _mm512_set1_ps(-INFINITY);
  const KvRowPrefetch prefetch(layer, block_table, n_pos, kv_head);
  prefetch.FirstKeys();
  for (int64_t j0 = 0; j0 < n_pos; j0 += 16) {
    prefetch.KeysAt(j0);
    ScoreBlockBf16<NQ, D32>(at.Block(layer.k, j0), std::min<int64_t>(16, n_pos - j0), qb, vscale,
                            scores, stride, j0, vmax);
  }
  float inv_sum[NQ];
  for (int h = 0; h < NQ; ++h) inv_sum[h] = ExpScoresBf16(scores + h * stride, n_pos, vmax[h]);
  __m512 lo[NQ][D32], hi[NQ][D32];
  for (int h = 0; h < NQ; ++h) {
    for (int c = 0; c < D32; ++c) lo[h][c] = hi[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j0 = 0; j0 < n_pos; j0 += 16) {
    prefetch.ValuesAt(j0);
    WeighBlockBf16<NQ, D32>(at.Block(layer.v, j0), std::min<int64_t>(16, n_pos - j0), scores,
                            stride, j0, lo, hi);
  }
  for (int h = 0; h < NQ; ++h) StoreWeighedBf16<D32>(lo[h], hi[h], inv_sum[h], out + h * d);
}

// AttendDecodeRowBf16Avx512 for every kv head at once, as
// AttendDecodeHeadsAvx512 is AttendDecodeRowAvx512's: the same numbers, a
// block's kv heads read together, the sums kept in scratch between blocks.
template <int NQ, int D32>
__attribute__((target("avx512bf16"))) void AttendDecodeHeadsBf16Avx512(
    const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, const float* q,
    float scale, float* out, float* scratch, float* lse) {
  constexpr int d = 32 * D32;
  const int heads = layer.kv_heads;
  const int64_t stride = n_pos + 16;
  const int64_t run = (int64_t)layer.block_tokens * d;  // a kv head's rows in a block
  float* scores = scratch;                              // [heads * NQ][stride]
  // [heads * NQ][D32] each: the queries, then the two halves of the sums.
  auto* qb = reinterpret_cast<__m512bh(*)[D32]>(Align64(scratch + heads * NQ * stride));
  auto* lo = reinterpret_cast<__m512(*)[D32]>(qb + heads * NQ);
  auto* hi = lo + heads * NQ;
  for (int r = 0; r < heads * NQ; ++r) QueryBf16<D32>(q + r * d, qb[r]);
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax[kDecodeHeadsMaxQueries];
  for (int r = 0; r < heads * NQ; ++r) vmax[r] = _mm512_set1_ps(-INFINITY);
  const KvRowPrefetch prefetch(layer, block_table, n_pos, 0, heads);
  // Kv head 0's chunk at j0: the other kv heads' follow it, run elements apart.
  const AttendRows at(layer, block_table, n_pos, 0, NQ, q, 0, out, 0);
  const int64_t bt = layer.block_tokens;
  // Block by block, each kv head's chunks of it in order.
  prefetch.FirstKeys();
  for (int64_t b0 = 0; b0 < n_pos; b0 += bt) {
    prefetch.KeysAt(b0);
    const int64_t end = std::min(b0 + bt, n_pos);
    const fp16_t* block = at.Block(layer.k, b0);
    for (int h = 0; h < heads; ++h) {
      for (int64_t j0 = b0; j0 < end; j0 += 16) {
        ScoreBlockBf16<NQ, D32>(block + h * run + (j0 - b0) * d, std::min<int64_t>(16, n_pos - j0),
                                qb + h * NQ, vscale, scores + h * NQ * stride, stride, j0,
                                vmax + h * NQ);
      }
    }
  }
  float inv_sum[kDecodeHeadsMaxQueries];
  for (int r = 0; r < heads * NQ; ++r) {
    inv_sum[r] = ExpScoresBf16(scores + r * stride, n_pos, vmax[r], lse ? lse + r : nullptr);
    for (int c = 0; c < D32; ++c) lo[r][c] = hi[r][c] = _mm512_setzero_ps();
  }
  for (int64_t b0 = 0; b0 < n_pos; b0 += bt) {
    prefetch.ValuesAt(b0);
    const int64_t end = std::min(b0 + bt, n_pos);
    const fp16_t* block = at.Block(layer.v, b0);
    for (int h = 0; h < heads; ++h) {
      __m512 lh[NQ][D32], hh[NQ][D32];
      for (int i = 0; i < NQ; ++i) {
        for (int c = 0; c < D32; ++c) {
          lh[i][c] = lo[h * NQ + i][c];
          hh[i][c] = hi[h * NQ + i][c];
        }
      }
      for (int64_t j0 = b0; j0 < end; j0 += 16) {
        WeighBlockBf16<NQ, D32>(block + h * run + (j0 - b0) * d, std::min<int64_t>(16, n_pos - j0),
                                scores + h * NQ * stride, stride, j0, lh, hh);
      }
      for (int i = 0; i < NQ; ++i) {
        for (int c = 0; c < D32; ++c) {
          lo[h * NQ + i][c] = lh[i][c];
          hi[h * NQ + i][c] = hh[i][c];
        }
      }
    }
  }
  for (int r = 0; r < heads * NQ; ++r) StoreWeighedBf16<D32>(lo[r], hi[r], inv_sum[r], out + r * d);
}

// The prefill attention (AttendAvx2's contract): each 16-key K block is
// converted and transposed once for all rows * group queries, so a query's
// 16 scores are d FMAs of a broadcast query element against a row of K^T,
// with no horizontal sums; P V accumulates 16 lanes of the head at a time.
// A decode row of 3 or 4 queries (SmolLM2's GQA group of 3) takes
// AttendDecodeRowAvx512 instead, which reads K and V once without the
// transpose (1.6x this kernel per call on an AMX Xeon, kernels_bench
// BM_AttendDecodeRow, where the transpose kernel lost to the AVX2 one; on
// a Zen 4 as fast as the AVX2 register tiles, 4.9-5.0 us at 512 positions,
// since its queries left the FMAs' memory operands: 7.2 before); the
// transpose pays off for more queries a call (prefill rows, larger groups);
// 1 or 2 (MHA decode) and other shapes take the AVX2 kernel, 1.1-1.5x
// faster there.
// attend (kShortcuts: a decode row of a GQA group on its own kernel, 1 or 2
// queries on AVX2's) and attend_prompt (every row count on the body below).
template <bool kShortcuts, bool kBf16>
void AttendAvx512Body(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                      int kv_head, int group, const float* q, int64_t q_stride, float scale,
                      float* out, int64_t out_stride, float* scratch) {
  const int d = layer.head_dim;
  const int nq = rows * group;
  constexpr int kMaxQ = 64;
  if (d % 16 != 0 || d > 256 || !KvChunks::Fit(layer) || nq > kMaxQ || (kShortcuts && nq < 3)) {
    AttendAvx2<kShortcuts>(layer, block_table, n_pos, rows, kv_head, group, q, q_stride, scale, out,
                           out_stride, scratch);
    return;
  }
  // A decode row of a GQA group: the group's queries and outputs are
  // contiguous in their rows.
  using DecodeRow = void (*)(const KvLayerView&, const int32_t*, int64_t, int, const float*, float,
                             float*, float*);
  // (head_dim 32 or 64, as the fp32 decode row: wider heads of 4 queries
  // would hold more accumulators and queries than there are registers.)
  if (kShortcuts && kBf16 && rows == 1 && (nq == 3 || nq == 4) && (d == 32 || d == 64) &&
      GetCpuFeatures().avx512bf16) {
    static constexpr DecodeRow kDecodeRows[2][2] = {
        {AttendDecodeRowBf16Avx512<3, 1>, AttendDecodeRowBf16Avx512<3, 2>},
        {AttendDecodeRowBf16Avx512<4, 1>, AttendDecodeRowBf16Avx512<4, 2>}};
    kDecodeRows[nq - 3][d / 32 - 1](layer, block_table, n_pos, kv_head, q, scale, out, scratch);
    return;
  }
  if (kShortcuts && rows == 1 && (nq == 3 || nq == 4) && d <= 64) {
    static constexpr DecodeRow kDecodeRows[2][4] = {
        {AttendDecodeRowAvx512<kBf16, 3, 1>, AttendDecodeRowAvx512<kBf16, 3, 2>,
         AttendDecodeRowAvx512<kBf16, 3, 3>, AttendDecodeRowAvx512<kBf16, 3, 4>},
        {AttendDecodeRowAvx512<kBf16, 4, 1>, AttendDecodeRowAvx512<kBf16, 4, 2>,
         AttendDecodeRowAvx512<kBf16, 4, 3>, AttendDecodeRowAvx512<kBf16, 4, 4>}};
    kDecodeRows[nq - 3][d / 16 - 1](layer, block_table, n_pos, kv_head, q, scale, out, scratch);
    return;
  }
  const int dv = d / 16;
  const int64_t n_max = n_pos + rows - 1;  // positions the last row sees
  const int64_t stride = n_max + 16;
  float* scores = scratch;  // [nq][stride]
  // 16 x d fp32: K^T (d rows of 16 keys) in the scores pass, V rows in the
  // P V pass; 64-byte aligned for the vector loads.
  float* kv = Align64(scratch + nq * stride);
  const AttendRows at(layer, block_table, n_pos, kv_head, group, q, q_stride, out, out_stride);
  const __m512 vscale = _mm512_set1_ps(scale);

  __m512 vmax[kMaxQ];
  for (int h = 0; h < nq; ++h) vmax[h] = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, n_max - j0);
    const fp16_t* src = at.Block(layer.k, j0);
    for (int c = 0; c < dv; ++c) {  // K^T rows [16 c, 16 c + 16)
      __m512 r[16];
      for (int t = 0; t < 16; ++t)
        r[t] = t < nj ? LoadKv16<kBf16>(src + t * d + 16 * c) : _mm512_setzero_ps();
      Transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(kv + (16 * c + i) * 16, r[i]);
    }
    for (int h0 = 0; h0 < nq; h0 += 4) {
      const int nh4 = std::min(4, nq - h0);
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      const float* qh[4];
      for (int u = 0; u < 4; ++u) qh[u] = at.Q(h0 + std::min(u, nh4 - 1));
      for (int i = 0; i < d; ++i) {
        const __m512 kt = _mm512_load_ps(kv + i * 16);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(qh[u][i]), kt, acc[u]);
      }
      for (int u = 0; u < nh4; ++u) {
        const int h = h0 + u;
        const int64_t nh = std::min<int64_t>(nj, at.Visible(h) - j0);  // keys of this block it sees
        if (nh <= 0) continue;
        const __m512 sc = _mm512_mul_ps(acc[u], vscale);
        _mm512_storeu_ps(scores + h * stride + j0, sc);  // the row has 16 floats of slack
        vmax[h] = _mm512_mask_max_ps(vmax[h], (__mmask16)((1u << nh) - 1), vmax[h], sc);
      }
    }
  }

  float inv_sum[kMaxQ];
  for (int h = 0; h < nq; ++h) {
    inv_sum[h] = ExpScores(scores + h * stride, at.Visible(h), vmax[h]);
    float* oh = at.Out(h);
    for (int i = 0; i < d; i += 16) _mm512_storeu_ps(oh + i, _mm512_setzero_ps());
  }

  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, n_max - j0);
    const fp16_t* src = at.Block(layer.v, j0);
    for (int64_t i = 0; i < nj * d; i += 16) _mm512_store_ps(kv + i, LoadKv16<kBf16>(src + i));
    for (int h = 0; h < nq; ++h) {
      const int64_t nh = std::min<int64_t>(nj, at.Visible(h) - j0);
      if (nh <= 0) continue;
      const float* ph = scores + h * stride + j0;
      float* oh = at.Out(h);
      for (int v0 = 0; v0 < dv; v0 += 4) {  // up to 4 output vectors in registers
        const float* vb = kv + 16 * v0;
        switch (std::min(4, dv - v0)) {
          case 4: AccumulatePv<4>(ph, nh, vb, d, oh + 16 * v0); break;
          case 3: AccumulatePv<3>(ph, nh, vb, d, oh + 16 * v0); break;
          case 2: AccumulatePv<2>(ph, nh, vb, d, oh + 16 * v0); break;
          default: AccumulatePv<1>(ph, nh, vb, d, oh + 16 * v0); break;
        }
      }
    }
  }
  for (int h = 0; h < nq; ++h) {
    const __m512 inv = _mm512_set1_ps(inv_sum[h]);
    float* oh = at.Out(h);
    for (int i = 0; i < d; i += 16) _mm512_storeu_ps(oh + i, _mm512_mul_ps(_mm512_loadu_ps(oh + i), inv));
  }
}

// The body for the cache's element type.
template <bool kShortcuts>
void AttendAvx512(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                  int kv_head, int group, const float* q, int64_t q_stride, float scale, float* out,
                  int64_t out_stride, float* scratch) {
  const auto body =
      layer.bf16 ? AttendAvx512Body<kShortcuts, true> : AttendAvx512Body<kShortcuts, false>;
  body(layer, block_table, n_pos, rows, kv_head, group, q, q_stride, scale, out, out_stride,
       scratch);
}

// AttendDecodeHeadsAvx512 or AttendDecodeHeadsBf16Avx512 where attend(rows
// 1) would take their row kernels for each kv head (groups of 3 or 4;
// head_dim 16 to 64 on an fp16 cache, 32 or 64 on a bf16 one with
// AVX512_BF16); null for other shapes.
using DecodeHeads = void (*)(const KvLayerView&, const int32_t*, int64_t, const float*, float,
                             float*, float*, float*);
DecodeHeads DecodeHeadsKernel(const KvLayerView& layer, int group) {
  const int d = layer.head_dim;
  const bool shape = (group == 3 || group == 4) && KvChunks::Fit(layer) &&
                     layer.kv_heads * group <= kDecodeHeadsMaxQueries;
  if (shape && layer.bf16 && (d == 32 || d == 64) && GetCpuFeatures().avx512bf16) {
    static constexpr DecodeHeads kHeads[2][2] = {
        {AttendDecodeHeadsBf16Avx512<3, 1>, AttendDecodeHeadsBf16Avx512<3, 2>},
        {AttendDecodeHeadsBf16Avx512<4, 1>, AttendDecodeHeadsBf16Avx512<4, 2>}};
    return kHeads[group - 3][d / 32 - 1];
  }
  if (shape && !layer.bf16 && d % 16 == 0 && d <= 64) {
    static constexpr DecodeHeads kHeads[2][4] = {
        {AttendDecodeHeadsAvx512<false, 3, 1>, AttendDecodeHeadsAvx512<false, 3, 2>,
         AttendDecodeHeadsAvx512<false, 3, 3>, AttendDecodeHeadsAvx512<false, 3, 4>},
        {AttendDecodeHeadsAvx512<false, 4, 1>, AttendDecodeHeadsAvx512<false, 4, 2>,
         AttendDecodeHeadsAvx512<false, 4, 3>, AttendDecodeHeadsAvx512<false, 4, 4>}};
    return kHeads[group - 3][d / 16 - 1];
  }
  return nullptr;
}

bool AttendDecodeHeadsLseAvx512(const KvLayerView& layer, int group) {
  return DecodeHeadsKernel(layer, group) != nullptr;
}

// KernelTable::attend_decode_heads: DecodeHeadsKernel's, else attend for
// each kv head (lse null then: attend_decode_heads_lse said no).
void AttendDecodeHeadsAvx512Any(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                                int group, const float* q, float scale, float* out, float* scratch,
                                float* lse) {
  if (const DecodeHeads heads = DecodeHeadsKernel(layer, group)) {
    heads(layer, block_table, n_pos, q, scale, out, scratch, lse);
    return;
  }
  const int d = layer.head_dim;
  const int64_t row = (int64_t)group * d;
  for (int h = 0; h < layer.kv_heads; ++h) {
    AttendAvx512<true>(layer, block_table, n_pos, 1, h, group, q + h * row, row, scale,
                       out + h * row, row, scratch);
  }
}

// ---- Prompt attention on AMX-BF16 tiles -----------------------------------------

// x as bf16 hi + lo: hi rounded to nearest even, lo the rest rounded again
// (exact for an fp16 input: 11 significant bits).
__attribute__((target("avx512bf16"))) inline void SplitBf16(__m512 a, __m512 b, __m512i* hi,
                                                            __m512i* lo) {
  const __m512bh h = _mm512_cvtne2ps_pbh(b, a);
  const __m512 ha = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256((__m512i)h)), 16));
  const __m512 hb = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64((__m512i)h, 1)), 16));
  *hi = (__m512i)h;
  *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
}

// One 16-query x 16-key block of scores into C tile C through A tile A
// (configured for the tile's query rows): Qhi (Khi + Klo) + Qlo Khi over 64
// inputs, with K's B tiles in tiles 4-7 (hi 0-31, hi 32-63, lo 0-31, lo
// 32-63) and the queries' hi rows at a, lo rows at a + d; stored at dst.
// Without k_lo (a bf16 cache: K exact in its hi part), Qhi Khi + Qlo Khi
// and tiles 6 and 7 unread. A macro: the tile intrinsics paste their tile
// numbers into the assembly, so they must be literals (a template
// parameter is not).
#define PDQ_SCORE_TILE_BF16(C, A, a, a_stride, d, dst, dst_stride, k_lo) \
  do {                                                                   \
    _tile_zero(C);                                                       \
    _tile_loadd(A, (a), (a_stride));                                     \
    _tile_dpbf16ps(C, A, 4);                                             \
    if (k_lo) _tile_dpbf16ps(C, A, 6);                                   \
    _tile_loadd(A, (a) + 32, (a_stride));                                \
    _tile_dpbf16ps(C, A, 5);                                             \
    if (k_lo) _tile_dpbf16ps(C, A, 7);                                   \
    _tile_loadd(A, (a) + (d), (a_stride));                               \
    _tile_dpbf16ps(C, A, 4);                                             \
    _tile_loadd(A, (a) + (d) + 32, (a_stride));                          \
    _tile_dpbf16ps(C, A, 5);                                             \
    _tile_stored(C, (dst), (dst_stride));                                \
  } while (0)

// The prefill attention (AttendAvx2's contract) for head_dim 64 and 16-token
// blocks on AMX-BF16 tiles, fp32 sums. Scores keep about 16 bits: Q * scale
// and K each as bf16 hi + lo (K's two parts hold its fp16 value exactly),
// S = Qhi Khi + Qhi Klo + Qlo Khi a 16-key block at a time (one C tile per
// 16 queries); a score of one bf16 product each was not enough (SmolLM2's
// few large Q and K components made logits move by up to 2.7 at the first
// positions of a prompt). Softmax in fp32 on the stored scores; then
// O = P V with the weights and V as bf16, 32 keys a step into four C tiles
// (16 queries x 64 outputs). K blocks become B tiles once per call, V
// blocks once per call for every query tile (AttendScratch leaves room for
// all of them); keys past the last one any row sees are zero in both. A
// query's result does not depend on the others in its call: its scores are
// its own row of each C tile, and keys it does not see add zero products.
// A bf16 cache (kBf16Cache) holds K and V exactly as the tiles take them: K
// is one part (S = Qhi K + Qlo K, four products a block where fp16 takes
// six) and V goes into its tiles as it lies, so its numbers are those of
// the same arithmetic in double on the cache's values, up to Q's split
// (about 2^-17) and the softmax weights' rounding.
template <bool kBf16Cache>
__attribute__((target("amx-tile,amx-bf16,avx512bf16"))) void AttendPromptBf16AmxBody(
    const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows, int kv_head,
    int group, const float* q, int64_t q_stride, float scale, float* out, int64_t out_stride,
    float* scratch) {
  constexpr int d = 64;
  const int nq = rows * group;
  const int64_t n_max = n_pos + rows - 1;  // positions the last row sees
  const int64_t stride = n_max + 16;       // score floats a query
  const int64_t n_pad = (n_max + 31) / 32 * 32;
  float* scores = scratch;                                           // [nq][stride]
  uint16_t* qb = Align64<uint16_t>(scratch + (int64_t)nq * stride);  // [nq][hi d, lo d] bf16
  uint16_t* kt = Align64<uint16_t>(qb + 2 * nq * d);                 // 4 B tiles: hi 0-1, lo 2-3
  float* ob = Align64(kt + 4 * 512);                                 // [16][d] fp32
  uint16_t* vt = Align64<uint16_t>(ob + 16 * d);                     // [n_pad / 32][4] B tiles
  const AttendRows at(layer, block_table, n_pos, kv_head, group, q, q_stride, out, out_stride);
  // Q * scale as bf16 hi and lo rows (A tiles: row h, 32 inputs a step).
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < nq; ++h) {
    const float* qh = at.Q(h);
    for (int i = 0; i < d; i += 32) {
      __m512i hi, lo;
      SplitBf16(_mm512_mul_ps(_mm512_loadu_ps(qh + i), vscale),
                _mm512_mul_ps(_mm512_loadu_ps(qh + i + 16), vscale), &hi, &lo);
      _mm512_store_si512(qb + 2 * h * d + i, hi);
      _mm512_store_si512(qb + 2 * h * d + d + i, lo);
    }
  }
  // Tiles: 0 and 1 C (full, last), 2 and 3 A (full, last), 4-7 B (K hi and
  // lo, inputs 0-31 and 32-63).
  const int tiles = (nq + 15) / 16, last_rows = nq - 16 * (tiles - 1);
  AmxTileConfig cfg = FullAmxTiles();
  cfg.rows[1] = cfg.rows[3] = (uint8_t)last_rows;
  _tile_loadconfig(&cfg);
  const int64_t a_stride = 4 * d;  // bytes between a query's hi (or lo) rows
  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, n_max - j0);
    const fp16_t* src = at.Block(layer.k, j0);
    for (int c = 0; c < 2; ++c) {  // inputs [32 c, 32 c + 32): 16 pairs x 16 keys
      __m512 hi[16], lo[16];
      for (int t = 0; t < 16; ++t) {
        if (t >= nj) {
          hi[t] = lo[t] = _mm512_setzero_ps();
        } else if (kBf16Cache) {  // a key's 32 bf16 inputs: 16 pairs as they lie
          hi[t] = _mm512_loadu_ps(src + t * d + 32 * c);
        } else {
          __m512i h, l;
          SplitBf16(LoadF16x16(src + t * d + 32 * c), LoadF16x16(src + t * d + 32 * c + 16), &h,
                    &l);
          hi[t] = _mm512_castsi512_ps(h);
          lo[t] = _mm512_castsi512_ps(l);
        }
      }
      Transpose16(hi);  // row t: pair t of every key
      float* th = reinterpret_cast<float*>(kt + 512 * c);
      for (int t = 0; t < 16; ++t) _mm512_store_ps(th + 16 * t, hi[t]);
      if (!kBf16Cache) {
        Transpose16(lo);
        float* tl = reinterpret_cast<float*>(kt + 512 * (2 + c));
        for (int t = 0; t < 16; ++t) _mm512_store_ps(tl + 16 * t, lo[t]);
      }
    }
    _tile_loadd(4, kt, 64);
    _tile_loadd(5, kt + 512, 64);
    if (!kBf16Cache) {
      _tile_loadd(6, kt + 1024, 64);
      _tile_loadd(7, kt + 1536, 64);
    }
    for (int qt = 0; qt < tiles; ++qt) {
      float* dst = scores + (int64_t)16 * qt * stride + j0;
      const uint16_t* a = qb + 2 * 16 * qt * d;  // hi at a, lo at a + d
      if (qt + 1 < tiles) {
        PDQ_SCORE_TILE_BF16(0, 2, a, a_stride, d, dst, stride * 4, !kBf16Cache);
      } else {
        PDQ_SCORE_TILE_BF16(1, 3, a, a_stride, d, dst, stride * 4, !kBf16Cache);
      }
    }
  }
  // V as B tiles: 32 keys (16 pairs) x 16 outputs a tile, keys past n_max zero.
  for (int64_t j0 = 0; j0 < n_pad; j0 += 32) {
    // The two 16-key blocks of these 32 keys (the second may lie past n_max).
    const fp16_t* blocks[2] = {at.Block(layer.v, j0),
                               j0 + 16 < n_max ? at.Block(layer.v, j0 + 16) : nullptr};
    // Key j's outputs [16 c, 16 c + 16) in the cache; a bf16 cache's as 16
    // bf16, zero past n_max. (An fp16 cache's conversion stays in the body:
    // a lambda does not take the function's target.)
    auto v_row = [&](int64_t j, int c) { return blocks[(j - j0) / 16] + (j % 16) * d + 16 * c; };
    auto v_bf16 = [&](int64_t j, int c) {
      if (j >= n_max) return _mm256_setzero_si256();
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v_row(j, c)));
    };
    for (int c = 0; c < 4; ++c) {
      uint16_t* tile = vt + (j0 / 32 * 4 + c) * 512;
      for (int t = 0; t < 16; ++t) {
        const int64_t j = j0 + 2 * t;
        __m256i a, b;
        if (kBf16Cache) {
          a = v_bf16(j, c);
          b = v_bf16(j + 1, c);
        } else {
          a = (__m256i)_mm512_cvtneps_pbh(j < n_max ? LoadF16x16(v_row(j, c))
                                                    : _mm512_setzero_ps());
          b = (__m256i)_mm512_cvtneps_pbh(j + 1 < n_max ? LoadF16x16(v_row(j + 1, c))
                                                        : _mm512_setzero_ps());
        }
        const __m512i lo = _mm512_cvtepu16_epi32(a);
        const __m512i hi = _mm512_cvtepu16_epi32(b);
        _mm512_store_si512(tile + 32 * t, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
  }
  // Softmax per query in fp32; P as bf16 in place at the start of its row,
  // zero from the keys it does not see to n_pad.
  float inv_sum[64];
  for (int h = 0; h < nq; ++h) {
    float* sh = scores + h * stride;
    const int64_t n = at.Visible(h);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 valid = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
      vmax = _mm512_mask_max_ps(vmax, valid, vmax, _mm512_loadu_ps(sh + j));
    }
    inv_sum[h] = ExpScores(sh, n, vmax);  // zeros past n up to its 16-float step
    uint16_t* ph = reinterpret_cast<uint16_t*>(sh);
    for (int64_t j = 0; j < n_pad; j += 32) {
      // Reads 32 floats at j before writing 32 bf16 at j (half the bytes):
      // never over a float not yet read.
      const __mmask16 m0 = n - j >= 16 ? (__mmask16)0xffff
                           : n > j     ? (__mmask16)((1u << (n - j)) - 1)
                                       : 0;
      const __mmask16 m1 = n - j >= 32  ? (__mmask16)0xffff
                           : n > j + 16 ? (__mmask16)((1u << (n - j - 16)) - 1)
                                        : 0;
      const __m512 lo = _mm512_maskz_loadu_ps(m0, sh + j),
                   hi = _mm512_maskz_loadu_ps(m1, sh + j + 16);
      _mm512_storeu_si512(ph + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  // O = P V, 16 queries at a time into C tiles 0-3; A tile 4, B tiles 5-7.
  for (int qt = 0; qt < tiles; ++qt) {
    const int qrows = qt + 1 < tiles ? 16 : last_rows;
    AmxTileConfig pv = FullAmxTiles();
    for (int t = 0; t < 5; ++t) pv.rows[t] = (uint8_t)qrows;
    _tile_loadconfig(&pv);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* p0 = reinterpret_cast<const uint16_t*>(scores + (int64_t)16 * qt * stride);
    for (int64_t j0 = 0; j0 < n_pad; j0 += 32) {
      const uint16_t* tile = vt + j0 / 32 * 4 * 512;
      _tile_loadd(4, p0 + j0, stride * 4);
      _tile_loadd(5, tile, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, tile + 512, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, tile + 1024, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, tile + 1536, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, ob, 4 * d);
    _tile_stored(1, ob + 16, 4 * d);
    _tile_stored(2, ob + 32, 4 * d);
    _tile_stored(3, ob + 48, 4 * d);
    for (int r = 0; r < qrows; ++r) {
      const int h = 16 * qt + r;
      const __m512 inv = _mm512_set1_ps(inv_sum[h]);
      float* oh = at.Out(h);
      for (int i = 0; i < d; i += 16)
        _mm512_storeu_ps(oh + i, _mm512_mul_ps(_mm512_load_ps(ob + r * d + i), inv));
    }
  }
  _tile_release();
}
#undef PDQ_SCORE_TILE_BF16

void AttendPromptBf16Amx(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                         int rows, int kv_head, int group, const float* q, int64_t q_stride,
                         float scale, float* out, int64_t out_stride, float* scratch) {
  (layer.bf16 ? AttendPromptBf16AmxBody<true>
              : AttendPromptBf16AmxBody<false>)(layer, block_table, n_pos, rows, kv_head, group, q,
                                                q_stride, scale, out, out_stride, scratch);
}

}  // namespace

constexpr KernelTable kAvx512Kernels = {
    "avx512",
    GemmF16PanelsAvx512,
    GemmW4PanelsAvx512,
    GemmW4PanelsF32Avx512,
    GemmI8PanelsAvx512,
    QuantizeRowI8Avx512,
    GemmW4A8PanelsAvx512,
    QuantizeRowGroups<int8_t>,
    QuantizeRowGroups<int16_t>,
    RmsNormRowAvx512,
    GatedRow<false>,
    GatedRow<true>,
    AttendAvx512<true>,
    ToF16Avx512,
    GemmW8PanelsAvx512,
    nullptr,
    nullptr,
    nullptr,
    nullptr,  // bf16 tiles need AMX
    AttendAvx512<false>,
    AttendDecodeHeadsAvx512Any,
    AttendDecodeHeadsLseAvx512,
    ArgmaxRowAvx512,
    ExpRowAvx512,
};

// The AVX-512 table with AMX where it has tiles: the W8A8 GEMM on int8
// tiles, the bf16 GEMMs and the bf16 prompt attention (constant-initialized,
// as every table is, before any code that picks one runs).
constinit const KernelTable kAvx512AmxKernels = []() constexpr {
  KernelTable t = kAvx512Kernels;
  t.name = "avx512+amx";
  t.gemm_i8_panels = GemmI8PanelsAmx;
  t.gemm_w4_panels_bf16 = GemmW4PanelsBf16Amx;
  t.quantize_row_bf16 = QuantizeRowBf16Avx512;
  t.gemm_w8_panels_bf16 = GemmW8PanelsBf16Amx;
  t.attend_bf16 = AttendPromptBf16Amx;
  return t;
}
();

}  // namespace pdq::cpu
