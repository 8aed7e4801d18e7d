// Paged attention (attention.h): a warp per (query row, head), keys in tiles
// of 32 (a lane per key for the scores, a lane per output dimension for the
// values), online softmax across tiles.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"

namespace pdq::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

__device__ inline int64_t KvOffset(const KvLayerView& layer, const int32_t* block_table,
                                   int64_t pos, int kv_head) {
  const int64_t block = block_table[pos / layer.block_tokens];
  const int64_t slot = pos % layer.block_tokens;
  return ((block * layer.kv_heads + kv_head) * layer.block_tokens + slot) * layer.head_dim;
}

// One block per row; threads over (kv head, dimension).
__global__ void KvWriteKernel(KvLayerView layer, const int32_t* __restrict__ block_table,
                              const int32_t* __restrict__ positions, const float* __restrict__ k,
                              int64_t k_stride, const float* __restrict__ v, int64_t v_stride) {
  const int64_t i = blockIdx.x;
  const int d = layer.head_dim;
  __half* kc = reinterpret_cast<__half*>(layer.k);
  __half* vc = reinterpret_cast<__half*>(layer.v);
  for (int item = threadIdx.x; item < layer.kv_heads * d; item += blockDim.x) {
    const int h = item / d, e = item % d;
    const int64_t off = KvOffset(layer, block_table, positions[i], h) + e;
    kc[off] = __float2half_rn(k[i * k_stride + item]);
    vc[off] = __float2half_rn(v[i * v_stride + item]);
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AttentionKernel(KvLayerView layer, const int32_t* __restrict__ block_table, int64_t first_pos,
                    int64_t m, const float* __restrict__ q, int64_t q_stride, int heads,
                    float scale, float* __restrict__ out, int64_t out_stride) {
  __shared__ float q_shared[kWarpsPerBlock][kMaxHeadDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t item = (int64_t)blockIdx.x * kWarpsPerBlock + warp;
  if (item >= m * heads) return;  // whole warps only: no barrier follows
  const int64_t row = item / heads;
  const int head = (int)(item % heads);
  const int kv_head = head / (heads / layer.kv_heads);
  const int d = layer.head_dim;
  const int64_t n_keys = first_pos + row + 1;
  const float* q_row = q + row * q_stride + (int64_t)head * d;
  for (int e = lane; e < d; e += 32) q_shared[warp][e] = q_row[e];
  __syncwarp();

  const __half* kc = reinterpret_cast<const __half*>(layer.k);
  const __half* vc = reinterpret_cast<const __half*>(layer.v);
  float run_max = -INFINITY, run_sum = 0.0f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) acc[j] = 0.0f;

  for (int64_t tile = 0; tile < n_keys; tile += 32) {
    const int64_t key = tile + lane;
    float s = -INFINITY;
    int64_t v_off = 0;
    if (key < n_keys) {
      const int64_t off = KvOffset(layer, block_table, key, kv_head);
      v_off = off;
      const __half2* k2 = reinterpret_cast<const __half2*>(kc + off);
      float dot = 0.0f;
      for (int e = 0; e < d / 2; ++e) {
        const float2 kf = __half22float2(k2[e]);
        dot += q_shared[warp][2 * e] * kf.x + q_shared[warp][2 * e + 1] * kf.y;
      }
      s = dot * scale;
    }
    float tile_max = s;
    for (int o = 16; o > 0; o /= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, o));
    const float new_max = fmaxf(run_max, tile_max);    // finite: key `tile` is always valid
    const float correction = expf(run_max - new_max);  // 0 on the first tile
    const float prob = key < n_keys ? expf(s - new_max) : 0.0f;
    float tile_sum = prob;
    for (int o = 16; o > 0; o /= 2) tile_sum += __shfl_xor_sync(0xffffffff, tile_sum, o);
    run_sum = run_sum * correction + tile_sum;
    run_max = new_max;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) acc[j] *= correction;
    const int keys_here = n_keys - tile < 32 ? (int)(n_keys - tile) : 32;
    for (int kk = 0; kk < keys_here; ++kk) {
      const float p = __shfl_sync(0xffffffff, prob, kk);
      const int64_t off = __shfl_sync(0xffffffff, v_off, kk);
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < d) acc[j] += p * __half2float(vc[off + e]);
      }
    }
  }
  float* out_row = out + row * out_stride + (int64_t)head * d;
  const float inv = 1.0f / run_sum;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e < d) out_row[e] = acc[j] * inv;
  }
}

absl::Status CheckLayer(const char* kernel, const KvLayerView& layer) {
  if (layer.k == nullptr || layer.v == nullptr) return BadInput(kernel, "no K/V storage");
  if (reinterpret_cast<uintptr_t>(layer.k) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(layer.v) % 4 != 0) {
    return BadInput(kernel, "K/V storage must be 4-byte aligned");
  }
  if (layer.kv_heads <= 0 || layer.block_tokens <= 0 || layer.head_dim <= 0 ||
      layer.head_dim % 2 != 0 || layer.head_dim > kMaxHeadDim) {
    return BadInput(kernel, absl::StrCat("unsupported KV layout: ", layer.kv_heads, " heads of ",
                                         layer.head_dim, " (even, at most ", kMaxHeadDim,
                                         "), blocks of ", layer.block_tokens));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvWrite(const KvWriteParams& p, cudaStream_t stream) {
  if (absl::Status s = CheckLayer("KvWrite", p.layer); !s.ok()) return s;
  const int64_t width = (int64_t)p.layer.kv_heads * p.layer.head_dim;
  if (p.m <= 0 || p.m > 0x7fffffff || p.k_stride < width || p.v_stride < width) {
    return BadInput("KvWrite", absl::StrCat("bad shape: ", p.m, " rows of ", width, ", strides ",
                                            p.k_stride, "/", p.v_stride));
  }
  if (p.block_table == nullptr || p.positions == nullptr || p.k == nullptr || p.v == nullptr) {
    return BadInput("KvWrite", "needs block_table, positions, k and v");
  }
  KvWriteKernel<<<(unsigned)p.m, 256, 0, stream>>>(p.layer, p.block_table, p.positions, p.k,
                                                   p.k_stride, p.v, p.v_stride);
  return LaunchStatus("KvWrite");
}

absl::Status Attention(const AttentionParams& p, cudaStream_t stream) {
  if (absl::Status s = CheckLayer("Attention", p.layer); !s.ok()) return s;
  const int64_t width = (int64_t)p.heads * p.layer.head_dim;
  if (p.heads <= 0 || p.heads % p.layer.kv_heads != 0) {
    return BadInput("Attention", absl::StrCat(p.heads, " query heads is not a multiple of ",
                                              p.layer.kv_heads, " kv heads"));
  }
  if (p.m <= 0 || p.first_pos < 0 || p.q_stride < width || p.out_stride < width) {
    return BadInput("Attention",
                    absl::StrCat("bad shape: ", p.m, " rows from position ", p.first_pos,
                                 ", width ", width, ", strides ", p.q_stride, "/", p.out_stride));
  }
  if (p.block_table == nullptr || p.q == nullptr || p.out == nullptr) {
    return BadInput("Attention", "needs block_table, q and out");
  }
  const int64_t blocks = (p.m * p.heads + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return BadInput("Attention", "too many rows for one launch");
  AttentionKernel<<<(unsigned)blocks, kWarpsPerBlock * 32, 0, stream>>>(
      p.layer, p.block_table, p.first_pos, p.m, p.q, p.q_stride, p.heads, p.scale, p.out,
      p.out_stride);
  return LaunchStatus("Attention");
}

}  // namespace pdq::cuda
