// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and only
// reached through the dispatch table when the CPU has all three; nothing in
// this file may be called from a header-inline path.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/int16_dots.h"
#include "kernels/cpu/isa.h"

namespace pdq::cpu {
namespace {

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) to about 2 ulp for x in [-87, 88]; smaller x flush to 0.
inline __m256 Exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.3f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, result);
}

// ---- Sampling rows ---------------------------------------------------------------

// ArgmaxRowAvx512's lanes, 8 wide; the last n % 8 values after the lanes
// are reduced (their indices are larger, so only a larger value wins).
int64_t ArgmaxRowAvx2(const float* x, int64_t n) {
  __m256 best = _mm256_set1_ps(-INFINITY);
  __m256i where = _mm256_set1_epi32(-1), at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 larger = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, larger);
    where = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(where), _mm256_castsi256_ps(at), larger));
    at = _mm256_add_epi32(at, _mm256_set1_epi32(8));
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bw[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bw), where);
  int64_t arg = -1;
  for (int l = 0; l < 8; ++l) {
    if (bw[l] >= 0 && (arg < 0 || bv[l] > x[arg] || (bv[l] == x[arg] && bw[l] < arg))) arg = bw[l];
  }
  if (arg < 0) return kScalarKernels.argmax_row(x, n);  // nothing above -inf in the lanes
  for (; i < n; ++i) {
    if (x[i] > x[arg]) arg = i;
  }
  return arg;
}

float ExpRowAvx2(const float* x, int64_t n, float max, float scale, float* out) {
  const __m256 vmax = _mm256_set1_ps(max), vscale = _mm256_set1_ps(scale);
  __m256 vsum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax), vscale));
    _mm256_storeu_ps(out + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = HorizontalSum(vsum);
  if (i < n) {
    alignas(32) float in[8] = {}, e[8];
    std::copy(x + i, x + n, in);
    _mm256_store_ps(e, Exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(in), vmax), vscale)));
    for (int64_t j = 0; j < n - i; ++j) sum += out[i + j] = e[j];
  }
  return sum;
}

// ---- GEMM ------------------------------------------------------------------

// Rows [0, MR) of x against one fp16 panel, converting weights in registers.
// For the few-row (decode) case, where each weight is used MR times.
template <int MR>
inline void PanelDirect(const float* x, int64_t ldx, const fp16_t* panel, int64_t k, float* y,
                        int64_t ldy, int cols) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t kk = 0;
  if constexpr (MR == 1) {
    // Four independent accumulator pairs hide the FMA latency.
    __m256 a1[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 a2[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 a3[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; kk + 4 <= k; kk += 4) {
      const fp16_t* w = panel + kk * kPanelRows;
      const __m256 x0 = _mm256_broadcast_ss(x + kk), x1 = _mm256_broadcast_ss(x + kk + 1);
      const __m256 x2 = _mm256_broadcast_ss(x + kk + 2), x3 = _mm256_broadcast_ss(x + kk + 3);
      acc[0][0] = _mm256_fmadd_ps(x0, LoadF16x8(w), acc[0][0]);
      acc[0][1] = _mm256_fmadd_ps(x0, LoadF16x8(w + 8), acc[0][1]);
      a1[0] = _mm256_fmadd_ps(x1, LoadF16x8(w + 16), a1[0]);
      a1[1] = _mm256_fmadd_ps(x1, LoadF16x8(w + 24), a1[1]);
      a2[0] = _mm256_fmadd_ps(x2, LoadF16x8(w + 32), a2[0]);
      a2[1] = _mm256_fmadd_ps(x2, LoadF16x8(w + 40), a2[1]);
      a3[0] = _mm256_fmadd_ps(x3, LoadF16x8(w + 48), a3[0]);
      a3[1] = _mm256_fmadd_ps(x3, LoadF16x8(w + 56), a3[1]);
    }
    for (int h = 0; h < 2; ++h) {
      acc[0][h] = _mm256_add_ps(_mm256_add_ps(acc[0][h], a1[h]), _mm256_add_ps(a2[h], a3[h]));
    }
  }
  for (; kk < k; ++kk) {
    const fp16_t* w = panel + kk * kPanelRows;
    const __m256 b0 = LoadF16x8(w), b1 = LoadF16x8(w + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (cols == kPanelRows) {
      _mm256_storeu_ps(y + r * ldy, acc[r][0]);
      _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
    } else {
      alignas(32) float tmp[16];
      _mm256_store_ps(tmp, acc[r][0]);
      _mm256_store_ps(tmp + 8, acc[r][1]);
      for (int j = 0; j < cols; ++j) y[r * ldy + j] = tmp[j];
    }
  }
}

// The 6x16 register tile over an fp32 k-block of one panel (b: kc x 16);
// c rows are ldc floats apart.
template <int MR>
inline void Tile(const float* x, int64_t ldx, const float* b, int64_t kc, float* c, int64_t ldc,
                 bool load_c) {
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    if (load_c) {
      acc[r][0] = _mm256_loadu_ps(c + r * ldc);
      acc[r][1] = _mm256_loadu_ps(c + r * ldc + 8);
    } else {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_load_ps(b + kk * 16), b1 = _mm256_load_ps(b + kk * 16 + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

constexpr int64_t kKc = 256;  // k-block: a 16 KiB fp32 panel slice stays in L1
constexpr int kMr = 6;
constexpr int64_t kMc = 96;   // rows per accumulator block (6 KiB of c)

void TileAny(int mr, const float* x, int64_t ldx, const float* b, int64_t kc, float* c,
             int64_t ldc, bool load_c) {
  switch (mr) {
    case 6: Tile<6>(x, ldx, b, kc, c, ldc, load_c); break;
    case 5: Tile<5>(x, ldx, b, kc, c, ldc, load_c); break;
    case 4: Tile<4>(x, ldx, b, kc, c, ldc, load_c); break;
    case 3: Tile<3>(x, ldx, b, kc, c, ldc, load_c); break;
    case 2: Tile<2>(x, ldx, b, kc, c, ldc, load_c); break;
    default: Tile<1>(x, ldx, b, kc, c, ldc, load_c); break;
  }
}

// Blocked GEMM for many rows over panels [p_begin, p_end): a block of rows
// of x small enough to stay in L2 meets every panel in turn; each panel's
// fp32 k-slice, made by fill(p, k0, kc, b), sits in L1 while the 6x16 tiles
// accumulate into a small local C block.
template <typename FillB>
void BlockedGemm(int64_t n, int64_t k, int64_t p_begin, int64_t p_end, const float* x,
                 int64_t m, int64_t ldx, float* y, int64_t ldy, const FillB& fill) {
  alignas(64) float b[kKc * kPanelRows];
  alignas(64) float c[kMc * kPanelRows];
  // Rows per block: about 256 KiB of x, a multiple of the tile height.
  const int64_t rows_in_l2 = std::max<int64_t>(kMr, (256 << 10) / (4 * k) / kMr * kMr);
  const int64_t block = std::min(kMc, rows_in_l2);
  for (int64_t m0 = 0; m0 < m; m0 += block) {
    const int64_t mc = std::min(block, m - m0);
    for (int64_t p = p_begin; p < p_end; ++p) {
      for (int64_t k0 = 0; k0 < k; k0 += kKc) {
        const int64_t kc = std::min(kKc, k - k0);
        fill(p, k0, kc, b);
        for (int64_t r = 0; r < mc; r += kMr) {
          const int mr = (int)std::min<int64_t>(kMr, mc - r);
          TileAny(mr, x + (m0 + r) * ldx + k0, ldx, b, kc, c + r * kPanelRows, kPanelRows,
                  k0 != 0);
        }
      }
      const int cols = (int)std::min<int64_t>(kPanelRows, n - p * kPanelRows);
      for (int64_t r = 0; r < mc; ++r) {
        std::memcpy(y + (m0 + r) * ldy + p * kPanelRows, c + r * kPanelRows, cols * sizeof(float));
      }
    }
  }
}

void GemmF16PanelsAvx2(const PackedF16& w, int64_t p_begin, int64_t p_end, const float* x,
                       int64_t m, int64_t ldx, float* y, int64_t ldy) {
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
  // Larger m: convert each panel k-slice to fp32 once per row block.
  BlockedGemm(w.n, w.k, p_begin, p_end, x, m, ldx, y, ldy,
              [&](int64_t p, int64_t k0, int64_t kc, float* b) {
                const fp16_t* src = w.data + (p * w.k + k0) * kPanelRows;
                for (int64_t i = 0; i < kc * kPanelRows; i += 8) {
                  _mm256_store_ps(b + i, LoadF16x8(src + i));
                }
              });
}

// ---- W4A16 ------------------------------------------------------------------

// kernels/cpu/int16_dots.h, on vpmaddwd + vpaddd (the decode row on two
// chains).
void GemmW4PanelsAvx2(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                      const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  GemmW4PanelsInt16<2>(w, p_begin, p_end, xq, xs, xsum, m, y, ldy, kMaddDot);
}

// ---- W8A16: int8 weight groups, int16 activations ----------------------------

// kernels/cpu/int16_dots.h, on vpmaddwd + vpaddd, tiles of up to 3 rows.
void GemmW8PanelsAvx2(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                      const float* xs, int64_t m, float* y, int64_t ldy) {
  GemmW8PanelsInt16<3>(w, p_begin, p_end, xq, xs, m, y, ldy, kMaddDot, kMaddDot);
}

// Same values and rounding as QuantizeRowI16Ref: vcvtps2dq rounds to
// nearest even like nearbyint, and the sums are exact integers.
void QuantizeRowI16Avx2(const float* x, int64_t k, int group, int16_t* q, float* scale,
                        float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t g = 0; g * group < k; ++g) {
    const int64_t k0 = g * group, k1 = std::min<int64_t>(k, k0 + group);
    __m256 vmax = _mm256_setzero_ps();
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float absmax = _mm_cvtss_f32(m4);
    for (; i < k1; ++i) absmax = std::max(absmax, std::abs(x[i]));
    const float inv = absmax > 0.0f ? 32767.0f / absmax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i total = _mm256_setzero_si256();
    for (i = k0; i + 8 <= k1; i += 8) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
      total = _mm256_add_epi32(total, v);
      const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), packed);
    }
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, _MM_SHUFFLE(1, 0, 3, 2)));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, _MM_SHUFFLE(2, 3, 0, 1)));
    int32_t acc = _mm_cvtsi128_si32(t4);
    for (; i < k1; ++i) {
      q[i] = (int16_t)std::nearbyint(x[i] * inv);
      acc += q[i];
    }
    scale[g] = absmax / 32767.0f;
    sum[g] = scale[g] * (float)acc;
  }
}

// The many-row path dequantizes each panel k-slice to fp32 once per row
// block. Nibbles become fp16 1024 + q by OR-ing in the exponent byte 0x64, so
// one vcvtph2ps turns 8 of them into floats (bias = min - 1024 * scale).
void GemmW4PanelsF32Avx2(const PackedW4& w, int64_t p_begin, int64_t p_end, const float* x,
                         int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  const __m256 k1024 = _mm256_set1_ps(1024.0f);
  // Bytes 2i + e -> input e's rows: low nibbles give rows 0-7, high rows 8-15.
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i mask = _mm_set1_epi8(0x0f), magic = _mm_set1_epi8(0x64);
  BlockedGemm(w.n, w.k, p_begin, p_end, x, m, ldx, y, ldy,
              [&](int64_t p, int64_t k0, int64_t kc, float* b) {
                const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
                const fp16_t* sp = w.scale + p * groups * kPanelRows;
                const fp16_t* mp = w.min + p * groups * kPanelRows;
                // Groups (32, 64 or 128 inputs) never straddle a 256-input slice.
                for (int64_t g0 = k0; g0 < k0 + kc; g0 += w.group) {
                  const int64_t g = g0 / w.group, g1 = std::min<int64_t>(k0 + kc, g0 + w.group);
                  const __m256 s0 = LoadF16x8(sp + g * kPanelRows);
                  const __m256 s1 = LoadF16x8(sp + g * kPanelRows + 8);
                  const __m256 b0 = _mm256_fnmadd_ps(k1024, s0, LoadF16x8(mp + g * kPanelRows));
                  const __m256 b1 = _mm256_fnmadd_ps(k1024, s1, LoadF16x8(mp + g * kPanelRows + 8));
                  for (int64_t t = g0 / 2; t < g1 / 2; ++t) {
                    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + t * kPanelRows));
                    // [rows 0-7 of input 2t | rows 0-7 of 2t + 1], then rows 8-15.
                    const __m128i lo = _mm_shuffle_epi8(_mm_and_si128(v, mask), split);
                    const __m128i hi = _mm_shuffle_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), mask), split);
                    const __m128i even = _mm_unpacklo_epi64(lo, hi), odd = _mm_unpackhi_epi64(lo, hi);
                    float* dst = b + (2 * t - k0) * kPanelRows;
                    _mm256_store_ps(dst, _mm256_fmadd_ps(s0, _mm256_cvtph_ps(_mm_unpacklo_epi8(even, magic)), b0));
                    _mm256_store_ps(dst + 8, _mm256_fmadd_ps(s1, _mm256_cvtph_ps(_mm_unpackhi_epi8(even, magic)), b1));
                    _mm256_store_ps(dst + 16, _mm256_fmadd_ps(s0, _mm256_cvtph_ps(_mm_unpacklo_epi8(odd, magic)), b0));
                    _mm256_store_ps(dst + 24, _mm256_fmadd_ps(s1, _mm256_cvtph_ps(_mm_unpackhi_epi8(odd, magic)), b1));
                  }
                }
              });
}

// ---- W8A8 ---------------------------------------------------------------------

// Without VNNI, u8 x s8 products come from vpmaddubsw: |a| is the unsigned
// side and the weights take a's sign (vpsignb), so pair sums stay below
// 2 * 127 * 127 and never saturate; vpmaddwd then widens to int32.
template <int MR>
inline void I8Tile(const int8_t* panel, int64_t k4, const int8_t* xq, int64_t row_bytes,
                   const float* xs, const float* ws, float* y, int64_t ldy, int cols) {
  __m256i acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < k4; ++t) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 64 + 32));
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, xq + r * row_bytes + 4 * t, 4);
      const __m256i a = _mm256_set1_epi32(quad);
      const __m256i abs_a = _mm256_abs_epi8(a);
      const __m256i p0 = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(w0, a));
      const __m256i p1 = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(w1, a));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
    }
  }
  const __m256 s0 = _mm256_loadu_ps(ws), s1 = _mm256_loadu_ps(ws + 8);
  for (int r = 0; r < MR; ++r) {
    const __m256 xsr = _mm256_set1_ps(xs[r]);
    alignas(32) float tmp[16];
    // (float)dot * xs * ws in the reference's order, as the VNNI kernels do
    // (the avx2+vnni table takes this kernel below 4 rows and VNNI's from 4:
    // one order keeps a row's bits independent of the rows beside it).
    _mm256_store_ps(tmp, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0]), xsr), s0));
    _mm256_store_ps(tmp + 8, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][1]), xsr), s1));
    for (int j = 0; j < cols; ++j) y[r * ldy + j] = tmp[j];
  }
}

void GemmI8PanelsAvx2(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                      const float* xs, int64_t m, float* y, int64_t ldy) {
  const int64_t k4 = PackedI8K4(w.k), row_bytes = k4 * 4;
  // Rows in blocks that stay in L2 while every panel passes by.
  const int64_t block = std::max<int64_t>(4, (128 << 10) / row_bytes / 4 * 4);
  for (int64_t m0 = 0; m0 < m; m0 += block) {
    const int64_t mc = std::min(block, m - m0);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int8_t* panel = w.q + p * k4 * 4 * kPanelRows;
      const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
      // Padding rows past n have zero weights; their scale slots may not exist.
      alignas(32) float ws[16] = {};
      for (int j = 0; j < cols; ++j) ws[j] = w.scale[p * kPanelRows + j];
      for (int64_t r = m0; r < m0 + mc;) {
        const int64_t left = m0 + mc - r;
        const int8_t* a = xq + r * row_bytes;
        float* yr = y + r * ldy + p * kPanelRows;
        if (left >= 4) {
          I8Tile<4>(panel, k4, a, row_bytes, xs + r, ws, yr, ldy, cols);
          r += 4;
        } else if (left >= 2) {
          I8Tile<2>(panel, k4, a, row_bytes, xs + r, ws, yr, ldy, cols);
          r += 2;
        } else {
          I8Tile<1>(panel, k4, a, row_bytes, xs + r, ws, yr, ldy, cols);
          r += 1;
        }
      }
    }
  }
}

float QuantizeRowI8Avx2(const float* x, int64_t k, int8_t* q) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)));
  alignas(32) float t[8];
  _mm256_store_ps(t, vmax);
  float absmax = 0.0f;
  for (float v : t) absmax = std::max(absmax, v);
  for (; i < k; ++i) absmax = std::max(absmax, std::abs(x[i]));
  const float s = absmax / 127.0f;
  const float inv = s != 0.0f ? 127.0f / absmax : 0.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= k; i += 8) {
    // Round to nearest even, as the reference's nearbyint does; |v| <= 127.
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b8 = _mm_packs_epi16(w16, w16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), b8);
  }
  for (; i < PackedI8K4(k) * 4; ++i) {
    q[i] = i < k ? (int8_t)std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f) : 0;
  }
  return s;
}

// ---- Elementwise ------------------------------------------------------------

void RmsNormRowAvx2(const float* x, const float* weight, int64_t d, float eps, float* out) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = HorizontalSum(acc);
  for (; i < d; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / (float)d + eps);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                   _mm256_loadu_ps(weight + i)));
  }
  for (; i < d; ++i) out[i] = x[i] * scale * weight[i];
}

void SiluMulRowAvx2(const float* gate, const float* up, int64_t f, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= f; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < f; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// gelu_tanh(g) = g / 2 (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g +
// 0.044715 g^3): SiLU's form with another argument.
void GeluMulRowAvx2(const float* gate, const float* up, int64_t f, float* out) {
  const float k2 = 2.0f * 0.7978845608028654f;
  const __m256 one = _mm256_set1_ps(1.0f), vk = _mm256_set1_ps(-k2), vc = _mm256_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= f; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(vc, g), _mm256_mul_ps(g, g), g);
    const __m256 e = Exp(_mm256_mul_ps(vk, inner));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < f; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-k2 * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void ToF16Avx2(const float* src, int64_t n, fp16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    alignas(32) float tmp[8] = {};
    alignas(16) fp16_t out[8];
    for (int64_t j = i; j < n; ++j) tmp[j - i] = src[j];
    _mm_store_si128(reinterpret_cast<__m128i*>(out),
                    _mm256_cvtps_ph(_mm256_load_ps(tmp), _MM_FROUND_TO_NEAREST_INT));
    for (int64_t j = i; j < n; ++j) dst[j] = out[j - i];
  }
}

// ---- Attention ----------------------------------------------------------------

// Sums each of 8 vectors: lane t of the result is the sum of v[t].
inline __m256 Reduce8(const __m256 v[8]) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  // ab = [s0 s1 s2 s3 | s0' s1' s2' s3'] (halves of each sum), same for cd.
  const __m256 lo = _mm256_permute2f128_ps(ab, cd, 0x20), hi = _mm256_permute2f128_ps(ab, cd, 0x31);
  return _mm256_add_ps(lo, hi);
}

// The heads of one GQA group share every K and V row, so each chunk of 16
// keys is converted to fp32 once and reused by all of them; scores for 8 keys
// are reduced together instead of one horizontal sum per key.
// head_dim must be a multiple of 8 (up to 256); other sizes use the reference.
// out[0, 8 NV) += sum_j p[j] * v[j][0, 8 NV) over nj rows of v (d apart),
// the accumulators in registers.
template <int NV>
inline void AccumulatePv(const float* p, int64_t nj, const float* v, int d, float* out) {
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_loadu_ps(out + 8 * i);
  for (int64_t j = 0; j < nj; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(pj, _mm256_load_ps(v + j * d + 8 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// A decode row's attention works in register tiles straight from the fp16
// cache (no fp32 copy of the block: one query row cannot pay for it): up
// to kTileHeads query heads of a GQA group against 4 keys (scores) or
// against a slice of the value dimensions (outputs), every K/V vector
// loaded and converted once for those heads. 16 ymm registers hold
// 3 heads x 4 accumulators, the 3 query or weight vectors and the K/V one.
constexpr int kTileHeads = 3;

// s[j] = exp(s[j] - max) for j < n; their sum.
inline float ExpInPlace(float* s, int64_t n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = HorizontalSum(vsum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - max);
    sum += s[j];
  }
  return sum;
}

// A query's n scores s[0, n) become exp(s[j] - their max); returns 1 / the
// sum of those, the factor that makes them softmax weights, and writes max +
// log(sum) to lse where it is not null.
inline float SoftmaxWeights(float* s, int64_t n, float* lse = nullptr) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float max = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) max = std::max(max, s[j]);
  const float sum = ExpInPlace(s, n, max);
  if (lse != nullptr) *lse = max + std::log(sum);
  return 1.0f / sum;
}

// Lane t of the result: the sum of a[t]'s lanes.
inline __m128 Reduce4(const __m256 a[4]) {
  const __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
}

// 8 cached K or V elements as fp32: fp16 (F16C), or bf16
// (KvLayerView::bf16: the upper half of an fp32, widened and shifted).
template <bool kBf16>
inline __m256 LoadKv8(const fp16_t* p) {
  if constexpr (kBf16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  } else {
    return LoadF16x8(p);
  }
}

// s[h * s_stride + t] = scale * q[h] . k[t] for G heads (q rows d apart)
// and the 4 keys from k (rows d apart).
template <bool kBf16, int G>
inline void ScoreKeys4(const float* q, const fp16_t* k, int d, float scale, float* s,
                       int64_t s_stride) {
  __m256 acc[G][4];
  for (int h = 0; h < G; ++h)
    for (int t = 0; t < 4; ++t) acc[h][t] = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    __m256 qv[G];
    for (int h = 0; h < G; ++h) qv[h] = _mm256_loadu_ps(q + h * d + i);
    for (int t = 0; t < 4; ++t) {
      const __m256 kv = LoadKv8<kBf16>(k + t * d + i);
      for (int h = 0; h < G; ++h) acc[h][t] = _mm256_fmadd_ps(qv[h], kv, acc[h][t]);
    }
  }
  const __m128 vscale = _mm_set1_ps(scale);
  for (int h = 0; h < G; ++h) _mm_storeu_ps(s + h * s_stride, _mm_mul_ps(Reduce4(acc[h]), vscale));
}

// The same for one key.
template <bool kBf16, int G>
inline void ScoreKey1(const float* q, const fp16_t* k, int d, float scale, float* s,
                      int64_t s_stride) {
  __m256 acc[G];
  for (int h = 0; h < G; ++h) acc[h] = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 kv = LoadKv8<kBf16>(k + i);
    for (int h = 0; h < G; ++h)
      acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), kv, acc[h]);
  }
  for (int h = 0; h < G; ++h) s[h * s_stride] = HorizontalSum(acc[h]) * scale;
}

// The scores of G heads (q rows d apart) for the nj keys of a block (rows d
// apart from k): p[h * p_stride + j], j < nj.
template <bool kBf16, int G>
inline void ScoreBlock(const float* q, const fp16_t* k, int64_t nj, int d, float scale, float* p,
                       int64_t p_stride) {
  int64_t j = 0;
  for (; j + 4 <= nj; j += 4) ScoreKeys4<kBf16, G>(q, k + j * d, d, scale, p + j, p_stride);
  for (; j < nj; ++j) ScoreKey1<kBf16, G>(q, k + j * d, d, scale, p + j, p_stride);
}

// out[h][8 c0, 8 (c0 + C)) = sum over the n positions j of p[h][j] v[j][..]
// for G heads (p rows p_stride apart, out rows d apart); v rows are found
// through the block table (chunks: their places from vbase, this kv head's
// rows).
template <bool kBf16, int G, int C>
inline void WeighValues(const float* p, int64_t p_stride, const fp16_t* vbase,
                        const KvChunks& chunks, int64_t n, int d, int c0, float* out,
                        const KvRowPrefetch& prefetch) {
  __m256 acc[G][C];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    // The first slice's pass brings each block in; the later ones find it.
    if (c0 == 0) prefetch.ValuesAt(j0);
    const fp16_t* block = vbase + chunks.Offset(j0) + 8 * c0;
    const int64_t nj = std::min<int64_t>(16, n - j0);
    for (int64_t j = 0; j < nj; ++j) {
      __m256 pj[G];
      for (int h = 0; h < G; ++h) pj[h] = _mm256_broadcast_ss(p + h * p_stride + j0 + j);
      for (int c = 0; c < C; ++c) {
        const __m256 vv = LoadKv8<kBf16>(block + j * d + 8 * c);
        for (int h = 0; h < G; ++h) acc[h][c] = _mm256_fmadd_ps(pj[h], vv, acc[h][c]);
      }
    }
  }
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + h * d + 8 * (c0 + c), acc[h][c]);
}

// WeighValues<G, cn> for a slice of cn <= C vectors (a head dimension's
// last slice may be narrower), called directly so it inlines.
template <bool kBf16, int G, int C>
inline void WeighValueSlice(int cn, const float* p, int64_t p_stride, const fp16_t* vbase,
                            const KvChunks& chunks, int64_t n, int d, int c0, float* out,
                            const KvRowPrefetch& prefetch) {
  if constexpr (C > 1) {
    if (cn < C) {
      WeighValueSlice<kBf16, G, C - 1>(cn, p, p_stride, vbase, chunks, n, d, c0, out, prefetch);
      return;
    }
  }
  WeighValues<kBf16, G, C>(p, p_stride, vbase, chunks, n, d, c0, out, prefetch);
}

// One decode row: G <= kTileHeads heads (q, out rows d apart) over n_pos
// positions; p: G rows of p_stride >= n_pos + 8 floats for the scores.
template <bool kBf16, int G>
void AttendRowTiles(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                    int kv_head, const float* q, float scale, float* out, float* p,
                    int64_t p_stride) {
  const int d = layer.head_dim;
  const KvChunks chunks(layer, block_table);
  const fp16_t* kbase = layer.k + kv_head * chunks.head_stride;
  const fp16_t* vbase = layer.v + kv_head * chunks.head_stride;
  const KvRowPrefetch prefetch(layer, block_table, n_pos, kv_head);
  prefetch.FirstKeys();
  for (int64_t j0 = 0; j0 < n_pos; j0 += 16) {
    prefetch.KeysAt(j0);
    ScoreBlock<kBf16, G>(q, kbase + chunks.Offset(j0), std::min<int64_t>(16, n_pos - j0), d, scale,
                         p + j0, p_stride);
  }
  float inv_sum[G];
  for (int h = 0; h < G; ++h) inv_sum[h] = SoftmaxWeights(p + h * p_stride, n_pos);
  // Slices of C value vectors: as many accumulators as the registers hold.
  constexpr int C = G == 1 ? 8 : G == 2 ? 6 : 4;
  const int dv = d / 8;
  for (int c0 = 0; c0 < dv; c0 += C) {
    WeighValueSlice<kBf16, G, C>(std::min(C, dv - c0), p, p_stride, vbase, chunks, n_pos, d, c0,
                                 out, prefetch);
  }
  for (int h = 0; h < G; ++h) {
    const __m256 inv = _mm256_set1_ps(inv_sum[h]);
    for (int i = 0; i < d; i += 8) {
      _mm256_storeu_ps(out + h * d + i, _mm256_mul_ps(_mm256_loadu_ps(out + h * d + i), inv));
    }
  }
}

// acc[h][8 c0, 8 (c0 + C)) += p[h][j] v[j][..] for the nj rows of one V
// block (rows d apart from v) and G heads (p rows p_stride apart, acc rows d
// apart): WeighValues' steps for one block, its sums kept in memory between
// blocks (the same numbers: each float goes out and comes back unchanged).
template <bool kBf16, int G, int C>
inline void WeighBlock(const float* p, int64_t p_stride, const fp16_t* v, int64_t nj, int d, int c0,
                       float* acc) {
  __m256 a[G][C];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) a[h][c] = _mm256_loadu_ps(acc + h * d + 8 * (c0 + c));
  for (int64_t j = 0; j < nj; ++j) {
    __m256 pj[G];
    for (int h = 0; h < G; ++h) pj[h] = _mm256_broadcast_ss(p + h * p_stride + j);
    for (int c = 0; c < C; ++c) {
      const __m256 vv = LoadKv8<kBf16>(v + j * d + 8 * (c0 + c));
      for (int h = 0; h < G; ++h) a[h][c] = _mm256_fmadd_ps(pj[h], vv, a[h][c]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + h * d + 8 * (c0 + c), a[h][c]);
}

// WeighBlock for the last cn < C vectors of a head dimension, from c0.
template <bool kBf16, int G, int C>
inline void WeighBlockTail(int cn, const float* p, int64_t p_stride, const fp16_t* v, int64_t nj,
                           int d, int c0, float* acc) {
  if constexpr (C > 0) {
    if (cn == C) {
      WeighBlock<kBf16, G, C>(p, p_stride, v, nj, d, c0, acc);
    } else {
      WeighBlockTail<kBf16, G, C - 1>(cn, p, p_stride, v, nj, d, c0, acc);
    }
  }
}

// WeighBlock over a head dimension's slices of C vectors (the last may be
// narrower), as AttendRowTiles slices it.
template <bool kBf16, int G, int C>
inline void WeighBlockSlices(const float* p, int64_t p_stride, const fp16_t* v, int64_t nj, int d,
                             float* acc) {
  const int dv = d / 8;
  int c0 = 0;
  for (; c0 + C <= dv; c0 += C) WeighBlock<kBf16, G, C>(p, p_stride, v, nj, d, c0, acc);
  WeighBlockTail<kBf16, G, C - 1>(dv - c0, p, p_stride, v, nj, d, c0, acc);
}

// The query heads of a kv head in tiles of up to kTileHeads: fn(tile's
// first head, std::integral_constant<int, G>) for each.
template <typename Fn>
inline void ForHeadTiles(int group, const Fn& fn) {
  for (int h0 = 0; h0 < group; h0 += kTileHeads) {
    switch (std::min(kTileHeads, group - h0)) {
      case 3:
        fn(h0, std::integral_constant<int, 3>{});
        break;
      case 2:
        fn(h0, std::integral_constant<int, 2>{});
        break;
      default:
        fn(h0, std::integral_constant<int, 1>{});
        break;
    }
  }
}

// KernelTable::attend_decode_heads: AttendRowTiles for every kv head of the
// layer at once, with the same numbers: block by block, each kv head's rows
// in turn, so that a block's rows of all kv heads (one run in the cache)
// are read together and consecutive blocks stream, as the AVX-512 kernel
// does. The value sums wait in scratch between blocks. Needs kv_heads *
// group <= 16 (scratch: the scores, then kv_heads * group * head_dim sums in
// AttendWorkFloats' 32 head_dim rows).
template <bool kBf16>
void AttendDecodeHeadsAvx2Body(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                               int group, const float* q, float scale, float* out, float* scratch,
                               float* lse) {
  const int d = layer.head_dim;
  const int heads = layer.kv_heads;
  const int nq = heads * group;
  const KvChunks chunks(layer, block_table);
  const int64_t p_stride = n_pos + 16;
  float* p = scratch;              // [nq][p_stride]
  float* acc = p + nq * p_stride;  // [nq][d]
  const KvRowPrefetch prefetch(layer, block_table, n_pos, 0, heads);
  // fn(query row r, its tile's width G, the kv head's rows of the chunk,
  // the chunk's first position, its rows) for every block of `base` (K or
  // V) in order, in each every kv head in turn, and for each its 16-position
  // chunks in order (its rows in the block one run: blocks of more than 16
  // tokens read in order too) and every tile of its query heads.
  const int64_t bt = layer.block_tokens;
  auto for_blocks = [&](const fp16_t* base, bool keys, const auto& fn) {
    for (int64_t b0 = 0; b0 < n_pos; b0 += bt) {
      keys ? prefetch.KeysAt(b0) : prefetch.ValuesAt(b0);
      const int64_t end = std::min(b0 + bt, n_pos);
      const fp16_t* block = base + chunks.Offset(b0);
      for (int h = 0; h < heads; ++h) {
        for (int64_t j0 = b0; j0 < end; j0 += 16) {
          const fp16_t* chunk = block + h * chunks.head_stride + (j0 - b0) * d;
          const int64_t nj = std::min<int64_t>(16, n_pos - j0);
          ForHeadTiles(group, [&](int h0, auto g) { fn(h * group + h0, g, chunk, j0, nj); });
        }
      }
    }
  };
  prefetch.FirstKeys();
  for_blocks(layer.k, true, [&](int r, auto g, const fp16_t* rows, int64_t j0, int64_t nj) {
    ScoreBlock<kBf16, decltype(g)::value>(q + r * d, rows, nj, d, scale, p + r * p_stride + j0,
                                          p_stride);
  });
  float inv_sum[16];
  for (int r = 0; r < nq; ++r) {
    inv_sum[r] = SoftmaxWeights(p + r * p_stride, n_pos, lse ? lse + r : nullptr);
    std::fill(acc + r * d, acc + (r + 1) * d, 0.0f);
  }
  for_blocks(layer.v, false, [&](int r, auto g, const fp16_t* rows, int64_t j0, int64_t nj) {
    constexpr int G = decltype(g)::value;
    // As AttendRowTiles: as many accumulators as the registers hold.
    constexpr int C = G == 1 ? 8 : G == 2 ? 6 : 4;
    WeighBlockSlices<kBf16, G, C>(p + r * p_stride + j0, p_stride, rows, nj, d, acc + r * d);
  });
  for (int r = 0; r < nq; ++r) {
    const __m256 inv = _mm256_set1_ps(inv_sum[r]);
    for (int i = 0; i < d; i += 8) {
      _mm256_storeu_ps(out + r * d + i, _mm256_mul_ps(_mm256_loadu_ps(acc + r * d + i), inv));
    }
  }
}

}  // namespace

// `rows` consecutive query rows of one sequence (row r sees positions
// [0, n_pos + r)) times the `group` heads sharing kv head `kv_head`: each K/V
// block is converted to fp32 once for all rows * group query vectors; a
// decode row (rows 1) works in register tiles instead (AttendRowTiles).
// attend (kShortcuts: one row on AttendRowTiles) and attend_prompt (every
// row count on the body below).
template <bool kShortcuts, bool kBf16>
static void AttendAvx2Body(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                           int rows, int kv_head, int group, const float* q, int64_t q_stride,
                           float scale, float* out, int64_t out_stride, float* scratch) {
  const int d = layer.head_dim;
  const int nq = rows * group;
  constexpr int kMaxQ = 64;
  if (d % 8 != 0 || d > 256 || !KvChunks::Fit(layer) || nq > kMaxQ) {
    kScalarKernels.attend(layer, block_table, n_pos, rows, kv_head, group, q, q_stride, scale, out,
                          out_stride, scratch);
    return;
  }
  if (kShortcuts && rows == 1) {
    // The group's heads in tiles of up to kTileHeads; scratch holds
    // group * (n_pos + 16) score floats (AttendScratch).
    const int64_t p_stride = n_pos + 16;
    ForHeadTiles(group, [&](int h0, auto g) {
      AttendRowTiles<kBf16, decltype(g)::value>(layer, block_table, n_pos, kv_head, q + h0 * d,
                                                scale, out + h0 * d, scratch + h0 * p_stride,
                                                p_stride);
    });
    return;
  }
  const int dv = d / 8;
  const int64_t n_max = n_pos + rows - 1;  // positions the last row sees
  const int64_t stride = n_max + 16;
  float* scores = scratch;  // [nq][stride]
  // 16 x d fp32 rows (K, then V), 32-byte aligned for the vector loads.
  float* kv_rows = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(scratch + nq * stride) + 31) & ~uintptr_t{31});
  const KvChunks chunks(layer, block_table);
  const __m256 vscale = _mm256_set1_ps(scale);
  auto convert_block = [&](const fp16_t* base, int64_t j0, int64_t nj) {
    const fp16_t* src = base + chunks.Offset(j0) + kv_head * chunks.head_stride;
    for (int64_t i = 0; i < nj * d; i += 8) _mm256_store_ps(kv_rows + i, LoadKv8<kBf16>(src + i));
  };
  auto q_of = [&](int h) { return q + (h / group) * q_stride + (h % group) * d; };
  auto out_of = [&](int h) { return out + (h / group) * out_stride + (h % group) * d; };
  auto visible = [&](int h) { return n_pos + h / group; };  // positions query h sees

  float max_score[kMaxQ];
  std::fill(max_score, max_score + nq, -INFINITY);
  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, n_max - j0);
    convert_block(layer.k, j0, nj);
    for (int h = 0; h < nq; ++h) {
      const int64_t nh = std::min<int64_t>(nj, visible(h) - j0);  // keys of this block it sees
      if (nh <= 0) continue;
      const float* qh = q_of(h);
      float* sh = scores + h * stride + j0;
      int64_t j = 0;
      for (; j + 8 <= nh; j += 8) {
        __m256 acc[8];
        for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
        for (int v = 0; v < dv; ++v) {
          const __m256 qv = _mm256_loadu_ps(qh + 8 * v);
#pragma GCC unroll 8
          for (int t = 0; t < 8; ++t) {
            acc[t] = _mm256_fmadd_ps(qv, _mm256_load_ps(kv_rows + (j + t) * d + 8 * v), acc[t]);
          }
        }
        _mm256_storeu_ps(sh + j, _mm256_mul_ps(Reduce8(acc), vscale));
      }
      for (; j < nh; ++j) {
        __m256 acc = _mm256_setzero_ps();
        for (int v = 0; v < dv; ++v) {
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), _mm256_load_ps(kv_rows + j * d + 8 * v), acc);
        }
        sh[j] = HorizontalSum(acc) * scale;
      }
      for (j = 0; j < nh; ++j) max_score[h] = std::max(max_score[h], sh[j]);
    }
  }

  float inv_sum[kMaxQ];
  for (int h = 0; h < nq; ++h) {
    const int64_t n = visible(h);
    float* sh = scores + h * stride;
    inv_sum[h] = 1.0f / ExpInPlace(sh, n, max_score[h]);
    float* oh = out_of(h);
    for (int i = 0; i < d; ++i) oh[i] = 0.0f;
  }

  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, n_max - j0);
    convert_block(layer.v, j0, nj);
    for (int h = 0; h < nq; ++h) {
      const int64_t nh = std::min<int64_t>(nj, visible(h) - j0);
      if (nh <= 0) continue;
      const float* ph = scores + h * stride + j0;
      float* oh = out_of(h);
      // Up to 8 output vectors live in registers at a time.
      for (int v0 = 0; v0 < dv; v0 += 8) {
        const float* vb = kv_rows + 8 * v0;
        switch (std::min(8, dv - v0)) {
          case 8: AccumulatePv<8>(ph, nh, vb, d, oh + 8 * v0); break;
          case 7: AccumulatePv<7>(ph, nh, vb, d, oh + 8 * v0); break;
          case 6: AccumulatePv<6>(ph, nh, vb, d, oh + 8 * v0); break;
          case 5: AccumulatePv<5>(ph, nh, vb, d, oh + 8 * v0); break;
          case 4: AccumulatePv<4>(ph, nh, vb, d, oh + 8 * v0); break;
          case 3: AccumulatePv<3>(ph, nh, vb, d, oh + 8 * v0); break;
          case 2: AccumulatePv<2>(ph, nh, vb, d, oh + 8 * v0); break;
          default: AccumulatePv<1>(ph, nh, vb, d, oh + 8 * v0); break;
        }
      }
    }
  }
  for (int h = 0; h < nq; ++h) {
    const __m256 inv = _mm256_set1_ps(inv_sum[h]);
    float* oh = out_of(h);
    for (int v = 0; v < dv; ++v) {
      _mm256_storeu_ps(oh + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(oh + 8 * v), inv));
    }
  }
}

// The body for the cache's element type.
template <bool kShortcuts>
void AttendAvx2(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                int kv_head, int group, const float* q, int64_t q_stride, float scale, float* out,
                int64_t out_stride, float* scratch) {
  const auto body =
      layer.bf16 ? AttendAvx2Body<kShortcuts, true> : AttendAvx2Body<kShortcuts, false>;
  body(layer, block_table, n_pos, rows, kv_head, group, q, q_stride, scale, out, out_stride,
       scratch);
}

template void AttendAvx2<true>(const KvLayerView&, const int32_t*, int64_t, int, int, int,
                               const float*, int64_t, float, float*, int64_t, float*);
template void AttendAvx2<false>(const KvLayerView&, const int32_t*, int64_t, int, int, int,
                                const float*, int64_t, float, float*, int64_t, float*);

// KernelTable::attend_decode_heads_lse: whether AttendDecodeHeadsAvx2 takes
// the shape on its own body: attend (rows 1) would take its register tiles
// for each kv head and the sums fit the scratch (kv_heads * group <= 16).
bool AttendDecodeHeadsLseAvx2(const KvLayerView& layer, int group) {
  const int d = layer.head_dim;
  return d % 8 == 0 && d <= 256 && KvChunks::Fit(layer) && layer.kv_heads * group <= 16;
}

// KernelTable::attend_decode_heads: AttendDecodeHeadsAvx2Body where
// AttendDecodeHeadsLseAvx2 holds, else attend for each kv head (lse null).
void AttendDecodeHeadsAvx2(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                           int group, const float* q, float scale, float* out, float* scratch,
                           float* lse) {
  if (AttendDecodeHeadsLseAvx2(layer, group)) {
    const auto body =
        layer.bf16 ? AttendDecodeHeadsAvx2Body<true> : AttendDecodeHeadsAvx2Body<false>;
    body(layer, block_table, n_pos, group, q, scale, out, scratch, lse);
    return;
  }
  const int d = layer.head_dim;
  const int64_t row = (int64_t)group * d;
  for (int h = 0; h < layer.kv_heads; ++h) {
    AttendAvx2<true>(layer, block_table, n_pos, 1, h, group, q + h * row, row, scale, out + h * row,
                     row, scratch);
  }
}

const KernelTable kAvx2Kernels = {
    "avx2",
    GemmF16PanelsAvx2,
    GemmW4PanelsAvx2,
    GemmW4PanelsF32Avx2,
    GemmI8PanelsAvx2,
    QuantizeRowI8Avx2,
    nullptr,
    nullptr,  // no W4A8 on AVX2 yet: int16 activations throughout
    QuantizeRowI16Avx2,
    RmsNormRowAvx2,
    SiluMulRowAvx2,
    GeluMulRowAvx2,
    AttendAvx2<true>,
    ToF16Avx2,
    GemmW8PanelsAvx2,
    nullptr,
    nullptr,
    nullptr,  // no bf16 tiles
    nullptr,
    AttendAvx2<false>,
    AttendDecodeHeadsAvx2,
    AttendDecodeHeadsLseAvx2,
    ArgmaxRowAvx2,
    ExpRowAvx2,
};

}  // namespace pdq::cpu
