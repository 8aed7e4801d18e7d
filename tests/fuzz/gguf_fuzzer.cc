// libFuzzer target for the GGUF parser and everything a model load reads
// from metadata: any input must give a clean Status, never a crash.
// Build and run with `make fuzz` (needs clang).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gguf/gguf.h"
#include "gguf/gguf_dequant.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = pdq::GgufFile::FromBuffer(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  for (const pdq::GgufTensor& t : (*file)->tensors()) {
    // Dequantize the first row of each tensor: the parser promised its bytes exist.
    std::vector<float> row(t.row_length());
    (void)pdq::DequantizeRow(t.type, t.data, row.data(), t.row_length());
  }
  auto tok = pdq::Tokenizer::FromGguf(**file);
  if (tok.ok()) (void)(*tok)->Encode("fuzz <|im_start|> 123", true, true);
  return 0;
}
