// GPU kernel benchmark: every figure is a ratio to a ceiling measured in the
// same run (device-to-device copy bandwidth) or to a baseline run beside it
// (cuBLAS FP16), plus the datasheet peaks where the device is known.
//
//   W4A16 GEMV and small-m GEMM on the decode shapes of Llama 3.2 1B and
//   Llama 3 8B (one matrix at a time, weights rotated through more than the
//   L2 cache holds), and a whole decode step's GEMVs as one CUDA graph;
//   cuBLAS FP16 GEMV on the same shapes.
//   W8A8 at m = 4096 and 8192: cuBLASLt's int8 matmul alone and with the
//   activation quantization and dequantizing epilogue, against cuBLAS FP16.
//
// Inputs are hashed pseudo-random values, never zeros. Kernels are checked
// against the CPU in tests/cuda_kernels_test, not here.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "flags/flags.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w8a8.h"

namespace pdq {
namespace {

using cuda::DeviceBuffer;

__device__ inline uint32_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(x ^ (x >> 31));
}

// kind 0: random bytes; 1: fp16 pairs (scale in [1, 2) / 1024, min about
// -8 scale); 2: fp16 values in [-1, 1); 3: fp32 values in [-1, 1).
__global__ void FillKernel(uint32_t* p, int64_t words, uint64_t seed, int kind) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words;
       i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t r = Hash(seed * 0x100000001b3ull + i);
    if (kind == 0) {
      p[i] = r;
    } else if (kind == 1) {
      const float scale = (1.0f + (r & 0xffff) / 65536.0f) / 1024.0f;
      const __half2 h = __floats2half2_rn(scale, -8.0f * scale);
      p[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else if (kind == 3) {
      p[i] = __float_as_uint(r / 2147483648.0f - 1.0f);
    } else {
      const __half2 h =
          __floats2half2_rn((r & 0xffff) / 32768.0f - 1.0f, (r >> 16) / 32768.0f - 1.0f);
      p[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
}

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "gpu_bench: error: %s\n", s.ToString().c_str());
  std::exit(1);
}
void Check(const absl::Status& s) {
  if (!s.ok()) Die(s);
}
void Check(cudaError_t e, const char* what) { Check(cuda::CudaStatus(e, what)); }

DeviceBuffer Alloc(int64_t bytes, int kind, uint64_t seed) {
  auto b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) Die(b.status());
  FillKernel<<<1024, 256>>>(b->as<uint32_t>(), bytes / 4, seed, kind);
  Check(cudaGetLastError(), "fill");
  return std::move(*b);
}

// Median over `reps` timed batches of `inner` calls (after `warmup` calls) of
// the time per call, in seconds, by CUDA events on `stream`. With `graph`,
// the batch is captured once as a CUDA graph and replayed, so short kernels
// are timed without the gaps between separate launches.
double TimePerCall(cudaStream_t stream, int warmup, int reps, int inner,
                   const std::function<void(int)>& call, bool graph = false) {
  for (int i = 0; i < warmup; ++i) call(i);
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    for (int i = 0; i < inner; ++i) call(i);
    Check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
    Check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(g);
    Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");  // warm the graph itself
  }
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> per_call;
  int n = warmup;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    if (exec != nullptr) {
      Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    } else {
      for (int i = 0; i < inner; ++i) call(n++);
    }
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    per_call.push_back(ms * 1e-3 / inner);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

struct Row {
  std::string section, name;
  double seconds, rate;  // rate: GB/s or TOPS
  std::string unit;
  double ratio;  // to the section's ceiling or baseline
  std::string ratio_of;
};

std::vector<Row> rows;
void Report(Row r) {
  std::printf("%-8s %-34s %10.2f us %10.1f %-6s %6.1f%% of %s\n", r.section.c_str(), r.name.c_str(),
              r.seconds * 1e6, r.rate, r.unit.c_str(), 100.0 * r.ratio, r.ratio_of.c_str());
  std::fflush(stdout);
  rows.push_back(std::move(r));
}

struct Matrix {
  const char* name;
  int64_t n, k;
};
struct Model {
  const char* name;
  int layers;
  std::vector<Matrix> per_layer;
  Matrix head;
};

// Weights in the GPU W4 layout, groups of 128.
struct W4Weights {
  DeviceBuffer q, sm;
  cuda::GpuW4 view;
  int64_t bytes;
};
W4Weights MakeW4(const Matrix& mat, uint64_t seed) {
  W4Weights w;
  w.q = Alloc(cuda::GpuW4QBytes(mat.n, mat.k), 0, seed);
  w.sm = Alloc(cuda::GpuW4ScaleMinBytes(mat.n, mat.k, 128), 1, seed + 1);
  w.view = {w.q.as<uint8_t>(), w.sm.as<uint32_t>(), mat.n, mat.k, 128};
  w.bytes = w.q.bytes() + w.sm.bytes();
  return w;
}

int Main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  FlagParser flags("gpu_bench",
                   "W4A16, W8A8 and FP16 GPU kernels against the copy bandwidth and cuBLAS "
                   "measured in the same run.",
                   /*program=*/true);
  flags.String("json", &json_path, "also write the figures to this JSON file");
  flags.Bool("quick", &quick, "fewer shapes and repetitions (a smoke run)");
  if (int rc = ParseOrExit(flags, argc, argv, 1, "gpu_bench"); rc >= 0) return rc;
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "gpu_bench: error: no CUDA device present\n");
    return 1;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::string device = prop.name;
  std::printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize / 1048576.0);
  // Datasheet dense peaks (no sparsity) for the parts we know; 0 elsewhere.
  double int8_peak_tops = 0, fp16_peak_tflops = 0;
  // The SXM parts only (the H200 NVL's and the H100 PCIe's peaks are lower).
  const bool nvl = device.find("NVL") != std::string::npos;
  if ((device.find("H200") != std::string::npos && !nvl) ||
      device.find("H100 80GB HBM3") != std::string::npos) {
    int8_peak_tops = 1979;  // H100/H200 SXM
    fp16_peak_tflops = 989;
  }
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  auto blas_or = cuda::BlasHandles::Create();
  if (!blas_or.ok()) Die(blas_or.status());
  cuda::BlasHandles* blas = blas_or->get();
  const int reps = quick ? 3 : 9;

  // ---- The ceiling: device-to-device copy, bytes read plus written ----
  const int64_t copy_bytes = 1ll << 30;
  DeviceBuffer src = Alloc(copy_bytes, 0, 1), dst = Alloc(copy_bytes, 0, 2);
  const double copy_s = TimePerCall(stream, 2, reps, 5, [&](int) {
    Check(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  });
  const double hbm_gbps = 2.0 * copy_bytes / copy_s / 1e9;
  Report({"roofline", "device-to-device copy 1 GiB", copy_s, hbm_gbps, "GB/s", 1.0, "itself"});
  src = DeviceBuffer();
  dst = DeviceBuffer();

  const Model llama1b{
      "llama-1b",
      16,
      {{"qkv", 3072, 2048}, {"o", 2048, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192}},
      {"lm_head", 128256, 2048}};
  const Model llama8b{
      "llama-8b",
      32,
      {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}},
      {"lm_head", 128256, 4096}};
  std::vector<const Model*> models = {&llama1b};
  if (!quick) models.push_back(&llama8b);
  const int64_t rotate_bytes = 4 * (int64_t)prop.l2CacheSize;

  // ---- W4A16 per matrix, rotated through > 4x L2; FP16 GEMV beside it ----
  DeviceBuffer x = Alloc(16 * 16384 * 2, 2, 3), y = Alloc(16 * 128256 * 4, 0, 4);
  for (const Model* model : models) {
    std::vector<Matrix> mats = model->per_layer;
    mats.push_back(model->head);
    for (const Matrix& mat : mats) {
      std::vector<W4Weights> copies;
      int64_t one = 0;
      do {
        copies.push_back(MakeW4(mat, 100 + copies.size()));
        one = copies.back().bytes;
      } while ((int64_t)copies.size() * one < rotate_bytes && copies.size() < 64);
      for (int64_t m : quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8, 16}) {
        const double s = TimePerCall(
            stream, 3, reps, 20,
            [&](int i) {
              Check(cuda::W4A16Gemm({.w = copies[i % copies.size()].view,
                                     .x = x.as<fp16_t>(),
                                     .m = m,
                                     .ldx = mat.k,
                                     .y = y.as<float>(),
                                     .ldy = mat.n},
                                    stream));
            },
            /*graph=*/true);
        // Weights counted once: beyond 8 rows each block of 8 reads them
        // again (from L2 if they fit), so m = 16 is an effective rate.
        const double bytes = one + m * mat.k * 2 + m * mat.n * 4;
        Report({"w4a16",
                absl::StrFormat("%s %s %dx%d m=%d%s", model->name, mat.name, mat.n, mat.k, m,
                                m > 8 ? " (effective)" : ""),
                s, bytes / s / 1e9, "GB/s", bytes / s / 1e9 / hbm_gbps, "copy bandwidth"});
      }
      copies.clear();
      // cuBLAS FP16 GEMV, the unquantized baseline on the same shape.
      std::vector<DeviceBuffer> f16;
      const int64_t f16_bytes = mat.n * mat.k * 2;
      do {
        f16.push_back(Alloc(f16_bytes, 2, 200 + f16.size()));
      } while ((int64_t)f16.size() * f16_bytes < rotate_bytes && f16.size() < 16);
      const double s = TimePerCall(
          stream, 3, reps, 20,
          [&](int i) {
            Check(cuda::GemmF16({.blas = blas,
                                 .w = f16[i % f16.size()].as<fp16_t>(),
                                 .n = mat.n,
                                 .k = mat.k,
                                 .ldw = mat.k,
                                 .x = x.as<fp16_t>(),
                                 .m = 1,
                                 .ldx = mat.k,
                                 .y = y.as<float>(),
                                 .ldy = mat.n},
                                stream));
          },
          /*graph=*/true);
      const double bytes = f16_bytes + mat.k * 2 + mat.n * 4;
      Report({"fp16",
              absl::StrFormat("%s %s %dx%d m=1 (cuBLAS)", model->name, mat.name, mat.n, mat.k), s,
              bytes / s / 1e9, "GB/s", bytes / s / 1e9 / hbm_gbps, "copy bandwidth"});
    }
  }

  // ---- A whole decode step's W4A16 GEMVs as one CUDA graph ----
  for (const Model* model : models) {
    std::vector<W4Weights> weights;
    int64_t total = 0;
    for (int l = 0; l < model->layers; ++l) {
      for (const Matrix& mat : model->per_layer)
        weights.push_back(MakeW4(mat, 1000 + weights.size()));
    }
    weights.push_back(MakeW4(model->head, 999));
    for (const W4Weights& w : weights) total += w.bytes;
    auto run_all = [&] {
      for (const W4Weights& w : weights) {
        Check(cuda::W4A16Gemm({.w = w.view,
                               .x = x.as<fp16_t>(),
                               .m = 1,
                               .ldx = w.view.k,
                               .y = y.as<float>(),
                               .ldy = w.view.n},
                              stream));
      }
    };
    run_all();  // outside the capture: first launches, cached device queries
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    run_all();
    Check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    const double s = TimePerCall(
        stream, 2, reps, 5, [&](int) { Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    Report({"w4a16",
            absl::StrFormat("%s decode step, %d GEMVs, graph", model->name, (int)weights.size()), s,
            total / s / 1e9, "GB/s", total / s / 1e9 / hbm_gbps, "copy bandwidth"});
  }

  // ---- Paged attention: a decode step over a long context (bytes of K and
  // V against the copy bandwidth) and a prefill chunk (fp32 FLOP/s) ----
  {
    const int heads = 32, kv_heads = 8, head_dim = 128, block_tokens = 16;
    const int64_t context = 4096, blocks = context / block_tokens;
    const int64_t layer_elems = blocks * kv_heads * block_tokens * head_dim;
    DeviceBuffer k = Alloc(layer_elems * 2, 2, 21), v = Alloc(layer_elems * 2, 2, 22);
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = (int32_t)((b * 37) % blocks);
    auto dtable = DeviceBuffer::From(table);
    if (!dtable.ok()) Die(dtable.status());
    const int64_t rows = 512;
    DeviceBuffer q = Alloc(rows * heads * head_dim * 4, 3, 23),
                 out = Alloc(rows * heads * head_dim * 4, 0, 24);
    const KvLayerView layer{k.as<fp16_t>(), v.as<fp16_t>(), kv_heads, head_dim, block_tokens};
    auto attend = [&](int64_t first_pos, int64_t m) {
      Check(cuda::Attention({.layer = layer,
                             .block_table = dtable->as<int32_t>(),
                             .first_pos = first_pos,
                             .m = m,
                             .q = q.as<float>(),
                             .q_stride = heads * head_dim,
                             .heads = heads,
                             .scale = 0.088f,
                             .out = out.as<float>(),
                             .out_stride = heads * head_dim},
                            stream));
    };
    const double s_dec = TimePerCall(
        stream, 3, reps, 20, [&](int) { attend(context - 1, 1); }, true);
    const double kv_bytes = 2.0 * context * kv_heads * head_dim * 2;
    Report({"attn", absl::StrFormat("decode, %d keys, 32/8 heads x 128", (int)context), s_dec,
            kv_bytes / s_dec / 1e9, "GB/s", kv_bytes / s_dec / 1e9 / hbm_gbps, "copy bandwidth"});
    const double s_pre =
        TimePerCall(stream, 1, reps, 2, [&](int) { attend(context - rows, rows); });
    // QK^T and PV over the causal keys each row sees.
    const double flops =
        4.0 * heads * head_dim * (rows * (context - rows) + rows * (rows + 1) / 2.0);
    Report({"attn",
            absl::StrFormat("prefill %d rows at %d, 32/8 heads x 128", (int)rows, (int)context),
            s_pre, flops / s_pre / 1e12, "TFLOPS",
            fp16_peak_tflops > 0 ? flops / s_pre / 1e12 / fp16_peak_tflops : 0.0,
            fp16_peak_tflops > 0 ? "fp16 dense peak (datasheet)" : "unknown peak"});
  }

  // ---- W8A8 prefill GEMMs against cuBLAS FP16 ----
  struct Gemm {
    int64_t m, n, k;
  };
  std::vector<Gemm> gemms = {{4096, 4096, 4096}, {4096, 14336, 4096}};
  if (!quick) gemms.push_back({8192, 8192, 8192});
  for (const Gemm& g : gemms) {
    const double ops = 2.0 * g.m * g.n * g.k;
    DeviceBuffer wq = Alloc(cuda::GpuI8Bytes(g.n, g.k), 0, 11), xq = Alloc(g.m * g.k, 0, 12);
    DeviceBuffer acc = Alloc(g.m * cuda::GpuI8Rows(g.n) * 4, 0, 13);
    const double s_mm = TimePerCall(stream, 3, reps, 5, [&](int) {
      Check(blas->Int8Matmul(xq.as<int8_t>(), wq.as<int8_t>(), g.m, g.n, g.k, acc.as<int32_t>(),
                             stream));
    });
    const std::string shape = absl::StrFormat("%dx%dx%d", g.m, g.n, g.k);
    Report({"w8a8", "int8 matmul " + shape, s_mm, ops / s_mm / 1e12, "TOPS",
            int8_peak_tops > 0 ? ops / s_mm / 1e12 / int8_peak_tops : 0.0,
            int8_peak_tops > 0 ? "int8 dense peak (datasheet)" : "unknown peak"});
    acc = DeviceBuffer();
    DeviceBuffer ws = Alloc(g.n * 4, 1, 14), xh = Alloc(g.m * g.k * 2, 2, 15),
                 yf = Alloc(g.m * g.n * 4, 0, 16);
    DeviceBuffer scratch = Alloc(cuda::W8A8ScratchBytes(g.m, g.n, g.k), 0, 17);
    const double s_full = TimePerCall(stream, 3, reps, 5, [&](int) {
      Check(cuda::W8A8Gemm({.blas = blas,
                            .w = {wq.as<int8_t>(), ws.as<float>(), g.n, g.k},
                            .x = xh.as<fp16_t>(),
                            .m = g.m,
                            .ldx = g.k,
                            .y = yf.as<float>(),
                            .ldy = g.n,
                            .scratch = scratch.get()},
                           stream));
    });
    DeviceBuffer wh = Alloc(g.n * g.k * 2, 2, 18);
    const double s_f16 = TimePerCall(stream, 3, reps, 5, [&](int) {
      Check(cuda::GemmF16({.blas = blas,
                           .w = wh.as<fp16_t>(),
                           .n = g.n,
                           .k = g.k,
                           .ldw = g.k,
                           .x = xh.as<fp16_t>(),
                           .m = g.m,
                           .ldx = g.k,
                           .y = yf.as<float>(),
                           .ldy = g.n},
                          stream));
    });
    Report({"w8a8", "quantize+matmul+dequant " + shape, s_full, ops / s_full / 1e12, "TOPS",
            s_f16 / s_full, "cuBLAS FP16 speed"});
    Report({"fp16", "cuBLAS GEMM " + shape, s_f16, ops / s_f16 / 1e12, "TFLOPS",
            fp16_peak_tflops > 0 ? ops / s_f16 / 1e12 / fp16_peak_tflops : 0.0,
            fp16_peak_tflops > 0 ? "fp16 dense peak (datasheet)" : "unknown peak"});
  }

  if (!json_path.empty()) {
    std::string out = absl::StrCat("{\n  \"device\": \"", device,
                                   "\",\n  \"copy_gbps\": ", hbm_gbps, ",\n  \"rows\": [\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      absl::StrAppend(&out, "    {\"section\": \"", r.section, "\", \"name\": \"", r.name,
                      "\", \"seconds\": ", r.seconds, ", \"rate\": ", r.rate, ", \"unit\": \"",
                      r.unit, "\", \"ratio\": ", r.ratio, ", \"ratio_of\": \"", r.ratio_of, "\"}",
                      i + 1 < rows.size() ? ",\n" : "\n");
    }
    out += "  ]\n}\n";
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr || std::fwrite(out.data(), 1, out.size(), f) != out.size()) {
      std::fprintf(stderr, "gpu_bench: error: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace pdq

int main(int argc, char** argv) { return pdq::Main(argc, argv); }
