// Every CUDA kernel against the CPU: the scalar reference kernels
// (cpu::kScalarKernels) or, for RoPE and attention, the CPU kernels of
// kernels.h. Outputs start as NaN, so an element a kernel never wrote fails.
// Each test skips where no GPU is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w8a8.h"
#include "kernels/kernels.h"
#include "tests/cuda_test_util.h"

namespace pdq {
namespace {

using cuda_test::RandomFloats;
using cuda_test::RandomHalf;
using cuda_test::RelativeError;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; GPU test skipped";
  }
};

TEST_F(CudaKernelsTest, RmsNormMatchesScalarReference) {
  for (auto [m, d] : {std::pair<int64_t, int64_t>{1, 576}, {7, 1000}, {33, 4096}, {3, 5}}) {
    std::mt19937 rng(m * 131 + d);
    const std::vector<float> x = RandomFloats(m * d, rng, 2.0f), w = RandomFloats(d, rng, 2.0f);
    std::vector<float> want(m * d);
    for (int64_t i = 0; i < m; ++i) {
      cpu::kScalarKernels.rms_norm_row(x.data() + i * d, w.data(), d, 1e-5f, want.data() + i * d);
    }
    PDQ_DEVICE_COPY(dx, x);
    PDQ_DEVICE_COPY(dw, w);
    PDQ_DEVICE_POISONED(dout, m * d * 4);
    PDQ_DEVICE_POISONED(dhalf, m * d * 2);
    PDQ_ASSERT_OK(cuda::RmsNorm(
        {.x = dx.as<float>(), .weight = dw.as<float>(), .m = m, .d = d, .out = dout.as<float>()},
        nullptr));
    PDQ_ASSERT_OK(cuda::RmsNorm({.x = dx.as<float>(),
                                 .weight = dw.as<float>(),
                                 .m = m,
                                 .d = d,
                                 .out_half = dhalf.as<fp16_t>()},
                                nullptr));
    PDQ_DOWNLOAD(got, float, dout);
    PDQ_DOWNLOAD(got_half, fp16_t, dhalf);
    for (int64_t i = 0; i < m * d; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::abs(want[i]))) << "m=" << m << " d=" << d;
      ASSERT_NEAR(Fp16ToFp32(got_half[i]), want[i], 1e-3f * (1.0f + std::abs(want[i])))
          << "fp16 output, m=" << m << " d=" << d << " i=" << i;
    }
  }
}

TEST_F(CudaKernelsTest, GluMatchesScalarReference) {
  const int64_t m = 5, f = 1000;
  std::mt19937 rng(7);
  const std::vector<float> gate_up = RandomFloats(m * 2 * f, rng, 3.0f);
  PDQ_DEVICE_COPY(dgu, gate_up);
  for (cuda::GluKind kind : {cuda::GluKind::kSilu, cuda::GluKind::kGeluTanh}) {
    std::vector<float> want(m * f);
    for (int64_t i = 0; i < m; ++i) {
      const float* row = gate_up.data() + i * 2 * f;
      (kind == cuda::GluKind::kSilu
           ? cpu::kScalarKernels.silu_mul_row
           : cpu::kScalarKernels.gelu_mul_row)(row, row + f, f, want.data() + i * f);
    }
    PDQ_DEVICE_POISONED(dout, m * f * 4);
    PDQ_DEVICE_POISONED(dhalf, m * f * 2);
    PDQ_ASSERT_OK(cuda::Glu(
        {.kind = kind, .gate_up = dgu.as<float>(), .m = m, .f = f, .out = dout.as<float>()},
        nullptr));
    PDQ_ASSERT_OK(cuda::Glu(
        {.kind = kind, .gate_up = dgu.as<float>(), .m = m, .f = f, .out_half = dhalf.as<fp16_t>()},
        nullptr));
    PDQ_DOWNLOAD(got, float, dout);
    PDQ_DOWNLOAD(got_half, fp16_t, dhalf);
    for (int64_t i = 0; i < m * f; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::abs(want[i])))
          << (kind == cuda::GluKind::kSilu ? "silu" : "gelu") << " i=" << i;
      ASSERT_NEAR(Fp16ToFp32(got_half[i]), want[i], 1e-3f * (1.0f + std::abs(want[i])))
          << "fp16 output i=" << i;
    }
  }
}

TEST_F(CudaKernelsTest, RopeMatchesCpu) {
  const int64_t m = 6, stride = 300;
  const int heads = 4, head_dim = 64;
  std::mt19937 rng(11);
  std::vector<int32_t> positions(m);
  for (auto& p : positions) p = (int32_t)(rng() % 5000);
  std::vector<float> inv_freq(head_dim / 2);
  for (int t = 0; t < head_dim / 2; ++t) inv_freq[t] = std::pow(10000.0f, -2.0f * t / head_dim);
  PDQ_DEVICE_COPY(dpos, positions);
  PDQ_DEVICE_COPY(dfreq, inv_freq);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    std::vector<float> x = RandomFloats(m * stride, rng);
    PDQ_DEVICE_COPY(dx, x);
    Rope(CpuContext{}, x.data(), m, stride, heads, head_dim, positions.data(), inv_freq.data(),
         style);
    PDQ_ASSERT_OK(cuda::Rope({.x = dx.as<float>(),
                              .m = m,
                              .stride = stride,
                              .heads = heads,
                              .head_dim = head_dim,
                              .positions = dpos.as<int32_t>(),
                              .inv_freq = dfreq.as<float>(),
                              .style = style},
                             nullptr));
    PDQ_DOWNLOAD(got, float, dx);
    for (int64_t i = 0; i < m * stride; ++i) {
      ASSERT_NEAR(got[i], x[i], 1e-5f * (1.0f + std::abs(x[i]))) << "i=" << i;
    }
  }
}

TEST_F(CudaKernelsTest, ToHalfRoundsLikeTheCpu) {
  std::mt19937 rng(3);
  std::vector<float> x = RandomFloats(10000, rng, 1000.0f);
  x.insert(x.end(), {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, -3e-5f, 1.0f + 1.0f / 2048});
  PDQ_DEVICE_COPY(dx, x);
  PDQ_DEVICE_POISONED(dh, (int64_t)x.size() * 2);
  PDQ_ASSERT_OK(cuda::ToHalf(
      {.src = dx.as<float>(), .n = (int64_t)x.size(), .dst = dh.as<fp16_t>()}, nullptr));
  PDQ_DOWNLOAD(got, fp16_t, dh);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], Fp32ToFp16(x[i])) << x[i];
}

// The small kernels of the GPU forward pass, against plain loops.
TEST_F(CudaKernelsTest, EmbedAddBiasAndScaleColumnsMatchPlainLoops) {
  std::mt19937 rng(17);
  const int64_t vocab = 50, d = 300, m = 7, ldy = d + 5;
  const cuda_test::HalfData table = RandomHalf(vocab * d, rng);
  std::vector<int32_t> tokens(m);
  for (auto& t : tokens) t = (int32_t)(rng() % vocab);
  PDQ_DEVICE_COPY(dtable, table.half);
  PDQ_DEVICE_COPY(dtokens, tokens);
  PDQ_DEVICE_POISONED(dx, m * d * 4);
  PDQ_ASSERT_OK(cuda::Embed({.tokens = dtokens.as<int32_t>(),
                             .m = m,
                             .table = dtable.as<fp16_t>(),
                             .d = d,
                             .scale = 1.5f,
                             .out = dx.as<float>()},
                            nullptr));
  PDQ_DOWNLOAD(embedded, float, dx);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      ASSERT_EQ(embedded[i * d + j], table.f[tokens[i] * d + j] * 1.5f) << i << "," << j;
    }
  }

  const std::vector<float> y0 = RandomFloats(m * ldy, rng), x = RandomFloats(m * ldy, rng),
                           bias = RandomFloats(d, rng);
  PDQ_DEVICE_COPY(dy, y0);
  PDQ_DEVICE_COPY(dxs, x);
  PDQ_DEVICE_COPY(dbias, bias);
  PDQ_ASSERT_OK(cuda::Add({.y = dy.as<float>(), .x = dxs.as<float>(), .n = m * ldy}, nullptr));
  PDQ_ASSERT_OK(cuda::AddBias(
      {.y = dy.as<float>(), .m = m, .n = d, .ldy = ldy, .bias = dbias.as<float>()}, nullptr));
  PDQ_DOWNLOAD(sum, float, dy);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldy; ++j) {
      const float want = y0[i * ldy + j] + x[i * ldy + j] + (j < d ? bias[j] : 0.0f);
      ASSERT_EQ(sum[i * ldy + j], want) << i << "," << j << (j >= d ? " (past n)" : "");
    }
  }

  const int64_t k = 100, ldx = 104;
  const cuda_test::HalfData xh = RandomHalf(m * ldx, rng);
  std::vector<float> scale(k);
  for (float& v : scale) v = 0.25f + (float)(rng() % 100) / 50.0f;
  PDQ_DEVICE_COPY(dxh, xh.half);
  PDQ_DEVICE_COPY(dscale, scale);
  PDQ_DEVICE_POISONED(dout, m * k * 2);
  PDQ_ASSERT_OK(cuda::ScaleColumns({.x = dxh.as<fp16_t>(),
                                    .m = m,
                                    .k = k,
                                    .ldx = ldx,
                                    .scale = dscale.as<float>(),
                                    .out = dout.as<fp16_t>()},
                                   nullptr));
  PDQ_DOWNLOAD(scaled, fp16_t, dout);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(scaled[i * k + j], Fp32ToFp16(xh.f[i * ldx + j] * scale[j])) << i << "," << j;
    }
  }
}

// A paged cache with a scattered block table: the GPU writes the same fp16
// bits as the CPU, then attends the same over it (prefill rows and decode).
TEST_F(CudaKernelsTest, KvWriteAndAttentionMatchCpu) {
  for (int head_dim : {64, 80, 128, 256}) {
    const int heads = 8, kv_heads = 2, block_tokens = 16, blocks = 40;
    std::vector<int32_t> table(blocks);
    for (int b = 0; b < blocks; ++b) table[b] = (b * 17 + 5) % blocks;  // a permutation
    const int64_t width = (int64_t)kv_heads * head_dim, n_pos = 600;
    const int64_t cache_elems = (int64_t)blocks * kv_heads * block_tokens * head_dim;
    std::mt19937 rng(head_dim);
    std::vector<fp16_t> k_cache(cache_elems, 0), v_cache(cache_elems, 0);
    const KvLayerView cpu_layer{k_cache.data(), v_cache.data(), kv_heads, head_dim, block_tokens};
    const std::vector<float> k = RandomFloats(n_pos * width, rng),
                             v = RandomFloats(n_pos * width, rng);
    std::vector<int32_t> positions(n_pos);
    for (int64_t i = 0; i < n_pos; ++i) positions[i] = (int32_t)i;
    KvWrite(cpu_layer, table.data(), positions.data(), n_pos, k.data(), width, v.data(), width);

    PDQ_DEVICE_COPY(dk_cache, std::vector<fp16_t>(cache_elems, 0));
    PDQ_DEVICE_COPY(dv_cache, std::vector<fp16_t>(cache_elems, 0));
    PDQ_DEVICE_COPY(dtable, table);
    PDQ_DEVICE_COPY(dpos, positions);
    PDQ_DEVICE_COPY(dk, k);
    PDQ_DEVICE_COPY(dv, v);
    const KvLayerView gpu_layer{dk_cache.as<fp16_t>(), dv_cache.as<fp16_t>(), kv_heads, head_dim,
                                block_tokens};
    PDQ_ASSERT_OK(cuda::KvWrite({.layer = gpu_layer,
                                 .block_table = dtable.as<int32_t>(),
                                 .positions = dpos.as<int32_t>(),
                                 .m = n_pos,
                                 .k = dk.as<float>(),
                                 .k_stride = width,
                                 .v = dv.as<float>(),
                                 .v_stride = width},
                                nullptr));
    PDQ_DOWNLOAD(got_k, fp16_t, dk_cache);
    PDQ_DOWNLOAD(got_v, fp16_t, dv_cache);
    ASSERT_EQ(got_k, k_cache) << "head_dim " << head_dim;
    ASSERT_EQ(got_v, v_cache) << "head_dim " << head_dim;

    // Prefill rows from the start and late in the context, then decode
    // steps at the end and at 0 (one key). Large queries make peaked
    // softmaxes whose maximum moves between key tiles.
    for (auto [first_pos, m] : {std::pair<int64_t, int64_t>{0, 40}, {550, 50}, {599, 1}, {0, 1}}) {
      const int64_t q_stride = heads * head_dim + 3, out_stride = heads * head_dim + 5;
      const std::vector<float> q = RandomFloats(m * q_stride, rng, 4.0f);
      std::vector<float> want(m * out_stride, 0.0f);
      std::vector<float> scratch(
          AttentionScratchFloats(CpuContext{}, first_pos + m, heads, head_dim));
      const float scale = 1.0f / std::sqrt((float)head_dim);
      Attention(CpuContext{}, cpu_layer, table.data(), first_pos, m, q.data(), q_stride, heads,
                scale, want.data(), out_stride, scratch.data());
      PDQ_DEVICE_COPY(dq, q);
      PDQ_DEVICE_POISONED(dout, m * out_stride * 4);
      PDQ_ASSERT_OK(cuda::Attention({.layer = gpu_layer,
                                     .block_table = dtable.as<int32_t>(),
                                     .first_pos = first_pos,
                                     .m = m,
                                     .q = dq.as<float>(),
                                     .q_stride = q_stride,
                                     .heads = heads,
                                     .scale = scale,
                                     .out = dout.as<float>(),
                                     .out_stride = out_stride},
                                    nullptr));
      PDQ_DOWNLOAD(got, float, dout);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < heads * head_dim; ++j) {
          ASSERT_NEAR(got[i * out_stride + j], want[i * out_stride + j], 1e-4f)
              << "head_dim " << head_dim << " first_pos " << first_pos << " row " << i << " j "
              << j;
        }
      }
    }
  }
}

struct GemmShape {
  int64_t m, n, k;
  int group;  // W4A16 only
};

TEST_F(CudaKernelsTest, W4A16MatchesScalarReference) {
  // Partial chunks (k = 160, 576), padding rows (n = 37), several activation
  // blocks (m = 13), groups of 32 (scales per step) and of 64 and 128 (per
  // chunk), and n giving each tiling the launcher picks on a GPU of about
  // 132 multiprocessors: few tiles (16 warps a block), 264 or more (8), and
  // 1056 or more (two tiles a block, with an odd count).
  const GemmShape shapes[] = {{1, 37, 160, 32},     {3, 300, 576, 64},   {1, 2048, 2048, 128},
                              {8, 1000, 1024, 128}, {13, 50, 4096, 128}, {2, 6000, 1536, 32},
                              {1, 6000, 2048, 128}, {1, 17000, 256, 64}};
  for (const GemmShape& s : shapes) {
    SCOPED_TRACE(testing::Message()
                 << "m=" << s.m << " n=" << s.n << " k=" << s.k << " group=" << s.group);
    std::mt19937 rng(s.n * 7 + s.k);
    const std::vector<float> wf = RandomFloats(s.n * s.k, rng, 0.05f);
    std::vector<uint8_t> q(PackedW4QBytes(s.n, s.k), 0);
    std::vector<fp16_t> scale(PackedW4ScaleElements(s.n, s.k, s.group), 0),
        min(PackedW4ScaleElements(s.n, s.k, s.group), 0);
    QuantizeW4Rows(wf.data(), 0, s.n, s.k, s.group, false, q.data(), scale.data(), min.data());
    const PackedW4 w{q.data(), scale.data(), min.data(), s.n, s.k, s.group};
    std::vector<uint8_t> gq(cuda::GpuW4QBytes(s.n, s.k));
    std::vector<uint32_t> gsm(cuda::GpuW4ScaleMinBytes(s.n, s.k, s.group) / 4);
    PDQ_ASSERT_OK(cuda::RepackW4ForGpu(w, gq.data(), gsm.data()));

    const int64_t ldx = s.k + 8, ldy = s.n + 3;
    const cuda_test::HalfData x = RandomHalf(s.m * ldx, rng);
    std::vector<float> want(s.m * ldy, 0.0f);
    cpu::kScalarKernels.gemm_w4_panels_f32(w, 0, (s.n + kPanelRows - 1) / kPanelRows, x.f.data(),
                                           s.m, ldx, want.data(), ldy);
    PDQ_DEVICE_COPY(dq, gq);
    PDQ_DEVICE_COPY(dsm, gsm);
    PDQ_DEVICE_COPY(dx, x.half);
    PDQ_DEVICE_POISONED(dy, s.m * ldy * 4);
    const cuda::GpuW4 gw{dq.as<uint8_t>(), dsm.as<uint32_t>(), s.n, s.k, s.group};
    PDQ_ASSERT_OK(cuda::W4A16Gemm(
        {.w = gw, .x = dx.as<fp16_t>(), .m = s.m, .ldx = ldx, .y = dy.as<float>(), .ldy = ldy},
        nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    PDQ_DOWNLOAD(got, float, dy);
    // Weights rounded to fp16 once (as an FP16 copy would be), fp32 sums:
    // about 3e-4 of the norm. Per element, against its row's scale, so a
    // single wrong step of 16 inputs in one row shows too.
    EXPECT_LT(RelativeError(got, want, s.m, s.n, ldy), 2e-3);
    for (int64_t i = 0; i < s.m; ++i) {
      double ss = 0.0;
      for (int64_t j = 0; j < s.n; ++j) ss += (double)want[i * ldy + j] * want[i * ldy + j];
      const double row_rms = std::sqrt(ss / s.n);
      for (int64_t j = 0; j < s.n; ++j) {
        ASSERT_NEAR(got[i * ldy + j], want[i * ldy + j], 5e-3 * row_rms)
            << "row " << i << " col " << j;
      }
      for (int64_t j = s.n; j < ldy; ++j)
        ASSERT_TRUE(std::isnan(got[i * ldy + j])) << "wrote past n";
    }
  }
}

TEST_F(CudaKernelsTest, W8A8MatchesScalarReference) {
  auto blas = cuda::BlasHandles::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  // k not a multiple of 16 and n not of 4 exercise the padding.
  const GemmShape shapes[] = {
      {1, 64, 576, 0}, {7, 300, 1000, 0}, {33, 257, 260, 0}, {128, 512, 2048, 0}};
  for (const GemmShape& s : shapes) {
    for (bool smooth : {false, true}) {
      SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                      << (smooth ? " with input scale" : ""));
      std::mt19937 rng(s.n * 3 + s.k + smooth);
      const std::vector<float> wf = RandomFloats(s.n * s.k, rng, 0.05f);
      std::vector<int8_t> q(PackedI8Bytes(s.n, s.k), 0);
      std::vector<float> w_scale(s.n);
      QuantizeI8Rows(wf.data(), 0, s.n, s.k, q.data(), w_scale.data());
      const PackedI8 w{q.data(), w_scale.data(), s.n, s.k};
      std::vector<int8_t> gq(cuda::GpuI8Bytes(s.n, s.k));
      cuda::RepackI8ForGpu(w, gq.data());
      std::vector<float> in_scale(s.k);
      for (float& v : in_scale) v = 0.5f + (float)(rng() % 1000) / 500.0f;

      const int64_t ldx = s.k + 2, ldy = s.n + 1, k4 = PackedI8K4(s.k);
      const cuda_test::HalfData x = RandomHalf(s.m * ldx, rng, 2.0f);
      std::vector<int8_t> xq(s.m * k4 * 4);
      std::vector<float> xs(s.m), row(s.k), want(s.m * ldy, 0.0f);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.k; ++j) row[j] = x.f[i * ldx + j] * (smooth ? in_scale[j] : 1.0f);
        xs[i] = cpu::kScalarKernels.quantize_row_i8(row.data(), s.k, xq.data() + i * k4 * 4);
      }
      cpu::kScalarKernels.gemm_i8_panels(w, 0, (s.n + kPanelRows - 1) / kPanelRows, xq.data(),
                                         xs.data(), s.m, want.data(), ldy);

      PDQ_DEVICE_COPY(dq, gq);
      PDQ_DEVICE_COPY(dws, w_scale);
      PDQ_DEVICE_COPY(din, in_scale);
      PDQ_DEVICE_COPY(dx, x.half);
      PDQ_DEVICE_POISONED(dy, s.m * ldy * 4);
      PDQ_DEVICE_POISONED(dxq, s.m * cuda::GpuI8Ld(s.k));
      PDQ_DEVICE_POISONED(dxs, s.m * 4);
      auto scratch = cuda::DeviceBuffer::Allocate(cuda::W8A8ScratchBytes(s.m, s.n, s.k));
      ASSERT_TRUE(scratch.ok()) << scratch.status();
      const float* in = smooth ? din.as<float>() : nullptr;
      // The activation codes and scales first: bit for bit the CPU's.
      PDQ_ASSERT_OK(cuda::QuantizeRowsI8({.x = dx.as<fp16_t>(),
                                          .m = s.m,
                                          .k = s.k,
                                          .ldx = ldx,
                                          .in_scale = in,
                                          .xq = dxq.as<int8_t>(),
                                          .xs = dxs.as<float>()},
                                         nullptr));
      PDQ_DOWNLOAD(got_q, int8_t, dxq);
      PDQ_DOWNLOAD(got_xs, float, dxs);
      ASSERT_EQ(got_xs, xs);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < cuda::GpuI8Ld(s.k); ++j) {
          ASSERT_EQ(got_q[i * cuda::GpuI8Ld(s.k) + j], j < s.k ? xq[i * k4 * 4 + j] : 0)
              << "row " << i << " input " << j;
        }
      }
      PDQ_ASSERT_OK(cuda::W8A8Gemm({.blas = blas->get(),
                                    .w = {dq.as<int8_t>(), dws.as<float>(), s.n, s.k},
                                    .x = dx.as<fp16_t>(),
                                    .m = s.m,
                                    .ldx = ldx,
                                    .in_scale = in,
                                    .y = dy.as<float>(),
                                    .ldy = ldy,
                                    .scratch = scratch->get()},
                                   nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // Exact int32 sums, then the same two float products as the CPU.
      PDQ_DOWNLOAD(got, float, dy);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          ASSERT_NEAR(got[i * ldy + j], want[i * ldy + j],
                      1e-6f * (1.0f + std::abs(want[i * ldy + j])))
              << "row " << i << " col " << j;
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmF16MatchesScalarReference) {
  auto blas = cuda::BlasHandles::Create();
  ASSERT_TRUE(blas.ok()) << blas.status();
  const GemmShape shapes[] = {{1, 300, 576, 0}, {17, 1000, 1024, 0}, {256, 512, 512, 0}};
  for (const GemmShape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    std::mt19937 rng(s.m + s.n + s.k);
    const std::vector<float> wf = RandomFloats(s.n * s.k, rng, 0.05f);
    std::vector<fp16_t> packed(PackedF16Elements(s.n, s.k), 0);
    PackF16Rows(wf.data(), 0, s.n, s.k, packed.data());
    const PackedF16 w{packed.data(), s.n, s.k};
    std::vector<fp16_t> rows(s.n * s.k);
    cuda::UnpackF16ForGpu(w, rows.data());
    const int64_t ldx = s.k, ldy = s.n;
    const cuda_test::HalfData x = RandomHalf(s.m * ldx, rng);
    std::vector<float> want(s.m * ldy);
    cpu::kScalarKernels.gemm_f16_panels(w, 0, (s.n + kPanelRows - 1) / kPanelRows, x.f.data(), s.m,
                                        ldx, want.data(), ldy);
    PDQ_DEVICE_COPY(dw, rows);
    PDQ_DEVICE_COPY(dx, x.half);
    PDQ_DEVICE_POISONED(dy, s.m * ldy * 4);
    PDQ_ASSERT_OK(cuda::GemmF16({.blas = blas->get(),
                                 .w = dw.as<fp16_t>(),
                                 .n = s.n,
                                 .k = s.k,
                                 .ldw = s.k,
                                 .x = dx.as<fp16_t>(),
                                 .m = s.m,
                                 .ldx = ldx,
                                 .y = dy.as<float>(),
                                 .ldy = ldy},
                                nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    PDQ_DOWNLOAD(got, float, dy);
    EXPECT_LT(RelativeError(got, want, s.m, s.n, ldy), 1e-4);
  }
}

}  // namespace
}  // namespace pdq
