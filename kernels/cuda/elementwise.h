// Row-wise and elementwise kernels: RMSNorm, the gated activations (SwiGLU,
// GeGLU), rotary embeddings and fp32 -> fp16 conversion. Each computes what
// its CPU namesake in kernels/kernels.h computes, on device memory, with the
// launch convention of launch.h.
#pragma once

#include <cstdint>

#include "common/half.h"
#include "kernels/cuda/launch.h"
#include "kernels/kernels.h"

namespace pdq::cuda {

// out[i] = x[i] / rms(x[i]) * weight for m rows of length d. Exactly one of
// `out` (fp32) and `out_half` (fp16, what the GEMMs take) is set.
struct RmsNormParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  int64_t m = 0;
  int64_t d = 0;
  float eps = 1e-5f;
  float* out = nullptr;
  fp16_t* out_half = nullptr;
};
absl::Status RmsNorm(const RmsNormParams& p, cudaStream_t stream);

// gate_up rows hold [gate (f) | up (f)]; out[i][j] = act(gate) * up, m rows
// of f (fp32 into out, or fp16 into out_half: what the down projection takes).
enum class GluKind { kSilu, kGeluTanh };
struct GluParams {
  GluKind kind = GluKind::kSilu;
  const float* gate_up = nullptr;
  int64_t m = 0;
  int64_t f = 0;
  float* out = nullptr;
  fp16_t* out_half = nullptr;
};
absl::Status Glu(const GluParams& p, cudaStream_t stream);

// Rotary embedding in place on `heads` heads of head_dim per row, rows
// `stride` floats apart; positions (m entries) and inv_freq (head_dim / 2)
// in device memory. Angles are computed in double, as the CPU does.
struct RopeParams {
  float* x = nullptr;
  int64_t m = 0;
  int64_t stride = 0;
  int heads = 0;
  int head_dim = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  RopeStyle style = RopeStyle::kInterleaved;
};
absl::Status Rope(const RopeParams& p, cudaStream_t stream);

// dst[i] = fp16(src[i]) for n values, round to nearest even.
struct ToHalfParams {
  const float* src = nullptr;
  int64_t n = 0;
  fp16_t* dst = nullptr;
};
absl::Status ToHalf(const ToHalfParams& p, cudaStream_t stream);

// out[i] = table[tokens[i]] * scale: m rows of d from an fp16 table (the
// token embedding), tokens already checked against the table's rows.
struct EmbedParams {
  const int32_t* tokens = nullptr;
  int64_t m = 0;
  const fp16_t* table = nullptr;
  int64_t d = 0;
  float scale = 1.0f;
  float* out = nullptr;
};
absl::Status Embed(const EmbedParams& p, cudaStream_t stream);

// y[i] += x[i] for n values (the residual stream).
struct AddParams {
  float* y = nullptr;
  const float* x = nullptr;
  int64_t n = 0;
};
absl::Status Add(const AddParams& p, cudaStream_t stream);

// y[i][j] += bias[j] for m rows of n, ldy apart.
struct AddBiasParams {
  float* y = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t ldy = 0;
  const float* bias = nullptr;
};
absl::Status AddBias(const AddBiasParams& p, cudaStream_t stream);

// out[i][j] = fp16(x[i][j] * scale[j]) for m rows of k (x rows ldx apart,
// out rows k apart): a per-input scale (AWQ) applied before a GEMM.
struct ScaleColumnsParams {
  const fp16_t* x = nullptr;
  int64_t m = 0;
  int64_t k = 0;
  int64_t ldx = 0;
  const float* scale = nullptr;
  fp16_t* out = nullptr;
};
absl::Status ScaleColumns(const ScaleColumnsParams& p, cudaStream_t stream);

}  // namespace pdq::cuda
