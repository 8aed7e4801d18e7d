// KvLayout: comparison naming the differing field, and its wire encoding.
#include "engine/kv_layout.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdq {
namespace {

constexpr char kMagic[4] = {'P', 'D', 'Q', 'K'};
constexpr uint8_t kVersion = 1;

const char* RopeStyleName(RopeStyle s) {
  return s == RopeStyle::kInterleaved ? "interleaved" : "half-split";
}

// Little-endian writer and reader over a fixed buffer.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back((char)v); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) U8((uint8_t)(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) U8((uint8_t)(v >> (8 * i)));
  }
  void F32(float v) { U32(std::bit_cast<uint32_t>(v)); }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint8_t U8() { return (uint8_t)in_[pos_++]; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= (uint32_t)U8() << (8 * i);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= (uint64_t)U8() << (8 * i);
    return v;
  }
  float F32() { return std::bit_cast<float>(U32()); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kBf16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  if (name == "fp16") return KvDtype::kFp16;
  if (name == "bf16") return KvDtype::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV dtype '", std::string(name), "' (fp16 or bf16)"));
}

const char* KvBlockLayoutName(KvBlockLayout layout) {
  switch (layout) {
    case KvBlockLayout::kHeadTokenDim:
      return "[head][token][dim]";
  }
  return "?";
}

int64_t KvLayout::block_bytes() const {
  const int64_t elem = dtype == KvDtype::kFp16 || dtype == KvDtype::kBf16 ? 2 : 0;
  return 2 * block_elements() * elem;
}

std::string KvLayout::ToString() const {
  return absl::StrFormat(
      "KvLayout{model=%016x layers=%d kv_heads=%d head_dim=%d rope_base=%g rope_scale=%g "
      "rope=%s dtype=%s block_tokens=%d block_layout=%s}",
      model_fingerprint, num_layers, kv_heads, head_dim, rope_base, rope_linear_scale,
      RopeStyleName(rope_style), KvDtypeName(dtype), block_tokens, KvBlockLayoutName(block_layout));
}

std::string KvLayout::Serialize() const {
  std::string out;
  out.reserve(kSerializedBytes);
  out.append(kMagic, 4);
  Writer w(&out);
  w.U8(kVersion);
  w.U8((uint8_t)dtype);
  w.U8((uint8_t)block_layout);
  w.U8(rope_style == RopeStyle::kInterleaved ? 0 : 1);
  w.U64(model_fingerprint);
  w.U32((uint32_t)num_layers);
  w.U32((uint32_t)kv_heads);
  w.U32((uint32_t)head_dim);
  w.U32((uint32_t)block_tokens);
  w.F32(rope_base);
  w.F32(rope_linear_scale);
  return out;
}

absl::StatusOr<KvLayout> KvLayout::Deserialize(std::string_view bytes) {
  if (bytes.size() != kSerializedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout is ", bytes.size(), " bytes, expected ", kSerializedBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a KV layout (bad magic)");
  }
  Reader r(bytes.substr(4));
  KvLayout l;
  if (const uint8_t version = r.U8(); version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout version ", version, " is not supported (this build reads ", kVersion, ")"));
  }
  const uint8_t dtype = r.U8(), block_layout = r.U8(), rope = r.U8();
  if (dtype != (uint8_t)KvDtype::kFp16 && dtype != (uint8_t)KvDtype::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat("unknown KV dtype ", dtype));
  }
  if (block_layout != (uint8_t)KvBlockLayout::kHeadTokenDim) {
    return absl::InvalidArgumentError(absl::StrCat("unknown KV block layout ", block_layout));
  }
  if (rope > 1) return absl::InvalidArgumentError(absl::StrCat("unknown RoPE style ", rope));
  l.dtype = (KvDtype)dtype;
  l.block_layout = (KvBlockLayout)block_layout;
  l.rope_style = rope == 0 ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;
  l.model_fingerprint = r.U64();
  l.num_layers = (int32_t)r.U32();
  l.kv_heads = (int32_t)r.U32();
  l.head_dim = (int32_t)r.U32();
  l.block_tokens = (int32_t)r.U32();
  l.rope_base = r.F32();
  l.rope_linear_scale = r.F32();
  if (l.num_layers <= 0 || l.kv_heads <= 0 || l.head_dim <= 0 || l.block_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("malformed KV layout: ", l.ToString()));
  }
  return l;
}

absl::Status CheckKvCompatible(const KvLayout& mine, const KvLayout& theirs) {
  auto differ = [](const char* field, const auto& a, const auto& b) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV layout mismatch: ", field, " is ", a, " here, ", b, " in the peer"));
  };
  // Shape and encoding first: they name the most specific cause.
  if (mine.num_layers != theirs.num_layers) {
    return differ("num_layers", mine.num_layers, theirs.num_layers);
  }
  if (mine.kv_heads != theirs.kv_heads) return differ("kv_heads", mine.kv_heads, theirs.kv_heads);
  if (mine.head_dim != theirs.head_dim) return differ("head_dim", mine.head_dim, theirs.head_dim);
  if (mine.dtype != theirs.dtype) {
    return differ("dtype", KvDtypeName(mine.dtype), KvDtypeName(theirs.dtype));
  }
  if (mine.block_tokens != theirs.block_tokens) {
    return differ("block_tokens", mine.block_tokens, theirs.block_tokens);
  }
  if (mine.block_layout != theirs.block_layout) {
    return differ("block_layout", KvBlockLayoutName(mine.block_layout),
                  KvBlockLayoutName(theirs.block_layout));
  }
  if (mine.rope_style != theirs.rope_style) {
    return differ("rope_style", RopeStyleName(mine.rope_style), RopeStyleName(theirs.rope_style));
  }
  if (mine.rope_base != theirs.rope_base)
    return differ("rope_base", mine.rope_base, theirs.rope_base);
  if (mine.rope_linear_scale != theirs.rope_linear_scale) {
    return differ("rope_linear_scale", mine.rope_linear_scale, theirs.rope_linear_scale);
  }
  if (mine.model_fingerprint != theirs.model_fingerprint) {
    return differ("model_fingerprint (architecture or tokenizer)",
                  absl::StrFormat("%016x", mine.model_fingerprint),
                  absl::StrFormat("%016x", theirs.model_fingerprint));
  }
  return absl::OkStatus();
}

}  // namespace pdq
