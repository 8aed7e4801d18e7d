// Quantized loading: FP16-layer rules, SmoothQuant and calibrated W4
// methods against FP16, and the library call with pdq's defaults.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "quant/artifact.h"
#include "quant/calibrate.h"
#include "quant/quantized_load.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LastLogits;
using testing::LoadOrDie;
using testing::RelativeError;
using testing::RepeatedText;
using testing::Tokens;

TEST(QuantizeTest, LayerPatternsMatchWithWildcards) {
  EXPECT_TRUE(MatchesLayerPattern("output", "output"));
  EXPECT_TRUE(MatchesLayerPattern("blk.*.down", "blk.12.down"));
  EXPECT_TRUE(MatchesLayerPattern("*", "blk.0.qkv"));
  EXPECT_TRUE(MatchesLayerPattern("blk.1*", "blk.17.out"));
  EXPECT_FALSE(MatchesLayerPattern("blk.*.down", "blk.1.gate_up"));
  EXPECT_FALSE(MatchesLayerPattern("blk.1.*", "blk.17.out"));
  EXPECT_FALSE(MatchesLayerPattern("output", "outputs"));
}

TEST(QuantizeTest, Fp16LayersKeepTheirFp16Weights) {
  LoadOptions o;
  o.precision = Precision::kW8A8;
  auto all = Model::Load("synthetic:tiny", o);
  o.fp16_layers = {"blk.*.down", "output"};
  auto some = Model::Load("synthetic:tiny", o);
  ASSERT_TRUE(all.ok() && some.ok());
  const ModelConfig& c = (*all)->config();
  // int8 weights take 1 byte (+ a float scale per row), FP16 ones 2 bytes.
  const int64_t down = (int64_t)c.d_model * c.ffn_dim, output = c.output_params();
  const int64_t extra = c.num_layers * (down - c.d_model * 4) + output - c.vocab_size * 4;
  EXPECT_EQ((*some)->weight_bytes_per_token() - (*all)->weight_bytes_per_token(), extra);
}

// W8A16 layers (int8 groups of 32, 16-bit activations): half of FP16's
// bytes, logits next to the FP16 layer's, kept through artifacts; where a
// layer matches both lists FP16 wins.
TEST(QuantizeTest, W8LayersHalveTheirBytesAndTrackFp16) {
  LoadOptions o;
  o.precision = Precision::kW4A16;
  o.w4_group = 32;
  o.fp16_layers = {"output"};
  auto fp16_out = LoadOrDie("synthetic:tiny", 2, o);
  o.fp16_layers = {};
  o.w8_layers = {"output"};
  auto w8_out = LoadOrDie("synthetic:tiny", 2, o);
  o.fp16_layers = {"output"};
  auto both = LoadOrDie("synthetic:tiny", 2, o);
  ASSERT_TRUE(fp16_out && w8_out && both);
  const ModelConfig& c = fp16_out->config();
  const int64_t groups = (c.d_model + kW8Group - 1) / kW8Group;
  EXPECT_EQ(fp16_out->weight_bytes_per_token() - w8_out->weight_bytes_per_token(),
            c.output_params() * 2 - (c.output_params() + c.vocab_size * groups * 2));
  EXPECT_EQ(both->weight_bytes_per_token(), fp16_out->weight_bytes_per_token());

  auto tokens = Tokens(20, 384, 4);
  const Logits ref = LastLogits(*fp16_out.ctx, tokens), got = LastLogits(*w8_out.ctx, tokens);
  EXPECT_LT(RelativeError(got, ref), 0.01);
  EXPECT_GT(RelativeError(got, ref), 0.0);  // really another format

  const std::string path = ::testing::TempDir() + "/tiny_w8_output.pdqq";
  ASSERT_TRUE(w8_out->SaveQuantized(path).ok());
  auto artifact = ReadArtifact(path);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->header.w8_layers, (std::vector<std::string>{"output"}));
  LoadOptions lo;
  lo.quantized_weights = path;
  auto loaded = LoadOrDie("synthetic:tiny", 2, lo);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->options().w8_layers, (std::vector<std::string>{"output"}));
  EXPECT_EQ(LastLogits(*loaded.ctx, tokens).data, got.data);
}

TEST(SmoothQuantTest, CalibratedW8A8TracksFp16AndSurvivesArtifacts) {
  auto fp16 = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(fp16);
  auto stats = CollectActivationStats(*fp16.ctx, RepeatedText(20), CalibrationOptions{});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->count("blk.1.down"), 1u);
  EXPECT_EQ(stats->at("blk.1.down").absmax.size(), 128u);
  EXPECT_EQ(stats->count("output"), 1u);

  LoadOptions o;
  o.precision = Precision::kW8A8;
  o.smooth_alpha = 0.5f;
  EXPECT_EQ(Model::Load("synthetic:tiny", o).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no statistics
  o.activation_stats = &*stats;
  auto smooth = LoadOrDie("synthetic:tiny", 2, o);
  ASSERT_TRUE(smooth);

  auto tokens = Tokens(20, 384, 4);
  const Logits ref = LastLogits(*fp16.ctx, tokens), got = LastLogits(*smooth.ctx, tokens);
  EXPECT_LT(RelativeError(got, ref), 0.05);

  const std::string path = ::testing::TempDir() + "/tiny_smooth.pdqq";
  ASSERT_TRUE(smooth->SaveQuantized(path).ok());
  LoadOptions lo;
  lo.quantized_weights = path;
  auto loaded = LoadOrDie("synthetic:tiny", 2, lo);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(LastLogits(*loaded.ctx, tokens).data, got.data);
}

TEST(CalibratedW4Test, GptqAndAwqTrackFp16AndSurviveArtifacts) {
  auto fp16 = LoadOrDie("synthetic:tiny");
  ASSERT_TRUE(fp16);
  CalibrationOptions co;
  co.want_gram = [](const std::string& name) { return name != "output"; };
  auto stats = CollectActivationStats(*fp16.ctx, RepeatedText(20), co);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->at("blk.1.down").gram.size(), 128u * 128u);
  EXPECT_EQ(stats->at("blk.1.down").mean_abs.size(), 128u);
  EXPECT_TRUE(stats->at("output").gram.empty());

  // Scored on the calibration text itself: with a text this repetitive the
  // statistics describe nothing else (on other text GPTQ overfits them).
  std::vector<int32_t> tokens = fp16->tokenizer().Encode(RepeatedText(20), false, false);
  tokens.resize(48);
  const Logits ref = LastLogits(*fp16.ctx, tokens);
  LoadOptions o;
  o.precision = Precision::kW4A16;
  o.w4_group = 32;
  o.fp16_layers = {"output"};
  std::map<W4Method, double> error;
  for (W4Method m : {W4Method::kRtn, W4Method::kGptq, W4Method::kAwq, W4Method::kAwqGptq}) {
    o.w4_method = m;
    o.activation_stats = nullptr;
    if (m != W4Method::kRtn) {
      EXPECT_EQ(Model::Load("synthetic:tiny", o).status().code(),
                absl::StatusCode::kFailedPrecondition)
          << W4MethodName(m);
    }
    o.activation_stats = &*stats;
    auto model = LoadOrDie("synthetic:tiny", 2, o);
    ASSERT_TRUE(model);
    const Logits got = LastLogits(*model.ctx, tokens);
    error[m] = RelativeError(got, ref);
    if (m == W4Method::kAwqGptq) {
      const std::string path = ::testing::TempDir() + "/tiny_awq_gptq.pdqq";
      ASSERT_TRUE(model->SaveQuantized(path).ok());
      auto artifact = ReadArtifact(path);
      ASSERT_TRUE(artifact.ok()) << artifact.status();
      EXPECT_EQ(artifact->header.w4_method, "awq+gptq");
      LoadOptions lo;
      lo.quantized_weights = path;
      auto loaded = LoadOrDie("synthetic:tiny", 2, lo);
      ASSERT_TRUE(loaded);
      EXPECT_EQ(LastLogits(*loaded.ctx, tokens).data, got.data);  // the AWQ scales travel too
    }
  }
  // Measured: rtn 0.120, awq 0.095, gptq 0.048, awq+gptq 0.050.
  EXPECT_LT(error[W4Method::kGptq], error[W4Method::kRtn]);
  EXPECT_LT(error[W4Method::kAwqGptq], error[W4Method::kRtn]);
  EXPECT_LT(error[W4Method::kAwq], error[W4Method::kRtn]);
  EXPECT_EQ(ParseW4Method("gptq").value(), W4Method::kGptq);
  EXPECT_EQ(ParseW4Method("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

// The library call a worker makes: `precision` alone gives the measured
// configuration, calibrated on the built-in text.
TEST(QuantizedLoadTest, DefaultsAreTheMeasuredConfigurations) {
  EXPECT_GT(BuiltinCalibrationText().size(), 10000u);
  ThreadPool pool(2);
  const CpuContext cpu{&pool};
  QuantizedLoadOptions o;
  o.precision = Precision::kW8A8;
  o.calibration.max_windows = 2;
  EXPECT_TRUE(NeedsCalibration(o));
  std::vector<std::string> lines;
  o.log = [&](const std::string& line) { lines.push_back(line); };
  auto w8 = LoadQuantizedModel("synthetic:tiny", o, cpu);
  ASSERT_TRUE(w8.ok()) << w8.status();
  EXPECT_EQ((*w8)->options().smooth_alpha, 0.75f);
  EXPECT_TRUE((*w8)->options().fp16_layers.empty());
  EXPECT_EQ((*w8)->options().w8_layers, (std::vector<std::string>{"output", "blk.*.down"}));
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.front().find(std::string(BuiltinCalibrationTextName())), std::string::npos)
      << lines.front();

  QuantizedLoadOptions w4o;
  w4o.precision = Precision::kW4A16;
  EXPECT_FALSE(NeedsCalibration(w4o));
  auto w4 = LoadQuantizedModel("synthetic:tiny", w4o, cpu);
  ASSERT_TRUE(w4.ok()) << w4.status();
  EXPECT_EQ((*w4)->options().w4_group, 32);
  EXPECT_TRUE((*w4)->options().fp16_layers.empty());
  EXPECT_EQ((*w4)->options().w8_layers, (std::vector<std::string>{"output"}));

  // The artifact records all of it.
  const std::string path = ::testing::TempDir() + "/tiny_default_w8a8.pdqq";
  ASSERT_TRUE((*w8)->SaveQuantized(path).ok());
  auto artifact = ReadArtifact(path);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->header.smooth_alpha, 0.75f);
  EXPECT_TRUE(artifact->header.fp16_layers.empty());
  EXPECT_EQ(artifact->header.w8_layers, (std::vector<std::string>{"output", "blk.*.down"}));
  EXPECT_EQ(artifact->header.calibration, std::string(BuiltinCalibrationTextName()));
}

// The second W8A8 load of a model reads its statistics from the cache and
// gets the same weights; a damaged cache file is ignored, never trusted.
TEST(QuantizedLoadTest, CalibrationStatisticsAreCachedBetweenLoads) {
  ThreadPool pool(2);
  const CpuContext cpu{&pool};
  const std::string dir = ::testing::TempDir() + "/pdq_cache_test";
  std::filesystem::remove_all(dir);
  QuantizedLoadOptions o;
  o.precision = Precision::kW8A8;
  o.calibration.max_windows = 2;
  o.cache_dir = dir;
  std::vector<std::string> lines;
  o.log = [&](const std::string& line) { lines.push_back(line); };
  auto first = LoadQuantizedModel("synthetic:tiny", o, cpu);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("calibrated in"), std::string::npos) << lines.back();
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);

  lines.clear();
  auto second = LoadQuantizedModel("synthetic:tiny", o, cpu);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("from " + files[0].string()), std::string::npos) << lines[0];
  Context a(**first, cpu), b(**second, cpu);
  const std::vector<int32_t> tokens = Tokens(20, 384, 3);
  EXPECT_EQ(LastLogits(a, tokens).data, LastLogits(b, tokens).data);

  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << "PDQSTAT1 damaged";
  lines.clear();
  auto third = LoadQuantizedModel("synthetic:tiny", o, cpu);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("ignoring the calibration cache"), std::string::npos) << lines[0];
  Context c(**third, cpu);
  EXPECT_EQ(LastLogits(c, tokens).data, LastLogits(a, tokens).data);
  EXPECT_TRUE(LoadActivationStats(files[0].string()).ok());  // rewritten whole

  // Another text is another key.
  o.calibration_text = testing::RepeatedText(30);
  ASSERT_TRUE(LoadQuantizedModel("synthetic:tiny", o, cpu).ok());
  files.clear();
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 2u);
}

TEST(QuantizedLoadTest, BadOptionsNameTheOption) {
  ThreadPool pool(1);
  QuantizedLoadOptions o;
  o.precision = Precision::kW4A16;
  o.w4_group = 48;
  auto r = LoadQuantizedModel("synthetic:tiny", o, CpuContext{&pool});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "w4_group")) << r.status();
  o.w4_group = 0;
  o.w4_method = W4Method::kGptq;
  o.calibration_text = "";
  r = LoadQuantizedModel("synthetic:tiny", o, CpuContext{&pool});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("calibration text"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace pdq
