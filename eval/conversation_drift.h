// Drift over a scripted conversation: each line of a script is the user's
// next turn; the reference's greedy answer to each (cut at its
// end-of-generation token, at most `turn_tokens`) goes back into the
// history before the next, so the context grows turn by turn as in a real
// dialogue. Every turn re-reads the whole history, prefilled by the prefill
// precision and continued by the decode precision, as a disaggregated
// deployment without a prefix cache would; drift (eval/drift.h) is measured
// on each answer's positions.
//
// With `reuse_kv`, the test side keeps its KV from turn to turn as a prefix
// cache would: each turn reuses the whole blocks of the previous turn's
// prompt (written by the prefill precision) and answer (written by the
// decode precision) that the new prompt starts with, and prefills only the
// rest; the reference still computes every turn afresh. Against a run
// without it, this is the accuracy cost of reading KV another precision
// wrote. With `follow_ups_at_decode` as well, turns after the first prefill
// what is new at the decode precision, as a decode worker that prefills a
// short follow-up itself does (the first turn still at the prefill
// precision, as the prefill worker would).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/context.h"

namespace pdq {

struct ConversationTurnDrift {
  int turn = 0;  // from 1
  int64_t prompt_tokens = 0, reused_tokens = 0, answer_tokens = 0;
  double kl_mean = 0, agreement = 0;  // over the answer's positions
  int64_t first_divergence = -1;      // -1: none within the answer
};

struct ConversationDriftOptions {
  int turn_tokens = 96;  // longest answer
  bool reuse_kv = false;
  bool follow_ups_at_decode = false;  // needs reuse_kv
  // Called after each turn with the number of turns.
  std::function<void(const ConversationTurnDrift&, size_t)> progress;
};

struct ConversationDriftResult {
  std::vector<ConversationTurnDrift> turns;
  // Every answer position of every turn, in order.
  std::vector<double> kl_by_position, agreement_by_position;
  double kl_mean = 0, agreement = 0;  // over all those positions
  double reused_fraction = 0;         // of all prompt tokens, with reuse_kv
};

// An error names the turn that failed; InvalidArgument for an empty script.
absl::StatusOr<ConversationDriftResult> MeasureConversationDrift(
    Context& reference, Context& prefill, Context& decode, const std::vector<std::string>& turns,
    const ConversationDriftOptions& options);

}  // namespace pdq
