#include "worker/text_stream.h"

#include <algorithm>

namespace pdq::worker {

absl::StatusOr<std::string> TextStream::Push(int32_t id) {
  if (stopped_) return std::string();
  absl::StatusOr<std::string> piece = detok_.Push(id);
  if (!piece.ok()) return piece.status();
  held_ += *piece;
  return Release(false);
}

std::string TextStream::Finish() {
  if (stopped_) return std::string();
  held_ += detok_.Finish();
  return Release(true);
}

std::string TextStream::Release(bool final) {
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) {
    if (!s.empty()) cut = std::min(cut, held_.find(s));
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_) {
      if (s.empty()) continue;
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace pdq::worker
