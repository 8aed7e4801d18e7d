// GGUF reader: metadata and tensor table on built images, every malformed
// variant rejected with a clear error, and the real SmolLM2 file.
#include "gguf/gguf.h"

#include <cstdlib>
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "tests/gguf_builder.h"
#include "tests/test_paths.h"

namespace pdq {
namespace {

std::string SmallImage() {
  testing::GgufBuilder b;
  b.AddString("general.architecture", "llama");
  b.AddU32("llama.block_count", 2);
  b.AddF32("llama.rope.freq_base", 10000.0f);
  b.AddBool("tokenizer.ggml.add_bos_token", true);
  b.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  b.AddI32Array("tokenizer.ggml.token_type", {1, 1, 3});
  std::string f32(4 * 8, '\0');
  for (int i = 0; i < 8; ++i) {
    float v = (float)i;
    std::memcpy(&f32[4 * i], &v, 4);
  }
  b.AddTensor("w", /*F32*/ 0, {4, 2}, f32);
  b.AddTensor("q", /*Q8_0*/ 8, {32}, std::string(34, '\1'));
  return b.Build();
}

TEST(GgufTest, ReadsMetadataAndTensorTable) {
  auto file = GgufFile::FromBuffer(SmallImage());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->GetInt("llama.block_count"), 2);
  EXPECT_DOUBLE_EQ(*(*file)->GetFloat("llama.rope.freq_base"), 10000.0);
  EXPECT_TRUE(*(*file)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*(*file)->GetStringArray("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab"}));
  EXPECT_EQ(*(*file)->GetIntArray("tokenizer.ggml.token_type"),
            (std::vector<int64_t>{1, 1, 3}));
  const GgufTensor* w = (*file)->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type, GgmlType::kF32);
  EXPECT_EQ(w->num_elements(), 8);
  EXPECT_EQ(w->num_rows(), 2);
  EXPECT_EQ(w->nbytes, 32u);
  float v5;
  std::memcpy(&v5, w->data + 20, 4);
  EXPECT_EQ(v5, 5.0f);
  EXPECT_EQ((*file)->FindTensor("q")->nbytes, 34u);
  EXPECT_EQ((*file)->FindTensor("missing"), nullptr);
}

TEST(GgufTest, TypedAccessorsReportMissingAndMismatchedKeys) {
  auto file = GgufFile::FromBuffer(SmallImage());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->GetInt("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*file)->GetInt("general.architecture").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*file)->GetStringArray("tokenizer.ggml.token_type").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GgufTest, RejectsEveryTruncation) {
  const std::string image = SmallImage();
  for (size_t len = 0; len < image.size(); ++len) {
    auto file = GgufFile::FromBuffer(std::string_view(image.data(), len));
    EXPECT_FALSE(file.ok()) << "prefix of " << len << " bytes parsed";
  }
}

TEST(GgufTest, RejectsBadMagicAndVersion) {
  std::string image = SmallImage();
  image[0] = 'X';
  auto bad_magic = GgufFile::FromBuffer(image);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().message().find("magic"), std::string::npos);

  testing::GgufBuilder b;
  auto v1 = GgufFile::FromBuffer(b.Build(/*version=*/1));
  ASSERT_FALSE(v1.ok());
  EXPECT_NE(v1.status().message().find("version 1"), std::string::npos);
}

TEST(GgufTest, RejectsUnsupportedTensorType) {
  testing::GgufBuilder b;
  b.AddTensor("w", /*Q2_K*/ 10, {256}, std::string(84, '\0'));
  auto file = GgufFile::FromBuffer(b.Build());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("Q2_K"), std::string::npos) << file.status();
}

TEST(GgufTest, RejectsPartialBlockRowsAndDuplicateNames) {
  testing::GgufBuilder partial;
  partial.AddTensor("w", /*Q4_0*/ 2, {16}, std::string(18, '\0'));
  EXPECT_FALSE(GgufFile::FromBuffer(partial.Build()).ok());

  testing::GgufBuilder dup;
  dup.AddTensor("w", 0, {1}, std::string(4, '\0'));
  dup.AddTensor("w", 0, {1}, std::string(4, '\0'));
  EXPECT_FALSE(GgufFile::FromBuffer(dup.Build()).ok());
}

// Random byte flips must give a clean error or a consistent file, never a
// crash (the libFuzzer target explores this far more widely).
TEST(GgufTest, SurvivesRandomCorruption) {
  const std::string image = SmallImage();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string mutated = image;
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) mutated[rng() % mutated.size()] = (char)(rng() & 0xff);
    auto file = GgufFile::FromBuffer(mutated);
    if (file.ok()) {
      for (const GgufTensor& t : (*file)->tensors()) {
        ASSERT_LE(t.offset + t.nbytes, mutated.size()) << t.name;
      }
    }
  }
}

TEST(GgufTest, MissingFileIsNotFound) {
  auto file = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

TEST(GgufTest, OpensSmolLm2) {
  const std::string path = testing::ModelPath();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found at " << path << " (run make model)";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->GetInt("llama.block_count"), 30);
  EXPECT_EQ((*file)->tensors().size(), 272u);
  const GgufTensor* embd = (*file)->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
}

}  // namespace
}  // namespace pdq
