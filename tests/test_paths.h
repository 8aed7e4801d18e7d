// Where tests find the default model and the evaluation text; both may be
// absent, and tests that need them skip with a message saying so.
#pragma once

#include <cstdlib>
#include <string>

namespace pdq::testing {

inline std::string ModelPath() {
  const char* env = std::getenv("PDQ_MODEL");
  return env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline std::string WikiTextPath() {
  const char* env = std::getenv("PDQ_WIKITEXT");
  return env ? env : "../shared/data/wikitext-2-raw/wiki.test.raw";
}

}  // namespace pdq::testing
