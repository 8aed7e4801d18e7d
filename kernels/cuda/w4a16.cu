// The W4A16 GEMV / small-m GEMM kernel (layout and contract in w4a16.h).
//
// A block owns kTiles 16-row tiles and eight activation rows; its kWarps
// warps split the input chunks between them and sum their partial tiles in
// shared memory at the end. Each warp first issues every 16-byte weight load
// of kUnroll chunks, then dequantizes and multiplies them, so that several
// kilobytes per warp are in flight: what a bandwidth-bound kernel needs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/w4a16.h"

namespace pdq::cuda {
namespace {

static_assert(kW4TileRows == kPanelRows, "the GPU and CPU layouts share scale tiles");

constexpr int kUnroll = 4;

__device__ inline uint32_t AsU32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ inline __half2 AsHalf2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// The fp16 pair scale * q + min for the two codes in bits 0-3 and 16-19.
__device__ inline uint32_t Dequant(uint32_t word, __half2 scale, __half2 min) {
  const uint32_t biased = (word & 0x000f000fu) | 0x64006400u;  // fp16 1024 + q, exactly
  const __half2 q = __hsub2(AsHalf2(biased), AsHalf2(0x64006400u));
  return AsU32(__hfma2(q, scale, min));
}

__device__ inline void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                           uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline uint32_t Word(const uint4& v, int s) {
  return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w;
}

// kChunkInOneGroup: the group size is a multiple of 64, so each chunk's
// scales are loaded once rather than per step.
template <int kTiles, int kWarps, bool kChunkInOneGroup>
__global__ void __launch_bounds__(kWarps * 32)
    W4A16Kernel(const uint4* __restrict__ q, const uint32_t* __restrict__ scale_min,
                const __half* __restrict__ x, int64_t m, int64_t ldx, float* __restrict__ y,
                int64_t ldy, int64_t n, int64_t k, int group, int tiles, int chunks, int groups) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile0 = blockIdx.x * kTiles;
  const int64_t row0 = (int64_t)blockIdx.y * 8;  // this block's activation rows
  // Lane l supplies activation row row0 + l / 4 as the B operand (column g).
  const bool has_x = row0 + g < m;
  const __half* xr = x + (has_x ? (row0 + g) * ldx : 0);
  int tile_of[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) tile_of[i] = min(tile0 + i, tiles - 1);

  const int per_warp = (chunks + kWarps - 1) / kWarps;
  const int c_begin = warp * per_warp, c_end = min(chunks, c_begin + per_warp);
  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int c0 = c_begin; c0 < c_end; c0 += kUnroll) {
    uint4 a[kUnroll][kTiles];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        a[u][i] = c0 + u < c_end ? __ldg(q + ((int64_t)tile_of[i] * chunks + c0 + u) * 32 + lane)
                                 : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u >= c_end) break;
      // Scale and min of rows g (lo) and g + 8 (hi), per tile.
      __half2 lo_s[kTiles], lo_m[kTiles], hi_s[kTiles], hi_m[kTiles];
      auto load_scales = [&](int64_t kb) {
        const int64_t grp = kb / group;
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          const uint32_t* sm = scale_min + ((int64_t)tile_of[i] * groups + grp) * kW4TileRows;
          const __half2 lo = AsHalf2(__ldg(sm + g)), hi = AsHalf2(__ldg(sm + g + 8));
          lo_s[i] = __low2half2(lo);
          lo_m[i] = __high2half2(lo);
          hi_s[i] = __low2half2(hi);
          hi_m[i] = __high2half2(hi);
        }
      };
      if (kChunkInOneGroup) load_scales((int64_t)(c0 + u) * kW4ChunkInputs);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int64_t kb = (int64_t)(c0 + u) * kW4ChunkInputs + 16 * s;
        if (kb >= k) break;
        uint32_t b0 = 0, b1 = 0;
        if (has_x) {
          b0 = __ldg(reinterpret_cast<const unsigned int*>(xr + kb + 2 * t));
          b1 = __ldg(reinterpret_cast<const unsigned int*>(xr + kb + 2 * t + 8));
        }
        if (!kChunkInOneGroup) load_scales(kb);
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          const uint32_t w = Word(a[u][i], s);
          Mma(acc[i], Dequant(w, lo_s[i], lo_m[i]), Dequant(w >> 4, hi_s[i], hi_m[i]),
              Dequant(w >> 8, lo_s[i], lo_m[i]), Dequant(w >> 12, hi_s[i], hi_m[i]), b0, b1);
        }
      }
    }
  }

  // Sum the warps' partial tiles; warp 0 writes. c0, c1: weight row g,
  // activation rows 2t, 2t + 1; c2, c3: weight row g + 8.
  __shared__ float partial[kWarps][kTiles][4][32];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][i][r][lane] = acc[i][r];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    if (tile0 + i >= tiles) break;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += partial[w][i][r][lane];
      const int64_t n_row = (int64_t)(tile0 + i) * kW4TileRows + g + 8 * (r >> 1);
      const int64_t m_row = row0 + 2 * t + (r & 1);
      if (n_row < n && m_row < m) y[m_row * ldy + n_row] = sum;
    }
  }
}

template <int kTiles, int kWarps>
void Launch(const W4A16GemmParams& p, int64_t tiles, cudaStream_t stream) {
  const dim3 grid((unsigned)((tiles + kTiles - 1) / kTiles), (unsigned)((p.m + 7) / 8));
  auto kernel = p.w.group % kW4ChunkInputs == 0 ? W4A16Kernel<kTiles, kWarps, true>
                                                : W4A16Kernel<kTiles, kWarps, false>;
  kernel<<<grid, kWarps * 32, 0, stream>>>(
      reinterpret_cast<const uint4*>(p.w.q), p.w.scale_min, reinterpret_cast<const __half*>(p.x),
      p.m, p.ldx, p.y, p.ldy, p.w.n, p.w.k, p.w.group, (int)tiles, (int)GpuW4Chunks(p.w.k),
      (int)PackedW4Groups(p.w.k, p.w.group));
}

}  // namespace

absl::Status W4A16Gemm(const W4A16GemmParams& p, cudaStream_t stream) {
  const GpuW4& w = p.w;
  if (w.n <= 0 || w.k <= 0 || w.k % 16 != 0 || w.group <= 0 || w.group % 16 != 0) {
    return BadInput("W4A16Gemm",
                    absl::StrCat("weights ", w.n, "x", w.k, " in groups of ", w.group,
                                 ": k and the group size must be positive multiples of 16"));
  }
  if (p.m <= 0 || p.ldx < w.k || p.ldx % 2 != 0 || p.ldy < w.n) {
    return BadInput("W4A16Gemm",
                    absl::StrCat("bad shape: ", p.m, " rows, ldx ", p.ldx, " (even, >= k = ", w.k,
                                 "), ldy ", p.ldy, " (>= n = ", w.n, ")"));
  }
  if (w.q == nullptr || w.scale_min == nullptr || p.x == nullptr || p.y == nullptr) {
    return BadInput("W4A16Gemm", "needs weights, scales, x and y");
  }
  if (reinterpret_cast<uintptr_t>(w.q) % 16 != 0 || reinterpret_cast<uintptr_t>(p.x) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(w.scale_min) % 4 != 0) {
    return BadInput("W4A16Gemm", "q must be 16-byte aligned, x and scale_min 4-byte aligned");
  }
  const int64_t tiles = GpuW4Tiles(w.n);
  if (tiles > 0x7fffffff || (p.m + 7) / 8 > 65535 || GpuW4Chunks(w.k) > 0x7fffffff) {
    return BadInput("W4A16Gemm",
                    absl::StrCat("too large for one launch: ", p.m, "x", w.n, "x", w.k));
  }
  // Enough blocks to fill every multiprocessor a few times over; where the
  // tiles are few (short, wide matrices), more warps per block split k finer.
  const int sms = std::max(1, MultiprocessorCount());
  if (tiles >= 8 * (int64_t)sms) {
    Launch<2, 8>(p, tiles, stream);
  } else if (tiles >= 2 * (int64_t)sms) {
    Launch<1, 8>(p, tiles, stream);
  } else {
    Launch<1, 16>(p, tiles, stream);
  }
  return LaunchStatus("W4A16Gemm");
}

}  // namespace pdq::cuda
