// Deterministic random models of named shapes ("synthetic:NAME"), for tests
// and for benchmarking shapes larger than the shipped model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "tokenizer/tokenizer.h"

namespace pdq {

// Names accepted after "synthetic:".
std::vector<std::string> SyntheticModelNames();
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name);
// A byte-level tokenizer (256 byte tokens, ChatML specials, padding tokens),
// and its spec (for tests that write it into a GGUF file).
TokenizerSpec SyntheticTokenizerSpec(int vocab_size);
absl::StatusOr<std::unique_ptr<Tokenizer>> SyntheticTokenizer(int vocab_size);
// n values uniform in [-scale, scale], a pure function of (name, n, scale).
std::vector<float> SyntheticTensor(const std::string& name, int64_t n, float scale);

}  // namespace pdq
