// The host side of kernels/cuda, which runs without a GPU: the weight
// layouts the kernels read, checked against the formulas their headers
// document, and the launchers' refusal of bad input before any launch.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w8a8.h"
#include "kernels/kernels.h"
#include "tests/cuda_test_util.h"

namespace pdq {
namespace {

// Decodes the repacked words by w4a16.h's description (lane l = 4g + t,
// step s, nibble p -> row g + 8 (p & 1), input 16 s + 2 t + 8 ((p >> 1) & 1)
// + (p >> 2)), independently of the repacking code.
TEST(CudaLayoutTest, W4RepackFollowsTheDocumentedLayout) {
  for (auto [n, k, group] :
       {std::tuple<int64_t, int64_t, int>{37, 160, 32}, {64, 576, 64}, {16, 1024, 128}}) {
    std::mt19937 rng(n + k);
    const std::vector<float> wf = cuda_test::RandomFloats(n * k, rng);
    std::vector<uint8_t> q(PackedW4QBytes(n, k));
    std::vector<fp16_t> scale(PackedW4ScaleElements(n, k, group)), min(scale.size());
    QuantizeW4Rows(wf.data(), 0, n, k, group, false, q.data(), scale.data(), min.data());
    const PackedW4 w{q.data(), scale.data(), min.data(), n, k, group};
    std::vector<uint8_t> gq(cuda::GpuW4QBytes(n, k));
    std::vector<uint32_t> gsm(cuda::GpuW4ScaleMinBytes(n, k, group) / 4);
    ASSERT_TRUE(cuda::RepackW4ForGpu(w, gq.data(), gsm.data()).ok());

    const int64_t tiles = cuda::GpuW4Tiles(n), chunks = cuda::GpuW4Chunks(k);
    int64_t checked = 0;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4;
          for (int s = 0; s < 4; ++s) {
            const uint8_t* word = gq.data() + ((tile * chunks + chunk) * 32 + lane) * 16 + 4 * s;
            const uint32_t bits = word[0] | word[1] << 8 | word[2] << 16 | (uint32_t)word[3] << 24;
            for (int p = 0; p < 8; ++p) {
              const int64_t row = tile * 16 + g + 8 * (p & 1);
              const int64_t input = chunk * 64 + 16 * s + 2 * t + 8 * ((p >> 1) & 1) + (p >> 2);
              const int code = (bits >> (4 * p)) & 0xf;
              const int want =
                  row < n && input < k
                      ? PackedW4Code(q.data() + row / 16 * (k / 2) * 16, input, row % 16)
                      : 0;
              ASSERT_EQ(code, want) << "row " << row << " input " << input;
              ASSERT_EQ(cuda::GpuW4Code(gq.data(), k, row, input), code);
              ++checked;
            }
          }
        }
      }
    }
    EXPECT_EQ(checked, tiles * 16 * chunks * 64);
    const int64_t groups = PackedW4Groups(k, group);
    for (int64_t row = 0; row < tiles * 16; ++row) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        const uint32_t pair = gsm[(row / 16 * groups + gi) * 16 + row % 16];
        const int64_t cpu = (row / 16 * groups + gi) * 16 + row % 16;
        EXPECT_EQ(pair & 0xffff, row < n ? scale[cpu] : 0);
        EXPECT_EQ(pair >> 16, row < n ? min[cpu] : 0);
      }
    }
  }
}

TEST(CudaLayoutTest, W4RepackRefusesWhatTheKernelCannotRead) {
  std::vector<uint8_t> q(PackedW4QBytes(16, 40), 0);
  std::vector<fp16_t> sm(PackedW4ScaleElements(16, 40, 32), 0);
  std::vector<uint8_t> gq(cuda::GpuW4QBytes(16, 48));
  std::vector<uint32_t> gsm(cuda::GpuW4ScaleMinBytes(16, 48, 32));
  const absl::Status s =
      cuda::RepackW4ForGpu({q.data(), sm.data(), sm.data(), 16, 40, 32}, gq.data(), gsm.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiples of 16"), std::string::npos) << s;
}

TEST(CudaLayoutTest, I8AndF16WeightsUnpackToRowMajor) {
  const int64_t n = 21, k = 37;
  std::mt19937 rng(5);
  const std::vector<float> wf = cuda_test::RandomFloats(n * k, rng);
  std::vector<int8_t> q(PackedI8Bytes(n, k));
  std::vector<float> scale(n);
  QuantizeI8Rows(wf.data(), 0, n, k, q.data(), scale.data());
  std::vector<int8_t> gq(cuda::GpuI8Bytes(n, k), 7);
  cuda::RepackI8ForGpu({q.data(), scale.data(), n, k}, gq.data());
  const int64_t ld = cuda::GpuI8Ld(k), k4 = PackedI8K4(k);
  ASSERT_EQ(ld, 48);
  ASSERT_EQ(cuda::GpuI8Rows(n), 24);
  for (int64_t row = 0; row < 24; ++row) {
    for (int64_t kk = 0; kk < ld; ++kk) {
      const int8_t want =
          row < n && kk < k ? q[(row / 16 * k4 + kk / 4) * 64 + 4 * (row % 16) + kk % 4] : 0;
      ASSERT_EQ(gq[row * ld + kk], want) << row << "," << kk;
    }
  }

  std::vector<fp16_t> packed(PackedF16Elements(n, k), 0);
  PackF16Rows(wf.data(), 0, n, k, packed.data());
  std::vector<fp16_t> rows(n * k);
  cuda::UnpackF16ForGpu({packed.data(), n, k}, rows.data());
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(rows[i], Fp32ToFp16(wf[i])) << i;
}

// Shapes and pointers are checked before anything touches a device, so
// these run (and must refuse) on a machine without one.
TEST(CudaLayoutTest, LaunchersRefuseBadInputBeforeLaunching) {
  alignas(16) static uint8_t bytes[4096];
  auto* h = reinterpret_cast<fp16_t*>(bytes);
  auto* f = reinterpret_cast<float*>(bytes);
  const cuda::GpuW4 w4{bytes, reinterpret_cast<uint32_t*>(bytes), 32, 64, 32};
  auto invalid = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kInvalidArgument;
  };

  EXPECT_TRUE(invalid(cuda::W4A16Gemm(
      {.w = {bytes, w4.scale_min, 32, 40, 32}, .x = h, .m = 1, .ldx = 40, .y = f, .ldy = 32},
      nullptr)));  // k not a multiple of 16
  EXPECT_TRUE(
      invalid(cuda::W4A16Gemm({.w = w4, .x = h, .m = 0, .ldx = 64, .y = f, .ldy = 32}, nullptr)));
  EXPECT_TRUE(invalid(cuda::W4A16Gemm({.w = w4, .x = h, .m = 1, .ldx = 65, .y = f, .ldy = 32},
                                      nullptr)));  // odd ldx
  EXPECT_TRUE(invalid(cuda::W4A16Gemm({.w = w4, .x = h + 1, .m = 1, .ldx = 64, .y = f, .ldy = 32},
                                      nullptr)));  // x not 4-byte aligned
  EXPECT_TRUE(invalid(cuda::W4A16Gemm(
      {.w = {bytes + 4, w4.scale_min, 32, 64, 32}, .x = h, .m = 1, .ldx = 64, .y = f, .ldy = 32},
      nullptr)));  // q not 16-byte aligned
  EXPECT_TRUE(invalid(
      cuda::W4A16Gemm({.w = w4, .x = h, .m = 1, .ldx = 64, .y = nullptr, .ldy = 32}, nullptr)));

  const KvLayerView layer{h, h, 2, 64, 16};
  const int32_t* table = reinterpret_cast<const int32_t*>(bytes);
  EXPECT_TRUE(invalid(cuda::Attention({.layer = layer,
                                       .block_table = table,
                                       .m = 1,
                                       .q = f,
                                       .q_stride = 384,
                                       .heads = 6 + 1,
                                       .out = f,
                                       .out_stride = 448},
                                      nullptr)));  // 7 heads over 2 kv heads
  EXPECT_TRUE(invalid(cuda::Attention({.layer = {h, h, 2, 300, 16},
                                       .block_table = table,
                                       .m = 1,
                                       .q = f,
                                       .q_stride = 2400,
                                       .heads = 8,
                                       .out = f,
                                       .out_stride = 2400},
                                      nullptr)));  // head_dim over 256
  EXPECT_TRUE(invalid(cuda::Attention({.layer = layer,
                                       .block_table = table,
                                       .first_pos = -1,
                                       .m = 1,
                                       .q = f,
                                       .q_stride = 512,
                                       .heads = 8,
                                       .out = f,
                                       .out_stride = 512},
                                      nullptr)));
  EXPECT_TRUE(invalid(cuda::KvWrite({.layer = layer,
                                     .block_table = table,
                                     .positions = table,
                                     .m = 1,
                                     .k = f,
                                     .k_stride = 100,
                                     .v = f,
                                     .v_stride = 128},
                                    nullptr)));  // k rows narrower than 2 x 64

  EXPECT_TRUE(invalid(cuda::RmsNorm({.x = f, .weight = f, .m = 1, .d = 8, .out = f, .out_half = h},
                                    nullptr)));  // both outputs
  EXPECT_TRUE(invalid(cuda::Glu({.gate_up = f, .m = 1, .f = 0, .out = f}, nullptr)));
  EXPECT_TRUE(invalid(cuda::Rope(
      {.x = f, .m = 1, .stride = 64, .heads = 1, .head_dim = 63, .positions = table, .inv_freq = f},
      nullptr)));  // odd head_dim
  EXPECT_TRUE(invalid(cuda::ToHalf({.src = f, .n = -1, .dst = h}, nullptr)));
  EXPECT_TRUE(
      invalid(cuda::Embed({.tokens = table, .m = 0, .table = h, .d = 8, .out = f}, nullptr)));
  EXPECT_TRUE(
      invalid(cuda::Embed({.tokens = nullptr, .m = 1, .table = h, .d = 8, .out = f}, nullptr)));
  EXPECT_TRUE(invalid(cuda::Add({.y = f, .x = nullptr, .n = 8}, nullptr)));
  EXPECT_TRUE(invalid(cuda::AddBias({.y = f, .m = 2, .n = 8, .ldy = 4, .bias = f}, nullptr)));
  EXPECT_TRUE(invalid(cuda::ScaleColumns({.x = h, .m = 2, .k = 8, .ldx = 4, .scale = f, .out = h},
                                         nullptr)));  // ldx < k
  EXPECT_TRUE(invalid(cuda::GemmF16({.blas = nullptr,
                                     .w = h,
                                     .n = 8,
                                     .k = 8,
                                     .ldw = 8,
                                     .x = h,
                                     .m = 1,
                                     .ldx = 8,
                                     .y = f,
                                     .ldy = 8},
                                    nullptr)));  // no cuBLAS handles
  EXPECT_TRUE(invalid(cuda::GemmF16({.blas = nullptr,
                                     .w = h,
                                     .n = 8,
                                     .k = 8,
                                     .ldw = 4,
                                     .x = h,
                                     .m = 1,
                                     .ldx = 8,
                                     .y = f,
                                     .ldy = 8},
                                    nullptr)));  // ldw < k
  EXPECT_TRUE(invalid(cuda::W8A8Gemm({.blas = nullptr,
                                      .w = {reinterpret_cast<int8_t*>(bytes), f, 8, 16},
                                      .x = h,
                                      .m = 1,
                                      .ldx = 16,
                                      .y = f,
                                      .ldy = 8,
                                      .scratch = bytes},
                                     nullptr)));
  EXPECT_TRUE(invalid(
      cuda::QuantizeRowsI8({.x = h, .m = 2, .k = 16, .ldx = 8, .xq = nullptr, .xs = f}, nullptr)));
  EXPECT_TRUE(invalid(cuda::DequantI32(
      {.acc = nullptr, .m = 1, .n = 8, .lda = 8, .xs = f, .w_scale = f, .y = f, .ldy = 8},
      nullptr)));
}

}  // namespace
}  // namespace pdq
