// A router's books of one decode worker's KV blocks and streams between its
// heartbeats: a pure class (no clock, no locks; the registry holds its lock
// around it), so every order of sends, heartbeats and endings can be tested
// on its own (tests/kv_books_test.cc).
//
// A heartbeat carries the worker's free blocks and the streams it holds
// (WorkerLoad::kv_blocks_free, sequences_held), sampled together with two
// lists: the requests whose blocks the sample counts as taken and no
// earlier heartbeat listed (kv_taken_request_ids), and those whose blocks it
// counts as freed again (kv_released_request_ids). Between heartbeats the
// router books what it sends (until a heartbeat lists it taken) and credits
// what ended (from when it saw the end until a heartbeat lists it freed),
// so its room is exact whatever the order in which a sample, an end and the
// heartbeat carrying the sample reach it. Where the lists are missing (a
// worker that predates them) the books fall back to lasting one heartbeat,
// and a credit no heartbeat clears within kMaxCreditHeartbeats is dropped:
// the books then count the worker fuller than it is, never emptier.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace pdq::router {

class KvBooks {
 public:
  static constexpr int kMaxCreditHeartbeats = 4;

  // `id` was sent to the worker, holding `blocks` of its free ones.
  void Book(const std::string& id, int64_t blocks);

  // A heartbeat: `taken` and `released` as above; `taken_reported` and
  // `released_reported` say whether the worker lists them at all.
  void Heartbeat(const google::protobuf::RepeatedPtrField<std::string>& taken, bool taken_reported,
                 const google::protobuf::RepeatedPtrField<std::string>& released,
                 bool released_reported);

  // `id` ended at the router; `blocks`: what Book booked for it.
  void Done(const std::string& id, int64_t blocks);

  // Blocks the router has sent that the last heartbeat's free count still
  // counts as free, and blocks it counts as taken that have been freed:
  // room = free - booked_blocks() + credited_blocks().
  int64_t booked_blocks() const { return booked_blocks_; }
  int64_t credited_blocks() const { return credited_blocks_; }
  // The same in streams: held = sequences_held + booked_streams() -
  // credited_streams().
  int64_t booked_streams() const { return (int64_t)unlisted_.size(); }
  int64_t credited_streams() const { return (int64_t)ended_.size(); }

 private:
  struct Ended {
    int64_t blocks = 0;
    int heartbeats = 0;  // seen since the end without listing it freed
  };

  // Sent, not yet listed taken.
  absl::flat_hash_map<std::string, int64_t> unlisted_;
  int64_t booked_blocks_ = 0;
  // Listed taken, not yet ended at the router nor listed freed.
  absl::flat_hash_map<std::string, int64_t> listed_;
  // Ended at the router after being listed taken, not yet listed freed.
  absl::flat_hash_map<std::string, Ended> ended_;
  // Ended at the router before any heartbeat listed it taken: a heartbeat
  // sampled while the worker held it may still list it, and then its free
  // count holds the blocks until one lists them freed (short requests end
  // within a heartbeat interval all the time). Dropped after
  // kMaxCreditHeartbeats heartbeats that do not list it (it never reached
  // the worker, or the worker refused it).
  absl::flat_hash_map<std::string, Ended> ended_unlisted_;
  int64_t credited_blocks_ = 0;
};

}  // namespace pdq::router
