// Model loading (GGUF or synthetic) into FP16 panel-packed weights, and the
// batched forward pass: every sequence's new tokens go through the matmuls
// together; attention runs per sequence over its paged KV blocks.
#include "engine/model.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "engine/gguf.h"
#include "engine/gguf_dequant.h"
#include "engine/artifact.h"
#include "engine/linear.h"
#include "engine/synthetic.h"

namespace pdq {

int64_t ModelConfig::layer_matmul_params() const {
  const int64_t per_layer = (int64_t)d_model * (q_dim() + 2 * kv_dim()) +
                            (int64_t)q_dim() * d_model + 3 * (int64_t)d_model * ffn_dim;
  return per_layer * num_layers;
}

double ModelConfig::ForwardFlops(int64_t past, int64_t tokens, int64_t logit_rows) const {
  // Query at position p attends to p + 1 keys: QK^T and PV, 2 FLOPs each.
  const double keys = (double)tokens * (double)past + (double)tokens * (tokens + 1) / 2.0;
  const double attention = 4.0 * keys * q_dim() * num_layers;
  return 2.0 * (double)layer_matmul_params() * (double)tokens +
         2.0 * (double)output_params() * (double)logit_rows + attention;
}

bool MatchesLayerPattern(const std::string& pattern, const std::string& name) {
  // Iterative glob with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp16: return "fp16";
    case Precision::kW8A8: return "w8a8";
    case Precision::kW4A16: return "w4a16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp16") return Precision::kFp16;
  if (name == "w8a8") return Precision::kW8A8;
  if (name == "w4a16") return Precision::kW4A16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (expected fp16, w8a8 or w4a16)"));
}

const char* W4MethodName(W4Method m) {
  switch (m) {
    case W4Method::kRtn: return "rtn";
    case W4Method::kAwq: return "awq";
    case W4Method::kGptq: return "gptq";
    case W4Method::kAwqGptq: return "awq+gptq";
  }
  return "?";
}

absl::StatusOr<W4Method> ParseW4Method(const std::string& name) {
  for (W4Method m : {W4Method::kRtn, W4Method::kAwq, W4Method::kGptq, W4Method::kAwqGptq}) {
    if (name == W4MethodName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown W4 method '", name, "' (expected rtn, awq, gptq or awq+gptq)"));
}

namespace {

// Reads a GGUF tensor as fp32 rows, checking its shape [in, out].
absl::StatusOr<std::vector<float>> ReadTensor(const GgufFile& file, const std::string& name,
                                              std::vector<int64_t> want_dims) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  if (t->dims != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has shape [", absl::StrJoin(t->dims, ", "), "], expected [",
        absl::StrJoin(want_dims, ", "), "]"));
  }
  std::vector<float> out(t->num_elements());
  PDQ_ASSIGN_OR_RETURN(const uint64_t row_bytes, GgmlRowBytes(t->type, t->row_length()));
  for (int64_t r = 0; r < t->num_rows(); ++r) {
    PDQ_RETURN_IF_ERROR(DequantizeRow(t->type, t->data + r * row_bytes,
                                      out.data() + r * t->row_length(), t->row_length()));
  }
  return out;
}

absl::StatusOr<int64_t> RequireInt(const GgufFile& f, const std::string& key, int64_t lo,
                                   int64_t hi) {
  PDQ_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' = ", v, " is outside [", lo, ", ", hi, "]"));
  }
  return v;
}

// A float key that may be absent (then `fallback`) but not of the wrong type.
absl::StatusOr<double> OptionalFloat(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.Has(key)) return fallback;
  return f.GetFloat(key);
}

// Checks that every tensor the model needs is present with the right shape,
// before any weight memory is allocated.
absl::Status CheckTensors(const GgufFile& f, const ModelConfig& c) {
  const int64_t d = c.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"token_embd.weight", {d, c.vocab_size}}, {"output_norm.weight", {d}}};
  if (!c.tied_output) want.push_back({"output.weight", {d, c.vocab_size}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    want.push_back({p + "attn_norm.weight", {d}});
    want.push_back({p + "ffn_norm.weight", {d}});
    want.push_back({p + "attn_q.weight", {d, c.q_dim()}});
    want.push_back({p + "attn_k.weight", {d, c.kv_dim()}});
    want.push_back({p + "attn_v.weight", {d, c.kv_dim()}});
    want.push_back({p + "attn_output.weight", {c.q_dim(), d}});
    want.push_back({p + "ffn_gate.weight", {d, c.ffn_dim}});
    want.push_back({p + "ffn_up.weight", {d, c.ffn_dim}});
    want.push_back({p + "ffn_down.weight", {c.ffn_dim, d}});
    if (c.qkv_bias) {
      want.push_back({p + "attn_q.bias", {c.q_dim()}});
      want.push_back({p + "attn_k.bias", {c.kv_dim()}});
      want.push_back({p + "attn_v.bias", {c.kv_dim()}});
    }
  }
  for (const auto& [name, dims] : want) {
    const GgufTensor* t = f.FindTensor(name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
    if (t->dims != dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' has shape [", absl::StrJoin(t->dims, ", "), "], expected [",
          absl::StrJoin(dims, ", "), "]"));
    }
  }
  // FP16 weights (the largest format loaded) plus the embedding copy must fit.
  const double bytes = 2.0 * ((double)c.layer_matmul_params() + 2.0 * (double)c.output_params());
  const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  if (ram > 0 && bytes > ram) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs about ", (int64_t)(bytes / (1 << 30)), " GiB of weights; this machine has ",
        (int64_t)(ram / (1 << 30)), " GiB"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& f) {
  ModelConfig c;
  PDQ_ASSIGN_OR_RETURN(c.arch, f.GetString("general.architecture"));
  if (c.arch != "llama" && c.arch != "qwen2") {
    return absl::UnimplementedError(absl::StrCat(
        "architecture '", c.arch, "' is not supported (pdq runs llama and qwen2)"));
  }
  c.name = f.GetString("general.name").value_or(c.arch);
  const std::string a = c.arch + ".";
  PDQ_ASSIGN_OR_RETURN(c.num_layers, RequireInt(f, a + "block_count", 1, 1024));
  PDQ_ASSIGN_OR_RETURN(c.d_model, RequireInt(f, a + "embedding_length", 1, 1 << 16));
  PDQ_ASSIGN_OR_RETURN(c.ffn_dim, RequireInt(f, a + "feed_forward_length", 1, 1 << 18));
  PDQ_ASSIGN_OR_RETURN(c.num_heads, RequireInt(f, a + "attention.head_count", 1, 1024));
  c.num_kv_heads = c.num_heads;
  if (f.Has(a + "attention.head_count_kv")) {
    PDQ_ASSIGN_OR_RETURN(c.num_kv_heads,
                         RequireInt(f, a + "attention.head_count_kv", 1, c.num_heads));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError("head_count is not a multiple of head_count_kv");
  }
  c.head_dim = c.d_model / c.num_heads;
  if (f.Has(a + "attention.key_length")) {
    PDQ_ASSIGN_OR_RETURN(c.head_dim, RequireInt(f, a + "attention.key_length", 2, 1024));
  }
  if (c.head_dim < 2 || c.head_dim > 1024 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head dimension ", c.head_dim, " must be even and in [2, 1024]"));
  }
  if (f.Has(a + "rope.dimension_count")) {
    PDQ_ASSIGN_OR_RETURN(int64_t rot, f.GetInt(a + "rope.dimension_count"));
    if (rot != c.head_dim) {
      return absl::UnimplementedError(absl::StrCat(
          "partial rotary embedding (", rot, " of ", c.head_dim, " dims) is not supported"));
    }
  }
  c.max_context = 4096;
  if (f.Has(a + "context_length")) {
    PDQ_ASSIGN_OR_RETURN(c.max_context, RequireInt(f, a + "context_length", 1, 1 << 24));
  }
  PDQ_ASSIGN_OR_RETURN(const double base, OptionalFloat(f, a + "rope.freq_base", 10000.0));
  PDQ_ASSIGN_OR_RETURN(const double eps,
                       OptionalFloat(f, a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(base > 1.0) || !std::isfinite(base)) {
    return absl::InvalidArgumentError(absl::StrCat("rope.freq_base ", base, " must be > 1"));
  }
  if (!(eps >= 0.0) || !(eps < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("RMSNorm epsilon ", eps, " is out of range"));
  }
  c.rope_base = (float)base;
  c.norm_eps = (float)eps;
  const std::string scaling = f.GetString(a + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_linear_scale = (float)f.GetFloat(a + "rope.scaling.factor").value_or(1.0);
    if (!(c.rope_linear_scale > 0)) return absl::InvalidArgumentError("bad rope.scaling.factor");
  } else if (scaling != "none") {
    return absl::UnimplementedError(absl::StrCat("rope scaling '", scaling, "' is not supported"));
  }
  c.rope_style = c.arch == "qwen2" ? RopeStyle::kHalfSplit : RopeStyle::kInterleaved;
  c.qkv_bias = c.arch == "qwen2";
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  return c;
}

}  // namespace

// Builds a Model from a GGUF file or a synthetic spec.
class ModelLoader {
 public:
  // With skip_weights the linear layers are allocated but left empty, for
  // an artifact to fill.
  static absl::StatusOr<std::unique_ptr<Model>> FromGguf(const std::string& path,
                                                         const LoadOptions& options,
                                                         bool skip_weights);
  static absl::StatusOr<std::unique_ptr<Model>> FromSynthetic(const std::string& name,
                                                              const LoadOptions& options,
                                                              bool skip_weights);

 private:
  static std::unique_ptr<Model> NewModel(const LoadOptions& options);
  static void Finish(Model& m);
  static absl::Status AllocateLayers(Model& m, const LoadOptions& options);
  static WritableLinear* Linear(const std::unique_ptr<LinearWeights>& l) {
    return static_cast<WritableLinear*>(l.get());
  }
  // Finalizes the named linear layers with their calibration statistics.
  static absl::Status FinalizeLinears(const LoadOptions& options,
                                      const std::vector<std::pair<std::string, LinearWeights*>>& named) {
    for (const auto& [name, linear] : named) {
      const LayerStats* stats = nullptr;
      if (options.activation_stats != nullptr) {
        auto it = options.activation_stats->find(name);
        if (it != options.activation_stats->end()) stats = &it->second;
      }
      absl::Status s = static_cast<WritableLinear*>(linear)->Finalize(stats);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
    }
    return absl::OkStatus();
  }
};

Model::Model() = default;

struct Model::Workspace {
  std::vector<float> x, h, qkv, attn, gate_up, act, tmp, rows, scratch;
  std::vector<int32_t> positions;
};

Model::~Model() = default;

std::unique_ptr<Model> ModelLoader::NewModel(const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->precision_ = options.precision;
  m->pool_ = std::make_unique<ThreadPool>(options.threads);
  m->ctx_ = CpuContext{m->pool_.get()};
  m->ws_ = std::make_unique<Model::Workspace>();
  return m;
}

absl::Status ModelLoader::AllocateLayers(Model& m, const LoadOptions& options) {
  if (options.precision == Precision::kW4A16 && options.w4_group != 32 &&
      options.w4_group != 64 && options.w4_group != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("W4A16 group size must be 32, 64 or 128, got ", options.w4_group));
  }
  const ModelConfig& c = m.config_;
  auto make = [&](const std::string& name, int64_t out, int64_t in) {
    LinearOptions lo{options.precision, options.w4_group, options.w4_symmetric,
                     options.precision == Precision::kW8A8 ? options.smooth_alpha : 0.0f,
                     options.w4_method};
    for (const std::string& pattern : options.fp16_layers) {
      if (MatchesLayerPattern(pattern, name)) lo.precision = Precision::kFp16;
    }
    return MakeLinear(lo, out, in);
  };
  m.layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    Model::Layer& l = m.layers_[i];
    const std::string p = absl::StrCat("blk.", i, ".");
    l.qkv = make(p + "qkv", c.q_dim() + 2 * c.kv_dim(), c.d_model);
    l.out = make(p + "out", c.d_model, c.q_dim());
    l.gate_up = make(p + "gate_up", 2 * c.ffn_dim, c.d_model);
    l.down = make(p + "down", c.d_model, c.ffn_dim);
  }
  m.output_ = make("output", c.vocab_size, c.d_model);
  m.embedding_.assign((size_t)c.vocab_size * c.d_model, 0);
  return absl::OkStatus();
}

void ModelLoader::Finish(Model& m) {
  const ModelConfig& c = m.config_;
  m.inv_freq_.resize(c.head_dim / 2);
  for (int i = 0; i < c.head_dim / 2; ++i) {
    m.inv_freq_[i] = (float)(std::pow((double)c.rope_base, -2.0 * i / c.head_dim) /
                             c.rope_linear_scale);
  }
}

absl::StatusOr<std::unique_ptr<Model>> ModelLoader::FromGguf(const std::string& path,
                                                             const LoadOptions& options,
                                                             bool skip_weights) {
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  std::unique_ptr<Model> m = NewModel(options);
  PDQ_ASSIGN_OR_RETURN(m->config_, ConfigFromGguf(*file));
  PDQ_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(*file));
  ModelConfig& c = m->config_;
  c.vocab_size = m->tokenizer_->vocab_size();
  if (absl::Status s = CheckTensors(*file, c); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("'", path, "': ", s.message()));
  }
  PDQ_RETURN_IF_ERROR(AllocateLayers(*m, options));
  const int64_t d = c.d_model;

  auto embd = ReadTensor(*file, "token_embd.weight", {d, c.vocab_size});
  if (!embd.ok()) return embd.status();
  for (size_t i = 0; i < embd->size(); ++i) m->embedding_[i] = Fp32ToFp16((*embd)[i]);
  if (skip_weights) {
    // The artifact supplies the output projection.
  } else if (c.tied_output) {
    Linear(m->output_)->SetRows(0, c.vocab_size, embd->data());
  } else {
    PDQ_ASSIGN_OR_RETURN(auto out, ReadTensor(*file, "output.weight", {d, c.vocab_size}));
    Linear(m->output_)->SetRows(0, c.vocab_size, out.data());
  }
  embd->clear();
  PDQ_ASSIGN_OR_RETURN(m->output_norm_, ReadTensor(*file, "output_norm.weight", {d}));

  if (const GgufTensor* rf = file->FindTensor("rope_freqs.weight"); rf != nullptr) {
    return absl::UnimplementedError("per-dimension rope frequency factors are not supported yet");
  }

  // Layers dequantize in parallel; each thread owns whole layers.
  std::vector<absl::Status> status(c.num_layers);
  m->pool_->ParallelFor(c.num_layers, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      status[i] = [&]() -> absl::Status {
        Model::Layer& l = m->layers_[i];
        const std::string p = absl::StrCat("blk.", i, ".");
        PDQ_ASSIGN_OR_RETURN(l.attn_norm, ReadTensor(*file, p + "attn_norm.weight", {d}));
        PDQ_ASSIGN_OR_RETURN(l.ffn_norm, ReadTensor(*file, p + "ffn_norm.weight", {d}));
        struct Part {
          const char* name;
          LinearWeights* dst;
          int64_t row0, rows, in;
        };
        const Part parts[] = {
            {"attn_q", l.qkv.get(), 0, c.q_dim(), d},
            {"attn_k", l.qkv.get(), c.q_dim(), c.kv_dim(), d},
            {"attn_v", l.qkv.get(), c.q_dim() + c.kv_dim(), c.kv_dim(), d},
            {"attn_output", l.out.get(), 0, d, c.q_dim()},
            {"ffn_gate", l.gate_up.get(), 0, c.ffn_dim, d},
            {"ffn_up", l.gate_up.get(), c.ffn_dim, c.ffn_dim, d},
            {"ffn_down", l.down.get(), 0, d, c.ffn_dim},
        };
        for (const Part& part : parts) {
          if (!skip_weights) {
            PDQ_ASSIGN_OR_RETURN(auto w, ReadTensor(*file, p + part.name + ".weight",
                                                    {part.in, part.rows}));
            static_cast<WritableLinear*>(part.dst)->SetRows(part.row0, part.rows, w.data());
          }
          if (c.qkv_bias && part.dst == l.qkv.get()) {
            PDQ_ASSIGN_OR_RETURN(auto b, ReadTensor(*file, p + part.name + ".bias", {part.rows}));
            static_cast<WritableLinear*>(part.dst)->SetBias(part.row0, b);
          }
        }
        if (skip_weights) return absl::OkStatus();
        return FinalizeLinears(options, {{p + "qkv", l.qkv.get()}, {p + "out", l.out.get()},
                                         {p + "gate_up", l.gate_up.get()},
                                         {p + "down", l.down.get()}});
      }();
    }
  });
  for (const absl::Status& s : status) {
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("'", path, "': ", s.message()));
  }
  if (!skip_weights) PDQ_RETURN_IF_ERROR(FinalizeLinears(options, {{"output", m->output_.get()}}));
  Finish(*m);
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> ModelLoader::FromSynthetic(const std::string& name,
                                                                  const LoadOptions& options,
                                                                  bool skip_weights) {
  PDQ_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(name));
  std::unique_ptr<Model> m = NewModel(options);
  m->config_ = config;
  PDQ_ASSIGN_OR_RETURN(m->tokenizer_, SyntheticTokenizer(config.vocab_size));
  PDQ_RETURN_IF_ERROR(AllocateLayers(*m, options));
  const ModelConfig& c = m->config_;
  const int64_t d = c.d_model;
  {
    // Small enough that logits have a realistic spread (not one-hot), so KL
    // and top-1 comparisons between precisions mean something.
    std::vector<float> embd = SyntheticTensor("token_embd", (int64_t)c.vocab_size * d, 0.25f);
    for (size_t i = 0; i < embd.size(); ++i) m->embedding_[i] = Fp32ToFp16(embd[i]);
    if (!skip_weights) Linear(m->output_)->SetRows(0, c.vocab_size, embd.data());
  }
  m->output_norm_.assign(d, 1.0f);
  m->pool_->ParallelFor(c.num_layers, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      Model::Layer& l = m->layers_[i];
      l.attn_norm.assign(d, 1.0f);
      l.ffn_norm.assign(d, 1.0f);
      int part = 0;
      for (LinearWeights* w : {l.qkv.get(), l.out.get(), l.gate_up.get(), l.down.get()}) {
        if (skip_weights) break;
        const auto values = SyntheticTensor(absl::StrCat("blk.", i, ".", part++),
                                            w->out_features() * w->in_features(),
                                            1.0f / std::sqrt((float)w->in_features()));
        static_cast<WritableLinear*>(w)->SetRows(0, w->out_features(), values.data());
      }
      if (c.qkv_bias) {
        static_cast<WritableLinear*>(l.qkv.get())
            ->SetBias(0, SyntheticTensor(absl::StrCat("blk.", i, ".bias"),
                                         l.qkv->out_features(), 0.1f));
      }
    }
  });
  if (!skip_weights) {
    PDQ_RETURN_IF_ERROR(FinalizeLinears(options, m->NamedLinears()));
  }
  Finish(*m);
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& spec,
                                                   const LoadOptions& options) {
  if (options.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  LoadOptions effective = options;
  std::optional<Artifact> artifact;
  if (!options.quantized_weights.empty()) {
    PDQ_ASSIGN_OR_RETURN(artifact, ReadArtifact(options.quantized_weights));
    PDQ_ASSIGN_OR_RETURN(const std::string fingerprint, SourceFingerprint(spec));
    if (fingerprint != artifact->header.source_fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", options.quantized_weights, "' was made from another model ('",
          artifact->header.source_name, "', fingerprint ", artifact->header.source_fingerprint,
          "); '", spec, "' has fingerprint ", fingerprint));
    }
    PDQ_ASSIGN_OR_RETURN(effective.precision, ParsePrecision(artifact->header.scheme));
    if (effective.precision == Precision::kW4A16) effective.w4_group = artifact->header.group_size;
    effective.w4_symmetric = artifact->header.symmetric;
    effective.fp16_layers = artifact->header.fp16_layers;
    effective.smooth_alpha = artifact->header.smooth_alpha;
    PDQ_ASSIGN_OR_RETURN(effective.w4_method, ParseW4Method(artifact->header.w4_method));
  }
  const bool skip = artifact.has_value();
  absl::StatusOr<std::unique_ptr<Model>> model =
      absl::StartsWith(spec, "synthetic:")
          ? ModelLoader::FromSynthetic(spec.substr(10), effective, skip)
          : ModelLoader::FromGguf(spec, effective, skip);
  if (!model.ok()) return model.status();
  (*model)->options_ = effective;
  (*model)->source_spec_ = spec;
  if (!artifact) return model;

  // Fill every linear layer from the artifact, checking names and shapes.
  const auto named = (*model)->NamedLinears();
  if (artifact->header.tensors.size() != named.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", options.quantized_weights, "' has ", artifact->header.tensors.size(),
        " tensors; the model has ", named.size(), " linear layers"));
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const ArtifactTensor& t = artifact->header.tensors[i];
    auto* linear = static_cast<WritableLinear*>(named[i].second);
    if (t.name != named[i].first || t.out != linear->out_features() ||
        t.in != linear->in_features()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact tensor ", i, " is '", t.name, "' [", t.out, " x ", t.in, "], expected '",
          named[i].first, "' [", linear->out_features(), " x ", linear->in_features(), "]"));
    }
    absl::Status s =
        linear->DeserializeWeights(artifact->payload().substr(t.offset, t.bytes));
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("artifact tensor '", t.name, "': ", s.message()));
    }
  }
  return model;
}

std::vector<std::pair<std::string, LinearWeights*>> Model::NamedLinears() const {
  std::vector<std::pair<std::string, LinearWeights*>> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const std::string p = absl::StrCat("blk.", i, ".");
    out.emplace_back(p + "qkv", l.qkv.get());
    out.emplace_back(p + "out", l.out.get());
    out.emplace_back(p + "gate_up", l.gate_up.get());
    out.emplace_back(p + "down", l.down.get());
  }
  out.emplace_back("output", output_.get());
  return out;
}

absl::Status Model::SaveQuantized(const std::string& path) const {
  if (precision_ == Precision::kFp16) {
    return absl::FailedPreconditionError("FP16 weights are the reference; nothing to save");
  }
  ArtifactHeader h;
  h.scheme = PrecisionName(precision_);
  h.group_size = precision_ == Precision::kW4A16 ? options_.w4_group : 0;
  h.symmetric = options_.w4_symmetric;
  h.fp16_layers = options_.fp16_layers;
  h.smooth_alpha = precision_ == Precision::kW8A8 ? options_.smooth_alpha : 0.0f;
  h.w4_method = W4MethodName(precision_ == Precision::kW4A16 ? options_.w4_method : W4Method::kRtn);
  h.source_name = source_spec_.substr(source_spec_.find_last_of('/') + 1);
  PDQ_ASSIGN_OR_RETURN(h.source_fingerprint, SourceFingerprint(source_spec_));
  std::vector<std::string> payloads;
  for (const auto& [name, linear] : NamedLinears()) {
    h.tensors.push_back({name, linear->out_features(), linear->in_features(), 0, 0});
    payloads.push_back(static_cast<const WritableLinear*>(linear)->SerializeWeights());
  }
  return WriteArtifact(path, std::move(h), payloads);
}

int64_t Model::weight_bytes_per_token() const {
  int64_t bytes = output_->weight_bytes();
  for (const Layer& l : layers_) {
    bytes += l.qkv->weight_bytes() + l.out->weight_bytes() + l.gate_up->weight_bytes() +
             l.down->weight_bytes();
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<KvCache>> Model::NewKvCache(int64_t tokens) const {
  if (tokens <= 0) return absl::InvalidArgumentError("KV cache must hold at least one token");
  KvCacheConfig kc;
  kc.num_layers = config_.num_layers;
  kc.kv_heads = config_.num_kv_heads;
  kc.head_dim = config_.head_dim;
  kc.num_blocks = (tokens + kc.block_tokens - 1) / kc.block_tokens;
  return KvCache::Create(kc);
}

absl::Status Model::Forward(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits) {
  const ModelConfig& c = config_;
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  if (kv.config().num_layers != c.num_layers || kv.config().kv_heads != c.num_kv_heads ||
      kv.config().head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV cache shape does not match the model");
  }
  // Validate everything before touching the cache.
  int64_t total = 0, logit_rows = 0, blocks_needed = 0, max_pos = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& b = batch[e];
    if (!kv.HasSequence(b.seq)) return absl::NotFoundError(absl::StrCat("no sequence ", b.seq));
    for (size_t f = 0; f < e; ++f) {
      if (batch[f].seq == b.seq) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b.seq, " appears twice"));
      }
    }
    if (b.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b.seq, " has no new tokens"));
    }
    if (b.num_logits < 0 || b.num_logits > (int64_t)b.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("num_logits ", b.num_logits,
                                                     " outside [0, ", b.tokens.size(), "]"));
    }
    for (int32_t t : b.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " outside vocabulary [0, ", c.vocab_size, ")"));
      }
    }
    const int64_t len = kv.Length(b.seq) + (int64_t)b.tokens.size();
    if (len > c.max_context) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", len,
                                                " tokens exceeds the model's context of ",
                                                c.max_context));
    }
    blocks_needed += std::max<int64_t>(
        0, (len + kv.config().block_tokens - 1) / kv.config().block_tokens -
               (int64_t)kv.BlockTable(b.seq).size());
    max_pos = std::max(max_pos, len);
    total += (int64_t)b.tokens.size();
    logit_rows += b.num_logits;
  }
  if (blocks_needed > kv.num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: batch needs ", blocks_needed, " more blocks, ", kv.num_free_blocks(),
        " free"));
  }
  for (const BatchEntry& b : batch) {
    PDQ_RETURN_IF_ERROR(kv.Reserve(b.seq, kv.Length(b.seq) + (int64_t)b.tokens.size()));
  }

  const int64_t d = c.d_model, qkvd = c.q_dim() + 2 * c.kv_dim(), f = c.ffn_dim;
  Workspace& w = *ws_;
  auto fit = [](std::vector<float>& v, int64_t n) {
    if ((int64_t)v.size() < n) v.resize(n);
  };
  fit(w.x, total * d);
  fit(w.h, total * d);
  fit(w.tmp, total * d);
  fit(w.qkv, total * qkvd);
  fit(w.attn, total * c.q_dim());
  fit(w.gate_up, total * 2 * f);
  fit(w.act, total * f);
  fit(w.rows, logit_rows * d);
  fit(w.scratch, AttentionScratchFloats(ctx_, max_pos, c.num_heads, c.head_dim));
  w.positions.resize(total);

  // Embedding and positions.
  std::vector<int64_t> offset(batch.size());
  int64_t row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    offset[e] = row;
    const int64_t start = kv.Length(batch[e].seq);
    for (size_t i = 0; i < batch[e].tokens.size(); ++i, ++row) {
      const fp16_t* src = embedding_.data() + (int64_t)batch[e].tokens[i] * d;
      for (int64_t j = 0; j < d; ++j) w.x[row * d + j] = Fp16ToFp32(src[j]);
      w.positions[row] = (int32_t)(start + (int64_t)i);
    }
  }

  const float scale = 1.0f / std::sqrt((float)c.head_dim);
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& L = layers_[li];
    const KvLayerView kvl = kv.Layer(li);
    RmsNorm(ctx_, w.x.data(), L.attn_norm.data(), total, d, c.norm_eps, w.h.data());
    if (observer_) observer_(absl::StrCat("blk.", li, ".qkv"), w.h.data(), total, d);
    L.qkv->Forward(ctx_, w.h.data(), total, d, w.qkv.data(), qkvd);
    Rope(ctx_, w.qkv.data(), total, qkvd, c.num_heads, c.head_dim, w.positions.data(),
         inv_freq_.data(), c.rope_style);
    Rope(ctx_, w.qkv.data() + c.q_dim(), total, qkvd, c.num_kv_heads, c.head_dim,
         w.positions.data(), inv_freq_.data(), c.rope_style);
    for (size_t e = 0; e < batch.size(); ++e) {
      const int64_t n = (int64_t)batch[e].tokens.size();
      const float* qkv = w.qkv.data() + offset[e] * qkvd;
      const int32_t* table = kv.BlockTable(batch[e].seq).data();
      KvWrite(kvl, table, w.positions.data() + offset[e], n, qkv + c.q_dim(), qkvd,
              qkv + c.q_dim() + c.kv_dim(), qkvd);
      Attention(ctx_, kvl, table, kv.Length(batch[e].seq), n, qkv, qkvd, c.num_heads, scale,
                w.attn.data() + offset[e] * c.q_dim(), c.q_dim(), w.scratch.data());
    }
    if (observer_) observer_(absl::StrCat("blk.", li, ".out"), w.attn.data(), total, c.q_dim());
    L.out->Forward(ctx_, w.attn.data(), total, c.q_dim(), w.tmp.data(), d);
    for (int64_t i = 0; i < total * d; ++i) w.x[i] += w.tmp[i];
    RmsNorm(ctx_, w.x.data(), L.ffn_norm.data(), total, d, c.norm_eps, w.h.data());
    if (observer_) observer_(absl::StrCat("blk.", li, ".gate_up"), w.h.data(), total, d);
    L.gate_up->Forward(ctx_, w.h.data(), total, d, w.gate_up.data(), 2 * f);
    SiluMul(ctx_, w.gate_up.data(), total, f, w.act.data());
    if (observer_) observer_(absl::StrCat("blk.", li, ".down"), w.act.data(), total, f);
    L.down->Forward(ctx_, w.act.data(), total, f, w.tmp.data(), d);
    for (int64_t i = 0; i < total * d; ++i) w.x[i] += w.tmp[i];
  }

  // Final norm and output projection for the rows that need logits only.
  logits->vocab_size = c.vocab_size;
  logits->first_row.assign(batch.size(), 0);
  logits->num_rows.assign(batch.size(), 0);
  int64_t out_row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t n = (int64_t)batch[e].tokens.size();
    const int64_t first = n - batch[e].num_logits;
    logits->first_row[e] = out_row;
    logits->num_rows[e] = n - first;
    RmsNorm(ctx_, w.x.data() + (offset[e] + first) * d, output_norm_.data(), n - first, d,
            c.norm_eps, w.rows.data() + out_row * d);
    out_row += n - first;
  }
  logits->data.resize(logit_rows * c.vocab_size);
  if (observer_ && logit_rows > 0) observer_("output", w.rows.data(), logit_rows, d);
  if (logit_rows > 0) output_->Forward(ctx_, w.rows.data(), logit_rows, d, logits->data.data(), c.vocab_size);

  for (const BatchEntry& b : batch) kv.SetLength(b.seq, kv.Length(b.seq) + (int64_t)b.tokens.size());
  return absl::OkStatus();
}

}  // namespace pdq
