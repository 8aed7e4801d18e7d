// W4A16 on the GPU: y[m][n] = sum_k x[m][k] * W[n][k] with W in 4-bit
// groups as in kernels/kernels.h (w = scale * q + min per row and group of
// `group` inputs), x in fp16 and y in fp32. Each weight is dequantized to
// fp16 in registers (one fused multiply-add, as an FP16 copy of the weights
// would round it) and the products run on tensor cores (mma.m16n8k16) with
// fp32 accumulation; up to 8 activation rows share one weight load, so
// batched decode costs what one sequence costs. Meant for decode (m up to
// a few dozen); every 8 rows beyond that read the weights again.
//
// Layout (GpuW4), chosen so that one 16-byte load per lane is exactly the A
// operand of four mma steps, and a warp's loads cover 512 contiguous bytes:
//  - rows in tiles of 16, inputs in chunks of 64; per (tile, chunk) 512
//    bytes: 16 per lane, one 32-bit word per step of 16 inputs;
//  - in lane l's word for step s (g = l / 4, t = l % 4), nibble p (bits
//    4p..4p+3) holds the code of row g + 8 (p & 1) and input
//    16 s + 2 t + 8 ((p >> 1) & 1) + (p >> 2) of the chunk, so that
//    (word >> 4i) & 0x000f000f is the fp16x2 register a_i of the mma;
//  - scale and min as one fp16 pair (scale in the low half) per
//    (tile, group, row in tile).
// Rows past n and inputs past k hold code 0 with scale and min 0.
#pragma once

#include <cstdint>

#include "common/half.h"
#include "kernels/cuda/launch.h"
#include "kernels/kernels.h"

namespace pdq::cuda {

constexpr int kW4TileRows = 16;
constexpr int kW4ChunkInputs = 64;

inline int64_t GpuW4Tiles(int64_t n) { return (n + kW4TileRows - 1) / kW4TileRows; }
inline int64_t GpuW4Chunks(int64_t k) { return (k + kW4ChunkInputs - 1) / kW4ChunkInputs; }
inline int64_t GpuW4QBytes(int64_t n, int64_t k) { return GpuW4Tiles(n) * GpuW4Chunks(k) * 512; }
inline int64_t GpuW4ScaleMinBytes(int64_t n, int64_t k, int group) {
  return GpuW4Tiles(n) * PackedW4Groups(k, group) * kW4TileRows * 4;
}

struct GpuW4 {
  const uint8_t* q = nullptr;           // GpuW4QBytes(n, k), 16-byte aligned
  const uint32_t* scale_min = nullptr;  // GpuW4ScaleMinBytes(n, k, group) / 4 pairs
  int64_t n = 0;
  int64_t k = 0;    // a multiple of 16
  int group = 128;  // a multiple of 16
};

// Host side: repacks CPU-packed weights (host memory) into host buffers of
// GpuW4QBytes and GpuW4ScaleMinBytes bytes, to be copied to the device.
// InvalidArgument where k or group is not a multiple of 16.
absl::Status RepackW4ForGpu(const PackedW4& w, uint8_t* q, uint32_t* scale_min);
// Host side: the code of weight (row, input) in a repacked q (what the
// kernel decodes there); for tests and tools.
int GpuW4Code(const uint8_t* q, int64_t k, int64_t row, int64_t input);

// x rows are ldx halves apart (even, x 4-byte aligned), y rows ldy floats.
struct W4A16GemmParams {
  GpuW4 w;
  const fp16_t* x = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
absl::Status W4A16Gemm(const W4A16GemmParams& p, cudaStream_t stream);

}  // namespace pdq::cuda
