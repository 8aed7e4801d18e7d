// Model loading: GGUF or synthetic weights, rounded to the FP16 reference and
// packed at the requested precision (or read from a quantized artifact).
#include "engine/model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/hash.h"
#include "engine/linear.h"
#include "engine/synthetic.h"
#include "gguf/gguf.h"
#include "gguf/gguf_dequant.h"
#include "kernels/cpu/thread_pool.h"
#include "quant/artifact.h"

namespace pdq {

namespace {

// The GGUF tensor `name`, checked to have shape `want_dims` ([in, out]).
absl::StatusOr<const GgufTensor*> CheckedTensor(const GgufFile& file, const std::string& name,
                                                const std::vector<int64_t>& want_dims) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  if (t->dims != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has shape [", absl::StrJoin(t->dims, ", "), "], expected [",
        absl::StrJoin(want_dims, ", "), "]"));
  }
  return t;
}

// Rows [first, first + rows) of `t` as fp32 into `out`.
absl::Status DequantizeRows(const GgufTensor& t, int64_t first, int64_t rows, float* out) {
  PDQ_ASSIGN_OR_RETURN(const uint64_t row_bytes, GgmlRowBytes(t.type, t.row_length()));
  for (int64_t r = 0; r < rows; ++r) {
    PDQ_RETURN_IF_ERROR(DequantizeRow(t.type, t.data + (first + r) * row_bytes,
                                      out + r * t.row_length(), t.row_length()));
  }
  return absl::OkStatus();
}

// Reads a GGUF tensor as fp32 rows, checking its shape [in, out].
absl::StatusOr<std::vector<float>> ReadTensor(const GgufFile& file, const std::string& name,
                                              std::vector<int64_t> want_dims) {
  PDQ_ASSIGN_OR_RETURN(const GgufTensor* t, CheckedTensor(file, name, want_dims));
  std::vector<float> out(t->num_elements());
  PDQ_RETURN_IF_ERROR(DequantizeRows(*t, 0, t->num_rows(), out.data()));
  file.DropPages(*t);
  return out;
}

// Reads a GGUF tensor of shape [in, out] as fp32 rows `panel` rows at a
// time, handing each panel to fn(first row, rows, data): no whole-tensor
// copy (the embedding's is 108 MiB of fp32 for a 135M model).
absl::Status ForEachPanel(const GgufFile& file, const std::string& name,
                          std::vector<int64_t> want_dims, int64_t panel,
                          const std::function<void(int64_t, int64_t, const float*)>& fn) {
  PDQ_ASSIGN_OR_RETURN(const GgufTensor* t, CheckedTensor(file, name, want_dims));
  std::vector<float> buf(panel * t->row_length());
  for (int64_t r0 = 0; r0 < t->num_rows(); r0 += panel) {
    const int64_t rows = std::min(panel, t->num_rows() - r0);
    PDQ_RETURN_IF_ERROR(DequantizeRows(*t, r0, rows, buf.data()));
    fn(r0, rows, buf.data());
  }
  file.DropPages(*t);
  return absl::OkStatus();
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

// Whether layer tensors come as one attn_qkv (Phi-3 files have it; a phi3
// file with attn_q/k/v is read as such, as llama.cpp does).
bool FusedQkv(const GgufFile& f, const Architecture& a) {
  return a.fused_qkv && f.FindTensor("blk.0.attn_qkv.weight") != nullptr;
}

// Checks that every tensor the model needs is present with the right shape,
// before any weight memory is allocated.
absl::Status CheckTensors(const GgufFile& f, const ModelConfig& c, const Architecture& a,
                          bool fused_qkv) {
  const int64_t d = c.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"token_embd.weight", {d, c.vocab_size}}, {"output_norm.weight", {d}}};
  if (!c.tied_output) want.push_back({"output.weight", {d, c.vocab_size}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    want.push_back({p + "attn_norm.weight", {d}});
    want.push_back({p + "ffn_norm.weight", {d}});
    if (fused_qkv) {
      want.push_back({p + "attn_qkv.weight", {d, c.q_dim() + 2 * c.kv_dim()}});
    } else {
      want.push_back({p + "attn_q.weight", {d, c.q_dim()}});
      want.push_back({p + "attn_k.weight", {d, c.kv_dim()}});
      want.push_back({p + "attn_v.weight", {d, c.kv_dim()}});
    }
    want.push_back({p + "attn_output.weight", {c.q_dim(), d}});
    if (a.fused_gate_up) {
      want.push_back({p + "ffn_up.weight", {d, 2 * c.ffn_dim}});
    } else {
      want.push_back({p + "ffn_gate.weight", {d, c.ffn_dim}});
      want.push_back({p + "ffn_up.weight", {d, c.ffn_dim}});
    }
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
  const Architecture* arch = FindArchitecture(c.arch);
  if (arch == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "architecture '", c.arch, "' is not supported (pdq runs ", SupportedArchitectures(), ")"));
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
  // A sliding attention window (Phi-3's key) pdq does not apply: contexts
  // are capped at the window, where attending to everything is the same.
  if (f.Has(a + "attention.sliding_window")) {
    PDQ_ASSIGN_OR_RETURN(int64_t window, f.GetInt(a + "attention.sliding_window"));
    if (window > 0 && window < c.max_context) c.max_context = (int)window;
  }
  c.ApplyArchitecture(*arch);
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
                                                         bool skip_weights, ThreadPool& pool);
  static absl::StatusOr<std::unique_ptr<Model>> FromSynthetic(const std::string& name,
                                                              const LoadOptions& options,
                                                              bool skip_weights,
                                                              ThreadPool& pool);
  // Configuration and tokenizer only (Model::LoadShape).
  static absl::StatusOr<std::unique_ptr<Model>> Shape(const std::string& spec,
                                                      const LoadOptions& options);

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

Model::~Model() = default;

std::unique_ptr<Model> ModelLoader::NewModel(const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->precision_ = options.precision;
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
                     options.w4_method, options.w4_a8_min_rows, false,
                     options.bf16_min_rows};
    for (const std::string& pattern : options.w8_layers) {
      if (MatchesLayerPattern(pattern, name)) lo.w8a16 = true;
    }
    for (const std::string& pattern : options.fp16_layers) {
      if (MatchesLayerPattern(pattern, name)) {
        lo.precision = Precision::kFp16;
        lo.w8a16 = false;
      }
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
                                                             bool skip_weights, ThreadPool& pool) {
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  std::unique_ptr<Model> m = NewModel(options);
  PDQ_ASSIGN_OR_RETURN(m->config_, ConfigFromGguf(*file));
  PDQ_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(*file));
  ModelConfig& c = m->config_;
  c.vocab_size = m->tokenizer_->vocab_size();
  const Architecture& arch = *FindArchitecture(c.arch);
  const bool fused_qkv = FusedQkv(*file, arch);
  if (absl::Status s = CheckTensors(*file, c, arch, fused_qkv); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("'", path, "': ", s.message()));
  }
  PDQ_RETURN_IF_ERROR(AllocateLayers(*m, options));
  const int64_t d = c.d_model;

  // The embedding and output projection a panel of rows at a time (the
  // artifact supplies the projection when skip_weights).
  constexpr int64_t kPanel = 256;
  PDQ_RETURN_IF_ERROR(ForEachPanel(
      *file, "token_embd.weight", {d, c.vocab_size}, kPanel,
      [&](int64_t row0, int64_t rows, const float* x) {
        fp16_t* dst = m->embedding_.data() + row0 * d;
        for (int64_t i = 0; i < rows * d; ++i) dst[i] = Fp32ToFp16(x[i]);
        if (!skip_weights && c.tied_output) Linear(m->output_)->SetRows(row0, rows, x);
      }));
  if (!skip_weights && !c.tied_output) {
    PDQ_RETURN_IF_ERROR(ForEachPanel(
        *file, "output.weight", {d, c.vocab_size}, kPanel,
        [&](int64_t row0, int64_t rows, const float* x) {
          Linear(m->output_)->SetRows(row0, rows, x);
        }));
  }
  PDQ_ASSIGN_OR_RETURN(m->output_norm_, ReadTensor(*file, "output_norm.weight", {d}));

  if (const GgufTensor* rf = file->FindTensor("rope_freqs.weight"); rf != nullptr) {
    return absl::UnimplementedError("per-dimension rope frequency factors are not supported yet");
  }
  if (file->FindTensor("rope_factors_long.weight") != nullptr ||
      file->FindTensor("rope_factors_short.weight") != nullptr) {
    return absl::UnimplementedError(
        "LongRoPE (rope_factors_long/short, Phi-3's 128k-context variants) is not supported");
  }

  // Layers dequantize in parallel; each thread owns whole layers.
  std::vector<absl::Status> status(c.num_layers);
  pool.ParallelFor(c.num_layers, 1, [&](int64_t begin, int64_t end, int) {
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
        // Our qkv holds the q, k, v rows and gate_up the gate, then the up
        // rows: a fused tensor (Phi-3) is already laid out that way.
        std::vector<Part> parts;
        if (fused_qkv) {
          parts.push_back({"attn_qkv", l.qkv.get(), 0, c.q_dim() + 2 * c.kv_dim(), d});
        } else {
          parts.push_back({"attn_q", l.qkv.get(), 0, c.q_dim(), d});
          parts.push_back({"attn_k", l.qkv.get(), c.q_dim(), c.kv_dim(), d});
          parts.push_back({"attn_v", l.qkv.get(), c.q_dim() + c.kv_dim(), c.kv_dim(), d});
        }
        parts.push_back({"attn_output", l.out.get(), 0, d, c.q_dim()});
        if (arch.fused_gate_up) {
          parts.push_back({"ffn_up", l.gate_up.get(), 0, 2 * c.ffn_dim, d});
        } else {
          parts.push_back({"ffn_gate", l.gate_up.get(), 0, c.ffn_dim, d});
          parts.push_back({"ffn_up", l.gate_up.get(), c.ffn_dim, c.ffn_dim, d});
        }
        parts.push_back({"ffn_down", l.down.get(), 0, d, c.ffn_dim});
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
                                                                  bool skip_weights,
                                                                  ThreadPool& pool) {
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
  pool.ParallelFor(c.num_layers, 1, [&](int64_t begin, int64_t end, int) {
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

absl::StatusOr<std::unique_ptr<Model>> ModelLoader::Shape(const std::string& spec,
                                                          const LoadOptions& options) {
  std::unique_ptr<Model> m = NewModel(options);
  if (absl::StartsWith(spec, "synthetic:")) {
    PDQ_ASSIGN_OR_RETURN(m->config_, SyntheticConfig(spec.substr(10)));
    PDQ_ASSIGN_OR_RETURN(m->tokenizer_, SyntheticTokenizer(m->config_.vocab_size));
  } else {
    PDQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(spec));
    PDQ_ASSIGN_OR_RETURN(m->config_, ConfigFromGguf(*file));
    PDQ_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(*file));
    m->config_.vocab_size = m->tokenizer_->vocab_size();
  }
  Finish(*m);
  m->options_ = options;
  m->source_spec_ = spec;
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::LoadShape(const std::string& spec,
                                                        Precision precision, KvDtype kv_dtype) {
  LoadOptions options;
  options.precision = precision;
  options.kv_dtype = kv_dtype;
  return ModelLoader::Shape(spec, options);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& spec,
                                                   const LoadOptions& options) {
  ThreadPool pool;
  return Load(spec, options, CpuContext{&pool});
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& spec,
                                                   const LoadOptions& options,
                                                   const CpuContext& ctx) {
  if (ctx.pool == nullptr) return absl::InvalidArgumentError("Model::Load needs a thread pool");
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
    effective.w8_layers = artifact->header.w8_layers;
    effective.smooth_alpha = artifact->header.smooth_alpha;
    effective.calibration = artifact->header.calibration;
    PDQ_ASSIGN_OR_RETURN(effective.w4_method, ParseW4Method(artifact->header.w4_method));
  }
  const bool skip = artifact.has_value();
  absl::StatusOr<std::unique_ptr<Model>> model =
      absl::StartsWith(spec, "synthetic:")
          ? ModelLoader::FromSynthetic(spec.substr(10), effective, skip, *ctx.pool)
          : ModelLoader::FromGguf(spec, effective, skip, *ctx.pool);
  if (!model.ok()) return model.status();
  (*model)->options_ = effective;
  (*model)->options_.activation_stats = nullptr;  // the caller's; used only while loading
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
  if (!has_weights()) return absl::FailedPreconditionError("the model was loaded without weights");
  ArtifactHeader h;
  h.scheme = PrecisionName(precision_);
  h.group_size = precision_ == Precision::kW4A16 ? options_.w4_group : 0;
  h.symmetric = options_.w4_symmetric;
  h.fp16_layers = options_.fp16_layers;
  h.w8_layers = options_.w8_layers;
  h.smooth_alpha = precision_ == Precision::kW8A8 ? options_.smooth_alpha : 0.0f;
  h.calibration = options_.calibration;
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
  if (!has_weights()) return 0;
  int64_t bytes = output_->weight_bytes();
  for (const Layer& l : layers_) {
    bytes += l.qkv->weight_bytes() + l.out->weight_bytes() + l.gate_up->weight_bytes() +
             l.down->weight_bytes();
  }
  return bytes;
}

int64_t Model::resident_weight_bytes() const {
  int64_t bytes = weight_bytes_per_token() + (int64_t)(embedding_.size() * sizeof(fp16_t)) +
                  (int64_t)(output_norm_.size() * sizeof(float));
  for (const Layer& l : layers_) {
    bytes += (int64_t)((l.attn_norm.size() + l.ffn_norm.size()) * sizeof(float));
  }
  return bytes;
}

uint64_t ModelFingerprint(const ModelConfig& c, const Tokenizer& tokenizer) {
  const int64_t shape[] = {c.num_layers, c.d_model,  c.num_heads,  c.num_kv_heads,
                           c.head_dim,   c.ffn_dim,  c.vocab_size, c.qkv_bias,
                           (int64_t)c.rope_style};
  const float rope[] = {c.rope_base, c.rope_linear_scale};
  uint64_t h = Hash64(c.arch);
  h = Hash64(shape, sizeof(shape), h);
  h = Hash64(rope, sizeof(rope), h);
  const uint64_t vocab = tokenizer.fingerprint();
  return Hash64(&vocab, sizeof(vocab), h);
}

KvLayout Model::kv_layout(int block_tokens) const {
  KvLayout l;
  l.model_fingerprint = ModelFingerprint(config_, *tokenizer_);
  l.num_layers = config_.num_layers;
  l.kv_heads = config_.num_kv_heads;
  l.head_dim = config_.head_dim;
  l.rope_base = config_.rope_base;
  l.rope_linear_scale = config_.rope_linear_scale;
  l.rope_style = config_.rope_style;
  l.dtype = options_.kv_dtype;
  l.block_tokens = block_tokens;
  l.block_layout = KvBlockLayout::kHeadTokenDim;
  return l;
}

absl::StatusOr<std::unique_ptr<KvCache>> Model::NewKvCache(
    int64_t tokens, std::shared_ptr<KvAllocator> allocator) const {
  if (tokens <= 0) return absl::InvalidArgumentError("KV cache must hold at least one token");
  KvCacheConfig kc;
  kc.layout = kv_layout();
  kc.num_blocks = (tokens + kc.layout.block_tokens - 1) / kc.layout.block_tokens;
  kc.allocator = std::move(allocator);
  return KvCache::Create(kc);
}

}  // namespace pdq
