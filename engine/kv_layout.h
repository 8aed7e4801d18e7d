// What the bytes of a KV cache mean, as a value that travels with them: two
// processes compare layouts before one reads KV blocks the other wrote. The
// weight precision is deliberately not part of it: a W8A8 prefill and a W4A16
// decode of the same model share a layout, which is the point of pdq.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace pdq {

// The cache's element type: fp16, or bf16 (rounded to nearest even; fewer
// mantissa bits, and dot products of their own where the CPU has
// AVX512_BF16). Two workers exchange KV only at the same dtype.
enum class KvDtype : uint8_t { kFp16 = 1, kBf16 = 2 };
const char* KvDtypeName(KvDtype dtype);
// "fp16" or "bf16" (--kv-dtype).
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);

// The byte order inside one block of one layer. kHeadTokenDim: K is
// [kv_heads][block_tokens][head_dim] elements, and V the same, in separate
// regions (see KvCache::MemoryRegions).
enum class KvBlockLayout : uint8_t { kHeadTokenDim = 1 };
const char* KvBlockLayoutName(KvBlockLayout layout);

struct KvLayout {
  // Stable hash of the weights-independent model identity: architecture,
  // shape, RoPE settings and the tokenizer (ModelFingerprint below).
  uint64_t model_fingerprint = 0;
  int32_t num_layers = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  // Keys are stored after RoPE, so its settings decide what they mean.
  float rope_base = 0.0f;
  float rope_linear_scale = 1.0f;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  KvDtype dtype = KvDtype::kFp16;
  int32_t block_tokens = 16;
  KvBlockLayout block_layout = KvBlockLayout::kHeadTokenDim;

  // Elements of K (or of V) in one block of one layer.
  int64_t block_elements() const { return (int64_t)kv_heads * block_tokens * head_dim; }
  // The room a sequence of `tokens` tokens takes: whole blocks, in tokens
  // (what a cache holding several sequences must be sized by).
  int64_t SequenceTokens(int64_t tokens) const {
    return (tokens + block_tokens - 1) / block_tokens * block_tokens;
  }
  // Bytes of K plus V for one block in one layer.
  int64_t block_bytes() const;
  // Bytes of K plus V for one token over every layer (what a token's KV
  // costs in memory and on the wire).
  int64_t bytes_per_token() const { return block_bytes() * num_layers / block_tokens; }

  bool operator==(const KvLayout& other) const = default;
  std::string ToString() const;

  // Fixed-size little-endian encoding with a version byte first, for
  // handshakes: kSerializedBytes long.
  static constexpr size_t kSerializedBytes = 40;
  std::string Serialize() const;
  // InvalidArgument for a wrong size, an unknown version, dtype or layout.
  static absl::StatusOr<KvLayout> Deserialize(std::string_view bytes);
};

// OK when a cache laid out as `mine` can read blocks laid out as `theirs`;
// otherwise FailedPrecondition naming the first field that differs and both
// values ("KV layout mismatch: block_tokens is 16 here, 32 in the peer").
absl::Status CheckKvCompatible(const KvLayout& mine, const KvLayout& theirs);

}  // namespace pdq
