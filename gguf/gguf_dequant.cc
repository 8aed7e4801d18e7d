// Scalar dequantization of ggml block formats to fp32, bit for bit what
// ggml-quants.c dequantize_row_* produces; used once per weight at load time.
#include "gguf/gguf_dequant.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace pdq {
namespace {

// GGUF data is little-endian and is read in place.
static_assert(std::endian::native == std::endian::little);

constexpr int64_t kQK = 32;    // elements per block of the *_0 / *_1 formats
constexpr int64_t kQK_K = 256;  // elements per K-quant super-block

struct BlockInfo {
  int64_t elems;
  int64_t bytes;
};

// Only the types DequantizeRow handles; other types are reported unsupported
// by both functions so that sizing and decoding never disagree.
bool SupportedBlockInfo(GgmlType type, BlockInfo* info) {
  switch (type) {
    case GgmlType::kF32: *info = {1, 4}; return true;
    case GgmlType::kF16: *info = {1, 2}; return true;
    case GgmlType::kBF16: *info = {1, 2}; return true;
    case GgmlType::kQ4_0: *info = {kQK, 2 + 16}; return true;
    case GgmlType::kQ4_1: *info = {kQK, 2 + 2 + 16}; return true;
    case GgmlType::kQ5_0: *info = {kQK, 2 + 4 + 16}; return true;
    case GgmlType::kQ5_1: *info = {kQK, 2 + 2 + 4 + 16}; return true;
    case GgmlType::kQ8_0: *info = {kQK, 2 + 32}; return true;
    case GgmlType::kQ4_K: *info = {kQK_K, 2 + 2 + 12 + 128}; return true;
    case GgmlType::kQ5_K: *info = {kQK_K, 2 + 2 + 12 + 32 + 128}; return true;
    case GgmlType::kQ6_K: *info = {kQK_K, 128 + 64 + 16 + 2}; return true;
    default: return false;
  }
}

absl::StatusOr<BlockInfo> CheckedBlockInfo(GgmlType type, int64_t n) {
  BlockInfo info;
  if (!SupportedBlockInfo(type, &info)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot dequantize tensor type ", GgmlTypeName(type)));
  }
  if (n < 0 || n % info.elems != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count ", n, " is not a multiple of the ",
                     GgmlTypeName(type), " block size ", info.elems));
  }
  return info;
}

// Blocks are packed without padding, so 16-bit fields are usually unaligned.
inline float LoadFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// ggml's get_scale_min_k4: eight 6-bit scales and eight 6-bit mins packed
// into 12 bytes. Sub-blocks 0..3 sit in the low 6 bits of bytes 0..3 (scale)
// and 4..7 (min); sub-blocks 4..7 take their low 4 bits from the nibbles of
// bytes 8..11 and their top 2 bits from the spare top bits of bytes 0..7.
inline void KScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 0x3f;
    *min = s[j + 4] & 0x3f;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void DequantF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadFp16(src + 2 * i);
}

void DequantBF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    dst[i] = Bf16ToFp32(b);
  }
}

// Q4_0: {fp16 d; u8 qs[16]}; byte j holds element j (low nibble) and j+16.
void DequantQ4_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQK) {
    const float d = LoadFp16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = (float)((qs[j] & 0x0f) - 8) * d;
      dst[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
  }
}

// Q4_1: {fp16 d, m; u8 qs[16]}; value = q*d + m.
void DequantQ4_1(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 20, dst += kQK) {
    const float d = LoadFp16(src);
    const float m = LoadFp16(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = (float)(qs[j] & 0x0f) * d + m;
      dst[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0: {fp16 d; u8 qh[4]; u8 qs[16]}; bit i of the little-endian qh word is
// the fifth bit of element i.
void DequantQ5_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 22, dst += kQK) {
    const float d = LoadFp16(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = (int)((qh >> j) & 1) << 4;
      const int hi1 = (int)((qh >> (j + 16)) & 1) << 4;
      dst[j] = (float)(((qs[j] & 0x0f) | hi0) - 16) * d;
      dst[j + 16] = (float)(((qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

// Q5_1: {fp16 d, m; u8 qh[4]; u8 qs[16]}; value = q*d + m.
void DequantQ5_1(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 24, dst += kQK) {
    const float d = LoadFp16(src);
    const float m = LoadFp16(src + 2);
    uint32_t qh;
    std::memcpy(&qh, src + 4, 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = (int)((qh >> j) & 1) << 4;
      const int hi1 = (int)((qh >> (j + 16)) & 1) << 4;
      dst[j] = (float)((qs[j] & 0x0f) | hi0) * d + m;
      dst[j + 16] = (float)((qs[j] >> 4) | hi1) * d + m;
    }
  }
}

// Q8_0: {fp16 d; i8 qs[32]}.
void DequantQ8_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 34, dst += kQK) {
    const float d = LoadFp16(src);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = (float)qs[j] * d;
  }
}

// Q4_K: {fp16 d, dmin; u8 scales[12]; u8 qs[128]}. Each 64-element chunk
// reads 32 bytes: low nibbles are sub-block 2c, high nibbles sub-block 2c+1.
void DequantQ4_K(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 144, dst += kQK_K) {
    const float d = LoadFp16(src);
    const float dmin = LoadFp16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      KScaleMin(scales, 2 * c, &sc0, &m0);
      KScaleMin(scales, 2 * c + 1, &sc1, &m1);
      // Products rounded to float first, as ggml does.
      const float d0 = d * (float)sc0, min0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, min1 = dmin * (float)m1;
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * (float)(q[l] & 0x0f) - min0;
        y[l + 32] = d1 * (float)(q[l] >> 4) - min1;
      }
    }
  }
}

// Q5_K: {fp16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}. As Q4_K, with
// the fifth bit of element l of sub-block s in bit s of qh[l].
void DequantQ5_K(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 176, dst += kQK_K) {
    const float d = LoadFp16(src);
    const float dmin = LoadFp16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      KScaleMin(scales, 2 * c, &sc0, &m0);
      KScaleMin(scales, 2 * c + 1, &sc1, &m1);
      const float d0 = d * (float)sc0, min0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, min1 = dmin * (float)m1;
      const int shift0 = 2 * c, shift1 = 2 * c + 1;
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) {
        const int q0 = (q[l] & 0x0f) | (((qh[l] >> shift0) & 1) << 4);
        const int q1 = (q[l] >> 4) | (((qh[l] >> shift1) & 1) << 4);
        y[l] = d0 * (float)q0 - min0;
        y[l + 32] = d1 * (float)q1 - min1;
      }
    }
  }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d}. Each 128-element half
// uses 64 ql bytes and 32 qh bytes; element l + 32k (k = 0..3) takes a nibble
// of ql[l] or ql[l+32] and bits 2k..2k+1 of qh[l]; 16 elements per scale.
void DequantQ6_K(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 210, dst += kQK_K) {
    const float d = LoadFp16(src + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
    // (d * scale) is rounded to float before the quant multiply, as in ggml.
    float ds[16];
    for (int i = 0; i < 16; ++i) ds[i] = d * (float)scales[i];
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + 64 * half;
      const uint8_t* qh = src + 128 + 32 * half;
      const float* sc = ds + 8 * half;
      float* y = dst + 128 * half;
      // Elements l and l + 16 of each 32-group use different scales; looping
      // over the two 16-runs keeps the scale loop-invariant for vectorizing.
      for (int s = 0; s < 2; ++s) {
        for (int l = 16 * s; l < 16 * s + 16; ++l) {
          const int q0 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q1 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = sc[s] * (float)q0;
          y[l + 32] = sc[s + 2] * (float)q1;
          y[l + 64] = sc[s + 4] * (float)q2;
          y[l + 96] = sc[s + 6] * (float)q3;
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t n) {
  absl::StatusOr<BlockInfo> info = CheckedBlockInfo(type, n);
  if (!info.ok()) return info.status();
  return (uint64_t)(n / info->elems) * (uint64_t)info->bytes;
}

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  absl::StatusOr<BlockInfo> info = CheckedBlockInfo(type, n);
  if (!info.ok()) return info.status();
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info->elems;
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, s, (size_t)n * sizeof(float));
      break;
    case GgmlType::kF16: DequantF16(s, dst, n); break;
    case GgmlType::kBF16: DequantBF16(s, dst, n); break;
    case GgmlType::kQ4_0: DequantQ4_0(s, dst, nb); break;
    case GgmlType::kQ4_1: DequantQ4_1(s, dst, nb); break;
    case GgmlType::kQ5_0: DequantQ5_0(s, dst, nb); break;
    case GgmlType::kQ5_1: DequantQ5_1(s, dst, nb); break;
    case GgmlType::kQ8_0: DequantQ8_0(s, dst, nb); break;
    case GgmlType::kQ4_K: DequantQ4_K(s, dst, nb); break;
    case GgmlType::kQ5_K: DequantQ5_K(s, dst, nb); break;
    case GgmlType::kQ6_K: DequantQ6_K(s, dst, nb); break;
    default:  // CheckedBlockInfo already rejected every other type
      return absl::InternalError(
          absl::StrCat("no dequantizer for ", GgmlTypeName(type)));
  }
  return absl::OkStatus();
}

}  // namespace pdq
