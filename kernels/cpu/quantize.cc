// Weight quantizers: ISA-independent, run once at load or quantize time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"
#include "kernels/kernels.h"

namespace pdq {

void PackW4Rows(const uint8_t* codes, const fp16_t* scales, const fp16_t* mins, int64_t row0,
                int64_t rows, int64_t k, int group, uint8_t* q, fp16_t* scale, fp16_t* min) {
  PDQ_CHECK(k % 2 == 0 && group > 0 && 256 % group == 0);
  const int64_t groups = PackedW4Groups(k, group);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row0 + r, p = n / kPanelRows, j = n % kPanelRows;
    for (int64_t g = 0; g < groups; ++g) {
      scale[(p * groups + g) * kPanelRows + j] = scales[r * groups + g];
      min[(p * groups + g) * kPanelRows + j] = mins[r * groups + g];
    }
    const uint8_t* c = codes + r * k;
    uint8_t* qp = q + p * (k / 2) * kPanelRows;
    const int shift = j < 8 ? 0 : 4;
    for (int64_t i = 0; i < k; ++i) {
      PDQ_CHECK(c[i] < 16);
      uint8_t& byte = qp[(i / 2) * kPanelRows + 2 * (j % 8) + i % 2];
      byte = (uint8_t)((byte & (0xf0 >> shift)) | (c[i] << shift));
    }
  }
}

void W4GroupParams(const float* w, int64_t n, bool symmetric, fp16_t* scale, fp16_t* min,
                   float shrink) {
  float lo = w[0], hi = w[0];
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  float s, m;
  if (symmetric) {
    // Like ggml's Q4_0: the extreme value maps to q = 0 (i.e. -8 * s).
    const float extreme = -lo > hi ? lo : hi;
    s = shrink * extreme / -8.0f;
    m = -8.0f * s;
  } else {
    s = shrink * (hi - lo) / 15.0f;
    m = shrink * lo;
  }
  *scale = Fp32ToFp16(s);
  *min = Fp32ToFp16(m);
}

void QuantizeW4Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int group,
                    bool symmetric, uint8_t* q, fp16_t* scale, fp16_t* min) {
  PDQ_CHECK(k % 2 == 0 && group > 0 && 256 % group == 0);
  const int64_t groups = PackedW4Groups(k, group);
  std::vector<uint8_t> codes(k);
  std::vector<fp16_t> scales(groups), mins(groups);
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = src + r * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group, k1 = std::min<int64_t>(k, k0 + group);
      W4GroupParams(w + k0, k1 - k0, symmetric, &scales[g], &mins[g]);
      // Quantize against the stored (rounded) scale and min.
      const float sr = Fp16ToFp32(scales[g]), mr = Fp16ToFp32(mins[g]);
      const float inv = sr != 0.0f ? 1.0f / sr : 0.0f;
      for (int64_t i = k0; i < k1; ++i) {
        codes[i] = W4Code(w[i], inv, mr);
      }
    }
    PackW4Rows(codes.data(), scales.data(), mins.data(), row0 + r, 1, k, group, q, scale, min);
  }
}

void QuantizeI8Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int8_t* q,
                    float* scale) {
  const int64_t k4 = PackedI8K4(k);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row0 + r, p = n / kPanelRows, j = n % kPanelRows;
    const float* w = src + r * k;
    float absmax = 0.0f;
    for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::abs(w[i]));
    const float s = absmax / 127.0f;
    scale[n] = s;
    const float inv = s != 0.0f ? 1.0f / s : 0.0f;
    int8_t* panel = q + p * k4 * 4 * kPanelRows;
    for (int64_t i = 0; i < k4 * 4; ++i) {
      const float v = i < k ? std::nearbyint(w[i] * inv) : 0.0f;
      panel[(i / 4) * 4 * kPanelRows + 4 * j + i % 4] = (int8_t)std::clamp(v, -127.0f, 127.0f);
    }
  }
}

void QuantizeW8Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int8_t* q,
                    fp16_t* scale) {
  PDQ_CHECK(k % 2 == 0);
  const int64_t groups = PackedW8Groups(k);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row0 + r, p = n / kPanelRows, j = n % kPanelRows;
    const float* w = src + r * k;
    int8_t* panel = q + p * k * kPanelRows;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * kW8Group, k1 = std::min<int64_t>(k, k0 + kW8Group);
      float absmax = 0.0f;
      for (int64_t i = k0; i < k1; ++i) absmax = std::max(absmax, std::abs(w[i]));
      const fp16_t s = Fp32ToFp16(absmax / 127.0f);
      scale[(p * groups + g) * kPanelRows + j] = s;
      // Codes against the stored scale: a Q8_0 group (w = d q, d an fp16)
      // has absmax 127 d, so s == d and every code comes back as it was.
      const float sr = Fp16ToFp32(s), inv = sr != 0.0f ? 1.0f / sr : 0.0f;
      for (int64_t i = k0; i < k1; ++i) {
        panel[(i / 2) * 2 * kPanelRows + 2 * j + i % 2] =
            (int8_t)std::clamp(std::nearbyint(w[i] * inv), -127.0f, 127.0f);
      }
    }
  }
}

void DequantizeW8Rows(const PackedW8& w, int64_t row0, int64_t rows, float* dst) {
  const int64_t groups = PackedW8Groups(w.k);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row0 + r, p = n / kPanelRows, j = n % kPanelRows;
    const int8_t* panel = w.q + p * w.k * kPanelRows;
    for (int64_t i = 0; i < w.k; ++i) {
      const float s = Fp16ToFp32(w.scale[(p * groups + i / kW8Group) * kPanelRows + j]);
      dst[r * w.k + i] = s * (float)PackedW8Code(panel, i, j);
    }
  }
}

}  // namespace pdq
