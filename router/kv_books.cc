#include "router/kv_books.h"

#include <algorithm>

namespace pdq::router {

void KvBooks::Book(const std::string& id, int64_t blocks) {
  unlisted_[id] += blocks;
  booked_blocks_ += blocks;
}

void KvBooks::Heartbeat(const google::protobuf::RepeatedPtrField<std::string>& taken,
                        bool taken_reported,
                        const google::protobuf::RepeatedPtrField<std::string>& released,
                        bool released_reported) {
  if (!released_reported) {
    // Its free count is taken to count every end before this heartbeat.
    ended_.clear();
    credited_blocks_ = 0;
  } else {
    for (auto& [id, e] : ended_) ++e.heartbeats;
  }
  for (auto& [id, e] : ended_unlisted_) ++e.heartbeats;
  if (taken_reported) {
    for (const std::string& id : taken) {
      if (auto it = unlisted_.find(id); it != unlisted_.end()) {
        booked_blocks_ -= it->second;
        listed_[id] = it->second;
        unlisted_.erase(it);
      } else if (auto e = ended_unlisted_.find(id); e != ended_unlisted_.end()) {
        // Sampled while the worker held it, though it has ended since.
        ended_[id] = {e->second.blocks, 0};
        credited_blocks_ += e->second.blocks;
        ended_unlisted_.erase(e);
      }  // else another router's
    }
  } else {
    // Its free count is taken to count everything sent before it.
    for (const auto& [id, blocks] : unlisted_) listed_[id] = blocks;
    unlisted_.clear();
    booked_blocks_ = 0;
  }
  if (!released_reported) return;
  // Read after the taken list: a request taken and freed since the last
  // heartbeat moved to listed_ above and leaves it here.
  for (const std::string& id : released) {
    if (listed_.erase(id) > 0) continue;  // freed before its end reached the router
    if (auto it = ended_.find(id); it != ended_.end()) {
      credited_blocks_ -= it->second.blocks;
      ended_.erase(it);
    }
  }
  // Credits no heartbeat cleared (a lost heartbeat's list): dropped, so the
  // books err towards full.
  for (auto it = ended_.begin(); it != ended_.end();) {
    if (it->second.heartbeats < kMaxCreditHeartbeats) {
      ++it;
      continue;
    }
    credited_blocks_ -= it->second.blocks;
    ended_.erase(it++);
  }
  absl::erase_if(ended_unlisted_,
                 [](const auto& entry) { return entry.second.heartbeats >= kMaxCreditHeartbeats; });
}

void KvBooks::Done(const std::string& id, int64_t blocks) {
  if (auto it = unlisted_.find(id); it != unlisted_.end()) {
    // Never counted taken: the booking goes.
    const int64_t off = std::min(it->second, blocks);
    booked_blocks_ -= off;
    it->second -= off;
    if (it->second <= 0) unlisted_.erase(it);
    ended_unlisted_[id] = {off, 0};
    return;
  }
  auto it = listed_.find(id);
  if (it == listed_.end()) return;  // freed, as a heartbeat said: nothing to credit
  ended_[id] = {it->second, 0};
  credited_blocks_ += it->second;
  listed_.erase(it);
}

}  // namespace pdq::router
