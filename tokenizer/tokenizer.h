// The tokenizers of GGUF models: byte-level BPE (GPT-2 family: SmolLM2,
// Llama 3, Qwen2, ...) and SentencePiece BPE (Llama 2, Mistral 7B, Phi-3,
// Gemma), built from a GGUF vocabulary, plus chat templating and UTF-8-safe
// streaming decode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdq {

class GgufFile;

// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerSpec {
  // "gpt2": byte-level BPE, tokens are GPT-2 byte-to-unicode encoded strings
  // merged by `merges`. "llama": SentencePiece BPE, tokens are text with
  // U+2581 for spaces (and <0xXX> byte tokens), merged by `scores`.
  std::string model = "gpt2";
  std::vector<std::string> tokens;
  std::vector<TokenType> types;     // empty: all normal
  std::vector<std::string> merges;  // gpt2: "left right", highest priority first
  std::vector<float> scores;        // llama: per token; the higher merges first
  bool add_space_prefix = true;     // llama: a space before the text (and after control tokens)
  std::string pre = "gpt2";         // gpt2's pre-tokenizer: gpt2, smollm, llama-bpe, qwen2
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> eog_ids;  // extra end-of-generation ids (e.g. <|im_end|>)
  bool add_bos = false;
  std::string chat_template;  // Jinja source from the GGUF; used to pick a format
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file. InvalidArgument when the model is
  // neither byte-level BPE ("gpt2") nor SentencePiece BPE ("llama"), or the
  // pre-tokenizer is unknown.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSpec(TokenizerSpec spec);
  ~Tokenizer();

  // Encodes UTF-8 text. With parse_special, control/user-defined tokens that
  // appear literally in the text ("<|im_start|>") become their ids. Adds BOS
  // first when add_bos and the vocabulary has one. Invalid UTF-8 bytes are
  // encoded as their byte tokens, never dropped.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const;
  // Encodes text that continues an earlier one (a solution after its
  // prompt): no BOS, no special tokens, and no SentencePiece dummy-prefix
  // space, which would put a token at the join that the model never sees.
  std::vector<int32_t> EncodeContinuation(std::string_view text) const;

  // Raw bytes a token stands for (control tokens give their text, e.g.
  // "<|im_end|>"). InvalidArgument when id is outside [0, vocab_size()).
  absl::StatusOr<std::string> TokenBytes(int32_t id) const;
  // Concatenated bytes of `ids`; may end inside a UTF-8 sequence.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

  // Renders messages with the model's chat template (ChatML for SmolLM2 and
  // Qwen2, the Llama 3 header format, Llama 2's and Mistral's [INST] turns,
  // Gemma's turns, Phi-3's tags), the formats llama.cpp recognizes. With add_generation_prompt the
  // text ends where the assistant's reply begins.
  absl::StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  bool add_bos() const;
  // True for EOS and the other end-of-generation tokens (<|im_end|>, <|eot_id|>).
  bool IsEndOfGeneration(int32_t id) const;
  // Id of an exact token string, or -1.
  int32_t TokenId(std::string_view token) const;
  // A stable hash of the vocabulary, merges, special ids and pre-tokenizer:
  // equal exactly when two tokenizers turn text into the same ids.
  uint64_t fingerprint() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text chunks that never split a UTF-8
// character; bytes of an unfinished character wait for the next token.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Returns the complete characters now available (possibly empty).
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns what is left; an unfinished character becomes U+FFFD.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace pdq
