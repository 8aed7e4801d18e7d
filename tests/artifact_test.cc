// Quantized weight artifacts: round trips give identical logits; another
// model's, corrupt and unknown artifacts are refused with clear messages.
#include "quant/artifact.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace pdq {
namespace {

using testing::LastLogits;
using testing::LoadOrDie;
using testing::Tokens;

class ArtifactTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ArtifactTest, RoundTripGivesTheSameLogits) {
  const std::string path = ::testing::TempDir() + "/tiny_" + GetParam() + ".pdqq";
  auto quantized = LoadOrDie("synthetic:tiny@" + GetParam());
  ASSERT_TRUE(quantized);
  ASSERT_TRUE(quantized->SaveQuantized(path).ok());
  LoadOptions o;
  o.quantized_weights = path;
  auto loaded = LoadOrDie("synthetic:tiny", 2, o);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(PrecisionName(loaded->precision()), GetParam());
  auto tokens = Tokens(12, 384, 9);
  const Logits want = LastLogits(*quantized.ctx, tokens);
  ASSERT_FALSE(want.data.empty());
  EXPECT_EQ(want.data, LastLogits(*loaded.ctx, tokens).data);
}

INSTANTIATE_TEST_SUITE_P(Schemes, ArtifactTest, ::testing::Values("w4a16", "w8a8"));

TEST(ArtifactErrorsTest, WrongModelCorruptFileAndUnknownSchemeAreRejected) {
  const std::string path = ::testing::TempDir() + "/tiny_errors.pdqq";
  auto quantized = LoadOrDie("synthetic:tiny@w4a16");
  ASSERT_TRUE(quantized);
  ASSERT_TRUE(quantized->SaveQuantized(path).ok());
  LoadOptions o;
  o.quantized_weights = path;

  auto other = Model::Load("synthetic:tiny-qwen2", o);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("another model"), std::string::npos) << other.status();

  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated_path = path + ".truncated";
  std::ofstream(truncated_path, std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  o.quantized_weights = truncated_path;
  auto truncated = Model::Load("synthetic:tiny", o);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument) << truncated.status();

  std::string unknown = bytes;
  const size_t at = unknown.find("\"w4a16\"");
  ASSERT_NE(at, std::string::npos);
  unknown.replace(at, 7, "\"w9a9x\"");
  const std::string unknown_path = path + ".unknown";
  std::ofstream(unknown_path, std::ios::binary) << unknown;
  o.quantized_weights = unknown_path;
  auto bad_scheme = Model::Load("synthetic:tiny", o);
  ASSERT_FALSE(bad_scheme.ok());
  EXPECT_NE(bad_scheme.status().message().find("unknown scheme 'w9a9x'"), std::string::npos)
      << bad_scheme.status();

  const std::string junk_path = path + ".junk";
  std::ofstream(junk_path) << "not an artifact";
  o.quantized_weights = junk_path;
  EXPECT_EQ(Model::Load("synthetic:tiny", o).status().code(), absl::StatusCode::kInvalidArgument);

  auto fp16 = LoadOrDie("synthetic:tiny");
  EXPECT_EQ(fp16->SaveQuantized(path + ".fp16").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pdq
