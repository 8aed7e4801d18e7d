// The batched forward pass: every valid entry's new tokens go through the
// matmuls together; attention runs per sequence over its paged KV blocks.
#include "engine/context.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq {

absl::Status Logits::FirstError() const {
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

struct Context::Workspace {
  std::vector<float> x, h, qkv, attn, gate_up, act, tmp, rows, scratch;
  std::vector<float> rope;  // every row's rotations (RopeAngles), for every layer
  std::vector<int32_t> positions;
  std::vector<AttentionSeq> attention;  // one per sequence of the step
};

Context::Context(const Model& model, const CpuContext& cpu, std::unique_ptr<ForwardBackend> backend)
    : model_(model),
      layout_(model.kv_layout()),
      cpu_(cpu),
      backend_(std::move(backend)),
      ws_(std::make_unique<Workspace>()) {
  PDQ_CHECK(cpu.pool != nullptr);
}

Context::~Context() = default;

int64_t Context::workspace_bytes() const {
  const Workspace& w = *ws_;
  size_t floats = 0;
  for (const std::vector<float>* v :
       {&w.x, &w.h, &w.qkv, &w.attn, &w.gate_up, &w.act, &w.tmp, &w.rows, &w.scratch, &w.rope}) {
    floats += v->capacity();
  }
  return (int64_t)(floats * sizeof(float) + w.positions.capacity() * sizeof(int32_t));
}

std::string Context::device() const { return backend_ ? backend_->name() : "cpu"; }

absl::StatusOr<std::unique_ptr<KvCache>> Context::NewKvCache(int64_t tokens) const {
  return model_.NewKvCache(tokens, backend_ ? backend_->kv_allocator() : nullptr);
}

absl::Status Context::ForwardAll(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits) {
  PDQ_RETURN_IF_ERROR(Forward(kv, batch, logits));
  return logits->FirstError();
}

absl::Status Context::Forward(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits) {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  KvLayout mine = layout_;
  mine.block_tokens = kv.layout().block_tokens;  // any block size reads the same
  if (absl::Status s = CheckKvCompatible(mine, kv.layout()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the KV cache is laid out for another model: ", s.message()));
  }
  // A backend without an allocator of its own works on host caches.
  if (backend_ && backend_->kv_allocator() ? kv.allocator() != backend_->kv_allocator()
                                           : !kv.host_accessible()) {
    return absl::InvalidArgumentError(absl::StrCat("the KV cache lives in ", kv.memory(),
                                                   " memory; this context runs on ", device(),
                                                   " (make caches with Context::NewKvCache)"));
  }
  if (!backend_ && !model_.has_weights()) {
    return absl::FailedPreconditionError(
        "this model was loaded without weights (Model::LoadShape); only a backend that reads "
        "none, such as an emulated worker's, runs it");
  }
  if (backend_ && observer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("activation observers (calibration) run on the CPU, not on ", device()));
  }
  ForwardPlan plan;
  if (!Plan(kv, batch, logits, &plan)) return absl::OkStatus();
  if (backend_) {
    if (absl::Status s = backend_->Run(batch, plan, kv, layer_observer_, logits); !s.ok()) {
      // No entry ran: no logits, and no length moves (the reserved blocks
      // stay with their sequences, for a retry).
      logits->data.clear();
      logits->num_rows.assign(batch.size(), 0);
      return s;
    }
  } else {
    RunOnCpu(kv, batch, plan, logits);
  }
  for (size_t e : plan.run) {
    PDQ_CHECK(kv.SetLength(batch[e].seq, plan.start[e] + (int64_t)batch[e].tokens.size()).ok());
  }
  return absl::OkStatus();
}

bool Context::Plan(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits,
                   ForwardPlan* plan) {
  const ModelConfig& c = model_.config_;
  const int64_t block_tokens = kv.layout().block_tokens;

  // Check each entry on its own; the valid ones run (decode entries first,
  // below).
  logits->status.assign(batch.size(), absl::OkStatus());
  std::vector<size_t>& run = plan->run;
  std::vector<int64_t>& start = plan->start;
  start.assign(batch.size(), 0);
  int64_t total = 0, logit_rows = 0, blocks_left = kv.num_free_blocks(), max_pos = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& b = batch[e];
    absl::Status& st = logits->status[e];
    const absl::StatusOr<int64_t> length = kv.Length(b.seq);
    if (!length.ok()) {
      st = length.status();
      continue;
    }
    for (size_t f = 0; f < e && st.ok(); ++f) {
      if (batch[f].seq == b.seq) {
        st = absl::InvalidArgumentError(absl::StrCat("sequence ", b.seq, " appears twice"));
      }
    }
    if (st.ok() && b.tokens.empty()) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", b.seq, " has no new tokens"));
    }
    if (st.ok() && (b.num_logits < 0 || b.num_logits > (int64_t)b.tokens.size())) {
      st = absl::InvalidArgumentError(
          absl::StrCat("num_logits ", b.num_logits, " outside [0, ", b.tokens.size(), "]"));
    }
    for (size_t i = 0; st.ok() && i < b.tokens.size(); ++i) {
      if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab_size) {
        st = absl::InvalidArgumentError(
            absl::StrCat("token id ", b.tokens[i], " outside vocabulary [0, ", c.vocab_size, ")"));
      }
    }
    const int64_t len = *length + (int64_t)b.tokens.size();
    if (st.ok() && len > c.max_context) {
      st = absl::OutOfRangeError(absl::StrCat(
          "sequence of ", len, " tokens exceeds the model's context of ", c.max_context));
    }
    if (!st.ok()) continue;
    const int64_t more = std::max<int64_t>(
        0, (len + block_tokens - 1) / block_tokens - *kv.Capacity(b.seq) / block_tokens);
    if (more > blocks_left) {
      st = absl::ResourceExhaustedError(absl::StrCat("KV cache full: sequence ", b.seq, " needs ",
                                                     more, " more blocks, ", blocks_left, " free"));
      continue;
    }
    blocks_left -= more;
    start[e] = *length;
    run.push_back(e);
    max_pos = std::max(max_pos, len);
    total += (int64_t)b.tokens.size();
    logit_rows += b.num_logits;
  }
  logits->vocab_size = c.vocab_size;
  logits->first_row.assign(batch.size(), 0);
  logits->num_rows.assign(batch.size(), 0);
  if (run.empty()) {
    logits->data.clear();
    return false;
  }
  for (size_t e : run) {
    PDQ_CHECK(kv.Reserve(batch[e].seq, start[e] + (int64_t)batch[e].tokens.size()).ok());
  }
  plan->total = total;
  plan->logit_rows = logit_rows;
  plan->max_pos = max_pos;
  // Decode entries first: the linear layers take decode and prompt rows in
  // separate calls where their kernels differ (LinearWeights::Forward).
  std::stable_partition(run.begin(), run.end(), [&](size_t e) { return !IsPromptEntry(batch[e]); });
  plan->offset.resize(run.size());
  plan->tables.resize(run.size());
  plan->decode_rows = plan->decode_logit_rows = 0;
  int64_t row = 0, out_row = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    const BatchEntry& b = batch[run[i]];
    if (!IsPromptEntry(b)) {
      plan->decode_rows += (int64_t)b.tokens.size();
      plan->decode_logit_rows += b.num_logits;
    }
    plan->offset[i] = row;
    plan->tables[i] = *kv.BlockTable(b.seq);
    row += (int64_t)b.tokens.size();
    logits->first_row[run[i]] = out_row;
    logits->num_rows[run[i]] = b.num_logits;
    out_row += b.num_logits;
  }
  logits->data.resize(logit_rows * c.vocab_size);
  return true;
}

// engine/cuda/cuda_backend.cc (CudaBackend::Run) does the same on a GPU,
// step for step: a change to the model here belongs there too.
void Context::RunOnCpu(KvCache& kv, std::span<const BatchEntry> batch, const ForwardPlan& plan,
                       Logits* logits) {
  const Model& m = model_;
  const ModelConfig& c = m.config_;
  const std::vector<size_t>& run = plan.run;
  const std::vector<int64_t>& start = plan.start;
  const std::vector<int64_t>& offset = plan.offset;
  const std::vector<std::span<const int32_t>>& tables = plan.tables;
  const int64_t total = plan.total, logit_rows = plan.logit_rows, max_pos = plan.max_pos;
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
  fit(w.scratch, AttentionScratchFloats(cpu_, max_pos, c.num_heads, c.head_dim));
  w.positions.resize(total);
  w.attention.resize(run.size());

  // Embedding and positions; offset[i]: first row of run[i].
  int64_t row = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    const BatchEntry& b = batch[run[i]];
    for (size_t t = 0; t < b.tokens.size(); ++t, ++row) {
      const fp16_t* src = m.embedding_.data() + (int64_t)b.tokens[t] * d;
      for (int64_t j = 0; j < d; ++j) w.x[row * d + j] = Fp16ToFp32(src[j]) * c.embedding_scale;
      w.positions[row] = (int32_t)(start[run[i]] + (int64_t)t);
    }
  }
  fit(w.rope, total * c.head_dim);
  RopeAngles(cpu_, w.positions.data(), total, m.inv_freq_.data(), c.head_dim, w.rope.data());

  // Decode rows [0, decode) and prompt rows after them through `L`: one
  // call where its kernels treat both alike, else one for each, the prompt
  // rows' with CpuContext::prompt_rows.
  CpuContext prompt_cpu = cpu_;
  prompt_cpu.prompt_rows = true;
  auto linear = [&](const LinearWeights& L, const float* x, int64_t rows, int64_t decode,
                    int64_t ldx, float* y, int64_t ldy) {
    if (decode == 0 || decode == rows || !L.prompt_path_differs()) {
      L.Forward(decode == rows ? cpu_ : prompt_cpu, x, rows, ldx, y, ldy);
      return;
    }
    L.Forward(cpu_, x, decode, ldx, y, ldy);
    L.Forward(prompt_cpu, x + decode * ldx, rows - decode, ldx, y + decode * ldy, ldy);
  };
  const int64_t decode_rows = plan.decode_rows;

  const float scale = 1.0f / std::sqrt((float)c.head_dim);
  for (int li = 0; li < c.num_layers; ++li) {
    const Model::Layer& L = m.layers_[li];
    const KvLayerView kvl = kv.Layer(li);
    RmsNorm(cpu_, w.x.data(), L.attn_norm.data(), total, d, c.norm_eps, w.h.data());
    if (observer_) observer_(absl::StrCat("blk.", li, ".qkv"), w.h.data(), total, d);
    linear(*L.qkv, w.h.data(), total, decode_rows, d, w.qkv.data(), qkvd);
    // Q's heads and K's, which follow them in each row, in one pass.
    Rope(cpu_, w.qkv.data(), total, qkvd, c.num_heads + c.num_kv_heads, c.head_dim, w.rope.data(),
         c.rope_style);
    for (size_t i = 0; i < run.size(); ++i) {
      const int64_t n = (int64_t)batch[run[i]].tokens.size();
      const float* qkv = w.qkv.data() + offset[i] * qkvd;
      KvWrite(kvl, tables[i].data(), w.positions.data() + offset[i], n, qkv + c.q_dim(), qkvd,
              qkv + c.q_dim() + c.kv_dim(), qkvd);
      w.attention[i] = {tables[i].data(),
                        start[run[i]],
                        n,
                        qkv,
                        w.attn.data() + offset[i] * c.q_dim(),
                        IsPromptEntry(batch[run[i]])};
    }
    Attention(cpu_, kvl, w.attention.data(), (int64_t)run.size(), qkvd, c.num_heads, scale,
              c.q_dim(), w.scratch.data());
    if (layer_observer_) layer_observer_(li);
    if (observer_) observer_(absl::StrCat("blk.", li, ".out"), w.attn.data(), total, c.q_dim());
    linear(*L.out, w.attn.data(), total, decode_rows, c.q_dim(), w.tmp.data(), d);
    for (int64_t i = 0; i < total * d; ++i) w.x[i] += w.tmp[i];
    RmsNorm(cpu_, w.x.data(), L.ffn_norm.data(), total, d, c.norm_eps, w.h.data());
    if (observer_) observer_(absl::StrCat("blk.", li, ".gate_up"), w.h.data(), total, d);
    linear(*L.gate_up, w.h.data(), total, decode_rows, d, w.gate_up.data(), 2 * f);
    if (c.activation == Activation::kGeluTanh) {
      GeluMul(cpu_, w.gate_up.data(), total, f, w.act.data());
    } else {
      SiluMul(cpu_, w.gate_up.data(), total, f, w.act.data());
    }
    if (observer_) observer_(absl::StrCat("blk.", li, ".down"), w.act.data(), total, f);
    linear(*L.down, w.act.data(), total, decode_rows, f, w.tmp.data(), d);
    for (int64_t i = 0; i < total * d; ++i) w.x[i] += w.tmp[i];
  }

  // Final norm and output projection for the rows that need logits only.
  for (size_t i = 0; i < run.size(); ++i) {
    const BatchEntry& b = batch[run[i]];
    const int64_t n = (int64_t)b.tokens.size();
    const int64_t first = n - b.num_logits;
    RmsNorm(cpu_, w.x.data() + (offset[i] + first) * d, m.output_norm_.data(), n - first, d,
            c.norm_eps, w.rows.data() + logits->first_row[run[i]] * d);
  }
  if (observer_ && logit_rows > 0) observer_("output", w.rows.data(), logit_rows, d);
  if (logit_rows > 0) {
    linear(*m.output_, w.rows.data(), logit_rows, plan.decode_logit_rows, d, logits->data.data(),
           c.vocab_size);
  }
}

}  // namespace pdq
