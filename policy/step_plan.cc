#include "policy/step_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace pdq::policy {

void StepWork::AddChunk(int64_t past, int64_t tokens) {
  prefill_tokens += tokens;
  attention += double(tokens) * (double(past) + 0.5 * double(tokens));
}

void StepWork::AddDecodeRow(int64_t past) {
  ++decode_rows;
  attention += double(past) + 0.5;
}

namespace {

// The features, scaled so that each is of order one on typical steps and
// the least-squares state stays well conditioned.
constexpr double kPrior = 1e2;    // initial variance of each coefficient
constexpr double kForget = 0.98;  // older steps' weight per step
void Features(const StepWork& w, double x[4]) {
  x[0] = 1;
  x[1] = double(w.decode_rows) / 16;
  x[2] = double(w.prefill_tokens) / 256;
  x[3] = w.attention / 1e6;
}

}  // namespace

StepCostModel::StepCostModel() {
  for (int i = 0; i < kDim; ++i) {
    theta_[i] = 0;
    for (int j = 0; j < kDim; ++j) p_[i][j] = i == j ? kPrior : 0;
  }
}

double StepCostModel::Predict(const StepWork& w) const {
  if (n_ == 0) return 0;
  double x[kDim];
  Features(w, x);
  double t = 0;
  for (int i = 0; i < kDim; ++i) t += theta_[i] * x[i];
  return t;
}

void StepCostModel::Observe(const StepWork& w, double seconds) {
  double x[kDim], px[kDim];
  Features(w, x);
  double denom = kForget, err = seconds;
  for (int i = 0; i < kDim; ++i) {
    px[i] = 0;
    for (int j = 0; j < kDim; ++j) px[i] += p_[i][j] * x[j];
    denom += x[i] * px[i];
    err -= theta_[i] * x[i];
  }
  // Each part costs time or nothing: a coefficient driven below zero (by
  // features that moved together) is held at zero, so more work never looks
  // cheaper and the plan's searches see a monotone cost; the others take up
  // the difference on the next steps.
  for (int i = 0; i < kDim; ++i) theta_[i] = std::max(0.0, theta_[i] + px[i] / denom * err);
  // P = (P - P x x' P / denom) / forget; the forgetting stops while P is at
  // its prior's size, so steps that all look alike (decode only, for hours)
  // cannot blow up the directions they do not excite.
  double trace = 0;
  for (int i = 0; i < kDim; ++i) {
    for (int j = 0; j < kDim; ++j) p_[i][j] -= px[i] * px[j] / denom;
    trace += p_[i][i];
  }
  const double scale = trace < kPrior * kDim ? 1 / kForget : 1;
  for (int i = 0; i < kDim; ++i) {
    for (int j = 0; j < kDim; ++j) p_[i][j] *= scale;
  }
  ++n_;
  n_prefill_ += w.prefill_tokens > 0;
}

std::string StepCostModel::Describe() const {
  return absl::StrFormat("%.2f ms + %.3f ms/row + %.3f ms/token + %.2f ms/M pairs", theta_[0] * 1e3,
                         theta_[1] / 16 * 1e3, theta_[2] / 256 * 1e3, theta_[3] * 1e3);
}

StepPlan PlanStep(const StepInput& in, const StepCostModel& prefill_cost,
                  const StepCostModel& decode_cost) {
  StepPlan plan;
  plan.chunk.assign(in.prefill.size(), 0);
  StepWork decode;
  decode.decode_rows = in.decode_rows;
  decode.attention = in.decode_attention;
  const bool bound = in.tpot_target > 0 && in.decode_rows > 0;
  // Until the prompt pass has been timed, a bounded step takes a few
  // blocks: the first step measures, the next ones fit.
  const bool unknown = prefill_cost.prefill_observations() == 0;
  // What the prompt pass may take: the whole target when fused (the decode
  // rows are in the same pass), else what the decode pass leaves.
  const double decode_alone = in.fused ? 0 : decode_cost.Predict(decode);
  const double allowed = in.tpot_target - decode_alone;
  StepWork work = in.fused ? decode : StepWork{};
  int64_t budget = in.token_budget;
  // A pass of its own (not fused) pays its fixed cost (reading every
  // weight) however few tokens it computes: the least it takes is where the
  // tokens cost as much as that, so prompts progress at half the pass's
  // best rate or better even when the target leaves no room.
  int64_t min_chunk = in.min_chunk;
  if (!in.fused && !unknown) {
    const double fixed = prefill_cost.Predict(StepWork{});
    StepWork probe;
    probe.AddChunk(0, 256);
    const double per_token = (prefill_cost.Predict(probe) - fixed) / 256;
    if (per_token > 0) {
      const int64_t even = (int64_t)std::ceil(fixed / per_token);
      min_chunk = std::max(min_chunk, (even + in.align - 1) / in.align * in.align);
    }
  }
  for (size_t i = 0; i < in.prefill.size() && budget > 0; ++i) {
    const PrefillNeed& need = in.prefill[i];
    const int64_t most = std::min(need.remaining, budget);
    int64_t n = most;
    if (bound) {
      auto fits = [&](int64_t k) {
        StepWork w = work;
        w.AddChunk(need.past, k);
        return prefill_cost.Predict(w) <= allowed;
      };
      if (unknown) {
        n = std::min(most, 4 * in.min_chunk);
      } else if (!fits(most)) {
        int64_t lo = 0, hi = most;  // fits(lo), !fits(hi)
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (fits(mid) ? lo : hi) = mid;
        }
        n = lo;
      }
      if (n < most) {
        plan.bounded = true;
        if (n >= in.align && n < need.remaining) n -= n % in.align;
        // Prompts always progress: the first one waiting takes at least a
        // minimum chunk, whatever the target says.
        if (i == 0) n = std::max(n, std::min(most, min_chunk));
      }
    }
    if (n <= 0) break;
    plan.chunk[i] = n;
    plan.prefill_tokens += n;
    work.AddChunk(need.past, n);
    budget -= n;
    if (plan.bounded) break;
  }
  plan.predicted_seconds = in.fused ? prefill_cost.Predict(work)
                                    : (plan.prefill_tokens > 0 ? prefill_cost.Predict(work) : 0) +
                                          (in.decode_rows > 0 ? decode_cost.Predict(decode) : 0);
  return plan;
}

}  // namespace pdq::policy
