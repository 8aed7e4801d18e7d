// The forward pass of engine/context.cc on kernels/cuda (see cuda_backend.h).
#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w8a8.h"

namespace pdq {
namespace {

using cuda::DeviceBuffer;

class CudaKvAllocator final : public KvAllocator {
 public:
  explicit CudaKvAllocator(int device) : device_(device) {}
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaSetDevice(device_) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void Free(void* p) override {
    cudaSetDevice(device_);
    cudaFree(p);
  }
  std::string name() const override { return absl::StrCat("cuda:", device_); }
  bool host_accessible() const override { return false; }

 private:
  int device_;
};

// One linear layer in device memory, in the format of its CPU twin.
struct DeviceLinear {
  enum class Kind { kF16, kI8, kW4 } kind = Kind::kF16;
  int64_t n = 0, k = 0;
  int group = 0;
  DeviceBuffer w, scales, in_scale, bias;

  static absl::StatusOr<DeviceLinear> From(const LinearWeights& lin, const std::string& name) {
    const PackedLinear p = lin.Packed();
    DeviceLinear d;
    d.n = lin.out_features();
    d.k = lin.in_features();
    if (p.w4.q != nullptr) {
      d.kind = Kind::kW4;
      d.group = p.w4.group;
      std::vector<uint8_t> q(cuda::GpuW4QBytes(d.n, d.k));
      std::vector<uint32_t> sm(cuda::GpuW4ScaleMinBytes(d.n, d.k, d.group) / 4);
      if (absl::Status s = cuda::RepackW4ForGpu(p.w4, q.data(), sm.data()); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
      }
      PDQ_ASSIGN_OR_RETURN(d.w, DeviceBuffer::From(q));
      PDQ_ASSIGN_OR_RETURN(d.scales, DeviceBuffer::From(sm));
    } else if (p.i8.q != nullptr) {
      d.kind = Kind::kI8;
      std::vector<int8_t> q(cuda::GpuI8Bytes(d.n, d.k));
      cuda::RepackI8ForGpu(p.i8, q.data());
      PDQ_ASSIGN_OR_RETURN(d.w, DeviceBuffer::From(q));
      PDQ_ASSIGN_OR_RETURN(d.scales, DeviceBuffer::From(p.i8.scale, d.n));
    } else if (p.w8.q != nullptr) {
      // No W8A16 kernel on the GPU yet: the layer goes up as FP16 rows
      // (scale * q, rounded to fp16), at twice the bytes.
      d.kind = Kind::kF16;
      std::vector<float> wf(d.n * d.k);
      DequantizeW8Rows(p.w8, 0, d.n, wf.data());
      std::vector<fp16_t> rows(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) rows[i] = Fp32ToFp16(wf[i]);
      PDQ_ASSIGN_OR_RETURN(d.w, DeviceBuffer::From(rows));
    } else {
      d.kind = Kind::kF16;
      std::vector<fp16_t> rows(d.n * d.k);
      cuda::UnpackF16ForGpu(p.f16, rows.data());
      PDQ_ASSIGN_OR_RETURN(d.w, DeviceBuffer::From(rows));
    }
    if (p.in_scale != nullptr) {
      PDQ_ASSIGN_OR_RETURN(d.in_scale, DeviceBuffer::From(p.in_scale, d.k));
    }
    if (p.bias != nullptr && !p.bias->empty()) {
      PDQ_ASSIGN_OR_RETURN(d.bias, DeviceBuffer::From(p.bias->data(), d.n));
    }
    return d;
  }
};

}  // namespace

// Declared a friend by Model, to read the weights it uploads.
class CudaBackend final : public ForwardBackend {
 public:
  static absl::StatusOr<std::unique_ptr<ForwardBackend>> Create(const Model& model, int device);
  ~CudaBackend() override {
    cudaSetDevice(device_);
    blas_.reset();  // its handle is bound to the stream
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  std::shared_ptr<KvAllocator> kv_allocator() const override { return allocator_; }
  absl::Status Run(std::span<const BatchEntry> batch, const ForwardPlan& plan, KvCache& kv,
                   const std::function<void(int)>& layer_done, Logits* logits) override;

 private:
  struct Layer {
    DeviceBuffer attn_norm, ffn_norm;
    DeviceLinear qkv, out, gate_up, down;
  };
  // Device buffers that grow to the largest batch seen.
  struct Workspace {
    DeviceBuffer x, h16, qkv, attn, attn16, gate_up, act16, tmp, rows16, logits, scaled16,
        w8a8_scratch, tokens, positions, tables;
  };

  CudaBackend(const Model& model, int device) : model_(model), device_(device) {}
  absl::Status Linear(const DeviceLinear& lin, const fp16_t* x, int64_t m, float* y, int64_t ldy);
  static absl::Status Fit(DeviceBuffer& b, int64_t bytes);

  const Model& model_;
  const int device_;
  std::shared_ptr<KvAllocator> allocator_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::BlasHandles> blas_;
  DeviceBuffer embedding_, output_norm_, inv_freq_;
  DeviceLinear output_;
  std::vector<Layer> layers_;
  Workspace ws_;
};

absl::StatusOr<std::unique_ptr<ForwardBackend>> CudaBackend::Create(const Model& model,
                                                                    int device) {
  PDQ_RETURN_IF_ERROR(cuda::DevicePresent(device));
  PDQ_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  std::unique_ptr<CudaBackend> b(new CudaBackend(model, device));
  b->allocator_ = std::make_shared<CudaKvAllocator>(device);
  PDQ_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamCreate(&b->stream_), "cudaStreamCreate"));
  PDQ_ASSIGN_OR_RETURN(b->blas_, cuda::BlasHandles::Create());
  const ModelConfig& c = model.config_;
  PDQ_ASSIGN_OR_RETURN(b->embedding_, DeviceBuffer::From(model.embedding_));
  PDQ_ASSIGN_OR_RETURN(b->output_norm_, DeviceBuffer::From(model.output_norm_.data(), c.d_model));
  PDQ_ASSIGN_OR_RETURN(b->inv_freq_, DeviceBuffer::From(model.inv_freq_));
  PDQ_ASSIGN_OR_RETURN(b->output_, DeviceLinear::From(*model.output_, "output"));
  for (int li = 0; li < c.num_layers; ++li) {
    const Model::Layer& L = model.layers_[li];
    Layer d;
    const std::string blk = absl::StrCat("blk.", li, ".");
    PDQ_ASSIGN_OR_RETURN(d.attn_norm, DeviceBuffer::From(L.attn_norm.data(), c.d_model));
    PDQ_ASSIGN_OR_RETURN(d.ffn_norm, DeviceBuffer::From(L.ffn_norm.data(), c.d_model));
    PDQ_ASSIGN_OR_RETURN(d.qkv, DeviceLinear::From(*L.qkv, blk + "qkv"));
    PDQ_ASSIGN_OR_RETURN(d.out, DeviceLinear::From(*L.out, blk + "out"));
    PDQ_ASSIGN_OR_RETURN(d.gate_up, DeviceLinear::From(*L.gate_up, blk + "gate_up"));
    PDQ_ASSIGN_OR_RETURN(d.down, DeviceLinear::From(*L.down, blk + "down"));
    b->layers_.push_back(std::move(d));
  }
  return std::unique_ptr<ForwardBackend>(std::move(b));
}

absl::Status CudaBackend::Fit(DeviceBuffer& b, int64_t bytes) {
  if (bytes <= 0 || b.bytes() >= bytes) return absl::OkStatus();
  b = DeviceBuffer();  // free first: the old contents are not needed
  PDQ_ASSIGN_OR_RETURN(b, DeviceBuffer::Allocate(std::max<int64_t>(bytes, 256)));
  return absl::OkStatus();
}

// y = x W^T (+ bias) for m rows of fp16 x (k apart); y rows ldy floats.
absl::Status CudaBackend::Linear(const DeviceLinear& lin, const fp16_t* x, int64_t m, float* y,
                                 int64_t ldy) {
  switch (lin.kind) {
    case DeviceLinear::Kind::kF16:
      PDQ_RETURN_IF_ERROR(cuda::GemmF16({.blas = blas_.get(),
                                         .w = lin.w.as<fp16_t>(),
                                         .n = lin.n,
                                         .k = lin.k,
                                         .ldw = lin.k,
                                         .x = x,
                                         .m = m,
                                         .ldx = lin.k,
                                         .y = y,
                                         .ldy = ldy},
                                        stream_));
      break;
    case DeviceLinear::Kind::kI8:
      PDQ_CHECK(ws_.w8a8_scratch.bytes() >= cuda::W8A8ScratchBytes(m, lin.n, lin.k));
      PDQ_RETURN_IF_ERROR(
          cuda::W8A8Gemm({.blas = blas_.get(),
                          .w = {lin.w.as<int8_t>(), lin.scales.as<float>(), lin.n, lin.k},
                          .x = x,
                          .m = m,
                          .ldx = lin.k,
                          .in_scale = lin.in_scale.get() ? lin.in_scale.as<float>() : nullptr,
                          .y = y,
                          .ldy = ldy,
                          .scratch = ws_.w8a8_scratch.get()},
                         stream_));
      break;
    case DeviceLinear::Kind::kW4: {
      const fp16_t* in = x;
      if (lin.in_scale.get() != nullptr) {
        PDQ_CHECK(ws_.scaled16.bytes() >= m * lin.k * 2);
        PDQ_RETURN_IF_ERROR(cuda::ScaleColumns({.x = x,
                                                .m = m,
                                                .k = lin.k,
                                                .ldx = lin.k,
                                                .scale = lin.in_scale.as<float>(),
                                                .out = ws_.scaled16.as<fp16_t>()},
                                               stream_));
        in = ws_.scaled16.as<fp16_t>();
      }
      PDQ_RETURN_IF_ERROR(cuda::W4A16Gemm(
          {.w = {lin.w.as<uint8_t>(), lin.scales.as<uint32_t>(), lin.n, lin.k, lin.group},
           .x = in,
           .m = m,
           .ldx = lin.k,
           .y = y,
           .ldy = ldy},
          stream_));
      break;
    }
  }
  if (lin.bias.get() != nullptr) {
    PDQ_RETURN_IF_ERROR(cuda::AddBias(
        {.y = y, .m = m, .n = lin.n, .ldy = ldy, .bias = lin.bias.as<float>()}, stream_));
  }
  return absl::OkStatus();
}

// Context::RunOnCpu (engine/context.cc) step for step: a change to the
// model there belongs here too.
absl::Status CudaBackend::Run(std::span<const BatchEntry> batch, const ForwardPlan& plan,
                              KvCache& kv, const std::function<void(int)>& layer_done,
                              Logits* logits) {
  PDQ_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const ModelConfig& c = model_.config_;
  const int64_t total = plan.total, rows = plan.logit_rows;
  const int64_t d = c.d_model, q_dim = c.q_dim(), kv_dim = c.kv_dim(), f = c.ffn_dim;
  const int64_t qkvd = q_dim + 2 * kv_dim;

  // The batch's tokens, positions and block tables, in run order.
  std::vector<int32_t> tokens, positions, tables;
  std::vector<int64_t> table_at;  // per run entry: its first index in `tables`
  for (size_t i = 0; i < plan.run.size(); ++i) {
    const BatchEntry& b = batch[plan.run[i]];
    for (size_t t = 0; t < b.tokens.size(); ++t) {
      tokens.push_back(b.tokens[t]);
      positions.push_back((int32_t)(plan.start[plan.run[i]] + (int64_t)t));
    }
    table_at.push_back((int64_t)tables.size());
    tables.insert(tables.end(), plan.tables[i].begin(), plan.tables[i].end());
  }
  Workspace& w = ws_;
  // Scratch for the W8A8 layers and AWQ's scaled inputs, sized before any
  // launch: a buffer freed mid-pass could still be read by queued kernels.
  int64_t w8a8_bytes = 0, scaled_bytes = 0;
  auto need = [&](const DeviceLinear& lin, int64_t m) {
    if (lin.kind == DeviceLinear::Kind::kI8) {
      w8a8_bytes = std::max(w8a8_bytes, cuda::W8A8ScratchBytes(m, lin.n, lin.k));
    }
    if (lin.kind == DeviceLinear::Kind::kW4 && lin.in_scale.get() != nullptr) {
      scaled_bytes = std::max(scaled_bytes, m * lin.k * 2);
    }
  };
  for (const Layer& L : layers_) {
    for (const DeviceLinear* lin : {&L.qkv, &L.out, &L.gate_up, &L.down}) need(*lin, total);
  }
  need(output_, rows);
  for (auto [buf, bytes] : std::initializer_list<std::pair<DeviceBuffer*, int64_t>>{
           {&w.x, total * d * 4},
           {&w.h16, total * d * 2},
           {&w.qkv, total * qkvd * 4},
           {&w.attn, total * q_dim * 4},
           {&w.attn16, total * q_dim * 2},
           {&w.gate_up, total * 2 * f * 4},
           {&w.act16, total * f * 2},
           {&w.tmp, total * d * 4},
           {&w.rows16, rows * d * 2},
           {&w.logits, rows * c.vocab_size * 4},
           {&w.tokens, total * 4},
           {&w.positions, total * 4},
           {&w.tables, (int64_t)tables.size() * 4},
           {&w.w8a8_scratch, w8a8_bytes},
           {&w.scaled16, scaled_bytes}}) {
    PDQ_RETURN_IF_ERROR(Fit(*buf, bytes));
  }
  auto copy_in = [&](DeviceBuffer& dst, const std::vector<int32_t>& src) {
    return cuda::CudaStatus(
        cudaMemcpyAsync(dst.get(), src.data(), src.size() * 4, cudaMemcpyHostToDevice, stream_),
        "upload of the batch");
  };
  PDQ_RETURN_IF_ERROR(copy_in(w.tokens, tokens));
  PDQ_RETURN_IF_ERROR(copy_in(w.positions, positions));
  PDQ_RETURN_IF_ERROR(copy_in(w.tables, tables));

  float* x = w.x.as<float>();
  fp16_t* h16 = w.h16.as<fp16_t>();
  float* qkv = w.qkv.as<float>();
  float* tmp = w.tmp.as<float>();
  const int32_t* pos = w.positions.as<int32_t>();
  PDQ_RETURN_IF_ERROR(cuda::Embed({.tokens = w.tokens.as<int32_t>(),
                                   .m = total,
                                   .table = embedding_.as<fp16_t>(),
                                   .d = d,
                                   .scale = c.embedding_scale,
                                   .out = x},
                                  stream_));
  const float scale = 1.0f / std::sqrt((float)c.head_dim);
  auto rope = [&](float* heads_start, int heads) {
    return cuda::Rope({.x = heads_start,
                       .m = total,
                       .stride = qkvd,
                       .heads = heads,
                       .head_dim = c.head_dim,
                       .positions = pos,
                       .inv_freq = inv_freq_.as<float>(),
                       .style = c.rope_style},
                      stream_);
  };
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& L = layers_[li];
    const KvLayerView kvl = kv.Layer(li);
    PDQ_RETURN_IF_ERROR(cuda::RmsNorm({.x = x,
                                       .weight = L.attn_norm.as<float>(),
                                       .m = total,
                                       .d = d,
                                       .eps = c.norm_eps,
                                       .out_half = h16},
                                      stream_));
    PDQ_RETURN_IF_ERROR(Linear(L.qkv, h16, total, qkv, qkvd));
    PDQ_RETURN_IF_ERROR(rope(qkv, c.num_heads));             // queries
    PDQ_RETURN_IF_ERROR(rope(qkv + q_dim, c.num_kv_heads));  // keys
    for (size_t i = 0; i < plan.run.size(); ++i) {
      const int64_t n = (int64_t)batch[plan.run[i]].tokens.size(), off = plan.offset[i];
      const int32_t* table = w.tables.as<int32_t>() + table_at[i];
      const float* row = qkv + off * qkvd;
      PDQ_RETURN_IF_ERROR(cuda::KvWrite({.layer = kvl,
                                         .block_table = table,
                                         .positions = pos + off,
                                         .m = n,
                                         .k = row + q_dim,
                                         .k_stride = qkvd,
                                         .v = row + q_dim + kv_dim,
                                         .v_stride = qkvd},
                                        stream_));
      PDQ_RETURN_IF_ERROR(cuda::Attention({.layer = kvl,
                                           .block_table = table,
                                           .first_pos = plan.start[plan.run[i]],
                                           .m = n,
                                           .q = row,
                                           .q_stride = qkvd,
                                           .heads = c.num_heads,
                                           .scale = scale,
                                           .out = w.attn.as<float>() + off * q_dim,
                                           .out_stride = q_dim},
                                          stream_));
    }
    if (layer_done) {
      PDQ_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamSynchronize(stream_), "layer sync"));
      layer_done(li);
    }
    PDQ_RETURN_IF_ERROR(cuda::ToHalf(
        {.src = w.attn.as<float>(), .n = total * q_dim, .dst = w.attn16.as<fp16_t>()}, stream_));
    PDQ_RETURN_IF_ERROR(Linear(L.out, w.attn16.as<fp16_t>(), total, tmp, d));
    PDQ_RETURN_IF_ERROR(cuda::Add({.y = x, .x = tmp, .n = total * d}, stream_));
    PDQ_RETURN_IF_ERROR(cuda::RmsNorm({.x = x,
                                       .weight = L.ffn_norm.as<float>(),
                                       .m = total,
                                       .d = d,
                                       .eps = c.norm_eps,
                                       .out_half = h16},
                                      stream_));
    PDQ_RETURN_IF_ERROR(Linear(L.gate_up, h16, total, w.gate_up.as<float>(), 2 * f));
    PDQ_RETURN_IF_ERROR(
        cuda::Glu({.kind = c.activation == Activation::kGeluTanh ? cuda::GluKind::kGeluTanh
                                                                 : cuda::GluKind::kSilu,
                   .gate_up = w.gate_up.as<float>(),
                   .m = total,
                   .f = f,
                   .out_half = w.act16.as<fp16_t>()},
                  stream_));
    PDQ_RETURN_IF_ERROR(Linear(L.down, w.act16.as<fp16_t>(), total, tmp, d));
    PDQ_RETURN_IF_ERROR(cuda::Add({.y = x, .x = tmp, .n = total * d}, stream_));
  }

  // Final norm and output projection for the rows that need logits only.
  if (rows > 0) {
    for (size_t i = 0; i < plan.run.size(); ++i) {
      const BatchEntry& b = batch[plan.run[i]];
      if (b.num_logits == 0) continue;
      const int64_t first = plan.offset[i] + (int64_t)b.tokens.size() - b.num_logits;
      PDQ_RETURN_IF_ERROR(
          cuda::RmsNorm({.x = x + first * d,
                         .weight = output_norm_.as<float>(),
                         .m = b.num_logits,
                         .d = d,
                         .eps = c.norm_eps,
                         .out_half = w.rows16.as<fp16_t>() + logits->first_row[plan.run[i]] * d},
                        stream_));
    }
    PDQ_RETURN_IF_ERROR(
        Linear(output_, w.rows16.as<fp16_t>(), rows, w.logits.as<float>(), c.vocab_size));
    PDQ_RETURN_IF_ERROR(
        cuda::CudaStatus(cudaMemcpyAsync(logits->data.data(), w.logits.get(),
                                         rows * c.vocab_size * 4, cudaMemcpyDeviceToHost, stream_),
                         "download of the logits"));
  }
  return cuda::CudaStatus(cudaStreamSynchronize(stream_), "forward pass");
}

absl::StatusOr<std::unique_ptr<ForwardBackend>> MakeCudaBackend(const Model& model, int device) {
  return CudaBackend::Create(model, device);
}

}  // namespace pdq
