// Scalar reference kernels: plain loops, fp32 accumulation, the ground truth
// for the vectorized paths.
#include <cmath>
#include <cstring>

#include "kernels/cpu/isa.h"

namespace pdq::cpu {
namespace {

void GemmF16PanelsRef(const PackedF16& w, int64_t p_begin, int64_t p_end, const float* x,
                      int64_t m, int64_t ldx, float* y, int64_t ldy) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    const fp16_t* panel = w.data + p * w.k * kPanelRows;
    const int64_t rows = std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < rows; ++j) {
        float acc = 0.0f;
        for (int64_t kk = 0; kk < w.k; ++kk) {
          acc += x[i * ldx + kk] * Fp16ToFp32(panel[kk * kPanelRows + j]);
        }
        y[i * ldy + p * kPanelRows + j] = acc;
      }
    }
  }
}

void GemmW4PanelsF32Ref(const PackedW4& w, int64_t p_begin, int64_t p_end, const float* x,
                        int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
    const int64_t rows = std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int64_t kk = 0; kk < w.k; ++kk) {
          const int64_t g = (p * groups + kk / w.group) * kPanelRows + j;
          const int v = PackedW4Code(q, kk, j);
          acc += x[i * ldx + kk] * (Fp16ToFp32(w.scale[g]) * (float)v + Fp16ToFp32(w.min[g]));
        }
        y[i * ldy + p * kPanelRows + j] = acc;
      }
    }
  }
}

// Per group: (scale_w * scale_x) * sum(q_w * q_x) + min_w * scale_x * sum(q_x),
// for int16 (W4A16) or int8 (W4A8) activation rows `row_stride` apart.
template <typename T>
void GemmW4PanelsRefT(const PackedW4& w, int64_t p_begin, int64_t p_end, const T* xq,
                      int64_t row_stride, const float* xs, const float* xsum, int64_t m, float* y,
                      int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
    const int64_t rows = std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t k0 = g * w.group, k1 = std::min<int64_t>(w.k, k0 + w.group);
          int32_t dot = 0;
          for (int64_t kk = k0; kk < k1; ++kk) dot += PackedW4Code(q, kk, j) * xq[i * row_stride + kk];
          const int64_t sg = (p * groups + g) * kPanelRows + j;
          acc += Fp16ToFp32(w.scale[sg]) * xs[i * groups + g] * (float)dot +
                 Fp16ToFp32(w.min[sg]) * xsum[i * groups + g];
        }
        y[i * ldy + p * kPanelRows + j] = acc;
      }
    }
  }
}

void GemmW4PanelsRef(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                     const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  GemmW4PanelsRefT(w, p_begin, p_end, xq, w.k, xs, xsum, m, y, ldy);
}

void GemmW4A8PanelsRef(const PackedW4& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                       const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy) {
  GemmW4PanelsRefT(w, p_begin, p_end, xq, W4A8RowBytes(w.k), xs, xsum, m, y, ldy);
}

void GemmI8PanelsRef(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                     const float* xs, int64_t m, float* y, int64_t ldy) {
  const int64_t k4 = PackedI8K4(w.k);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int8_t* panel = w.q + p * k4 * 4 * kPanelRows;
    const int64_t rows = std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* a = xq + i * k4 * 4;
      for (int64_t j = 0; j < rows; ++j) {
        int32_t acc = 0;
        for (int64_t kk = 0; kk < k4 * 4; ++kk) {
          acc += (int32_t)a[kk] * (int32_t)panel[(kk / 4) * 4 * kPanelRows + 4 * j + kk % 4];
        }
        y[i * ldy + p * kPanelRows + j] = (float)acc * xs[i] * w.scale[p * kPanelRows + j];
      }
    }
  }
}

float QuantizeRowI8Ref(const float* x, int64_t k, int8_t* q) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::abs(x[i]));
  const float s = absmax / 127.0f;
  const float inv = s != 0.0f ? 127.0f / absmax : 0.0f;
  const int64_t k4 = PackedI8K4(k);
  for (int64_t i = 0; i < k4 * 4; ++i) {
    q[i] = i < k ? (int8_t)std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f) : 0;
  }
  return s;
}

// Per group: codes of x * (kMax / absmax) rounded to nearest, the scale and
// scale * the sum of the codes; kMax 32767 for int16 (W4A16), 127 for int8
// (W4A8, zero-padded to W4A8RowBytes).
template <typename T>
void QuantizeRowGroupsRef(const float* x, int64_t k, int group, T* q, float* scale, float* sum) {
  constexpr float kMax = sizeof(T) == 1 ? 127.0f : 32767.0f;
  for (int64_t g = 0; g * group < k; ++g) {
    const int64_t k0 = g * group, k1 = std::min<int64_t>(k, k0 + group);
    float absmax = 0.0f;
    for (int64_t i = k0; i < k1; ++i) absmax = std::max(absmax, std::abs(x[i]));
    const float inv = absmax > 0.0f ? kMax / absmax : 0.0f;
    int32_t total = 0;
    for (int64_t i = k0; i < k1; ++i) {
      q[i] = (T)std::nearbyint(x[i] * inv);
      total += q[i];
    }
    scale[g] = absmax / kMax;
    sum[g] = scale[g] * (float)total;
  }
  if constexpr (sizeof(T) == 1) {
    for (int64_t i = k; i < W4A8RowBytes(k); ++i) q[i] = 0;
  }
}

void RmsNormRowRef(const float* x, const float* weight, int64_t d, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / (float)d + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = x[i] * scale * weight[i];
}

void SiluMulRowRef(const float* gate, const float* up, int64_t f, float* out) {
  for (int64_t i = 0; i < f; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// In double: g/2 (1 + tanh(u)) cancels for g << 0.
void GeluMulRowRef(const float* gate, const float* up, int64_t f, float* out) {
  const double k = 0.7978845608028654;  // sqrt(2/pi)
  for (int64_t i = 0; i < f; ++i) {
    const double g = gate[i];
    out[i] = (float)(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

const fp16_t* KvRow(const fp16_t* base, const KvLayerView& layer, const int32_t* block_table,
                    int64_t pos, int kv_head) {
  const int64_t block = block_table[pos / layer.block_tokens];
  const int64_t slot = pos % layer.block_tokens;
  return base + ((block * layer.kv_heads + kv_head) * layer.block_tokens + slot) * layer.head_dim;
}

void AttendOneRef(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                  int kv_head, const float* q, float scale, float* out, float* scores) {
  const int d = layer.head_dim;
  const auto element = [&](fp16_t e) { return layer.bf16 ? Bf16ToFp32(e) : Fp16ToFp32(e); };
  float max_score = -INFINITY;
  for (int64_t j = 0; j < n_pos; ++j) {
    const fp16_t* k = KvRow(layer.k, layer, block_table, j, kv_head);
    float s = 0.0f;
    for (int i = 0; i < d; ++i) s += q[i] * element(k[i]);
    scores[j] = s * scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n_pos; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  for (int i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_pos; ++j) {
    const fp16_t* v = KvRow(layer.v, layer, block_table, j, kv_head);
    const float p = scores[j] / sum;
    for (int i = 0; i < d; ++i) out[i] += p * element(v[i]);
  }
}

void AttendRef(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
               int kv_head, int group, const float* q, int64_t q_stride, float scale, float* out,
               int64_t out_stride, float* scratch) {
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < group; ++i) {
      AttendOneRef(layer, block_table, n_pos + r, kv_head, q + r * q_stride + i * layer.head_dim,
                   scale, out + r * out_stride + i * layer.head_dim, scratch);
    }
  }
}

// Per group: (scale_w * scale_x) * sum(q_w * q_x), summed over the groups.
void GemmW8PanelsRef(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                     const float* xs, int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW8Groups(w.k);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int8_t* q = w.q + p * w.k * kPanelRows;
    const int64_t rows = std::min<int64_t>(kPanelRows, w.n - p * kPanelRows);
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t k0 = g * kW8Group, k1 = std::min<int64_t>(w.k, k0 + kW8Group);
          int32_t dot = 0;
          for (int64_t kk = k0; kk < k1; ++kk) dot += PackedW8Code(q, kk, j) * xq[i * w.k + kk];
          acc += Fp16ToFp32(w.scale[(p * groups + g) * kPanelRows + j]) * xs[i * groups + g] *
                 (float)dot;
        }
        y[i * ldy + p * kPanelRows + j] = acc;
      }
    }
  }
}

void ToF16Ref(const float* src, int64_t n, fp16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToFp16(src[i]);
}

}  // namespace

int64_t ArgmaxRowRef(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
  }
  return best;
}

float ExpRowRef(const float* x, int64_t n, float max, float scale, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp((x[i] - max) * scale);
  return sum;
}

const KernelTable kScalarKernels = {
    "scalar",
    GemmF16PanelsRef,
    GemmW4PanelsRef,
    GemmW4PanelsF32Ref,
    GemmI8PanelsRef,
    QuantizeRowI8Ref,
    GemmW4A8PanelsRef,
    QuantizeRowGroupsRef<int8_t>,
    QuantizeRowGroupsRef<int16_t>,
    RmsNormRowRef,
    SiluMulRowRef,
    GeluMulRowRef,
    AttendRef,
    ToF16Ref,
    GemmW8PanelsRef,
    nullptr,
    nullptr,
    nullptr,  // bf16 tiles: AMX only (the Bf16Ref functions below)
    nullptr,
    nullptr,
    nullptr,  // no bf16 prompt attention, no decode shortcuts
    nullptr,
    ArgmaxRowRef,
    ExpRowRef,
};

void QuantizeRowBf16Ref(const float* x, int64_t k, uint16_t* dst) {
  for (int64_t i = 0; i < Bf16RowElements(k); ++i) dst[i] = i < k ? Fp32ToBf16(x[i]) : 0;
}

// The bf16 tile GEMMs' reference: weight(p, kk, j) (row j of panel p,
// input kk, in fp32) rounded to bf16, times the bf16 rows, fp32 sums.
template <typename Weight>
void PanelsBf16Ref(int64_t n, int64_t k, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                   int64_t m, float* y, int64_t ldy, const Weight& weight) {
  const int64_t row = Bf16RowElements(k);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t rows = std::min<int64_t>(kPanelRows, n - p * kPanelRows);
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) {
          acc += Bf16ToFp32(Fp32ToBf16(weight(p, kk, j))) * Bf16ToFp32(xb[i * row + kk]);
        }
        y[i * ldy + p * kPanelRows + j] = acc;
      }
    }
  }
}

void GemmW4PanelsBf16Ref(const PackedW4& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW4Groups(w.k, w.group);
  PanelsBf16Ref(w.n, w.k, p_begin, p_end, xb, m, y, ldy, [&](int64_t p, int64_t kk, int64_t j) {
    const int64_t sg = (p * groups + kk / w.group) * kPanelRows + j;
    const uint8_t* q = w.q + p * (w.k / 2) * kPanelRows;
    return std::fma((float)PackedW4Code(q, kk, j), Fp16ToFp32(w.scale[sg]), Fp16ToFp32(w.min[sg]));
  });
}

void GemmW8PanelsBf16Ref(const PackedW8& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy) {
  const int64_t groups = PackedW8Groups(w.k);
  PanelsBf16Ref(w.n, w.k, p_begin, p_end, xb, m, y, ldy, [&](int64_t p, int64_t kk, int64_t j) {
    const float s = Fp16ToFp32(w.scale[(p * groups + kk / kW8Group) * kPanelRows + j]);
    return s * (float)PackedW8Code(w.q + p * w.k * kPanelRows, kk, j);
  });
}

}  // namespace pdq::cpu
