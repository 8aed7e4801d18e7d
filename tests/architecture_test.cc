// The architecture matrix: for each Transformer family pdq runs (llama,
// qwen2, phi3, gemma), a small GGUF file in that family's own tensor layout
// (Phi-3's fused attn_qkv and gate/up, or separate q/k/v; Gemma's tied
// embedding and wide heads; Qwen2's biases) with random weights, loaded by pdq and compared
// with a scalar double-precision forward pass written here from each
// family's definition, sharing no code with the engine. Each family's
// distinguishing trait is also flipped in the reference, to show the
// comparison would catch it.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "common/half.h"
#include "engine/context.h"
#include "engine/model.h"
#include "engine/synthetic.h"
#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/gguf_builder.h"
#include "tests/spm_reference.h"

namespace pdq {
namespace {

using testing::GgufBuilder;

struct Family {
  std::string arch;
  int heads, kv_heads, head_dim;
  bool qkv_bias = false;
  bool fused_qkv = false;        // one attn_qkv (Phi-3)
  bool fused_gate_up = false;    // ffn_up holds gate then up, no ffn_gate (Phi-3)
  bool tied = false;             // no output.weight
  bool gelu = false;             // GELU (tanh) gate instead of SiLU
  bool scale_embedding = false;  // embeddings times sqrt(d_model)
  bool neox = false;             // RoPE rotates (i, i + head_dim/2), else (2i, 2i+1)
  int sliding_window = 0;
};

constexpr int kLayers = 2, kD = 64, kFfn = 96, kContext = 256;
constexpr float kRopeBase = 10000.0f, kEps = 1e-6f;

// The model's tensors as GGUF stores them: `out` rows of `in` floats (GGUF
// dims [in, out]; one-dimensional when out is 1).
struct Tensor {
  int64_t in = 0, out = 0;
  std::vector<float> v;
};
struct Weights {
  std::map<std::string, Tensor> t;
  const std::vector<float>& operator[](const std::string& name) const { return t.at(name).v; }
};

// The synthetic models' byte-level vocabulary: 256 byte tokens and three
// control tokens, no padding.
const TokenizerSpec& Vocabulary() {
  static const TokenizerSpec spec = SyntheticTokenizerSpec(259);
  return spec;
}

int QDim(const Family& f) { return f.heads * f.head_dim; }
int KvDim(const Family& f) { return f.kv_heads * f.head_dim; }

// Random weights on the fp16 grid (so pdq's FP16 reference holds them
// exactly); norms near 1.
Weights MakeWeights(const Family& f, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Weights w;
  auto add = [&](const std::string& name, int64_t out, int64_t in, float scale, float offset) {
    Tensor& t = w.t[name];
    t.in = in;
    t.out = out;
    t.v.resize(out * in);
    for (float& x : t.v) x = Fp16ToFp32(Fp32ToFp16(offset + scale * normal(rng)));
  };
  add("token_embd.weight", vocab, kD, f.scale_embedding ? 0.1f : 1.0f, 0.0f);
  add("output_norm.weight", 1, kD, 0.1f, 1.0f);
  if (!f.tied) add("output.weight", vocab, kD, 1.0f / std::sqrt((float)kD), 0.0f);
  const float in_scale = 1.0f / std::sqrt((float)kD);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", 1, kD, 0.1f, 1.0f);
    add(p + "ffn_norm.weight", 1, kD, 0.1f, 1.0f);
    if (f.fused_qkv) {
      add(p + "attn_qkv.weight", QDim(f) + 2 * KvDim(f), kD, in_scale, 0.0f);
    } else {
      add(p + "attn_q.weight", QDim(f), kD, in_scale, 0.0f);
      add(p + "attn_k.weight", KvDim(f), kD, in_scale, 0.0f);
      add(p + "attn_v.weight", KvDim(f), kD, in_scale, 0.0f);
    }
    if (f.fused_gate_up) {
      add(p + "ffn_up.weight", 2 * kFfn, kD, in_scale, 0.0f);
    } else {
      add(p + "ffn_gate.weight", kFfn, kD, in_scale, 0.0f);
      add(p + "ffn_up.weight", kFfn, kD, in_scale, 0.0f);
    }
    if (f.qkv_bias) {
      add(p + "attn_q.bias", 1, QDim(f), 0.2f, 0.0f);
      add(p + "attn_k.bias", 1, KvDim(f), 0.2f, 0.0f);
      add(p + "attn_v.bias", 1, KvDim(f), 0.2f, 0.0f);
    }
    add(p + "attn_output.weight", kD, QDim(f), 1.0f / std::sqrt((float)QDim(f)), 0.0f);
    add(p + "ffn_down.weight", kD, kFfn, 1.0f / std::sqrt((float)kFfn), 0.0f);
  }
  return w;
}

// Writes the GGUF file; `extra` adds keys or tensors for error cases.
// With `sentencepiece`, the vocabulary is tests/spm_reference.h's
// SentencePiece model (as Llama 2, Mistral, Phi-3 mini and Gemma ship)
// instead of the byte-level one.
std::string WriteGguf(const Family& f, const Weights& w, const std::string& name,
                      const std::function<void(GgufBuilder&)>& extra = nullptr,
                      bool sentencepiece = false) {
  GgufBuilder b;
  const std::string a = f.arch + ".";
  b.AddString("general.architecture", f.arch);
  b.AddString("general.name", "test-" + f.arch);
  b.AddU32(a + "block_count", kLayers);
  b.AddU32(a + "embedding_length", kD);
  b.AddU32(a + "feed_forward_length", kFfn);
  b.AddU32(a + "attention.head_count", f.heads);
  b.AddU32(a + "attention.head_count_kv", f.kv_heads);
  if (f.head_dim != kD / f.heads) b.AddU32(a + "attention.key_length", f.head_dim);
  b.AddU32(a + "context_length", kContext);
  b.AddF32(a + "rope.freq_base", kRopeBase);
  b.AddF32(a + "attention.layer_norm_rms_epsilon", kEps);
  if (f.sliding_window > 0) b.AddU32(a + "attention.sliding_window", f.sliding_window);
  if (sentencepiece) {
    b.AddString("tokenizer.ggml.model", "llama");
    b.AddStringArray(
        "tokenizer.ggml.tokens",
        std::vector<std::string>(std::begin(testing::kSpmPieces), std::end(testing::kSpmPieces)));
    b.AddF32Array("tokenizer.ggml.scores", std::vector<float>(std::begin(testing::kSpmScores),
                                                              std::end(testing::kSpmScores)));
    b.AddI32Array("tokenizer.ggml.token_type", std::vector<int32_t>(std::begin(testing::kSpmTypes),
                                                                    std::end(testing::kSpmTypes)));
    b.AddU32("tokenizer.ggml.bos_token_id", testing::kSpmBos);
    b.AddU32("tokenizer.ggml.eos_token_id", testing::kSpmEos);
    b.AddBool("tokenizer.ggml.add_bos_token", true);
  } else {
    b.AddString("tokenizer.ggml.model", "gpt2");
    b.AddString("tokenizer.ggml.pre", "default");
    const TokenizerSpec& vocab = Vocabulary();
    b.AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
    std::vector<int32_t> types;
    for (TokenType type : vocab.types) types.push_back(static_cast<int32_t>(type));
    b.AddI32Array("tokenizer.ggml.token_type", types);
    b.AddStringArray("tokenizer.ggml.merges", {});
    b.AddU32("tokenizer.ggml.bos_token_id", vocab.bos_id);
    b.AddU32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  }
  if (extra) extra(b);
  for (const auto& [tensor, t] : w.t) {
    std::vector<uint64_t> dims = {(uint64_t)t.in};
    if (t.out > 1) dims.push_back(t.out);
    b.AddTensor(tensor, /*F32*/ 0, dims,
                std::string(reinterpret_cast<const char*>(t.v.data()), t.v.size() * sizeof(float)));
  }
  const std::string path =
      ::testing::TempDir() + "/pdq-arch-" + name + "-" + std::to_string(getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary) << b.Build();
  return path;
}

// ---- The scalar reference ---------------------------------------------------

using Vec = std::vector<double>;

Vec MatVec(const std::vector<float>& w, int64_t row0, int64_t rows, int64_t in, const Vec& x) {
  Vec y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < in; ++i) y[r] += (double)w[(row0 + r) * in + i] * x[i];
  }
  return y;
}

Vec RmsNorm(const Vec& x, const std::vector<float>& weight) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / (double)x.size() + kEps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * weight[i];
  return y;
}

void Rotate(double* head, int head_dim, int pos, bool neox) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double theta = pos * std::pow((double)kRopeBase, -2.0 * i / head_dim);
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const double x0 = head[a], x1 = head[b];
    head[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
    head[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
  }
}

// Logits at every position of `tokens`, by the family's definition.
std::vector<Vec> Reference(const Family& f, const Weights& w, const std::vector<int32_t>& tokens,
                           int vocab) {
  const int n = (int)tokens.size(), hd = f.head_dim, group = f.heads / f.kv_heads;
  std::vector<Vec> x(n);
  for (int t = 0; t < n; ++t) {
    x[t].resize(kD);
    for (int j = 0; j < kD; ++j) {
      x[t][j] = w["token_embd.weight"][(int64_t)tokens[t] * kD + j] *
                (f.scale_embedding ? std::sqrt((double)kD) : 1.0);
    }
  }
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const Vec h = RmsNorm(x[t], w[p + "attn_norm.weight"]);
      if (f.fused_qkv) {
        const auto& qkv = w[p + "attn_qkv.weight"];
        q[t] = MatVec(qkv, 0, QDim(f), kD, h);
        k[t] = MatVec(qkv, QDim(f), KvDim(f), kD, h);
        v[t] = MatVec(qkv, QDim(f) + KvDim(f), KvDim(f), kD, h);
      } else {
        q[t] = MatVec(w[p + "attn_q.weight"], 0, QDim(f), kD, h);
        k[t] = MatVec(w[p + "attn_k.weight"], 0, KvDim(f), kD, h);
        v[t] = MatVec(w[p + "attn_v.weight"], 0, KvDim(f), kD, h);
      }
      if (f.qkv_bias) {
        for (int i = 0; i < QDim(f); ++i) q[t][i] += w[p + "attn_q.bias"][i];
        for (int i = 0; i < KvDim(f); ++i) k[t][i] += w[p + "attn_k.bias"][i];
        for (int i = 0; i < KvDim(f); ++i) v[t][i] += w[p + "attn_v.bias"][i];
      }
      for (int h2 = 0; h2 < f.heads; ++h2) Rotate(&q[t][h2 * hd], hd, t, f.neox);
      for (int h2 = 0; h2 < f.kv_heads; ++h2) Rotate(&k[t][h2 * hd], hd, t, f.neox);
    }
    for (int t = 0; t < n; ++t) {
      Vec attn(QDim(f), 0.0);
      for (int h2 = 0; h2 < f.heads; ++h2) {
        const int kvh = h2 / group;
        Vec score(t + 1);
        double top = -1e300;
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int i = 0; i < hd; ++i) dot += q[t][h2 * hd + i] * k[s][kvh * hd + i];
          score[s] = dot / std::sqrt((double)hd);
          top = std::max(top, score[s]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - top));
        for (int s = 0; s <= t; ++s) {
          for (int i = 0; i < hd; ++i) attn[h2 * hd + i] += score[s] / sum * v[s][kvh * hd + i];
        }
      }
      const Vec o = MatVec(w[p + "attn_output.weight"], 0, kD, QDim(f), attn);
      for (int j = 0; j < kD; ++j) x[t][j] += o[j];
      const Vec h = RmsNorm(x[t], w[p + "ffn_norm.weight"]);
      Vec gate, up;
      if (f.fused_gate_up) {
        gate = MatVec(w[p + "ffn_up.weight"], 0, kFfn, kD, h);
        up = MatVec(w[p + "ffn_up.weight"], kFfn, kFfn, kD, h);
      } else {
        gate = MatVec(w[p + "ffn_gate.weight"], 0, kFfn, kD, h);
        up = MatVec(w[p + "ffn_up.weight"], 0, kFfn, kD, h);
      }
      Vec act(kFfn);
      for (int i = 0; i < kFfn; ++i) {
        const double g = gate[i];
        const double a =
            f.gelu ? 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)))
                   : g / (1 + std::exp(-g));
        act[i] = a * up[i];
      }
      const Vec down = MatVec(w[p + "ffn_down.weight"], 0, kD, kFfn, act);
      for (int j = 0; j < kD; ++j) x[t][j] += down[j];
    }
  }
  std::vector<Vec> logits(n);
  for (int t = 0; t < n; ++t) {
    const Vec h = RmsNorm(x[t], w["output_norm.weight"]);
    logits[t] = MatVec(w[f.tied ? "token_embd.weight" : "output.weight"], 0, vocab, kD, h);
  }
  return logits;
}

// Largest |a - b| over a row, relative to the row's largest |b|.
double RelativeError(const float* a, const Vec& b) {
  double err = 0, scale = 1e-9;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs((double)a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

const std::vector<Family>& Families() {
  static const std::vector<Family> families = [] {
    std::vector<Family> v;
    Family llama{"llama", 4, 2, 16};
    v.push_back(llama);
    Family qwen2{"qwen2", 4, 2, 16};
    qwen2.qkv_bias = qwen2.tied = qwen2.neox = true;
    v.push_back(qwen2);
    Family phi3{"phi3", 4, 4, 16};
    phi3.fused_qkv = phi3.fused_gate_up = phi3.neox = true;
    phi3.sliding_window = 128;
    v.push_back(phi3);
    Family phi3_split = phi3;  // a phi3 file with attn_q/k/v, which llama.cpp reads too
    phi3_split.fused_qkv = false;
    v.push_back(phi3_split);
    // Heads wider than d_model / heads (as in Gemma 7B) and one KV head (as
    // in Gemma 2B).
    Family gemma{"gemma", 4, 1, 32};
    gemma.tied = gemma.gelu = gemma.scale_embedding = gemma.neox = true;
    v.push_back(gemma);
    return v;
  }();
  return families;
}

class ArchitectureTest : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    vocab_ = (int)Vocabulary().tokens.size();
    weights_ = MakeWeights(GetParam(), vocab_, 7);
    path_ = WriteGguf(GetParam(), weights_, "ok");
  }
  void TearDown() override { std::remove(path_.c_str()); }

  std::unique_ptr<Model> Load(Precision precision = Precision::kFp16) {
    LoadOptions o;
    o.precision = precision;
    o.w4_group = 32;
    auto m = Model::Load(path_, o, CpuContext{&pool_});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::vector<int32_t> Prompt(int n) const {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 37 + 11) % 256);
    return t;
  }

  ThreadPool pool_{2};
  int vocab_ = 0;
  Weights weights_;
  std::string path_;
};

// pdq keeps the KV cache in fp16 and activations in fp32: about 4e-4 here.
constexpr double kTolerance = 2e-3;

TEST_P(ArchitectureTest, PrefillMatchesTheScalarReference) {
  const Family& f = GetParam();
  auto model = Load();
  ASSERT_TRUE(model);
  EXPECT_EQ(model->config().arch, f.arch);
  EXPECT_EQ(model->config().head_dim, f.head_dim);
  EXPECT_EQ(model->config().max_context, f.sliding_window > 0 ? f.sliding_window : kContext);
  const std::vector<int32_t> prompt = Prompt(24);
  const std::vector<Vec> want = Reference(f, weights_, prompt, vocab_);
  Context ctx(*model, CpuContext{&pool_});
  auto kv = model->NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  BatchEntry e{(*kv)->AddSequence(), prompt, (int64_t)prompt.size()};
  Logits got;
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &got).ok());
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    worst = std::max(worst, RelativeError(got.Row(0, t), want[t]));
  }
  EXPECT_LT(worst, kTolerance) << f.arch;

  // The same check would catch a family's trait done wrong: the reference
  // with its RoPE pairing, activation or embedding scale flipped is far off.
  std::vector<Family> wrong;
  Family rope = f;
  rope.neox = !f.neox;
  wrong.push_back(rope);
  if (f.gelu) {
    Family silu = f;
    silu.gelu = false;
    wrong.push_back(silu);
  }
  if (f.scale_embedding) {
    Family unscaled = f;
    unscaled.scale_embedding = false;
    wrong.push_back(unscaled);
  }
  for (const Family& w : wrong) {
    const std::vector<Vec> off = Reference(w, weights_, prompt, vocab_);
    double far = 0;
    for (size_t t = 0; t < prompt.size(); ++t) {
      far = std::max(far, RelativeError(got.Row(0, t), off[t]));
    }
    EXPECT_GT(far, 10 * kTolerance) << f.arch << ": a flipped trait went unnoticed";
  }
}

TEST_P(ArchitectureTest, DecodeStepsMatchTheScalarReference) {
  const Family& f = GetParam();
  auto model = Load();
  ASSERT_TRUE(model);
  const std::vector<int32_t> prompt = Prompt(20);
  const std::vector<Vec> want = Reference(f, weights_, prompt, vocab_);
  Context ctx(*model, CpuContext{&pool_});
  auto kv = model->NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  const SeqId seq = (*kv)->AddSequence();
  Logits got;
  BatchEntry e{seq, std::span<const int32_t>(prompt).first(12), 1};
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &got).ok());
  EXPECT_LT(RelativeError(got.Row(0, 0), want[11]), kTolerance);
  for (size_t t = 12; t < prompt.size(); ++t) {
    BatchEntry step{seq, std::span<const int32_t>(prompt).subspan(t, 1), 1};
    ASSERT_TRUE(ctx.ForwardAll(**kv, {&step, 1}, &got).ok());
    EXPECT_LT(RelativeError(got.Row(0, 0), want[t]), kTolerance) << f.arch << " position " << t;
  }
}

// The quantized precisions load every family and stay close to its FP16.
TEST_P(ArchitectureTest, QuantizedPrecisionsFollowFp16) {
  auto fp16 = Load();
  ASSERT_TRUE(fp16);
  const std::vector<int32_t> prompt = Prompt(16);
  auto last = [&](const Model& m) {
    Context ctx(m, CpuContext{&pool_});
    auto kv = m.NewKvCache(32);
    EXPECT_TRUE(kv.ok());
    BatchEntry e{(*kv)->AddSequence(), prompt, 1};
    Logits l;
    EXPECT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &l).ok());
    return std::vector<float>(l.Row(0, 0), l.Row(0, 0) + vocab_);
  };
  const std::vector<float> want = last(*fp16);
  Vec ref(want.begin(), want.end());
  for (Precision p : {Precision::kW8A8, Precision::kW4A16}) {
    auto q = Load(p);
    ASSERT_TRUE(q);
    const std::vector<float> got = last(*q);
    EXPECT_LT(RelativeError(got.data(), ref), 0.25) << GetParam().arch << " " << PrecisionName(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ArchitectureTest, ::testing::ValuesIn(Families()),
                         [](const auto& info) {
                           const Family& f = info.param;
                           return f.arch +
                                  (f.arch == "phi3" && !f.fused_qkv ? "_separate_qkv" : "");
                         });

// A family's GGUF with a SentencePiece vocabulary (as real Gemma and Phi-3
// mini files carry) loads whole: the tokenizer encodes as sentencepiece
// does, and the forward pass still matches the reference.
TEST(ArchitectureSentencePieceTest, GemmaWithASentencePieceVocabulary) {
  const Family gemma = Families().back();
  ASSERT_EQ(gemma.arch, "gemma");
  const int vocab = (int)std::size(testing::kSpmPieces);
  const Weights w = MakeWeights(gemma, vocab, 3);
  const std::string path = WriteGguf(gemma, w, "spm", nullptr, /*sentencepiece=*/true);
  ThreadPool pool(2);
  auto model = Model::Load(path, LoadOptions{}, CpuContext{&pool});
  std::remove(path.c_str());
  ASSERT_TRUE(model.ok()) << model.status();
  const Tokenizer& tok = (*model)->tokenizer();
  EXPECT_EQ(tok.vocab_size(), vocab);
  std::vector<int32_t> prompt = {testing::kSpmBos};
  prompt.insert(prompt.end(), testing::kSpmCases[1].ids.begin(), testing::kSpmCases[1].ids.end());
  ASSERT_EQ(tok.Encode(testing::kSpmCases[1].text, tok.add_bos(), false), prompt);
  const std::vector<Vec> want = Reference(gemma, w, prompt, vocab);
  Context ctx(**model, CpuContext{&pool});
  auto kv = (*model)->NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  BatchEntry e{(*kv)->AddSequence(), prompt, (int64_t)prompt.size()};
  Logits got;
  ASSERT_TRUE(ctx.ForwardAll(**kv, {&e, 1}, &got).ok());
  for (size_t t = 0; t < prompt.size(); ++t) {
    EXPECT_LT(RelativeError(got.Row(0, t), want[t]), kTolerance) << "position " << t;
  }
}

// ---- What is refused, and how ---------------------------------------------

class ArchitectureErrorTest : public ::testing::Test {
 protected:
  absl::Status LoadStatus(const Family& f, const Weights& w,
                          const std::function<void(GgufBuilder&)>& extra = nullptr) {
    const std::string path = WriteGguf(f, w, "err", extra);
    auto m = Model::Load(path, LoadOptions{}, CpuContext{&pool_});
    std::remove(path.c_str());
    return m.status();
  }
  ThreadPool pool_{1};
};

TEST_F(ArchitectureErrorTest, UnknownArchitectureNamesTheSupportedOnes) {
  Family f{"gemma2", 4, 1, 32};
  const absl::Status s = LoadStatus(f, MakeWeights(f, (int)Vocabulary().tokens.size(), 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("'gemma2'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("llama, qwen2, phi3, gemma"), std::string::npos) << s;
}

TEST_F(ArchitectureErrorTest, Phi3WithoutItsFusedGateUpIsAMissingTensor) {
  Family llama_ffn = Families()[2];
  llama_ffn.fused_gate_up = false;  // ffn_gate and ffn_up, as llama lays them out
  const absl::Status s =
      LoadStatus(Families()[2], MakeWeights(llama_ffn, (int)Vocabulary().tokens.size(), 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ffn_up"), std::string::npos) << s;
}

TEST_F(ArchitectureErrorTest, LongRopeIsRefused) {
  Family phi3 = Families()[2];
  const absl::Status s =
      LoadStatus(phi3, MakeWeights(phi3, (int)Vocabulary().tokens.size(), 1), [](GgufBuilder& b) {
        std::vector<float> factors(8, 1.0f);
        b.AddTensor("rope_factors_long.weight", 0, {8},
                    std::string(reinterpret_cast<const char*>(factors.data()), 32));
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("LongRoPE"), std::string::npos) << s;
}

}  // namespace
}  // namespace pdq
