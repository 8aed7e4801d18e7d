// Portable scalar IEEE fp16 and bfloat16 conversions: the reference every
// vectorized path (F16C, AVX-512, CUDA) is tested against.
#pragma once

#include <cstdint>
#include <cstring>

namespace pdq {

using fp16_t = uint16_t;  // IEEE 754 binary16 bits
using bf16_t = uint16_t;  // bfloat16 bits

inline float Fp16ToFp32(fp16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; overflow saturates to infinity as IEEE requires.
inline fp16_t Fp32ToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000u) return (fp16_t)(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000u) return (fp16_t)(sign | 0x7c00);  // >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14)
    if (abs < 0x33000000u) return (fp16_t)sign;  // < 2^-25 rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // value / 2^-24 == m * 2^(e - 126)
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return (fp16_t)(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return (fp16_t)(sign | half);
}

inline float Bf16ToFp32(bf16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16_t Fp32ToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000u) return (bf16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (bf16_t)(x >> 16);
}

}  // namespace pdq
