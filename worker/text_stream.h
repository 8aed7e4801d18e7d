// Token ids to the text a client sees: UTF-8-safe detokenization and stop
// strings. Text that could still turn into a stop string is held back until
// it cannot; a matched stop string and everything after it is never sent.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace pdq::worker {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop)
      : detok_(tokenizer), stop_(std::move(stop)) {}
  // The text `id` releases (possibly empty). Sets stopped() when a stop
  // string completed; the text before it is returned.
  absl::StatusOr<std::string> Push(int32_t id);
  // What is held back, at the end of the stream (not after a stop).
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  std::string Release(bool final);
  StreamingDetokenizer detok_;
  std::vector<std::string> stop_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace pdq::worker
