// Byte-level BPE as in GPT-2 / HF `tokenizers`: special-token split, PCRE2
// pre-tokenizer regex, id-pair merges by rank, and UTF-8-safe streaming decode.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/check.h"
#include "common/hash.h"
#include "gguf/gguf.h"

namespace pdq {
namespace {

// This Abseil may predate absl::string_view being std::string_view.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

enum class Utf8Scan { kComplete, kTruncated, kInvalid };

// Examines the character starting at s[i]. kComplete: *len is its length.
// kTruncated: s ends inside a valid prefix of *len bytes. kInvalid: *len is the
// length of the maximal invalid subpart (Unicode's U+FFFD substitution unit).
Utf8Scan ScanUtf8(std::string_view s, size_t i, size_t* len) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  *len = 1;
  if (b0 < 0x80) return Utf8Scan::kComplete;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    need = 2;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return Utf8Scan::kInvalid;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *len = k;
      return Utf8Scan::kTruncated;
    }
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      *len = k;
      return Utf8Scan::kInvalid;
    }
  }
  *len = need + 1;
  return Utf8Scan::kComplete;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// rest are moved to U+0100.. so every byte has a visible, non-space character.
std::array<uint32_t, 256> ByteToCodepoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Owns one compiled PCRE2 pattern (JIT-compiled when the platform allows).
class Regex {
 public:
  static absl::StatusOr<Regex> Compile(std::string_view pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("cannot compile pre-tokenizer regex at offset ",
                                              offset, ": ",
                                              reinterpret_cast<const char*>(message)));
    }
    // Without JIT pcre2_match falls back to the interpreter; same results.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return Regex(code);
  }

  Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}
  Regex& operator=(Regex&& other) noexcept {
    std::swap(code_, other.code_);
    return *this;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Finds the next non-empty match in s (valid UTF-8) at or after pos; false
  // when there is none.
  bool Find(std::string_view s, size_t pos, pcre2_match_data* md, size_t* start,
            size_t* end) const {
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const uint32_t options = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
    int rc = pcre2_match(code_, subject, s.size(), pos, options, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // JIT stack exhaustion on a pathological run: the interpreter keeps its
      // frames on the heap.
      rc = pcre2_match(code_, subject, s.size(), pos, options | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    *start = ov[0];
    *end = ov[1];
    return true;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// PCRE2 counts U+180E as \s (it was a space before Unicode 6.3); HF's regex
// engine and Rust use the White_Space property, which this class spells out.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\v\f\r\x20\x85\xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s and \S (inside or outside a class) to use kWhiteSpace.
std::string WithUnicodeWhiteSpace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", AsAbsl(kWhiteSpace), in_class ? "" : "]");
      } else if (e == 'S') {
        PDQ_CHECK(!in_class);  // no pattern here negates \S inside a class
        absl::StrAppend(&out, "[^", AsAbsl(kWhiteSpace), "]");
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerConfig {
  const char* pattern;
  bool split_digits;   // SmolLM2: every \p{N} character is its own piece first
  bool ignore_merges;  // Llama 3: a piece that is a whole token skips BPE
};

std::optional<PreTokenizerConfig> FindPreTokenizer(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2" || name == "default") {
    return PreTokenizerConfig{kGpt2Pattern, false, false};
  }
  if (name == "smollm") return PreTokenizerConfig{kGpt2Pattern, true, false};
  if (name == "llama-bpe" || name == "llama3") {
    return PreTokenizerConfig{kLlama3Pattern, false, true};
  }
  if (name == "qwen2") return PreTokenizerConfig{kQwen2Pattern, false, false};
  return std::nullopt;
}

enum class ChatFormat { kChatMl, kLlama3, kGemma, kPhi3, kLlama2, kMistral, kMistralV7, kUnknown };

// The variations of the [INST] formats (Llama 2 and Mistral), read off the
// template the way llama.cpp reads them.
struct InstFormat {
  bool system_tags = false;          // Llama 2: <<SYS>> ... <</SYS>> inside the first turn
  bool bos_in_history = false;       // Llama 2: <s> before each later [INST]
  bool strip = false;                // Llama 2: contents stripped
  std::string leading_space;         // Mistral v1: " [INST]" and " [/INST]"
  std::string trailing_space = " ";  // Mistral: "[INST] " (not v3-tekken)
  bool trim_assistant = false;       // Mistral v3
};

// The default system prompt a ChatML template inserts when the conversation
// has none, e.g. SmolLM2's "You are a helpful AI assistant named SmolLM, ...".
// Only literal text counts: an occurrence built from message fields (quotes,
// braces, '+') is the template rendering a caller's system message.
std::string DefaultChatMlSystem(std::string_view tmpl) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  for (size_t at = tmpl.find(kOpen); at != std::string_view::npos; at = tmpl.find(kOpen, at + 1)) {
    std::string_view rest = tmpl.substr(at + kOpen.size());
    if (rest.starts_with("\n")) {
      rest.remove_prefix(1);
    } else if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else {
      continue;
    }
    const size_t close = rest.find("<|im_end|>");
    if (close == std::string_view::npos) continue;
    const std::string_view text = rest.substr(0, close);
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string unescaped;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        unescaped.push_back('\n');
        ++i;
      } else {
        unescaped.push_back(text[i]);
      }
    }
    return unescaped;
  }
  return "";
}

constexpr int32_t kNoToken = -1;

struct MergeTarget {
  int32_t rank;
  int32_t id;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// BPE state for one pre-token: a doubly linked list over its initial byte
// symbols and a min-heap of candidate merges keyed by (rank, position).
struct Symbol {
  int32_t id;  // kNoToken once merged into its left neighbour (or unknown byte)
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t left;  // symbol index
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
  pcre2_match_data* match_data = nullptr;
  Scratch() : match_data(pcre2_match_data_create(1, nullptr)) { PDQ_CHECK(match_data); }
  ~Scratch() { pcre2_match_data_free(match_data); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

}  // namespace

struct Tokenizer::Impl {
  bool spm = false;  // SentencePiece BPE (TokenizerSpec::model "llama")
  std::vector<float> scores;
  bool add_space_prefix = true;
  std::array<int32_t, 256> spm_byte_id{};  // <0xXX> tokens
  // What merges may produce: normal and user-defined pieces, as in
  // sentencepiece (llama.cpp also lets them form control or byte tokens).
  std::vector<bool> spm_mergeable;
  int32_t unk_id = -1;
  std::vector<std::string> token_bytes;
  absl::flat_hash_map<std::string, int32_t> token_to_id;
  absl::flat_hash_map<uint64_t, MergeTarget> merges;
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int32_t, 256> byte_to_id{};
  // Control and user-defined tokens by first byte, longest first.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte;
  bool has_specials = false;
  std::optional<Regex> main_regex;
  std::optional<Regex> digit_regex;
  PreTokenizerConfig pre{};
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::vector<bool> is_eog;
  ChatFormat chat_format = ChatFormat::kChatMl;
  std::string chat_template;
  std::string default_system;
  bool trim_content = false;
  InstFormat inst;
  uint64_t fingerprint = 0;

  void EncodeOrdinary(std::string_view text, Scratch& s, std::vector<int32_t>* out) const;
  void PreTokenize(std::string_view run, Scratch& s, std::vector<int32_t>* out) const;
  void SplitWithRegex(std::string_view text, Scratch& s, std::vector<int32_t>* out) const;
  void EncodePiece(std::string_view piece, Scratch& s, std::vector<int32_t>* out) const;
  void TryAddCandidate(int32_t left, Scratch& s) const;
  void EncodeSpm(std::string_view text, bool space_prefix, std::vector<int32_t>* out) const;
};

// SentencePiece BPE, as llama.cpp and sentencepiece do it: spaces become
// U+2581 (with one more in front when asked), the text starts as one symbol
// per UTF-8 character, and the adjacent pair whose concatenation is the
// highest-scoring token merges first (ties: leftmost), until none is a
// token. Every merged symbol is a token; a single character that is not
// falls back to byte tokens (<0xXX>), or <unk> without them.
void Tokenizer::Impl::EncodeSpm(std::string_view text, bool space_prefix,
                                std::vector<int32_t>* out) const {
  static constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581
  std::string s;
  if (space_prefix) s = kSpace;
  for (char ch : text) {
    if (ch == ' ') {
      s += kSpace;
    } else {
      s.push_back(ch);
    }
  }
  struct Sym {
    size_t start, len;
    int prev, next;
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    if (ScanUtf8(s, i, &len) != Utf8Scan::kComplete) len = 1;
    syms.push_back({i, len, (int)syms.size() - 1, -1});
    if (syms.size() > 1) syms[syms.size() - 2].next = (int)syms.size() - 1;
    i += len;
  }
  struct Bigram {
    float score;
    int left, right;
    size_t len;
    bool operator<(const Bigram& o) const {  // the heap's top: best score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::vector<Bigram> heap;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view joined(s.data() + syms[left].start, syms[left].len + syms[right].len);
    const auto it = token_to_id.find(AsAbsl(joined));
    if (it == token_to_id.end() || !spm_mergeable[it->second]) return;
    heap.push_back({scores[it->second], left, right, joined.size()});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int i = 1; i < (int)syms.size(); ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Bigram b = heap.back();
    heap.pop_back();
    Sym& l = syms[b.left];
    Sym& r = syms[b.right];
    // Stale when either side has merged since it was queued.
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const std::string_view piece(s.data() + syms[i].start, syms[i].len);
    if (const auto it = token_to_id.find(AsAbsl(piece)); it != token_to_id.end()) {
      out->push_back(it->second);
      continue;
    }
    for (char ch : piece) {
      const int32_t id = spm_byte_id[static_cast<uint8_t>(ch)];
      if (id >= 0) {
        out->push_back(id);
      } else if (unk_id >= 0) {
        out->push_back(unk_id);
      }
    }
  }
}

void Tokenizer::Impl::EncodeOrdinary(std::string_view text, Scratch& s,
                                     std::vector<int32_t>* out) const {
  // Valid runs go through the regex; each byte of an invalid sequence becomes
  // its own piece so that nothing is dropped and the regex never sees it.
  size_t run_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    if (ScanUtf8(text, i, &len) == Utf8Scan::kComplete) {
      i += len;
      continue;
    }
    PreTokenize(text.substr(run_start, i - run_start), s, out);
    for (size_t k = 0; k < len; ++k) EncodePiece(text.substr(i + k, 1), s, out);
    i += len;
    run_start = i;
  }
  PreTokenize(text.substr(run_start), s, out);
}

void Tokenizer::Impl::PreTokenize(std::string_view run, Scratch& s,
                                  std::vector<int32_t>* out) const {
  if (run.empty()) return;
  if (!pre.split_digits) {
    SplitWithRegex(run, s, out);
    return;
  }
  size_t pos = 0, start, end;
  while (pos < run.size() && digit_regex->Find(run, pos, s.match_data, &start, &end)) {
    SplitWithRegex(run.substr(pos, start - pos), s, out);
    EncodePiece(run.substr(start, end - start), s, out);
    pos = end;
  }
  SplitWithRegex(run.substr(pos), s, out);
}

void Tokenizer::Impl::SplitWithRegex(std::string_view text, Scratch& s,
                                     std::vector<int32_t>* out) const {
  size_t pos = 0, start, end;
  while (pos < text.size() && main_regex->Find(text, pos, s.match_data, &start, &end)) {
    if (start > pos) EncodePiece(text.substr(pos, start - pos), s, out);  // unmatched gap
    EncodePiece(text.substr(start, end - start), s, out);
    pos = end;
  }
  if (pos < text.size()) EncodePiece(text.substr(pos), s, out);
}

void Tokenizer::Impl::TryAddCandidate(int32_t left, Scratch& s) const {
  if (left < 0) return;
  const Symbol& l = s.symbols[left];
  if (l.next < 0) return;
  const Symbol& r = s.symbols[l.next];
  if (l.id < 0 || r.id < 0) return;
  const auto it = merges.find(PairKey(l.id, r.id));
  if (it == merges.end()) return;
  s.heap.push_back({it->second.rank, left, l.id, r.id, it->second.id});
  std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
}

void Tokenizer::Impl::EncodePiece(std::string_view piece, Scratch& s,
                                  std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (pre.ignore_merges) {
    s.mapped.clear();
    for (char c : piece) AppendUtf8(byte_to_cp[static_cast<uint8_t>(c)], &s.mapped);
    const auto it = token_to_id.find(s.mapped);
    if (it != token_to_id.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const int32_t id = byte_to_id[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out->push_back(id);
    return;
  }
  const int32_t n = static_cast<int32_t>(piece.size());
  s.symbols.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    s.symbols[i] = {byte_to_id[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  s.heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) TryAddCandidate(i, s);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const Candidate c = s.heap.back();
    s.heap.pop_back();
    Symbol& l = s.symbols[c.left];
    // Stale when either side has merged since: ids only ever grow into longer
    // tokens, so equal ids mean the same two symbols are still adjacent.
    if (l.id != c.left_id || l.next < 0) continue;
    Symbol& r = s.symbols[l.next];
    if (r.id != c.right_id) continue;
    l.id = c.merged_id;
    r.id = kNoToken;
    l.next = r.next;
    if (l.next >= 0) s.symbols[l.next].prev = c.left;
    TryAddCandidate(l.prev, s);
    TryAddCandidate(c.left, s);
  }
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) {
    // A byte missing from the vocabulary cannot be represented; skip it.
    if (s.symbols[i].id >= 0) out->push_back(s.symbols[i].id);
  }
}

namespace {
// Everything that decides which ids a text becomes (and back): two
// tokenizers with the same fingerprint encode and decode alike.
uint64_t SpecFingerprint(const TokenizerSpec& spec) {
  uint64_t h = Hash64(spec.pre);
  for (const std::string& t : spec.tokens) h = Hash64(t, h);
  for (TokenType t : spec.types) h = Hash64(&t, sizeof(t), h);
  for (const std::string& m : spec.merges) h = Hash64(m, h);
  const int32_t ids[] = {spec.bos_id, spec.eos_id, spec.add_bos ? 1 : 0};
  h = Hash64(ids, sizeof(ids), h);
  if (spec.model != "gpt2") {  // (so byte-level BPE fingerprints stay as they were)
    h = Hash64(spec.model, h);
    h = Hash64(spec.scores.data(), spec.scores.size() * sizeof(float), h);
    h = Hash64(std::string_view(spec.add_space_prefix ? "prefix" : ""), h);
  }
  return Hash64(spec.eog_ids.data(), spec.eog_ids.size() * sizeof(int32_t), h);
}
}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(TokenizerSpec spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer vocabulary too large: ", n));
  }
  if (!spec.types.empty() && spec.types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", spec.types.size(), " token types for ", n, " tokens"));
  }
  const auto vocab = static_cast<int32_t>(n);
  auto check_id = [vocab](int32_t id, const char* what) -> absl::Status {
    if (id < -1 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " id ", id, " outside vocabulary [0, ", vocab, ")"));
    }
    return absl::OkStatus();
  };
  PDQ_RETURN_IF_ERROR(check_id(spec.bos_id, "BOS"));
  PDQ_RETURN_IF_ERROR(check_id(spec.eos_id, "EOS"));
  for (int32_t id : spec.eog_ids) {
    PDQ_RETURN_IF_ERROR(check_id(id, "end-of-generation"));
  }
  if (spec.model != "gpt2" && spec.model != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tokenizer model '", spec.model,
                     "' (pdq supports byte-level BPE 'gpt2' and SentencePiece BPE 'llama')"));
  }
  const bool spm = spec.model == "llama";
  if (spm && spec.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SentencePiece tokenizer has ", spec.scores.size(), " scores for ", n, " tokens"));
  }
  // SentencePiece has no pre-tokenizer: no regex is compiled for it.
  const std::optional<PreTokenizerConfig> pre = FindPreTokenizer(spm ? "default" : spec.pre);
  if (!pre) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown pre-tokenizer '", spec.pre, "' (pdq supports gpt2, smollm, llama-bpe, qwen2)"));
  }

  auto impl = std::make_unique<Impl>();
  impl->fingerprint = SpecFingerprint(spec);
  impl->spm = spm;
  impl->scores = std::move(spec.scores);
  impl->add_space_prefix = spec.add_space_prefix;
  impl->spm_byte_id.fill(kNoToken);
  impl->pre = *pre;
  if (!spm) {
    PDQ_ASSIGN_OR_RETURN(Regex main_regex, Regex::Compile(WithUnicodeWhiteSpace(pre->pattern)));
    impl->main_regex.emplace(std::move(main_regex));
  }
  if (!spm && pre->split_digits) {
    PDQ_ASSIGN_OR_RETURN(Regex digit_regex, Regex::Compile(R"(\p{N})"));
    impl->digit_regex.emplace(std::move(digit_regex));
  }

  const std::vector<TokenType> types =
      spec.types.empty() ? std::vector<TokenType>(n, TokenType::kNormal) : std::move(spec.types);
  impl->byte_to_cp = ByteToCodepoint();
  std::array<int16_t, 512> cp_to_byte;
  cp_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) cp_to_byte[impl->byte_to_cp[b]] = static_cast<int16_t>(b);

  impl->token_to_id.reserve(n);
  impl->token_bytes.resize(n);
  if (spm) impl->spm_mergeable.resize(n);
  for (int32_t id = 0; id < vocab; ++id) {
    const std::string& text = spec.tokens[id];
    if (spm) {
      impl->spm_mergeable[id] = types[id] == TokenType::kNormal ||
                                types[id] == TokenType::kUserDefined ||
                                types[id] == TokenType::kUndefined;
    }
    // Later duplicates win, as in HF's vocab dict and llama.cpp.
    impl->token_to_id.insert_or_assign(text, id);
    const TokenType type = types[id];
    std::string& bytes = impl->token_bytes[id];
    if (type == TokenType::kControl || type == TokenType::kUserDefined) {
      bytes = text;  // stored as raw text, not byte-encoded
      if (!text.empty()) {
        impl->specials_by_first_byte[static_cast<uint8_t>(text[0])].push_back(id);
        impl->has_specials = true;
      }
      continue;
    }
    if (type == TokenType::kByte && text.size() == 6 && text.starts_with("<0x") &&
        text.back() == '>' && absl::ascii_isxdigit(text[3]) && absl::ascii_isxdigit(text[4])) {
      auto hex = [](char c) {
        return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
      };
      bytes.push_back(static_cast<char>(hex(text[3]) * 16 + hex(text[4])));
      impl->spm_byte_id[static_cast<uint8_t>(bytes[0])] = id;
      continue;
    }
    if (spm) {
      // U+2581 stands for a space.
      bytes = absl::StrReplaceAll(text, {{"\xe2\x96\x81", " "}});
      if (type == TokenType::kUnknown && impl->unk_id < 0) impl->unk_id = id;
      continue;
    }
    // Undo bytes_to_unicode; a character outside that image is kept as is.
    for (size_t i = 0; i < text.size();) {
      size_t len;
      if (ScanUtf8(text, i, &len) != Utf8Scan::kComplete) {
        bytes.append(text, i, len);
        i += len;
        continue;
      }
      uint32_t cp = static_cast<uint8_t>(text[i]);
      if (len > 1) {
        cp &= 0xFF >> (len + 1);
        for (size_t k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
      }
      if (cp < cp_to_byte.size() && cp_to_byte[cp] >= 0) {
        bytes.push_back(static_cast<char>(cp_to_byte[cp]));
      } else {
        bytes.append(text, i, len);
      }
      i += len;
    }
  }
  for (auto& ids : impl->specials_by_first_byte) {
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return impl->token_bytes[a].size() > impl->token_bytes[b].size();
    });
  }
  std::string mapped;
  for (int b = 0; b < 256; ++b) {
    mapped.clear();
    AppendUtf8(impl->byte_to_cp[b], &mapped);
    const auto it = impl->token_to_id.find(mapped);
    impl->byte_to_id[b] = it == impl->token_to_id.end() ? kNoToken : it->second;
  }

  impl->merges.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& merge = spec.merges[rank];
    // Search from 1 so that a left side that is itself a space still parses.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 >= merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer merge ", rank, " '", merge, "' is not of the form 'left right'"));
    }
    const auto left = impl->token_to_id.find(AsAbsl(std::string_view(merge).substr(0, space)));
    const auto right = impl->token_to_id.find(AsAbsl(std::string_view(merge).substr(space + 1)));
    std::string joined = merge.substr(0, space);
    joined.append(merge, space + 1);
    const auto merged = impl->token_to_id.find(joined);
    // A merge whose parts or result are not tokens can never produce a token
    // id; llama.cpp tolerates these, so skip rather than reject the model.
    if (left == impl->token_to_id.end() || right == impl->token_to_id.end() ||
        merged == impl->token_to_id.end()) {
      continue;
    }
    impl->merges.try_emplace(PairKey(left->second, right->second),
                             MergeTarget{static_cast<int32_t>(rank), merged->second});
  }

  impl->bos_id = spec.bos_id;
  impl->eos_id = spec.eos_id;
  impl->add_bos = spec.add_bos;
  impl->is_eog.assign(n, false);
  if (spec.eos_id >= 0) impl->is_eog[spec.eos_id] = true;
  for (int32_t id : spec.eog_ids) {
    if (id >= 0) impl->is_eog[id] = true;
  }

  impl->chat_template = std::move(spec.chat_template);
  const std::string& tmpl = impl->chat_template;
  // A file without a template: ChatML, except for a SentencePiece
  // vocabulary without <|im_start|> (Llama 2 and Mistral conversions often
  // carry none; their [INST] format is not ChatML).
  const bool chatml_default = !spm || impl->token_to_id.contains(absl::string_view("<|im_start|>"));
  if ((tmpl.empty() && chatml_default) || tmpl.find("<|im_start|>") != std::string::npos) {
    impl->chat_format = ChatFormat::kChatMl;
    impl->default_system = DefaultChatMlSystem(tmpl);
  } else if (tmpl.find("<|start_header_id|>") != std::string::npos) {
    impl->chat_format = ChatFormat::kLlama3;
    impl->trim_content = tmpl.find("| trim") != std::string::npos;
  } else if (tmpl.find("[INST]") != std::string::npos) {
    auto has = [&](std::string_view part) { return tmpl.find(part) != std::string::npos; };
    InstFormat& f = impl->inst;
    if (has("[SYSTEM_PROMPT]")) {
      impl->chat_format = ChatFormat::kMistralV7;
    } else if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      // Mistral's official v1, v3 and v3-tekken templates.
      impl->chat_format = ChatFormat::kMistral;
      if (has(" [INST]")) {
        f.leading_space = " ";
      } else if (has("\"[INST]\"")) {
        f.trailing_space = "";
      } else {
        f.trim_assistant = true;
      }
    } else {
      impl->chat_format = ChatFormat::kLlama2;
      f.strip = has("content.strip()");
      f.bos_in_history = !f.strip && has("bos_token + '[INST]");
      f.system_tags = f.strip || f.bos_in_history || has("<<SYS>>");
    }
  } else if (tmpl.find("<start_of_turn>") != std::string::npos) {
    impl->chat_format = ChatFormat::kGemma;
  } else if (tmpl.find("<|user|>") != std::string::npos &&
             tmpl.find("<|assistant|>") != std::string::npos &&
             tmpl.find("<|end|>") != std::string::npos) {  // (Zephyr's has no <|end|>)
    impl->chat_format = ChatFormat::kPhi3;
  } else {
    impl->chat_format = ChatFormat::kUnknown;
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  TokenizerSpec spec;
  PDQ_ASSIGN_OR_RETURN(spec.model, file.GetString("tokenizer.ggml.model"));
  if (spec.model != "gpt2" && spec.model != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tokenizer model '", spec.model,
                     "' (pdq supports byte-level BPE 'gpt2' and SentencePiece BPE 'llama')"));
  }
  PDQ_ASSIGN_OR_RETURN(spec.tokens, file.GetStringArray("tokenizer.ggml.tokens"));
  if (file.Has("tokenizer.ggml.token_type")) {
    PDQ_ASSIGN_OR_RETURN(std::vector<int64_t> types, file.GetIntArray("tokenizer.ggml.token_type"));
    spec.types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", i, " has unknown token type ", types[i]));
      }
      spec.types.push_back(static_cast<TokenType>(types[i]));
    }
  }
  if (spec.model == "gpt2") {
    PDQ_ASSIGN_OR_RETURN(spec.merges, file.GetStringArray("tokenizer.ggml.merges"));
  } else {
    PDQ_ASSIGN_OR_RETURN(std::vector<double> scores, file.GetFloatArray("tokenizer.ggml.scores"));
    spec.scores.assign(scores.begin(), scores.end());
    if (file.Has("tokenizer.ggml.add_space_prefix")) {
      PDQ_ASSIGN_OR_RETURN(spec.add_space_prefix, file.GetBool("tokenizer.ggml.add_space_prefix"));
    }
  }
  if (file.Has("tokenizer.ggml.pre")) {
    PDQ_ASSIGN_OR_RETURN(spec.pre, file.GetString("tokenizer.ggml.pre"));
  }
  const int64_t vocab = static_cast<int64_t>(spec.tokens.size());
  auto read_id = [&](const char* key, int32_t* id) -> absl::Status {
    if (!file.Has(key)) return absl::OkStatus();
    PDQ_ASSIGN_OR_RETURN(int64_t value, file.GetInt(key));
    if (value < 0 || value >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " = ", value, " outside vocabulary [0, ", vocab, ")"));
    }
    *id = static_cast<int32_t>(value);
    return absl::OkStatus();
  };
  PDQ_RETURN_IF_ERROR(read_id("tokenizer.ggml.bos_token_id", &spec.bos_id));
  PDQ_RETURN_IF_ERROR(read_id("tokenizer.ggml.eos_token_id", &spec.eos_id));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    int32_t id = -1;
    PDQ_RETURN_IF_ERROR(read_id(key, &id));
    if (id >= 0) spec.eog_ids.push_back(id);
  }
  // Chat models end turns with these even when the metadata names only EOS.
  // Phi-3's <|end|> too, where it is a control token and not one of the
  // harmony format's mid-message markers (those vocabularies have <|return|>).
  const bool harmony =
      std::find(spec.tokens.begin(), spec.tokens.end(), "<|return|>") != spec.tokens.end();
  for (int32_t id = 0; id < vocab; ++id) {
    const std::string& t = spec.tokens[id];
    const bool control = !spec.types.empty() && spec.types[id] == TokenType::kControl;
    if (t == "<|im_end|>" || t == "<|eot_id|>" || t == "<|endoftext|>" || t == "<end_of_turn>" ||
        (t == "<|end|>" && control && !harmony)) {
      spec.eog_ids.push_back(id);
    }
  }
  if (file.Has("tokenizer.ggml.add_bos_token")) {
    PDQ_ASSIGN_OR_RETURN(spec.add_bos, file.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (file.Has("tokenizer.chat_template")) {
    PDQ_ASSIGN_OR_RETURN(spec.chat_template, file.GetString("tokenizer.chat_template"));
  }
  return FromSpec(std::move(spec));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.bos_id >= 0) out.push_back(m.bos_id);
  Scratch scratch;
  // SentencePiece puts a space before the text and after each control
  // token, as llama.cpp does.
  bool after_special = true;
  auto ordinary = [&](std::string_view part) {
    if (!m.spm) return m.EncodeOrdinary(part, scratch, &out);
    if (part.empty()) return;
    m.EncodeSpm(part, m.add_space_prefix && after_special, &out);
    after_special = false;
  };
  if (!parse_special || !m.has_specials) {
    ordinary(text);
    return out;
  }
  // Leftmost-longest special-token match, like HF's added-vocabulary split.
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t found = kNoToken;
    for (int32_t id : m.specials_by_first_byte[static_cast<uint8_t>(text[i])]) {
      if (text.substr(i).starts_with(m.token_bytes[id])) {
        found = id;
        break;
      }
    }
    if (found == kNoToken) {
      ++i;
      continue;
    }
    ordinary(text.substr(start, i - start));
    out.push_back(found);
    after_special = true;
    i += m.token_bytes[found].size();
    start = i;
  }
  ordinary(text.substr(start));
  return out;
}

std::vector<int32_t> Tokenizer::EncodeContinuation(std::string_view text) const {
  const Impl& m = *impl_;
  if (!m.spm) return Encode(text, /*add_bos=*/false, /*parse_special=*/false);
  std::vector<int32_t> out;
  m.EncodeSpm(text, /*space_prefix=*/false, &out);
  return out;
}

absl::StatusOr<std::string> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " outside vocabulary [0, ", vocab_size(), ")"));
  }
  return impl_->token_bytes[id];
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) return TokenBytes(id).status();
    out += impl_->token_bytes[id];
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                         bool add_generation_prompt) const {
  const Impl& m = *impl_;
  std::string out;
  switch (m.chat_format) {
    case ChatFormat::kChatMl:
      if (!m.default_system.empty() && !messages.empty() && messages[0].role != "system") {
        absl::StrAppend(&out, "<|im_start|>system\n", m.default_system, "<|im_end|>\n");
      }
      for (const ChatMessage& msg : messages) {
        absl::StrAppend(&out, "<|im_start|>", msg.role, "\n", msg.content, "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kLlama3:
      for (const ChatMessage& msg : messages) {
        absl::StrAppend(&out, "<|start_header_id|>", msg.role, "<|end_header_id|>\n\n",
                        m.trim_content ? absl::StripAsciiWhitespace(msg.content)
                                       : absl::string_view(msg.content),
                        "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kGemma: {
      // Gemma's turns, "model" for the assistant, contents trimmed; it has no
      // system turn, so the system messages open the next turn not the model's.
      std::string system;
      for (const ChatMessage& msg : messages) {
        const absl::string_view content = absl::StripAsciiWhitespace(msg.content);
        if (msg.role == "system") {
          absl::StrAppend(&system, content);
          continue;
        }
        const bool model = msg.role == "assistant";
        absl::StrAppend(&out, "<start_of_turn>", model ? "model" : msg.role, "\n");
        if (!model && !system.empty()) {
          absl::StrAppend(&out, system, "\n\n");
          system.clear();
        }
        absl::StrAppend(&out, content, "<end_of_turn>\n");
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }
    case ChatFormat::kPhi3:
      for (const ChatMessage& msg : messages) {
        absl::StrAppend(&out, "<|", msg.role, "|>\n", msg.content, "<|end|>\n");
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      return out;
    case ChatFormat::kLlama2: {
      // [INST] user [/INST]answer</s>[INST] ...; the first <s> is the
      // tokenizer's BOS. No generation prompt: the text ends after [/INST].
      const InstFormat& f = m.inst;
      out = "[INST] ";
      bool in_turn = true;
      for (const ChatMessage& msg : messages) {
        const absl::string_view content =
            f.strip ? absl::StripAsciiWhitespace(msg.content) : absl::string_view(msg.content);
        if (!in_turn) {
          out += f.bos_in_history ? "<s>[INST] " : "[INST] ";
          in_turn = true;
        }
        if (msg.role == "system") {
          absl::StrAppend(&out, f.system_tags ? "<<SYS>>\n" : "", content,
                          f.system_tags ? "\n<</SYS>>\n\n" : "\n");
        } else if (msg.role == "user") {
          absl::StrAppend(&out, content, " [/INST]");
        } else {
          absl::StrAppend(&out, content, "</s>");
          in_turn = false;
        }
      }
      return out;
    }
    case ChatFormat::kMistral: {
      const InstFormat& f = m.inst;
      bool in_turn = false;
      for (const ChatMessage& msg : messages) {
        if (!in_turn) {
          absl::StrAppend(&out, f.leading_space, "[INST]", f.trailing_space);
          in_turn = true;
        }
        if (msg.role == "system") {
          absl::StrAppend(&out, msg.content, "\n\n");
        } else if (msg.role == "user") {
          absl::StrAppend(&out, msg.content, f.leading_space, "[/INST]");
        } else {
          absl::StrAppend(&out, f.trailing_space,
                          f.trim_assistant ? absl::StripAsciiWhitespace(msg.content)
                                           : absl::string_view(msg.content),
                          "</s>");
          in_turn = false;
        }
      }
      return out;
    }
    case ChatFormat::kMistralV7:
      for (const ChatMessage& msg : messages) {
        if (msg.role == "system") {
          absl::StrAppend(&out, "[SYSTEM_PROMPT] ", msg.content, "[/SYSTEM_PROMPT]");
        } else if (msg.role == "user") {
          absl::StrAppend(&out, "[INST] ", msg.content, "[/INST]");
        } else {
          absl::StrAppend(&out, " ", msg.content, "</s>");
        }
      }
      return out;
    case ChatFormat::kUnknown:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(
      "chat template not recognized (pdq renders ChatML, Llama 3, Llama 2, Mistral, Gemma and "
      "Phi-3 formats); "
      "template begins: ",
      m.chat_template.substr(0, 80)));
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_bytes.size()); }
uint64_t Tokenizer::fingerprint() const { return impl_->fingerprint; }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_eog[id];
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  const auto it = impl_->token_to_id.find(AsAbsl(token));
  return it == impl_->token_to_id.end() ? -1 : it->second;
}

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  PDQ_ASSIGN_OR_RETURN(std::string bytes, tokenizer_.TokenBytes(id));
  pending_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len;
    const Utf8Scan scan = ScanUtf8(pending_, i, &len);
    if (scan == Utf8Scan::kTruncated) break;  // may complete with the next token
    if (scan == Utf8Scan::kComplete) {
      out.append(pending_, i, len);
    } else {
      out += kReplacementChar;
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len;
    if (ScanUtf8(pending_, i, &len) == Utf8Scan::kComplete) {
      out.append(pending_, i, len);
    } else {
      out += kReplacementChar;
    }
    i += len;
  }
  pending_.clear();
  return out;
}

}  // namespace pdq
