#include "sim/worker_sim.h"

#include <algorithm>

namespace pdq::sim {

using Stage = policy::StreamView::Stage;

void WorkerSim::Add(const SimStream& s) { streams_.push_back(s); }

void WorkerSim::KvLanded(int64_t id) {
  for (SimStream& s : streams_) {
    if (s.id != id) continue;
    s.stage = Stage::kDecoding;
    s.prefilled = s.prompt_tokens;
    s.kv_tokens = s.prompt_tokens;
    s.emitted = 1;
  }
}

void WorkerSim::Remove(int64_t id) {
  std::erase_if(streams_, [id](const SimStream& s) { return s.id == id; });
}

bool WorkerSim::HasWork() const {
  return std::any_of(streams_.begin(), streams_.end(),
                     [](const SimStream& s) { return s.stage != Stage::kOther; });
}

int64_t WorkerSim::queued_prompt_tokens() const {
  int64_t n = 0;
  for (const SimStream& s : streams_) {
    if (s.stage == Stage::kPrompt) n += s.prompt_tokens - s.prefilled;
  }
  return n;
}

int64_t WorkerSim::decoding() const {
  return std::count_if(streams_.begin(), streams_.end(),
                       [](const SimStream& s) { return s.stage == Stage::kDecoding; });
}

int64_t WorkerSim::Ending(const SimStep& step) const {
  int64_t n = 0;
  for (int64_t id : step.rows) {
    for (const SimStream& s : streams_) {
      if (s.id == id && LastToken(s)) ++n;
    }
  }
  return n;
}

int64_t WorkerSim::BlocksFor(int64_t tokens) const {
  const int64_t bt = spec_.batch.block_tokens;
  return (tokens + bt - 1) / bt;
}

bool WorkerSim::Reserve(int64_t tokens) {
  const int64_t blocks = BlocksFor(tokens);
  if (kv_blocks_used_ + blocks > spec_.kv_blocks) return false;
  kv_blocks_used_ += blocks;
  return true;
}

void WorkerSim::Unreserve(int64_t tokens) { kv_blocks_used_ -= BlocksFor(tokens); }

SimStep WorkerSim::Form() {
  std::vector<policy::StreamView> views;
  views.reserve(streams_.size());
  for (const SimStream& s : streams_) {
    views.push_back({s.stage, s.batch_priority, s.prefilled, s.prompt_tokens, s.kv_tokens});
  }
  policy::BatchOptions options = spec_.batch;
  options.fused = spec_.fused;
  const policy::StepComposition c =
      policy::FormStep(views, options, spec_.fused ? decode_cost_ : prompt_cost_, decode_cost_);
  SimStep step;
  for (size_t i : c.rows) {
    step.rows.push_back(streams_[i].id);
    step.pass_work.AddDecodeRow(streams_[i].kv_tokens);
  }
  for (size_t j = 0; j < c.prompts.size(); ++j) {
    if (c.chunk[j] == 0) continue;
    const SimStream& s = streams_[c.prompts[j]];
    step.chunks.emplace_back(s.id, c.chunk[j]);
    (spec_.fused ? step.pass_work : step.prompt_work).AddChunk(s.prefilled, c.chunk[j]);
  }
  step.predicted_seconds = c.plan.predicted_seconds;
  policy::RanToBack(streams_, c.rows);
  return step;
}

WorkerSim::WorkerSim(Role role, const WorkerSpec& spec) : role_(role), spec_(spec) {
  if (!spec_.calibrate || role_ == Role::kPrefill) return;
  // As the scheduler times them: one pass on the fused model, else the
  // prompt chunk on the prompt model and the rows on the decode model.
  for (const policy::CalibrationPass& p : policy::CalibrationPasses(spec_.fused)) {
    if (spec_.fused) {
      const policy::StepWork w = p.Work();
      decode_cost_.Calibrate(w, spec_.pass.Seconds(w));
      continue;
    }
    if (p.chunk > 0) {
      const policy::StepWork w = p.PromptWork();
      prompt_cost_.Calibrate(w, spec_.prompt_pass.Seconds(w));
    }
    if (p.rows > 0) {
      const policy::StepWork w = p.RowWork();
      decode_cost_.Calibrate(w, spec_.pass.Seconds(w));
    }
  }
}

StepTimes WorkerSim::ModelTimes(const SimStep& step, bool neighbour_idle) const {
  const WorkerSpec::Steps* alone =
      neighbour_idle && spec_.neighbour_idle.has_value() ? &*spec_.neighbour_idle : nullptr;
  const PassTime& pass = alone ? alone->pass : spec_.pass;
  const auto& row_factors = alone ? alone->row_factors : spec_.row_factors;
  const double overhead = alone ? alone->step_overhead : spec_.step_overhead;
  const double per_row = alone ? alone->step_overhead_per_row : spec_.step_overhead_per_row;
  StepTimes t;
  if (step.prompt_work.prefill_tokens > 0) t.prompt = spec_.prompt_pass.Seconds(step.prompt_work);
  if (step.pass_work.decode_rows > 0 || step.pass_work.prefill_tokens > 0) {
    t.pass = pass.Seconds(step.pass_work);
    // Decode steps alone (no prompt tokens in either model's pass), as the
    // served probe's one-client levels ran them; a prompt's tokens are
    // priced served apart (sim::PassProfile::served_prompt_factor).
    if (step.pass_work.prefill_tokens == 0 && step.prompt_work.prefill_tokens == 0) {
      t.pass *= RowFactorAt(row_factors, step.pass_work.decode_rows);
    }
  }
  t.overhead_per_row = per_row;
  if (!step.rows.empty()) t.overhead = overhead + per_row * double(step.rows.size());
  return t;
}

StepOutcome WorkerSim::Finish(const SimStep& step, const StepTimes& times) {
  if (step.prompt_work.prefill_tokens > 0) prompt_cost_.Observe(step.prompt_work, times.prompt);
  if (step.pass_work.decode_rows > 0 || step.pass_work.prefill_tokens > 0) {
    decode_cost_.Observe(step.pass_work, times.pass);
  }
  StepOutcome out;
  auto find = [&](int64_t id) {
    return std::find_if(streams_.begin(), streams_.end(),
                        [id](const SimStream& s) { return s.id == id; });
  };
  for (int64_t id : step.rows) {
    auto s = find(id);
    if (LastToken(*s)) out.finished.push_back(id);
    ++s->emitted;
    ++s->kv_tokens;
    out.tokens.push_back(id);
  }
  for (const auto& [id, n] : step.chunks) {
    auto s = find(id);
    s->prefilled += n;
    if (s->prefilled < s->prompt_tokens) continue;
    out.prefilled.push_back(id);
    out.tokens.push_back(id);  // the first token is sampled here
    if (s->prefill_only) {
      out.finished.push_back(id);
      continue;
    }
    s->stage = Stage::kDecoding;
    s->kv_tokens = s->prompt_tokens;
    s->emitted = 1;
    if (s->emitted >= s->output_tokens) out.finished.push_back(id);
  }
  std::erase_if(streams_, [&](const SimStream& s) {
    return std::find(out.finished.begin(), out.finished.end(), s.id) != out.finished.end();
  });
  return out;
}

}  // namespace pdq::sim
