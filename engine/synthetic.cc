// Shapes follow the published configurations of the models they are named
// after; weights come from a counter-based generator, so they are the same on
// every run and every thread count.
#include "engine/synthetic.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pdq {
namespace {

struct Shape {
  const char* name;
  const char* arch;
  int layers, d_model, heads, kv_heads, head_dim, ffn, vocab, context;
  float rope_base;
};

constexpr Shape kShapes[] = {
    {"tiny", "llama", 2, 64, 4, 2, 16, 128, 384, 512, 10000.0f},
    {"tiny-qwen2", "qwen2", 2, 64, 4, 2, 16, 128, 384, 512, 10000.0f},
    {"tiny-phi3", "phi3", 2, 64, 4, 4, 16, 128, 384, 512, 10000.0f},
    // Gemma's heads are wider than d_model / heads, with one KV head.
    {"tiny-gemma", "gemma", 2, 64, 4, 1, 32, 128, 384, 512, 10000.0f},
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f},
    {"smollm2-360m", "llama", 32, 960, 15, 5, 64, 2560, 49152, 8192, 100000.0f},
    {"llama-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 8192, 500000.0f},
};

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
// rest are shifted to U+0100 upwards, so every byte is a visible character.
std::string ByteToken(int byte) {
  static const std::vector<int> map = [] {
    std::vector<int> m(256, -1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      m[b] = printable ? b : next++;
    }
    return m;
  }();
  const int cp = map[byte];
  std::string s;
  if (cp < 0x80) {
    s.push_back((char)cp);
  } else {
    s.push_back((char)(0xc0 | (cp >> 6)));
    s.push_back((char)(0x80 | (cp & 0x3f)));
  }
  return s;
}

}  // namespace

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name) {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) {
    names.push_back(s.name);
    if (name != s.name) continue;
    ModelConfig c;
    c.name = absl::StrCat("synthetic:", s.name);
    c.num_layers = s.layers;
    c.d_model = s.d_model;
    c.num_heads = s.heads;
    c.num_kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.ffn_dim = s.ffn;
    c.vocab_size = s.vocab;
    c.max_context = s.context;
    c.rope_base = s.rope_base;
    c.ApplyArchitecture(*FindArchitecture(s.arch));
    c.tied_output = true;
    return c;
  }
  return absl::NotFoundError(absl::StrCat("unknown synthetic model '", name,
                                          "' (known: ", absl::StrJoin(names, ", "), ")"));
}

std::vector<std::string> SyntheticModelNames() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.push_back(s.name);
  return names;
}

TokenizerSpec SyntheticTokenizerSpec(int vocab_size) {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteToken(b));
  spec.types.assign(256, TokenType::kNormal);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    spec.tokens.push_back(special);
    spec.types.push_back(TokenType::kControl);
  }
  spec.bos_id = 256;
  spec.eos_id = 256;
  spec.eog_ids = {258};
  spec.chat_template = "<|im_start|>";
  while ((int)spec.tokens.size() < vocab_size) {
    spec.tokens.push_back(absl::StrCat("<unused_", spec.tokens.size(), ">"));
    spec.types.push_back(TokenType::kUnused);
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> SyntheticTokenizer(int vocab_size) {
  return Tokenizer::FromSpec(SyntheticTokenizerSpec(vocab_size));
}

std::vector<float> SyntheticTensor(const std::string& name, int64_t n, float scale) {
  uint64_t seed = 1469598103934665603ull;
  for (char ch : name) seed = (seed ^ (uint8_t)ch) * 1099511628211ull;
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix(seed + (uint64_t)i);
    out[i] = scale * ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
  return out;
}

}  // namespace pdq
