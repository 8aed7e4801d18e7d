#include "sim/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pdq::sim {

std::string Describe(const PlanOption& o) {
  return absl::StrCat(o.deployment, " ", o.prefill_precision, "/", o.decode_precision);
}

namespace {

absl::StatusOr<PlanOption> Evaluate(const Profile& profile, const PlanQuery& q,
                                    const WorkerOptions& wo, const std::string& deployment,
                                    const std::pair<std::string, std::string>& pair) {
  Deployment d;
  if (absl::Status s = ParseDeployment(deployment, &d); !s.ok()) return s;
  Precisions p;
  p.prefill = pair.first;
  p.decode = pair.second;
  p.monolithic = pair.second;
  p.monolithic_prompt = pair.first;
  if (absl::Status s = SpecsFromProfile(profile, p, wo, &d); !s.ok()) return s;
  absl::StatusOr<SeedSummary> r = RunSeeds(d, q.workload, q.targets, q.seeds);
  if (!r.ok()) return r.status();
  PlanOption o;
  o.deployment = deployment;
  o.prefill_precision = pair.first;
  o.decode_precision = pair.second;
  o.workers = d.monolithic + d.prefill + d.decode;
  o.result = *r;
  // Met with confidence: the attainment's 95% interval lies above the bar.
  o.meets = r->refused == 0 && r->met_fraction.mean - r->met_fraction.half_width >= q.attainment;
  const double tokens = r->output_tokens_per_second.mean;
  o.cost_per_million_output_tokens =
      tokens > 0 ? double(o.workers) * q.worker_hour_price / 3600 / tokens * 1e6 : 0;
  return o;
}

// How close to its targets an option runs: the larger of TTFT p90 and TPOT
// p90 over their targets (lower is more headroom). Options that all meet
// the targets serve the same load, so their goodput differs only by noise;
// headroom is what sets them apart.
double Pressure(const PlanOption& o, const Targets& t) {
  return std::max(o.result.ttft_p90.mean / t.ttft_seconds, o.result.tpot_p90.mean / t.tpot_seconds);
}

}  // namespace

absl::StatusOr<SimPlan> PlanBySimulation(const Profile& profile, const PlanQuery& q,
                                         const WorkerOptions& wo) {
  if (q.max_workers < 1 || q.seeds < 1 || q.pairs.empty() || !(q.attainment > 0) ||
      q.attainment > 1 || (!q.monolithic && !q.disaggregated)) {
    return absl::InvalidArgumentError(
        "plan: max_workers and seeds must be >= 1, attainment in (0, 1], at least one "
        "precision pair and one kind of deployment");
  }
  SimPlan plan;
  for (int n = 1; n <= q.max_workers; ++n) {
    plan = SimPlan{};
    plan.workers = n;
    for (const auto& pair : q.pairs) {
      std::vector<std::string> shapes;
      if (q.monolithic) shapes.push_back(absl::StrCat(n, "M"));
      for (int x = 1; q.disaggregated && x < n; ++x) {
        shapes.push_back(absl::StrCat(x, "P+", n - x, "D"));
      }
      for (const std::string& shape : shapes) {
        absl::StatusOr<PlanOption> o = Evaluate(profile, q, wo, shape, pair);
        if (!o.ok()) return o.status();
        plan.options.push_back(*o);
      }
    }
    for (int i = 0; i < (int)plan.options.size(); ++i) {
      const PlanOption& o = plan.options[i];
      if (!o.meets) continue;
      if (plan.best < 0) {
        plan.best = i;
        continue;
      }
      if (Pressure(o, q.targets) < Pressure(plan.options[plan.best], q.targets)) plan.best = i;
    }
    if (plan.best >= 0) break;
  }
  return plan;
}

absl::StatusOr<std::vector<Sensitivity>> PlanSensitivity(const Profile& profile, const PlanQuery& q,
                                                         const WorkerOptions& wo,
                                                         const SimPlan& plan, double change) {
  const std::string base = plan.best >= 0 ? Describe(plan.options[plan.best]) : "none";
  std::vector<Sensitivity> out;
  for (const char* term : {"prompt", "decode", "link"}) {
    for (double factor : {1 - change, 1 + change}) {
      Profile p = profile;
      for (PassProfile& pass : p.passes) {
        if (std::string(term) == "prompt") {
          pass.time.per_token *= factor;
          pass.time.per_pair *= factor;
        } else if (std::string(term) == "decode") {
          pass.time.fixed *= factor;
          pass.time.per_row *= factor;
        }
      }
      if (std::string(term) == "link") {
        for (LinkProfile& l : p.links) {
          l.link.bytes_per_second /= factor;
          l.link.latency_seconds *= factor;
        }
      }
      absl::StatusOr<SimPlan> r = PlanBySimulation(p, q, wo);
      if (!r.ok()) return r.status();
      Sensitivity s;
      s.term = term;
      s.factor = factor;
      s.recommendation = r->best >= 0 ? Describe(r->options[r->best]) : "none";
      s.same = s.recommendation == base;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace pdq::sim
