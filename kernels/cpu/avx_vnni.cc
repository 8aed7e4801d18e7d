// AVX-VNNI kernels (256-bit vpdpbusd: Alder Lake and later client CPUs,
// Sierra Forest), for CPUs that have them without the AVX-512 table's
// requirements. Compiled with -mavx2 -mfma -mf16c -mavxvnni and reached only
// through dispatch. The W8A8 GEMM from 4 rows, the W4A16 int16 kernels
// (decode row and tiles) and the W8A16 tiles differ from the AVX2 table, their dot products
// through asm helpers (GCC 12's intrinsics copy the accumulators; with them,
// 256-bit vpdpwssd had measured 0.8-0.9x vpmaddwd + vpaddd). Below 4 rows
// vpdpbusd did not beat the AVX2 W8A8 kernel. bench/RESULTS.md, "AVX-VNNI".
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/int16_dots.h"
#include "kernels/cpu/isa.h"

namespace pdq::cpu {
namespace {

// acc + vpdpbusd(a, b), as asm: GCC 12's intrinsic accumulates into a fresh
// register and copies it back, which in the 4-row tile below cost ten
// register copies and two stack stores per eight dot products (as the
// AVX-512 kernels' Dpbusd, avx512.cc). "+x" ties the accumulator; {vex}
// asks for the AVX-VNNI encoding (ymm0-15 only).
inline __m256i DpbusdVex(__m256i acc, __m256i a_u8, __m256i b_s8) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a_u8), "xm"(b_s8));
  return acc;
}
inline __m256i DpwssdVex(__m256i acc, __m256i a, __m256i b) {
  asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b));
  return acc;
}
// The same as the dot product int16_dots.h's kernels take (a lambda, so that
// each kernel is instantiated for it and inlines it).
constexpr auto kDpwssdVex = [](__m256i acc, __m256i a, __m256i b) { return DpwssdVex(acc, a, b); };

// ---- W4A16 -------------------------------------------------------------------

// W4A16 on int16 activations with the VEX vpdpwssd (kernels/cpu/int16_dots.h):
// a lone row (decode, or the last of a batch) on the AVX-512 table's
// 256-bit row kernel, four chains (one chain's latency would bound a group);
// other rows in tiles of up to 4 (6 measured the same). Sums and rounding
// are the AVX2 kernels' bit for bit.
void GemmW4PanelsVnni(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                      const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  GemmW4PanelsInt16<4>(w, p_begin, p_end, xq, xs, xsum, m, y, ldy, kDpwssdVex);
}

// ---- W8A16 --------------------------------------------------------------------

// W8A16 on int16 activations with the VEX vpdpwssd (kernels/cpu/int16_dots.h),
// in tiles of up to 4 rows. A lone row keeps AVX2's vpmaddwd + vpaddd: its
// single accumulator per half would wait on vpdpwssd's latency. Sums and
// rounding are the AVX2 kernel's bit for bit.
void GemmW8PanelsVnni(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                      const float* xs, int64_t m, float* y, int64_t ldy) {
  GemmW8PanelsInt16<4>(w, p_begin, p_end, xq, xs, m, y, ldy, kDpwssdVex, kMaddDot);
}

// ---- W8A8 ---------------------------------------------------------------------

// As in the AVX-512 kernel: vpdpbusd multiplies unsigned by signed bytes, so
// activations enter as x ^ 0x80 (x + 128) and 128 x each weight row's sum
// is subtracted, exactly. A panel's quad step is two vectors (rows 0-7,
// rows 8-15). `xu` holds the rows already flipped (GemmI8PanelsVnni), which
// frees the register the flip took: 6 rows x 2 accumulators, two weight
// vectors and the broadcast fill the 16.
template <int MR>
void I8VnniTile(const int8_t* panel, int64_t k4, const uint8_t* xu, int64_t row_bytes,
                const float* xs, const __m256i offset[2], const __m256 ws[2], float* y, int64_t ldy,
                int cols) {
  __m256i acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t t = 0; t < k4; ++t) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 64 + 32));
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, xu + r * row_bytes + 4 * t, 4);
      const __m256i a = _mm256_set1_epi32(quad);
      acc[r][0] = DpbusdVex(acc[r][0], a, w0);
      acc[r][1] = DpbusdVex(acc[r][1], a, w1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    // (float)dot * xs * ws in the reference's order.
    const __m256 xsr = _mm256_set1_ps(xs[r]);
    alignas(32) float tmp[16];
    for (int h = 0; h < 2; ++h) {
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][h], offset[h]));
      _mm256_store_ps(tmp + 8 * h, _mm256_mul_ps(_mm256_mul_ps(dot, xsr), ws[h]));
    }
    std::memcpy(y + r * ldy, tmp, cols * sizeof(float));
  }
}

void GemmI8PanelsVnni(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                      const float* xs, int64_t m, float* y, int64_t ldy) {
  if (m < 4) {  // decode: one or two dpbusd chains are latency-bound; AVX2 is faster
    kAvx2Kernels.gemm_i8_panels(w, p_begin, p_end, xq, xs, m, y, ldy);
    return;
  }
  const int64_t k4 = PackedI8K4(w.k), row_bytes = k4 * 4;
  const __m256i k128 = _mm256_set1_epi8((char)0x80);
  // Rows in blocks that stay in L2 while every panel passes by.
  const int64_t block = std::max<int64_t>(6, (128 << 10) / row_bytes / 6 * 6);
  // The block's rows flipped to unsigned once (x ^ 0x80), not per broadcast:
  // at most 128 KiB a thread (6 rows where a row is longer than a sixth of
  // that), kept for the next call.
  thread_local std::vector<uint8_t> flipped;
  flipped.resize(std::max<size_t>(flipped.size(), (size_t)(block * row_bytes)));
  for (int64_t m0 = 0; m0 < m; m0 += block) {
    const int64_t mc = std::min(block, m - m0);
    for (int64_t i = 0; i + 32 <= mc * row_bytes; i += 32) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m0 * row_bytes + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(flipped.data() + i),
                          _mm256_xor_si256(v, k128));
    }
    for (int64_t i = mc * row_bytes / 32 * 32; i < mc * row_bytes; ++i) {
      flipped[i] = (uint8_t)(xq[m0 * row_bytes + i] ^ 0x80);
    }
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int8_t* panel = w.q + p * k4 * 4 * kPanelRows;
      const int cols = (int)std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
      // Padding rows past n have zero weights; their scale slots may not exist.
      alignas(32) float scales[16] = {};
      for (int j = 0; j < cols; ++j) scales[j] = w.scale[p * kPanelRows + j];
      const __m256 ws[2] = {_mm256_load_ps(scales), _mm256_load_ps(scales + 8)};
      __m256i offset[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int64_t t = 0; t < k4; ++t) {
        for (int h = 0; h < 2; ++h) {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + t * 64 + 32 * h));
          offset[h] = DpbusdVex(offset[h], k128, wv);
        }
      }
      for (int64_t r = m0; r < m0 + mc;) {
        const int64_t left = m0 + mc - r;
        const uint8_t* a = flipped.data() + (r - m0) * row_bytes;
        float* yr = y + r * ldy + p * kPanelRows;
        const int mr = (int)std::min<int64_t>(6, left);
        switch (mr) {
          case 6:
            I8VnniTile<6>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols);
            break;
          case 5:
            I8VnniTile<5>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols);
            break;
          case 4: I8VnniTile<4>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 3: I8VnniTile<3>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          case 2: I8VnniTile<2>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
          default: I8VnniTile<1>(panel, k4, a, row_bytes, xs + r, offset, ws, yr, ldy, cols); break;
        }
        r += mr;
      }
    }
  }
}

}  // namespace

const KernelTable& AvxVnniKernels() {
  // Built on first use from the AVX2 table (constant-initialized, so ready
  // before any caller), with the integer products replaced.
  static const KernelTable table = [] {
    KernelTable t = kAvx2Kernels;
    t.name = "avx2+vnni";
    t.gemm_i8_panels = GemmI8PanelsVnni;
    t.gemm_w4_panels = GemmW4PanelsVnni;
    t.gemm_w8_panels = GemmW8PanelsVnni;
    return t;
  }();
  return table;
}

}  // namespace pdq::cpu
