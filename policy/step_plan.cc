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
  decode_attention += double(past) + 0.5;
}

namespace {

constexpr double kForget = 0.95;  // a pass's weight, per pass since
// The parts in units that keep them of order one on typical steps, so that
// the normal equations stay well conditioned.
constexpr double kRowScale = 1.0 / 16, kTokenScale = 1.0 / 256, kPairScale = 1e-6;

constexpr int kParts = NormalEquations::kParts;

void Features(const StepWork& w, double x[kParts]) {
  x[0] = 1;
  x[1] = double(w.decode_rows) * kRowScale;
  x[2] = double(w.prefill_tokens) * kTokenScale;
  x[3] = w.attention * kPairScale;
  x[4] = w.decode_attention * kPairScale;
}

// Solves a[n][n] y = b in place (Gauss-Jordan, partial pivoting); false when
// a pivot is negligible against the matrix's size (parts that moved
// together in every sample).
bool Solve(int n, double a[kParts][kParts + 1], double y[kParts]) {
  double size = 0;
  for (int i = 0; i < n; ++i) size = std::max(size, std::abs(a[i][i]));
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    for (int k = 0; k <= n; ++k) std::swap(a[c][k], a[pivot][k]);
    if (!(std::abs(a[c][c]) > 1e-10 * size)) return false;
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  for (int i = 0; i < n; ++i) y[i] = a[i][n] / a[i][i];
  return true;
}

}  // namespace

void NormalEquations::Add(const StepWork& w, double seconds, double weight) {
  if (!(seconds > 0) || !(weight > 0)) return;
  double x[kParts];
  Features(w, x);
  const double k = weight / (seconds * seconds);
  for (int i = 0; i < kParts; ++i) {
    for (int j = 0; j < kParts; ++j) a[i][j] += k * x[i] * x[j];
    b[i] += k * x[i] * seconds;
  }
  yy += k * seconds * seconds;
}

void NormalEquations::Scale(double f) {
  for (int i = 0; i < kParts; ++i) {
    for (int j = 0; j < kParts; ++j) a[i][j] *= f;
    b[i] *= f;
  }
  yy *= f;
}

void NormalEquations::Plus(const NormalEquations& o) {
  for (int i = 0; i < kParts; ++i) {
    for (int j = 0; j < kParts; ++j) a[i][j] += o.a[i][j];
    b[i] += o.b[i];
  }
  yy += o.yy;
}

StepCoefficients NormalEquations::Fit() const {
  // Each part scaled by its diagonal so that the solves compare like with
  // like; a part no sample exercised (zero diagonal) stays out.
  double d[kParts];
  for (int i = 0; i < kParts; ++i) d[i] = a[i][i] > 0 ? std::sqrt(a[i][i]) : 0;
  // Fewer parts first; more only for a residual that is really smaller.
  static const std::vector<int> masks = [] {
    std::vector<int> m;
    for (int mask = 1; mask < (1 << kParts); ++mask) m.push_back(mask);
    std::stable_sort(m.begin(), m.end(),
                     [](int l, int r) { return __builtin_popcount(l) < __builtin_popcount(r); });
    return m;
  }();
  double best[kParts] = {}, best_residual = INFINITY;
  for (int mask : masks) {
    int idx[kParts], n = 0;
    bool usable = true;
    for (int i = 0; i < kParts; ++i) {
      if (!(mask >> i & 1)) continue;
      usable = usable && d[i] > 0;
      idx[n++] = i;
    }
    if (!usable) continue;
    double m[kParts][kParts + 1], y[kParts];
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < n; ++c) m[r][c] = a[idx[r]][idx[c]] / (d[idx[r]] * d[idx[c]]);
      m[r][n] = b[idx[r]] / d[idx[r]];
    }
    if (!Solve(n, m, y)) continue;
    if (std::any_of(y, y + n, [](double v) { return v < 0; })) continue;
    double g[kParts] = {};
    for (int r = 0; r < n; ++r) g[idx[r]] = y[r] / d[idx[r]];
    double residual = yy;
    for (int i = 0; i < kParts; ++i) {
      residual -= 2 * g[i] * b[i];
      for (int j = 0; j < kParts; ++j) residual += g[i] * a[i][j] * g[j];
    }
    if (residual < best_residual - 1e-9 * yy) {
      best_residual = residual;
      std::copy(g, g + kParts, best);
    }
  }
  return {best[0],
          best[1] * kRowScale,
          best[2] * kTokenScale,
          best[3] * kPairScale,
          best[4] * kPairScale,
          {}};
}

double Interpolated(const std::vector<std::pair<double, double>>& points, double x) {
  if (x <= points.front().first) return points.front().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [x1, y1] = points[i];
    if (x > x1) continue;
    const auto& [x0, y0] = points[i - 1];
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  }
  return points.back().second;
}

double StepCoefficients::RowStep(double rows) const {
  return row_steps.empty() ? 0 : Interpolated(row_steps, rows);
}

bool StepCoefficients::RowStepsValid() const {
  for (size_t i = 0; i < row_steps.size(); ++i) {
    const auto& [rows, seconds] = row_steps[i];
    if (!std::isfinite(rows) || !std::isfinite(seconds) || rows < 1) return false;
    if (i > 0 && !(rows > row_steps[i - 1].first)) return false;
  }
  return true;
}

StepCoefficients FitStepTime(const std::vector<StepSample>& samples) {
  NormalEquations e;
  for (const StepSample& p : samples) e.Add(p.work, p.seconds, p.weight);
  return e.Fit();
}

double StepCostModel::Predict(const StepWork& w) const {
  if (n_ == 0 && !calibrated_) return 0;
  return fit_.Seconds(w);
}

void StepCostModel::Observe(const StepWork& w, double seconds) {
  recent_.Scale(kForget);
  recent_.Add(w, seconds, 1);
  ++n_;
  n_prefill_ += w.prefill_tokens > 0;
  Refit();
}

void StepCostModel::Calibrate(const StepWork& w, double seconds) {
  calibration_.Add(w, seconds, 1);
  calibrated_ = true;
  n_prefill_ += w.prefill_tokens > 0;
  Refit();
}

void StepCostModel::Refit() {
  NormalEquations all = recent_;
  all.Plus(calibration_);
  fit_ = all.Fit();
}

std::string StepCostModel::Describe() const {
  return absl::StrFormat(
      "%.2f ms + %.3f ms/row + %.3f ms/token + %.2f ms/M pairs + %.2f ms/M decode pairs",
      fit_.fixed * 1e3, fit_.per_row * 1e3, fit_.per_token * 1e3, fit_.per_pair * 1e9,
      fit_.per_decode_pair * 1e9);
}

StepPlan PlanStep(const StepInput& in, const StepCostModel& prefill_cost,
                  const StepCostModel& decode_cost) {
  StepPlan plan;
  plan.chunk.assign(in.prefill.size(), 0);
  StepWork decode;
  decode.decode_rows = in.decode_rows;
  decode.decode_attention = in.decode_attention;
  const bool bound = (in.tpot_target > 0 || in.prompt_share > 0) && in.decode_rows > 0;
  // Until the prompt pass has been timed, a bounded step takes a few
  // blocks: the first step measures, the next ones fit.
  const bool unknown = prefill_cost.prefill_observations() == 0;
  // What the prompt pass may take: the whole target when fused (the decode
  // rows are in the same pass), else what the decode pass leaves.
  const double decode_alone = in.fused ? 0 : decode_cost.Predict(decode);
  double target = in.tpot_target;
  if (bound && target == 0) {
    // A share of the step: the rest is what the step costs without prompt
    // tokens (the rows in the fused pass; the decode pass and the prompt
    // pass's fixed cost otherwise).
    const double rest =
        in.fused ? prefill_cost.Predict(decode) : decode_alone + prefill_cost.Predict(StepWork{});
    target = rest / (1 - std::min(in.prompt_share, 0.99));
  }
  if (bound) plan.target_seconds = target;
  const double allowed = target - decode_alone;
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
        if (n >= in.align && n < need.remaining) {
          // A target in time is kept: the block below. A share is a
          // proportion: the nearest block (the one below can cost a third
          // of the prompt work when chunks are a block or two).
          n = in.tpot_target > 0 ? n - n % in.align
                                 : std::min(most, (n + in.align / 2) / in.align * in.align);
        }
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

StepWork CalibrationPass::Work() const {
  StepWork w = RowWork();
  if (chunk > 0) w.AddChunk(0, chunk);
  return w;
}

StepWork CalibrationPass::PromptWork() const { return CalibrationPass{0, 0, chunk}.Work(); }

StepWork CalibrationPass::RowWork() const {
  StepWork w;
  for (int64_t r = 0; r < rows; ++r) w.AddDecodeRow(context);
  return w;
}

namespace {
constexpr int64_t kCalibrationContext = 16, kCalibrationLongContext = 128;
constexpr int64_t kCalibrationRows = 4;
}  // namespace

std::vector<CalibrationPass> CalibrationPasses(bool fused) {
  // Prompt chunks of three sizes (a pass's fixed cost against its cost per
  // token), decode batches of two (per row) and at two contexts (per decode
  // attention pair: at one, a row's pairs are a multiple of its rows and
  // the fit cannot price them), and when fused the two together: 240 prompt
  // tokens in all, so about a second on the slowest 2-core machine measured
  // (a W8A8 pass at 4 ms a token, Zen 1), and about as long again filling
  // the rows' sequences (4 x 128 tokens, untimed).
  const int64_t c = kCalibrationContext;
  std::vector<CalibrationPass> passes = {{0, 0, 16},
                                         {0, 0, 64},
                                         {0, 0, 160},
                                         {1, c, 0},
                                         {kCalibrationRows, c, 0},
                                         {kCalibrationRows, kCalibrationLongContext, 0}};
  if (fused) passes.push_back({2, c, 32});
  return passes;
}

int64_t CalibrationKvTokens(bool fused, int64_t block_tokens) {
  int64_t rows = 0, chunk = 0, context = 0;
  for (const CalibrationPass& p : CalibrationPasses(fused)) {
    rows = std::max(rows, p.rows);
    chunk = std::max(chunk, p.chunk);
    context = std::max(context, p.context);
  }
  const auto blocks = [&](int64_t tokens) {
    return (tokens + block_tokens - 1) / block_tokens * block_tokens;
  };
  return rows * blocks(context + 1) + blocks(chunk);
}

}  // namespace pdq::policy
