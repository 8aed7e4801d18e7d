// Tokenizer: BPE merge order, special tokens, byte safety and streaming decode
// on a tiny vocabulary, and exact ids on SmolLM2 against HF `tokenizers`.
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/check.h"
#include "gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/gguf_builder.h"
#include "tests/spm_reference.h"
#include "tests/test_paths.h"

namespace pdq {
namespace {

bool Contains(const absl::Status& status, const std::string& part) {
  return std::string(status.message()).find(part) != std::string::npos;
}

// GPT-2 bytes_to_unicode, written out independently of the implementation.
std::string ByteToken(uint8_t b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// All 256 byte tokens (id == byte), then extra tokens appended by the caller.
TokenizerSpec ByteSpec() {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteToken(static_cast<uint8_t>(b)));
  return spec;
}

int32_t AddToken(TokenizerSpec& spec, const std::string& text,
                 TokenType type = TokenType::kNormal) {
  if (spec.types.empty() && type != TokenType::kNormal) {
    spec.types.assign(spec.tokens.size(), TokenType::kNormal);
  }
  spec.tokens.push_back(text);
  if (!spec.types.empty()) spec.types.push_back(type);
  return static_cast<int32_t>(spec.tokens.size() - 1);
}

std::unique_ptr<Tokenizer> Build(TokenizerSpec spec) {
  auto tok = Tokenizer::FromSpec(std::move(spec));
  PDQ_CHECK(tok.ok());
  return std::move(*tok);
}

std::string DecodeOrDie(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  auto text = tok.Decode(ids);
  PDQ_CHECK(text.ok());
  return *text;
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(TokenizerTest, MergesLowestRankFirst) {
  TokenizerSpec spec = ByteSpec();
  const int32_t ab = AddToken(spec, "ab");
  const int32_t bc = AddToken(spec, "bc");
  TokenizerSpec other = spec;
  spec.merges = {"b c", "a b"};
  other.merges = {"a b", "b c"};
  EXPECT_EQ(Build(spec)->Encode("abc", false, false), (std::vector<int32_t>{'a', bc}));
  EXPECT_EQ(Build(other)->Encode("abc", false, false), (std::vector<int32_t>{ab, 'c'}));
}

TEST(TokenizerTest, MergesChainAndTieBreakLeftmost) {
  TokenizerSpec spec = ByteSpec();
  const int32_t aa = AddToken(spec, "aa");
  const int32_t aaaa = AddToken(spec, "aaaa");
  const int32_t sp_a = AddToken(spec, ByteToken(' ') + "a");
  spec.merges = {"a a", "aa aa", ByteToken(' ') + " a"};
  auto tok = Build(spec);
  // Equal-rank pairs merge left to right: "aaa" is "aa"+"a", not "a"+"aa".
  EXPECT_EQ(tok->Encode("aaa", false, false), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok->Encode("aaaaa", false, false), (std::vector<int32_t>{aaaa, 'a'}));
  // The gpt2 regex keeps a leading space with the word: " a" and " aa" pieces.
  EXPECT_EQ(tok->Encode("a a", false, false), (std::vector<int32_t>{'a', sp_a}));
}

TEST(TokenizerTest, ParsesSpecialTokensLongestFirst) {
  TokenizerSpec spec = ByteSpec();
  const int32_t start = AddToken(spec, "<|im_start|>", TokenType::kControl);
  const int32_t sp = AddToken(spec, "<sp>", TokenType::kUserDefined);
  const int32_t sp_long = AddToken(spec, "<sp>long", TokenType::kControl);
  spec.bos_id = start;
  auto tok = Build(spec);
  std::vector<int32_t> want = {start};
  for (int32_t id : Bytes("hi")) want.push_back(id);
  want.push_back(sp_long);
  want.push_back(sp);
  want.push_back('x');
  EXPECT_EQ(tok->Encode("<|im_start|>hi<sp>long<sp>x", false, true), want);
  // Without parse_special the markers are plain text and round-trip.
  const std::vector<int32_t> plain = tok->Encode("<|im_start|>hi", false, false);
  EXPECT_EQ(plain, Bytes("<|im_start|>hi"));
  EXPECT_EQ(DecodeOrDie(*tok, plain), "<|im_start|>hi");
  EXPECT_EQ(*tok->TokenBytes(start), "<|im_start|>");
  EXPECT_EQ(tok->Encode("x", true, false), (std::vector<int32_t>{start, 'x'}));
}

TEST(TokenizerTest, InvalidUtf8RoundTripsBytesExactly) {
  auto tok = Build(ByteSpec());
  const std::string inputs[] = {
      std::string("a\xff") + "b",
      std::string("caf\xc3"),                  // truncated 2-byte sequence
      std::string("\xe2\x82 x \xed\xa0\x80"),  // truncated, then a surrogate
      std::string("\xf4\x90\x80\x80 \xc0\xaf \x80\x80"),
      std::string("ok \xf0\x9f\x98\x80 \xf0\x9f\x98 end\n\n"),
      std::string("\0mid\0", 5),
  };
  for (const std::string& s : inputs) {
    const std::vector<int32_t> ids = tok->Encode(s, false, true);
    EXPECT_EQ(ids, Bytes(s));
    EXPECT_EQ(DecodeOrDie(*tok, ids), s);
  }
}

TEST(TokenizerTest, LongRunsEncodeWithoutBlowup) {
  TokenizerSpec spec = ByteSpec();
  AddToken(spec, "aa");
  AddToken(spec, ByteToken(' ') + ByteToken(' '));
  spec.merges = {"a a", ByteToken(' ') + " " + ByteToken(' ')};
  auto tok = Build(spec);
  const std::string text =
      std::string(200000, ' ') + std::string(200000, 'a') + "\n" + std::string(100000, '\n');
  EXPECT_EQ(DecodeOrDie(*tok, tok->Encode(text, false, true)), text);
}

TEST(TokenizerTest, StreamingWaitsForWholeCharacters) {
  auto tok = Build(ByteSpec());
  StreamingDetokenizer stream(*tok);
  EXPECT_EQ(*stream.Push('a'), "a");
  EXPECT_EQ(*stream.Push(0xC3), "");
  EXPECT_EQ(*stream.Push(0xA9), "\xc3\xa9");  // é
  const std::string emoji = "\xf0\x9f\x98\x80";
  EXPECT_EQ(*stream.Push(0xF0), "");
  EXPECT_EQ(*stream.Push(0x9F), "");
  EXPECT_EQ(*stream.Push(0x98), "");
  EXPECT_EQ(*stream.Push(0x80), emoji);
  EXPECT_EQ(stream.Finish(), "");
}

TEST(TokenizerTest, StreamingReplacesInvalidBytes) {
  auto tok = Build(ByteSpec());
  StreamingDetokenizer stream(*tok);
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(*stream.Push(0xFF), fffd);
  EXPECT_EQ(*stream.Push(0xC3), "");
  EXPECT_EQ(*stream.Push('x'), fffd + "x");  // the lead byte can never complete
  EXPECT_EQ(*stream.Push(0xE2), "");
  EXPECT_EQ(*stream.Push(0x82), "");
  EXPECT_EQ(stream.Finish(), fffd);  // flushed unfinished character
  EXPECT_EQ(*stream.Push('y'), "y");
  EXPECT_FALSE(stream.Push(100000).ok());
}

TEST(TokenizerTest, RejectsBadSpecs) {
  TokenizerSpec pre = ByteSpec();
  pre.pre = "klingon";
  auto s = Tokenizer::FromSpec(pre);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status(), "klingon")) << s.status();

  TokenizerSpec merges = ByteSpec();
  AddToken(merges, "ab");
  merges.merges = {"a b", "ab", "a b c"};
  s = Tokenizer::FromSpec(merges);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status(), "merge 1 ")) << s.status();

  TokenizerSpec bos = ByteSpec();
  bos.bos_id = 256;
  EXPECT_EQ(Tokenizer::FromSpec(bos).status().code(), absl::StatusCode::kInvalidArgument);

  TokenizerSpec types = ByteSpec();
  types.types = {TokenType::kNormal};
  EXPECT_EQ(Tokenizer::FromSpec(types).status().code(), absl::StatusCode::kInvalidArgument);

  auto tok = Build(ByteSpec());
  EXPECT_EQ(tok->TokenBytes(256).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->TokenBytes(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tok->Decode({1, 2, 999}).ok());
}

TEST(TokenizerTest, OtherPreTokenizersSplitAsSpecified) {
  // With only byte tokens the ids are the bytes for any split; the split
  // shows through when a merge crosses a piece boundary.
  for (const char* pre : {"gpt2", "smollm", "llama-bpe", "qwen2", "default"}) {
    TokenizerSpec spec = ByteSpec();
    spec.pre = pre;
    const int32_t d12 = AddToken(spec, "12");
    spec.merges = {"1 2"};
    auto tok = Build(spec);
    const std::vector<int32_t> ids = tok->Encode("x12", false, false);
    const bool split_digits = std::string(pre) == "smollm" || std::string(pre) == "qwen2";
    EXPECT_EQ(ids, split_digits ? Bytes("x12") : (std::vector<int32_t>{'x', d12})) << pre;
    const std::string text = "Hello, WORLD'S 1234567 \r\n\n  x\t\xce\xb1\xce\xb2 \xff!";
    EXPECT_EQ(DecodeOrDie(*tok, tok->Encode(text, false, true)), text) << pre;
  }
}

TEST(TokenizerTest, Llama3SkipsMergesForWholeTokens) {
  // Ranks make BPE build "ab"+"c"; llama-bpe takes the whole-word token.
  TokenizerSpec spec = ByteSpec();
  spec.pre = "llama-bpe";
  const int32_t ab = AddToken(spec, "ab");
  const int32_t abc = AddToken(spec, "abc");
  spec.merges = {"a b"};
  auto tok = Build(spec);
  EXPECT_EQ(tok->Encode("abc", false, false), (std::vector<int32_t>{abc}));
  EXPECT_EQ(tok->Encode("abd", false, false), (std::vector<int32_t>{ab, 'd'}));
}

TEST(TokenizerTest, RendersChatFormats) {
  // The messages rendered with a byte vocabulary carrying `tmpl`.
  auto render = [](const std::string& tmpl, const std::vector<ChatMessage>& messages) {
    TokenizerSpec spec = ByteSpec();
    spec.chat_template = tmpl;
    return Build(spec)->ApplyChatTemplate(messages, true);
  };
  const std::vector<ChatMessage> chat = {{"user", "Hi"}};
  EXPECT_EQ(*render("", chat), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  const std::vector<ChatMessage> two = {{"system", "Be brief."}, {"user", " Hi \n"}};
  EXPECT_EQ(*render("{% set content = '<|start_header_id|>' + message['role'] + "
                    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}",
                    two),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  // Gemma: "model" turns, trimmed contents, no system turn (it opens the
  // first user turn).
  const std::vector<ChatMessage> dialogue = {
      {"system", "Be brief."}, {"user", " Hi \n"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(*render("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                    "'<end_of_turn>\\n' }}",
                    dialogue),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  // Phi-3: a tag per role, each turn closed by <|end|>.
  EXPECT_EQ(
      *render(
          "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
          "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' "
          "+ "
          "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
          "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif "
          "%}",
          two),
      "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi \n<|end|>\n<|assistant|>\n");

  // Zephyr's tags look like Phi-3's but its turns end with </s>: not Phi-3.
  EXPECT_EQ(
      render("{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
             "message['content'] + eos_token }}{% endif %}{% endfor %}{{ '<|assistant|>' }}",
             chat)
          .status()
          .code(),
      absl::StatusCode::kUnimplemented);

  // The [INST] family, read off the template as llama.cpp reads it.
  const std::vector<ChatMessage> turns = {
      {"system", "Be brief."}, {"user", " Hi "}, {"assistant", " Hello. "}, {"user", "Bye"}};
  // Llama 2's official template: <<SYS>> in the first turn, contents stripped.
  EXPECT_EQ(*render("{% if messages[0]['role'] == 'system' %}... '<<SYS>>\\n' + system_message ..."
                    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
                    turns),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  // A bare [INST] template: no system tags, nothing stripped.
  EXPECT_EQ(*render("{{ bos_token }}[INST] {{ message }} [/INST]", turns),
            "[INST] Be brief.\n Hi  [/INST] Hello. </s>[INST] Bye [/INST]");
  // Mistral v1, v3 and v7.
  EXPECT_EQ(*render("{{ bos_token }}... ' [INST] ' + system_message ...", turns),
            " [INST] Be brief.\n\n Hi  [/INST]  Hello. </s> [INST] Bye [/INST]");
  EXPECT_EQ(*render("{{ bos_token }}[AVAILABLE_TOOLS] ... '[INST]' ...", turns),
            "[INST] Be brief.\n\n Hi [/INST] Hello.</s>[INST] Bye[/INST]");
  EXPECT_EQ(
      *render("[SYSTEM_PROMPT] ... [INST] ...", turns),
      "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST]  Hi [/INST]  Hello. </s>[INST] Bye[/INST]");

  EXPECT_EQ(render("### Instruction:\n{{ message }}\n### Response:", chat).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(TokenizerTest, ReadsGgufMetadata) {
  TokenizerSpec base = ByteSpec();
  std::vector<std::string> tokens = base.tokens;
  tokens.push_back("ab");
  tokens.push_back("<|im_end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  testing::GgufBuilder b;
  b.AddString("tokenizer.ggml.model", "gpt2");
  b.AddString("tokenizer.ggml.pre", "smollm");
  b.AddStringArray("tokenizer.ggml.tokens", tokens);
  b.AddI32Array("tokenizer.ggml.token_type", types);
  b.AddStringArray("tokenizer.ggml.merges", {"a b"});
  b.AddU32("tokenizer.ggml.bos_token_id", 'B');
  b.AddU32("tokenizer.ggml.eos_token_id", 'E');
  auto file = GgufFile::FromBuffer(b.Build());
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 258);
  EXPECT_EQ((*tok)->bos_id(), 'B');
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_TRUE((*tok)->IsEndOfGeneration('E'));
  EXPECT_TRUE((*tok)->IsEndOfGeneration(257));
  EXPECT_FALSE((*tok)->IsEndOfGeneration('a'));
  EXPECT_EQ((*tok)->TokenId("ab"), 256);
  EXPECT_EQ((*tok)->Encode("ab<|im_end|>", false, true), (std::vector<int32_t>{256, 257}));

  testing::GgufBuilder bert;
  bert.AddString("tokenizer.ggml.model", "bert");
  bert.AddStringArray("tokenizer.ggml.tokens", tokens);
  auto bert_file = GgufFile::FromBuffer(bert.Build());
  ASSERT_TRUE(bert_file.ok());
  auto bad = Tokenizer::FromGguf(**bert_file);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status(), "unsupported tokenizer model 'bert'")) << bad.status();
}

// Phi-3's <|end|> closes a turn where it is a control token, but not in a
// harmony vocabulary (which has <|return|>) or as plain text.
TEST(TokenizerTest, EndTokenEndsGenerationOnlyAsPhi3sControlToken) {
  auto load = [](const std::vector<std::pair<std::string, int>>& extra) {
    std::vector<std::string> tokens = ByteSpec().tokens;
    std::vector<int32_t> types(tokens.size(), 1);
    for (const auto& [text, type] : extra) tokens.push_back(text), types.push_back(type);
    testing::GgufBuilder b;
    b.AddString("tokenizer.ggml.model", "gpt2");
    b.AddStringArray("tokenizer.ggml.tokens", tokens);
    b.AddI32Array("tokenizer.ggml.token_type", types);
    b.AddStringArray("tokenizer.ggml.merges", {});
    auto file = GgufFile::FromBuffer(b.Build());
    EXPECT_TRUE(file.ok());
    auto tok = Tokenizer::FromGguf(**file);
    EXPECT_TRUE(tok.ok()) << tok.status();
    return std::move(*tok);
  };
  EXPECT_TRUE(load({{"<|end|>", 3}})->IsEndOfGeneration(256));
  EXPECT_FALSE(load({{"<|end|>", 1}})->IsEndOfGeneration(256));
  EXPECT_FALSE(load({{"<|end|>", 3}, {"<|return|>", 3}})->IsEndOfGeneration(256));
}

// SentencePiece BPE against the sentencepiece library itself: a model it
// trained (tests/reference/make_spm_reference.py), its vocabulary and
// scores as GGUF stores them, and the ids it gives for each string.
TokenizerSpec SpmSpec() {
  TokenizerSpec spec;
  spec.model = "llama";
  for (size_t i = 0; i < std::size(testing::kSpmPieces); ++i) {
    spec.tokens.push_back(testing::kSpmPieces[i]);
    spec.scores.push_back(testing::kSpmScores[i]);
    spec.types.push_back(static_cast<TokenType>(testing::kSpmTypes[i]));
  }
  spec.bos_id = testing::kSpmBos;
  spec.eos_id = testing::kSpmEos;
  return spec;
}

TEST(TokenizerTest, SentencePieceMatchesTheSentencepieceLibrary) {
  auto tok = Build(SpmSpec());
  for (const testing::SpmCase& c : testing::kSpmCases) {
    EXPECT_EQ(tok->Encode(c.text, false, false), c.ids) << c.text;
    // Decoding gives the text back, after the dummy-prefix space.
    EXPECT_EQ(DecodeOrDie(*tok, c.ids), std::string(" ") + c.text) << c.text;
  }
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  EXPECT_EQ(tok->Encode("", true, false), (std::vector<int32_t>{testing::kSpmBos}));
  // A control token in the text, with parse_special: the text after it gets
  // its own leading space, as llama.cpp does.
  const std::vector<int32_t> hello = tok->Encode("GNU", false, false);
  std::vector<int32_t> want = {testing::kSpmBos};
  want.insert(want.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok->Encode("<s>GNU", false, true), want);
  // A continuation gets no dummy prefix: "GNU" then " is" encode as "GNU is".
  std::vector<int32_t> joined = tok->Encode("GNU", false, false);
  const std::vector<int32_t> rest = tok->EncodeContinuation(" is");
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(DecodeOrDie(*tok, joined), " GNU is");
  EXPECT_EQ(joined, tok->Encode("GNU is", false, false));
  // A SentencePiece file without a chat template is not taken for ChatML
  // (Llama 2 and Mistral conversions often carry none).
  EXPECT_EQ(tok->ApplyChatTemplate({{"user", "Hi"}}, true).status().code(),
            absl::StatusCode::kUnimplemented);
  // Without the dummy prefix no space is added.
  TokenizerSpec bare = SpmSpec();
  bare.add_space_prefix = false;
  EXPECT_EQ(DecodeOrDie(*Build(bare), Build(bare)->Encode("GNU is", false, false)), "GNU is");
  EXPECT_NE(Build(bare)->fingerprint(), tok->fingerprint());
  TokenizerSpec rescored = SpmSpec();
  std::swap(rescored.scores[300], rescored.scores[301]);
  EXPECT_NE(Build(rescored)->fingerprint(), tok->fingerprint());
}

TEST(TokenizerTest, SentencePieceFromGguf) {
  const TokenizerSpec spec = SpmSpec();
  std::vector<int32_t> types;
  for (TokenType t : spec.types) types.push_back(static_cast<int32_t>(t));
  testing::GgufBuilder b;
  b.AddString("tokenizer.ggml.model", "llama");
  b.AddStringArray("tokenizer.ggml.tokens", spec.tokens);
  b.AddF32Array("tokenizer.ggml.scores", spec.scores);
  b.AddI32Array("tokenizer.ggml.token_type", types);
  b.AddU32("tokenizer.ggml.bos_token_id", testing::kSpmBos);
  b.AddU32("tokenizer.ggml.eos_token_id", testing::kSpmEos);
  b.AddBool("tokenizer.ggml.add_bos_token", true);
  auto file = GgufFile::FromBuffer(b.Build());
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE((*tok)->add_bos());
  std::vector<int32_t> want = {testing::kSpmBos};
  const std::vector<int32_t>& ids = testing::kSpmCases[0].ids;
  want.insert(want.end(), ids.begin(), ids.end());
  EXPECT_EQ((*tok)->Encode(testing::kSpmCases[0].text, true, false), want);

  // Scores that do not match the vocabulary are refused.
  TokenizerSpec short_scores = SpmSpec();
  short_scores.scores.pop_back();
  EXPECT_EQ(Tokenizer::FromSpec(short_scores).status().code(), absl::StatusCode::kInvalidArgument);
  testing::GgufBuilder no_scores;
  no_scores.AddString("tokenizer.ggml.model", "llama");
  no_scores.AddStringArray("tokenizer.ggml.tokens", spec.tokens);
  auto ns = GgufFile::FromBuffer(no_scores.Build());
  ASSERT_TRUE(ns.ok());
  EXPECT_FALSE(Tokenizer::FromGguf(**ns).ok());
}

struct ReferenceCase {
  std::string text;
  std::vector<int32_t> ids;
};

// Generated by tests/reference/make_tokenizer_reference.py
const ReferenceCase kSmolLmCases[] = {
    {"Hello world", {19556, 905}},
    {"The quick brown fox jumps over the lazy dog.",
     {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}},
    {" leading space", {2899, 1898}},
    {"trailing space ", {4861, 4966, 1898, 216}},
    {"multiple   spaces   here", {30404, 256, 5600, 256, 1535}},
    {"   ", {333}},
    {"line one\012line two", {1311, 582, 198, 1311, 827}},
    {"para one\012\012para two\012", {39879, 582, 198, 198, 39879, 827, 198}},
    {"\011 tabs\011and\015\012CRLF", {197, 29416, 197, 397, 201, 198, 9088, 60, 54}},
    {"12345", {33, 34, 35, 36, 37}},
    {"pi is 3.14, not 3.15!", {9020, 314, 216, 35, 30, 33, 36, 28, 441, 216, 35, 30, 33, 37, 17}},
    {"Wait... what?!?! (yes) [no] {maybe} --> ok;",
     {33359, 2026, 732, 17593, 17593, 365, 10407, 25, 933, 4607, 77, 1662, 27066, 109, 29255, 10907,
      43}},
    {"don't I'll we're they've she'd it's I'm",
     {12420, 982, 339, 3060, 392, 2316, 502, 3543, 1041, 6737, 357, 506, 339, 5248}},
    {"DON'T I'LL", {52, 2154, 23, 68, 339, 23, 16421}},
    {"na\303\257ve caf\303\251 r\303\251sum\303\251", {3546, 46494, 37366, 412, 2756, 5422, 2756}},
    {"\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203"
     "\210\343\200\201\344\270\255\346\226\207\346\226\207\346\234\254",
     {23274, 115,   40993, 179,   120, 248,   26453, 11100, 224,   10391,
      251,   10391, 134,   11100, 226, 29917, 28589, 29184, 29184, 40993}},
    {"emoji: \360\237\230\200\360\237\216\211 and \360\237\221\215\360\237\217\275 family "
     "\360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247",
     {391,  33777, 42,  40303, 218, 10813, 232,   227, 284, 15107, 235, 231,   10813, 233, 138,
      1564, 15107, 235, 118,   321, 231,   10813, 235, 119, 321,   231, 10813, 235,   117}},
    {"def f(x):\012    return x ** 2  # square\012",
     {1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 216, 907, 5222, 198}},
    {"<|im_start|>user\012Hi<|im_end|>\012<|im_start|>assistant\012",
     {1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198}},
    {"a\302\240b\343\200\200c", {81, 15442, 82, 12109, 218, 83}},
    {"\331\241\331\242\331\243 \342\205\253 \302\275",
     {164, 111, 164, 112, 164, 113, 216, 173, 223, 121, 216, 16738}},
};
constexpr size_t kWikiTextTokenCount = 304830;
const int32_t kWikiTextFirstIds[] = {
    446,   6356,  389,   9226,  352,   446,   216,   2738,  6356,  389,   9226,  352,   314,
    354,   2321,  4771,  3297,  8552,  284,   16984, 17523, 1673,  909,   761,   253,   16204,
    3394,  29,    48,    45608, 1791,  335,   260,   8552,  3086,  378,   8593,  281,   216,
    34,    32,    32,    32,    1673,  669,   436,   3922,  411,   253,   45608, 1791,  281,
    260,   1238,  3488,  707,   2855,  411,   15399, 5970,  3139,  3297,  527,   436,   4940,
    281,   216,   34,    32,    32,    33,    418,   260,   7598,  5620,  22660, 1673,  909,
    761,   253,   16204, 1791,  281,   260,   8552,  3086,  22083, 2322,  1413,  277,   281,
    216,   34,    32,    32,    34,    1673,  533,   216,   34,    32,    32,    36,    389,
    9226,  352,   16176, 253,   1791,  347,   476,   26984, 476,   281,   260,   12592, 476,
    25617, 13285, 637,   99,    10124, 476,   282,   260,   8552,  3086,  378,   6880,  37648,
    8544,  384,   4870,  455,   6719,  11064, 5068,  17444, 284,   41446, 91,    12469, 89,
    1673,  909,   436,   5044,  281,   260,   216,   34,    32,    32,    37,    16984, 24374,
    282,   260,   14953, 32821, 2292,  1238,  18593, 33817, 3297,  527,   436,   4940,  418,
    260,   37011, 22660, 281,   31150, 284,   260,   8386,  1153,  31313, 32909, 281,   4528,
    1673,  909,   436,   9067,  411,   2322,  312,   627,   1111,  284,   4870,  455,   6719,
    5465,  1316,  621,   912,   3297,  1541,  1674,  1777,  15540, 3297,  15688, 11360, 3297,
    31426, 14969, 375,   3297,  45223, 37583, 284,   17290, 286,   8501,  1673,  216,   2738,
    533,   216,   34,    32,    32,    38,    3297,  389,   9226,  352,   4870,  455,   6719,
    1316,  621,   912,   281,   260,   1238,  35492, 2855,  411,   5068,  43967, 17925, 1673,
    909,   6254,  335,   253,   216,   34,    32,    32,    38,    12592, 282,   260,   8552,
    3086,  3297,  23968, 3297,  3922,  411,   253,   1791,  281,   260,   216,   34,    32,
    32,    39,    16984, 2262,  282,   1073,  288,   4202,  313,   9067,  411,   18746, 519,
    428,   461,   396,   1673,  1073,  288,   4202,  313,   436,   4940,  418,   13363, 22660,
    281,   260,   4528,  46530, 282,   25667, 366,   24072, 284,   27065, 4256,  1673,  389,
    9226,  352,   4870,  455,   281,   827,   9411,  281,   216,   34,    32,    32,    40,
    3297,  4115,  2501,  7203,  22609, 411,   47363, 7042,  2250,  1866,  89,    3297,  284,
    4250,  2393,  377,   3704,  9067,  411,   11256, 318,   4290,  11302, 1673,  533,   2405,
    216,   34,    32,    32,    40,    3297,  389,   9226,  352,   1135,  253,   16204, 5796,
    335,   253,   827,   3394,  29,    48,    599,   12592, 13210, 282,   260,   8552,  3086,
    408,   894,   260,   16754, 3297,  3922,  411,   354,   5796,  335,   260,   8552,  3086,
    42411, 579,   281,   4745,  216,   34,    32,    32,    40,    1673,  909,   761,   253,
    19122, 1791,  281,   3772,  14612, 282,   260,   8552,  3086,  17709, 531,   866,   281,
    216,   34,    32,    33,    32,    3297,  347,   476,   659,   1153,  258,   40775, 476,
    1673,  389,   9226,  352,   4870,  455,   281,   260,   216,   34,    32,    33,    33,
    4771,  24271, 264,   2372,  9067,  411,   7042,  2250,  1866,  89,    1673,  216,   2738,
    446,   446,   24132, 446,   446,   216,   2738,  446,   446,   446,   216,   34,    32,
    32,    32,    816,   216,   34,    32,    32,    37,    446,   446,   446,   216,   2738,
    533,   216,   34,    32,    32,    32,    389,   9226,  352,   761,   253,   16204, 3394,
    29,    48,    45608, 1791,  335,   260,   8552,  3086,  378,   8593,  8544,  384,   18821,
    476,   7850,  2860,  541,   476,   281,   260,   12592, 3297,  476,   533,   16872, 25742,
    476,   1673,  389,   9226,  352,   4870,  455,   347,   476,   7850,  476,   281,   260,
    1238,  3488,  707,   2855,  411,   15399, 5970,  3139,  3297,  527,   436,   4940,  281,
    216,   34,    32,    32,    33,    418,   260,   7598,  5620,  22660, 1673,  330,   2523,
    282,   389,   9226,  352,   637,   99,    2851,  281,   378,   18994, 335,   10528, 3873,
    1272,  347,   476,   3302,  31734, 1800,  4761,  476,   281,   260,   1791,  3297,  284,
    384,   3656,  2609,  9470,  281,   378,   28961, 3297,  284,   39881, 9942,  1673,  909,
    6254,  281,   260,   8552,  3086,  22083, 2322,  1413,  277,   281,   216,   34,    32,
    32,    34,    347,   476,   5419,  391,   1166,  1713,  473,   476,   281,   260,   12592,
    476,   12558, 9545,  2144,  1254,  476,   3297,  284,   761,   253,   1791,  347,   253,
    896,   1843,  476,   17225, 105,   625,   48146, 476,   335,   378,   8593,  1673,  216,
    2738,  909,   761,   253,   19122, 1791,  281,   216,   34,    32,    32,    35,    335,
    827,   14612, 282,   378,   8593,  3297,  347,   1843,  476,   6380,  270,   17073, 476,
    1673,  533,   216,   34,    32,    32,    36,    389,   9226,  352,   16176, 253,   1791,
    347,   476,   26984, 476,   281,   260,   12592, 476,   25617, 13285, 637,   99,    10124,
    476,   282,   260,   8552,  3086,  378,   6880,  37648, 8544,  384,   4870,  455,   6719,
    11064, 5068,  17444, 284,   41446, 91,    12469, 89,    1673,  389,   9226,  352,   4870,
    455,   347,   476,   9117,  723,   476,   3297,  281,   260,   216,   34,    32,    32,
    37,    16984, 24374, 282,   260,   14953, 32821, 2292,  1238,  18593, 33817, 1673,  657,
    436,   4940,  418,   260,   37011, 22660, 281,   31150, 3297,  284,   260,   8386,  1153,
    31313, 32909, 281,   4528,  1673,  909,   436,   9067,  411,   2322,  312,   627,   1111,
    284,   4870,  455,   6719,  5465,  1316,  621,   912,   3297,  1541,  1674,  1777,  15540,
    3297,  15688, 11360, 3297,  31426, 14969, 375,   3297,  45223, 37583, 284,   17290, 286,
    8501,  1673,  389,   9226,  352,   3656,  253,   15380, 2523,  281,   378,   13001, 31728,
    1577,  476,   378,   8947,  314,   443,   2494,  5055,  7902,  3297,  351,   27652, 13171,
    429,   5465,  1316,  621,   912,   365,   1209,  551,   21321, 271,   515,   429,   650,
    2851,  347,   6971,  37291, 442,   33606, 637,   99,    24630, 2481,  3297,  6356,  389,
    9226,  352,   3297,  1541,  1674,  1777,  15540, 284,   31426, 14969, 375,   1673,  476,
    378,   22316, 5332,  3297,  476,   5465,  1316,  621,   912,   284,   6356,  389,   9226,
    352,   2626,  30190, 7523,  260,   4655,  454,   1467,  1673,  476,   216,   2738,  446,
    446,   446,   216,   34,    32,    32,    38,    816,   1386,  446,   446,   446,   216,
    2738,  533,   216,   34,    32,    32,    38,    389,   9226,  352,   4870,  455,   281,
    260,   1238,  35492, 2855,  411,   5068,  43967, 17925, 1673,  378,   1238,  436,   599,
    282,   253,   3086,  527,   11364, 896,   47872, 3297,  14089, 18204, 2272,  27821, 3066,
    2272,  35492, 1673,  533,   253,   216,   34,    32,    32,    38,    5473,  3297,  6955,
    17523, 5465,  1316,  621,   912,   4329,  389,   9226,  352,   347,   582,   282,   650,
    4932,  857,   3394,  29,    48,    5703,  1577,  476,   339,   5732,  1891,  351,   253,
    18904, 1217,  6356,  389,   9226,  352,   3297,  617,   436,   281,   260,   20930, 3093,
    282,   18204, 3297,  27821, 3066,  284,   35492, 418,   260,   2071,  1673,  909,   4944,
    957,   5717,  281,   18593, 33817, 1673,  476,   909,   18821, 476,   27429, 34159, 476,
    335,   260,   216,   34,    32,    32,    38,    12592, 282,   260,   8552,  3086,  3297,
    23968, 3297,  14089, 476,   23368, 339,   330,   676,   476,   1673,  389,   9226,  352,
    4870,  455,   347,   476,   4967,  476,   281,   260,   216,   34,    32,    32,    39,
    2262,  282,   1073,  288,   4202,  313,   9067,  411,   18746, 519,   428,   461,   396,
    1673,  1073,  288,   4202,  313,   436,   4940,  418,   13363, 22660, 281,   260,   4528,
    46530, 282,   25667, 366,   24072, 284,   27065, 4256,  1673,  533,   253,   2523,  282,
    260,   2262,  327,   378,   13001, 31728, 3297,  16984, 6112,  6660,  29400, 5332,  3297,
    476,   6356,  389,   9226,  352,   6633,  253,   14685, 13047, 288,   260,   3632,  347,
    4967,  1673,  476,   216,   2738,  389,   9226,  352,   4870,  455,   281,   827,   9411,
    281,   216,   34,    32,    32,    40,    3297,  4115,  2501,  7203,  22609, 411,   47363,
    7042,  2250,  1866,  89,    3297,  284,   4250,  2393,  377,   3704,  9067,  411,   11256,
    318,   4290,  11302, 1673,  389,   9226,  352,   18821, 253,   1843,  3365,  476,   39000,
    476,   281,   4250,  2393,  377,   3704,  3297,  617,   12082, 1683,  351,   1843,  476,
    18890, 476,   347,   260,   476,   8354,  5717,  4563,  617,   15743, 357,   767,   351,
    312,   2078,  89,    476,   1673,  389,   9226,  352,   16204, 4870,  455,   335,   253,
    827,   3394,  29,    48,    599,   12592, 13210, 476,   408,   3072,  476,   281,   2405,
    216,   34,    32,    32,    40,    282,   260,   8552,  3086,  408,   894,   260,   16754,
    347,   1843,  476,   33988, 1413,  477,   264,   476,   1673,  909,   6254,  335,   260,
    8552,  3086,  42411, 579,   347,   476,   27639, 476,   281,   4745,  216,   34,    32,
    32,    40,    1673,  909,   761,   253,   19122, 1791,  281,   3772,  14612, 282,   260,
    8552,  3086,  17709, 531,   866,   281,   216,   34,    32,    33,    32,    3297,  347,
    476,   659,   1153,  258,   40775, 476,   1673,  909,   18821, 354,   5851,  9115,  6784,
    327,   253,   2340,  26782, 1673,  909,   23028, 335,   260,   7183,  7590,  281,   42968,
    253,   9115,  335,   8552,  1577,  476,   33340, 253,   3648,  314,   253,   8463,  1786,
    1673,  21890, 1719,  346,   699,   732,   346,   637,   257,   5348,  563,   645,   346,
    1326,  637,   100,   314,   1035,  26393, 564,   665,   359,   39721, 335,   932,   617,
    359,   10216, 418,   2498,  346,   738,   5695,  284,   4145,  346,   260,   6204,  288,
    1481,  665,   284,   1492,  702,   346,   699,   732,   346,   637,   257,   2567,  1673,
    476,   389,   9226,  352,   4870,  455,   281,   260,   216,   34,    32,    33,    33,
    4771,  24271, 264,   2372,  9067,  411,   7042,  2250,  1866,  89,    1673,  216,   2738,
    446,   446,   21805, 2882,  446,   446,   216,   2738,  446,   446,   446,   21805, 446,
    446,   446,   216,   2738,  446,   446,   446,   32048, 446,   446,   446,   216,   2738,
    446,   446,   446,   22660, 446,   446,   446,   216,   2738,  446,   13300, 18555, 446,
    216,   2738,  13300, 18555, 365,   40883, 816,   452,   3481,  1577,  17566, 18555, 8544,
    4097,  1577,  17097, 247,   246,   16821, 121,   8544,  216,   39,    33,    34,    816,
    216,   39,    39,    32,    2481,  436,   253,   7411,  4097,  5720,  282,   260,   22721,
    16552, 1673,  13957, 351,   9679,  389,   2554,  365,   9679,  8394,  2481,  3297,  384,
    314,   4540,  1217,  260,   6250,  282,   260,   4097,  15583, 1673,  2736,  6250,  21635,
    436,   288,   3809,  650,   1798,  347,   253,   3424,  3181,  19062, 3297,  564,   384,
    8271,  7168,  288,   919,   260,   2371,  20777, 1673,  2736,  1029,  3297,  702,   260,
    2444,  1798,  3297,  436,   28671, 411,   260,   1117,  450,   1999,  276,   30405, 282,
    216,   39,    37,    37,    3297,  284,   650,   1596,  216,   33,    37,    929,   592,
    253,   655,   282,   2743,  3836,  18004, 1673,  216,   2738,  3483,  7083,  384,   436,
    1838,  3394,  29,    48,    1343,  288,   550,   6578,  3297,  650,   1806,  2422,  288,
    325,   32347, 9594,  281,   1062,  4097,  284,   4931,  6546,  2517,  1673,  3513,  650,
    21174, 2385,  3297,  3920,  16764, 3822,  11515, 457,   719,   10733, 690,   260,   6399,
    1673,  909,   553,   719,   1217,  260,   476,   48210, 3394,  29,    48,    41893, 476,
    284,   260,   476,   48210, 3394,  29,    48,    33322, 476,   411,   4097,  12815, 3297,
    979,   260,   1845,  282,   650,   746,   553,   3917,  1272,  288,   325,   4727,  288,
    4641,  4419,  347,   476,   260,   4097,  43692, 3297,  42545, 3297,  27879, 311,   3297,
    12081, 3297,  28264, 3297,  28517, 3297,  46895, 3297,  389,   36369, 8876,  3297,  39499,
    355,   389,   6155,  10945, 609,   476,   1673,  216,   2738,  446,   446,   5330,  446,
    446,   216,   2738,  13553, 4097,  6546,  10083, 14198, 260,   1029,  282,   260,   1919,
    645,   16702, 253,   746,   3297,  253,   2180,  527,   41134, 21632, 9038,  288,   476,
    260,   2800,  5823,  338,   2556,  4097,  2275,  27758, 826,   984,   284,   13951, 476,
    1673,  4311,  800,   282,   13300, 18555, 637,   99,    11515, 3865,  13951, 284,   1463,
    3297,  451,   2180,  314,   2755,  1070,  1673,  5839,  2166,  3297,  4329,  411,   260,
    4097,  12873, 4967,  12524, 3297,  314,   338,   4097,  11515, 359,   3431,  19484, 3297,
    33219, 862,   2468,  338,   1124,  325,   4006,  3297,  564,   527,   354,   5632,  3912,
    856,   325,   9830,  288,   699,   1673,  1068,  2148,  4641,  4419,  3297,  476,   378,
    1181,  8589,  392,   699,   260,   655,   3297,  260,   1379,  284,   260,   5687,  281,
    260,   3969,  3297,  260,   540,   24390, 392,   359,   288,   4219,  357,   25378, 3297,
    284,   260,   966,   523,   325,   338,   392,   2267,  20820, 260,   8216,  355,   2319,
    288,   1044,  357,   13587, 476,   1673,  12502, 29140, 4567,  253,   3464,  4186,  1542,
    288,   13300, 18555, 3297,  17087, 338,   260,   3175,  282,   260,   5720,  637,   99,
    746,   2309,  6970,  282,   650,   2444,  1029,  3297,  2161,  670,   260,   476,   1234,
    7888,  476,   11767, 2918,  804,   327,   540,   3435,  15583, 1673,  216,   2738,  446,
    446,   446,   7049,  929,   446,   446,   446,   216,   2738,  3529,  282,   732,   314,
    1343,  282,   13300, 18555, 637,   99,    1029,  2216,  429,   650,   11515, 1673,  2736,
    33964, 19756, 436,   13300, 25562, 11649, 3297,  253,   5332,  23694, 284,   5720,  981,
    260,   10563, 282,   43022, 25048, 1673,  13300, 18555, 436,   3988,  281,   216,   39,
    33,    34,    8544,  260,   3018,  33284, 314,   6552,  3297,  2560,  338,   357,   436,
    2141,  12196, 922,   604,   3297,  5684,  276,   10416, 365,   452,   516,   8347,  314,
    253,   20334, 8991,  2481,  1673,  533,   1916,  1029,  3297,  384,   2500,  3930,  288,
    4523,  288,   260,   3575,  2240,  282,   27006, 637,   276,   3297,  16918,
};

// The real SmolLM2 tokenizer, loaded once; nullptr when the model is absent.
const Tokenizer* SmolLm() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    const std::string path = testing::ModelPath();
    if (!std::filesystem::exists(path)) return nullptr;
    auto file = GgufFile::Open(path);
    PDQ_CHECK(file.ok());
    auto t = Tokenizer::FromGguf(**file);
    PDQ_CHECK(t.ok());
    return t->release();
  }();
  return tok;
}

#define SKIP_WITHOUT_MODEL()                                    \
  if (SmolLm() == nullptr)                                      \
  GTEST_SKIP() << "model not found at " << testing::ModelPath() \
               << " (set PDQ_MODEL or run make model)"

std::string ReadWikiText() {
  std::ifstream in(testing::WikiTextPath(), std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TokenizerTest, SmolLmMatchesHfTokenizers) {
  SKIP_WITHOUT_MODEL();
  for (const ReferenceCase& c : kSmolLmCases) {
    EXPECT_EQ(SmolLm()->Encode(c.text, false, true), c.ids) << "text: " << c.text;
  }
}

TEST(TokenizerTest, SmolLmRoundTripsUtf8Text) {
  SKIP_WITHOUT_MODEL();
  for (const ReferenceCase& c : kSmolLmCases) {
    EXPECT_EQ(DecodeOrDie(*SmolLm(), SmolLm()->Encode(c.text, false, true)), c.text);
    EXPECT_EQ(DecodeOrDie(*SmolLm(), SmolLm()->Encode(c.text, false, false)), c.text);
  }
}

TEST(TokenizerTest, SmolLmMetadata) {
  SKIP_WITHOUT_MODEL();
  const Tokenizer& tok = *SmolLm();
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_TRUE(tok.IsEndOfGeneration(2));  // <|im_end|>
  EXPECT_TRUE(tok.IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok.IsEndOfGeneration(1));
  EXPECT_EQ(tok.TokenId("<|im_start|>"), 1);
  EXPECT_EQ(tok.Encode("Hi", true, false), (std::vector<int32_t>{1, 26843}));
}

TEST(TokenizerTest, SmolLmRendersChatMl) {
  SKIP_WITHOUT_MODEL();
  auto text = SmolLm()->ApplyChatTemplate({{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto with_system = SmolLm()->ApplyChatTemplate({{"system", "S"}, {"user", "Hi"}}, false);
  EXPECT_EQ(*with_system, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(TokenizerTest, SmolLmStreamsEmojiSplitAcrossTokens) {
  SKIP_WITHOUT_MODEL();
  const std::string text = "emoji: \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 and caf\xc3\xa9 \xe6\x97\xa5";
  StreamingDetokenizer stream(*SmolLm());
  std::string joined;
  for (int32_t id : SmolLm()->Encode(text, false, false)) {
    auto chunk = stream.Push(id);
    ASSERT_TRUE(chunk.ok());
    // Every chunk is whole characters: none contains U+FFFD from a split.
    EXPECT_EQ(chunk->find("\xef\xbf\xbd"), std::string::npos);
    joined += *chunk;
  }
  joined += stream.Finish();
  EXPECT_EQ(joined, text);
}

TEST(TokenizerTest, SmolLmRoundTripsWikiTextPrefix) {
  SKIP_WITHOUT_MODEL();
  const std::string wiki = ReadWikiText();
  if (wiki.empty()) GTEST_SKIP() << "WikiText not found at " << testing::WikiTextPath();
  const std::string prefix = wiki.substr(0, 100 * 1024);
  EXPECT_EQ(DecodeOrDie(*SmolLm(), SmolLm()->Encode(prefix, false, true)), prefix);
}

TEST(TokenizerTest, SmolLmWikiTextMatchesHfCount) {
  SKIP_WITHOUT_MODEL();
  const std::string wiki = ReadWikiText();
  if (wiki.empty()) GTEST_SKIP() << "WikiText not found at " << testing::WikiTextPath();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = SmolLm()->Encode(wiki, false, true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s (%.1f MB/s)\n", wiki.size(), ids.size(),
              seconds, wiki.size() / seconds / 1e6);
  EXPECT_EQ(ids.size(), kWikiTextTokenCount);
  const size_t n = std::size(kWikiTextFirstIds);
  ASSERT_GE(ids.size(), n);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + n),
            std::vector<int32_t>(kWikiTextFirstIds, kWikiTextFirstIds + n));
}

}  // namespace
}  // namespace pdq
