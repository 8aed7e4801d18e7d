// Row-wise and elementwise kernels (elementwise.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/elementwise.h"

namespace pdq::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline void Store(float* out, int64_t i, float v) { out[i] = v; }
__device__ inline void Store(__half* out, int64_t i, float v) { out[i] = __float2half_rn(v); }

// One block per row, reducing the sum of squares across it.
template <typename Out>
__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ weight,
                              int64_t d, float eps, Out* __restrict__ out) {
  const float* row = x + blockIdx.x * d;
  Out* out_row = out + blockIdx.x * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += row[i] * row[i];
  ss = BlockReduce(ss, [](float a, float b) { return a + b; });
  const float scale = rsqrtf(ss / (float)d + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    Store(out_row, i, row[i] * scale * weight[i]);
}

__device__ inline float Silu(float g) { return g / (1.0f + expf(-g)); }

// As the CPU reference: in double, since g/2 (1 + tanh(u)) cancels for g << 0.
__device__ inline float GeluTanh(float g) {
  const double k = 0.7978845608028654;  // sqrt(2/pi)
  const double gd = g;
  return (float)(0.5 * gd * (1.0 + tanh(k * (gd + 0.044715 * gd * gd * gd))));
}

template <GluKind kKind, typename Out>
__global__ void GluKernel(const float* __restrict__ gate_up, int64_t m, int64_t f,
                          Out* __restrict__ out) {
  const int64_t total = m * f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / f, col = i % f;
    const float g = gate_up[row * 2 * f + col], u = gate_up[row * 2 * f + f + col];
    const float a = kKind == GluKind::kSilu ? Silu(g) : GeluTanh(g);
    Store(out, i, a * u);
  }
}

// One block per row; threads take (head, pair) items.
__global__ void RopeKernel(float* __restrict__ x, int64_t stride, int heads, int head_dim,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, bool interleaved) {
  const int half = head_dim / 2;
  float* row = x + blockIdx.x * stride;
  const double pos = positions[blockIdx.x];
  for (int item = threadIdx.x; item < heads * half; item += blockDim.x) {
    const int h = item / half, t = item % half;
    double sn, cs;
    sincos(pos * (double)inv_freq[t], &sn, &cs);
    float* v = row + (int64_t)h * head_dim;
    const int a = interleaved ? 2 * t : t;
    const int c = interleaved ? 2 * t + 1 : t + half;
    const float x0 = v[a], x1 = v[c];
    v[a] = x0 * (float)cs - x1 * (float)sn;
    v[c] = x0 * (float)sn + x1 * (float)cs;
  }
}

__global__ void ToHalfKernel(const float* __restrict__ src, int64_t n, __half* __restrict__ dst) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

__global__ void EmbedKernel(const int32_t* __restrict__ tokens, const __half* __restrict__ table,
                            int64_t d, float scale, float* __restrict__ out) {
  const __half* row = table + (int64_t)tokens[blockIdx.x] * d;
  float* out_row = out + blockIdx.x * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = __half2float(row[i]) * scale;
}

__global__ void AddKernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void AddBiasKernel(float* __restrict__ y, int64_t m, int64_t n, int64_t ldy,
                              const float* __restrict__ bias) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * n;
       i += (int64_t)gridDim.x * blockDim.x) {
    y[i / n * ldy + i % n] += bias[i % n];
  }
}

__global__ void ScaleColumnsKernel(const __half* __restrict__ x, int64_t m, int64_t k, int64_t ldx,
                                   const float* __restrict__ scale, __half* __restrict__ out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * k;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    out[i] = __float2half_rn(__half2float(x[r * ldx + c]) * scale[c]);
  }
}

unsigned StrideBlocks(int64_t n) { return GridStrideBlocks(n, kThreads); }

// The GLU kernel of `kKind` writing fp32 or fp16, as the params say.
template <GluKind kKind>
void LaunchGlu(const GluParams& p, cudaStream_t stream) {
  const unsigned blocks = StrideBlocks(p.m * p.f);
  if (p.out != nullptr) {
    GluKernel<kKind><<<blocks, kThreads, 0, stream>>>(p.gate_up, p.m, p.f, p.out);
  } else {
    GluKernel<kKind><<<blocks, kThreads, 0, stream>>>(p.gate_up, p.m, p.f,
                                                      reinterpret_cast<__half*>(p.out_half));
  }
}

}  // namespace

absl::Status RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.d <= 0 || p.m > 0x7fffffff) {
    return BadInput("RmsNorm", absl::StrCat("bad shape ", p.m, "x", p.d));
  }
  if (p.x == nullptr || p.weight == nullptr || (p.out == nullptr) == (p.out_half == nullptr)) {
    return BadInput("RmsNorm", "needs x, weight and exactly one of out and out_half");
  }
  if (p.out != nullptr) {
    RmsNormKernel<<<(unsigned)p.m, kThreads, 0, stream>>>(p.x, p.weight, p.d, p.eps, p.out);
  } else {
    RmsNormKernel<<<(unsigned)p.m, kThreads, 0, stream>>>(p.x, p.weight, p.d, p.eps,
                                                          reinterpret_cast<__half*>(p.out_half));
  }
  return LaunchStatus("RmsNorm");
}

absl::Status Glu(const GluParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.f <= 0) return BadInput("Glu", absl::StrCat("bad shape ", p.m, "x", p.f));
  if (p.gate_up == nullptr || (p.out == nullptr) == (p.out_half == nullptr)) {
    return BadInput("Glu", "needs gate_up and exactly one of out and out_half");
  }
  if (p.kind == GluKind::kSilu) {
    LaunchGlu<GluKind::kSilu>(p, stream);
  } else {
    LaunchGlu<GluKind::kGeluTanh>(p, stream);
  }
  return LaunchStatus("Glu");
}

absl::Status Rope(const RopeParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.m > 0x7fffffff || p.heads <= 0 || p.head_dim <= 0 || p.head_dim % 2 != 0 ||
      p.stride < (int64_t)p.heads * p.head_dim) {
    return BadInput("Rope", absl::StrCat("bad shape: ", p.m, " rows of ", p.heads, " heads x ",
                                         p.head_dim, ", stride ", p.stride));
  }
  if (p.x == nullptr || p.positions == nullptr || p.inv_freq == nullptr) {
    return BadInput("Rope", "needs x, positions and inv_freq");
  }
  RopeKernel<<<(unsigned)p.m, kThreads, 0, stream>>>(p.x, p.stride, p.heads, p.head_dim,
                                                     p.positions, p.inv_freq,
                                                     p.style == RopeStyle::kInterleaved);
  return LaunchStatus("Rope");
}

absl::Status ToHalf(const ToHalfParams& p, cudaStream_t stream) {
  if (p.n <= 0) return BadInput("ToHalf", absl::StrCat("bad length ", p.n));
  if (p.src == nullptr || p.dst == nullptr) return BadInput("ToHalf", "needs src and dst");
  ToHalfKernel<<<StrideBlocks(p.n), kThreads, 0, stream>>>(p.src, p.n,
                                                           reinterpret_cast<__half*>(p.dst));
  return LaunchStatus("ToHalf");
}

absl::Status Embed(const EmbedParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.m > 0x7fffffff || p.d <= 0) {
    return BadInput("Embed", absl::StrCat("bad shape ", p.m, "x", p.d));
  }
  if (p.tokens == nullptr || p.table == nullptr || p.out == nullptr) {
    return BadInput("Embed", "needs tokens, table and out");
  }
  EmbedKernel<<<(unsigned)p.m, kThreads, 0, stream>>>(
      p.tokens, reinterpret_cast<const __half*>(p.table), p.d, p.scale, p.out);
  return LaunchStatus("Embed");
}

absl::Status Add(const AddParams& p, cudaStream_t stream) {
  if (p.n <= 0) return BadInput("Add", absl::StrCat("bad length ", p.n));
  if (p.y == nullptr || p.x == nullptr) return BadInput("Add", "needs y and x");
  AddKernel<<<StrideBlocks(p.n), kThreads, 0, stream>>>(p.y, p.x, p.n);
  return LaunchStatus("Add");
}

absl::Status AddBias(const AddBiasParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.n <= 0 || p.ldy < p.n) {
    return BadInput("AddBias", absl::StrCat("bad shape ", p.m, "x", p.n, ", ldy ", p.ldy));
  }
  if (p.y == nullptr || p.bias == nullptr) return BadInput("AddBias", "needs y and bias");
  AddBiasKernel<<<StrideBlocks(p.m * p.n), kThreads, 0, stream>>>(p.y, p.m, p.n, p.ldy, p.bias);
  return LaunchStatus("AddBias");
}

absl::Status ScaleColumns(const ScaleColumnsParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.k <= 0 || p.ldx < p.k) {
    return BadInput("ScaleColumns", absl::StrCat("bad shape ", p.m, "x", p.k, ", ldx ", p.ldx));
  }
  if (p.x == nullptr || p.scale == nullptr || p.out == nullptr) {
    return BadInput("ScaleColumns", "needs x, scale and out");
  }
  ScaleColumnsKernel<<<StrideBlocks(p.m * p.k), kThreads, 0, stream>>>(
      reinterpret_cast<const __half*>(p.x), p.m, p.k, p.ldx, p.scale,
      reinterpret_cast<__half*>(p.out));
  return LaunchStatus("ScaleColumns");
}

}  // namespace pdq::cuda
