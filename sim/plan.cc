#include "sim/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pdq::sim {

std::string Describe(const PlanOption& o) {
  return absl::StrCat(o.deployment, " ", o.prefill_precision, "/", o.decode_precision);
}

namespace {

// A precision pair's workers: monolithic ones decode at the second and
// compute prompts at the first.
Precisions PairPrecisions(const std::pair<std::string, std::string>& pair) {
  Precisions p;
  p.prefill = pair.first;
  p.decode = pair.second;
  p.monolithic = pair.second;
  p.monolithic_prompt = pair.first;
  return p;
}

absl::StatusOr<Deployment> DeploymentFor(const Profile& profile, const WorkerOptions& wo,
                                         const std::string& deployment,
                                         const std::pair<std::string, std::string>& pair) {
  Deployment d;
  if (absl::Status s = ParseDeployment(deployment, &d); !s.ok()) return s;
  if (absl::Status s = SpecsFromProfile(profile, PairPrecisions(pair), wo, &d); !s.ok()) return s;
  return d;
}

// Met with confidence: none refused and the attainment's 95% interval
// above the bar.
bool Meets(const SeedSummary& r, double attainment) {
  return r.refusals.total() == 0 && r.met_fraction.mean - r.met_fraction.half_width >= attainment;
}

}  // namespace

absl::StatusOr<SeedSummary> RunSteady(const Deployment& d, Workload w, const Targets& t, int seeds,
                                      double attainment, Workload* ran) {
  if (ran != nullptr) *ran = w;
  if (w.arrivals == Workload::Arrivals::kClosedLoop || !(w.rate > 0) || !w.phases.empty()) {
    return RunSeeds(d, w, t, seeds);
  }
  // The ramp is the first requests sent (they found idle workers), not the
  // first to end: under overload those are refusals, which Meets must see.
  w.warmup_first_to_end = false;
  for (int round = 0;; ++round) {
    absl::StatusOr<SeedSummary> r = RunSeeds(d, w, t, seeds);
    if (!r.ok()) return r.status();
    if (ran != nullptr) *ran = w;
    // A run that misses in the ramp misses at steady state too (it started
    // from idle workers): no need to run it longer.
    if (!Meets(*r, attainment)) return r;
    const double lifetime =
        r->ttft_p90.mean + r->tpot_p90.mean * double(std::max<int64_t>(0, w.output_tokens - 1));
    const int needed = (int)std::min<double>(kMaxSteadyRequests / 2,
                                             std::ceil(kSteadyLifetimes * lifetime * w.rate));
    if ((w.warmup >= needed && w.requests >= needed) || round == 3) return r;
    w.warmup = std::max(w.warmup, needed);
    w.requests = std::max(w.requests, needed);
  }
}

namespace {

absl::StatusOr<PlanOption> Evaluate(const Profile& profile, const PlanQuery& q,
                                    const WorkerOptions& wo, const std::string& deployment,
                                    const std::pair<std::string, std::string>& pair) {
  absl::StatusOr<Deployment> dep = DeploymentFor(profile, wo, deployment, pair);
  if (!dep.ok()) return dep.status();
  const Deployment& d = *dep;
  PlanOption o;
  absl::StatusOr<SeedSummary> r =
      RunSteady(d, q.workload, q.targets, q.seeds, q.attainment, &o.workload);
  if (!r.ok()) return r.status();
  o.deployment = deployment;
  o.prefill_precision = pair.first;
  o.decode_precision = pair.second;
  o.workers = d.monolithic + d.prefill + d.decode;
  o.result = *r;
  o.meets = Meets(*r, q.attainment);
  // What it delivers under this load: where it keeps up, every arrival's
  // tokens (a run's own tokens a second divide by its span, whose ramp and
  // drain weigh more in a shorter run); where it does not, what the run got.
  const double tokens = o.meets && o.workload.rate > 0
                            ? o.workload.rate * double(o.workload.output_tokens)
                            : r->output_tokens_per_second.mean;
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

int ClusterCoresPerNode(const Profile& profile, const WorkerOptions& wo) {
  if (wo.threads > 0) return wo.threads;
  int most = 0;
  for (const PassProfile& p : profile.passes) most = std::max(most, p.threads);
  return std::max(1, most);
}

absl::StatusOr<std::vector<ClusterPoint>> SweepCluster(
    const Profile& profile, const ClusterQuery& q, const WorkerOptions& wo,
    const std::function<void(const ClusterPoint&, int, int)>& progress) {
  if (q.nodes.empty() || q.plan.pairs.empty() || !(q.tolerance > 0) || q.plan.seeds < 1 ||
      !(q.plan.attainment > 0) || q.plan.attainment > 1) {
    return absl::InvalidArgumentError(
        "cluster sweep: at least one node count and one precision pair, tolerance > 0, seeds "
        ">= 1, attainment in (0, 1]");
  }
  for (int n : q.nodes) {
    if (n < 2) return absl::InvalidArgumentError("cluster sweep: node counts must be at least 2");
  }
  for (double share : q.prefill_shares) {
    if (!(share > 0 && share < 1)) {
      return absl::InvalidArgumentError("cluster sweep: prefill shares must be in (0, 1)");
    }
  }
  const int cores = ClusterCoresPerNode(profile, wo);
  // The shapes of each size: monolithic, then each distinct prefill count.
  std::vector<std::pair<int, std::string>> shapes;  // (nodes, deployment)
  for (int n : q.nodes) {
    shapes.emplace_back(n, absl::StrCat(n, "M"));
    std::vector<int> xs;
    for (double share : q.prefill_shares) {
      const int x = std::clamp((int)std::lround(share * n), 1, n - 1);
      if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
    }
    std::sort(xs.begin(), xs.end());
    for (int x : xs) shapes.emplace_back(n, absl::StrCat(x, "P+", n - x, "D"));
  }
  const int total = (int)(shapes.size() * q.plan.pairs.size());
  std::vector<ClusterPoint> out;
  // Where a search starts: the last rate found for the same pair and kind
  // of deployment, scaled by the nodes (capacity grows about so); else 1/s.
  auto guess = [&](const ClusterPoint& p) {
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      if (it->rate > 0 && it->prefill_precision == p.prefill_precision &&
          it->decode_precision == p.decode_precision && (it->prefill == 0) == (p.prefill == 0)) {
        return it->rate * double(p.nodes) / it->nodes;
      }
    }
    return 1.0;
  };
  for (const auto& pair : q.plan.pairs) {
    for (const auto& [n, shape] : shapes) {
      absl::StatusOr<Deployment> dep = DeploymentFor(profile, wo, shape, pair);
      if (!dep.ok()) return dep.status();
      ClusterPoint p;
      p.nodes = n;
      p.deployment = shape;
      p.prefill_precision = pair.first;
      p.decode_precision = pair.second;
      p.prefill = dep->prefill;
      p.decode = dep->decode;
      auto met = [&](double rate) -> absl::StatusOr<bool> {
        Workload w = q.plan.workload;
        w.rate = rate;
        ++p.runs;
        absl::StatusOr<SeedSummary> s =
            RunSteady(*dep, w, q.plan.targets, q.plan.seeds, q.plan.attainment);
        if (!s.ok()) return s.status();
        if (!Meets(*s, q.plan.attainment)) return false;
        p.result = *s;  // the highest met so far
        return true;
      };
      double lo = 0, hi = 0;  // the highest rate met, the lowest missed
      double r = guess(p);
      // Bracket: double until a rate is missed, halve until one is met
      // (giving up below a request a day: nothing meets).
      while ((lo == 0 || hi == 0) && r > 1e-5 && r < 1e7) {
        absl::StatusOr<bool> m = met(r);
        if (!m.ok()) return m.status();
        if (*m) {
          lo = r;
          r *= 2;
        } else {
          hi = r;
          r /= 2;
        }
      }
      while (lo > 0 && hi > 0 && hi > lo * (1 + q.tolerance)) {
        const double mid = std::sqrt(lo * hi);
        absl::StatusOr<bool> m = met(mid);
        if (!m.ok()) return m.status();
        (*m ? lo : hi) = mid;
      }
      p.rate = lo;
      p.missed_rate = hi;
      if (lo > 0) {
        // At steady state: the arrivals' rate times the share within the
        // targets (a run's own goodput divides by its span, whose ramp and
        // drain weigh more the fewer requests it has).
        p.goodput_tokens_per_second =
            lo * p.result.met_fraction.mean * double(q.plan.workload.output_tokens);
        p.tokens_per_second_per_core = p.goodput_tokens_per_second / (double(n) * cores);
        if (p.goodput_tokens_per_second > 0) {
          p.cost_per_million_output_tokens =
              double(n) * q.plan.worker_hour_price / 3600 / p.goodput_tokens_per_second * 1e6;
        }
      }
      out.push_back(p);
      if (progress) progress(out.back(), (int)out.size(), total);
    }
  }
  return out;
}

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

absl::StatusOr<Profile> ScaleProfileTerm(const Profile& profile, std::string_view term,
                                         double factor) {
  if (!(factor > 0) || !std::isfinite(factor)) {
    return absl::InvalidArgumentError(absl::StrCat("profile term factor ", factor, ": want > 0"));
  }
  Profile p = profile;
  if (term == "prompt") {
    for (PassProfile& pass : p.passes) {
      pass.time.per_token *= factor;
      pass.time.per_pair *= factor;
    }
  } else if (term == "decode") {
    for (PassProfile& pass : p.passes) {
      pass.time.fixed *= factor;
      pass.time.per_row *= factor;
      pass.time.per_decode_pair *= factor;
      for (auto& [rows, seconds] : pass.time.row_steps) seconds *= factor;
      pass.step_overhead *= factor;
      pass.step_overhead_per_row *= factor;
      pass.stream_finish_seconds *= factor;
    }
    for (SplitProfile& s : p.splits) {
      s.decode_step_overhead *= factor;
      s.decode_step_overhead_per_row *= factor;
    }
  } else if (term == "link") {
    for (LinkProfile& l : p.links) {
      l.link.bytes_per_second /= factor;
      l.link.latency_seconds *= factor;
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("profile term \"", std::string(term), "\": want prompt, decode or link"));
  }
  return p;
}

absl::StatusOr<std::vector<Sensitivity>> PlanSensitivity(const Profile& profile, const PlanQuery& q,
                                                         const WorkerOptions& wo,
                                                         const SimPlan& plan, double change) {
  const std::string base = plan.best >= 0 ? Describe(plan.options[plan.best]) : "none";
  std::vector<Sensitivity> out;
  for (const char* term : kProfileTerms) {
    for (double factor : {1 - change, 1 + change}) {
      absl::StatusOr<Profile> p = ScaleProfileTerm(profile, term, factor);
      if (!p.ok()) return p.status();
      absl::StatusOr<SimPlan> r = PlanBySimulation(*p, q, wo);
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

namespace {

// The prompt tokens a worker of `spec` computes in `seconds`, at the
// workload's prompt length.
double PromptTokensIn(const WorkerSpec& spec, int64_t prompt_tokens, double seconds) {
  policy::StepWork w;
  w.AddChunk(0, prompt_tokens);
  const double pass = (spec.fused ? spec.pass : spec.prompt_pass).Seconds(w);
  return pass > 0 ? seconds * double(prompt_tokens) / pass : 0;
}

// `base` with the target of `metric` set (added where it has none).
void SetTarget(HpaSpec& h, PodMetric metric, double value) {
  for (MetricTarget& t : h.metrics) {
    if (t.metric == metric) {
      t.average_value = value;
      return;
    }
  }
  h.metrics.push_back({metric, value});
}

}  // namespace

absl::StatusOr<AutoscalePlan> PlanAutoscaling(
    const Profile& profile, const PlanQuery& q, const WorkerOptions& wo, const PlanOption& option,
    const AutoscaleQuery& a, const std::function<void(const AutoscaleTry&, int, int)>& progress) {
  if (a.phases.empty()) return absl::InvalidArgumentError("autoscale: no rate phase");
  absl::StatusOr<Deployment> dep = DeploymentFor(
      profile, wo, option.deployment, {option.prefill_precision, option.decode_precision});
  if (!dep.ok()) return dep.status();
  const Deployment& d = *dep;
  AutoscalePlan out;
  const WorkerSpec& prompts = d.monolithic > 0 ? d.monolithic_worker : d.prefill_worker;
  out.queued_tokens =
      std::max(1.0, PromptTokensIn(prompts, q.workload.prompt_tokens, q.targets.ttft_seconds / 2));

  Workload w = q.workload;
  w.warmup = 0;
  double per_cycle = 0;
  for (const Workload::Phase& p : a.phases) {
    out.phases.push_back({p.seconds, p.rate * q.workload.rate});
    per_cycle += p.seconds * p.rate * q.workload.rate;
  }
  w.phases = out.phases;
  out.requests = std::max(50, (int)std::lround(2 * per_cycle));
  w.requests = out.requests;
  absl::StatusOr<SeedSummary> fixed = RunSeeds(d, w, q.targets, q.seeds);
  if (!fixed.ok()) return fixed.status();
  out.fixed = *fixed;

  // The HPAs of one try.
  auto hpas_for = [&](double sequences) {
    std::array<std::optional<HpaSpec>, 3> h;
    auto pool = [&](Role role, int count, bool prefills, bool decodes) {
      if (count <= 0) return;
      HpaSpec spec = a.base[static_cast<int>(role)];
      spec.min_replicas = 1;
      spec.max_replicas = std::max(2, 2 * count);
      if (prefills) SetTarget(spec, PodMetric::kQueuedPromptTokens, out.queued_tokens);
      if (decodes) SetTarget(spec, PodMetric::kActiveSequences, sequences);
      h[static_cast<int>(role)] = spec;
    };
    pool(Role::kPrefill, d.prefill, true, false);
    pool(Role::kDecode, d.decode, false, true);
    pool(Role::kBoth, d.monolithic, true, true);
    return h;
  };
  int best_attaining = -1;
  const int n_targets = (int)std::size(kSequenceTargets);
  for (double sequences : kSequenceTargets) {
    if (sequences > d.monolithic_worker.batch.max_decode_batch ||
        sequences > d.decode_worker.batch.max_decode_batch) {
      break;
    }
    Deployment scaled = d;
    scaled.prefill = std::min(d.prefill, 1);
    scaled.decode = std::min(d.decode, 1);
    scaled.monolithic = std::min(d.monolithic, 1);
    const auto h = hpas_for(sequences);
    for (Role r : {Role::kPrefill, Role::kDecode, Role::kBoth}) {
      scaled.hpa(r) = h[static_cast<int>(r)];
    }
    scaled.pod_start_seconds = a.pod_start_seconds;
    absl::StatusOr<SeedSummary> r = RunSeeds(scaled, w, q.targets, q.seeds);
    if (!r.ok()) return r.status();
    AutoscaleTry t;
    t.sequences = sequences;
    t.replay = *r;
    t.meets = Meets(*r, q.attainment);
    out.tries.push_back(t);
    const int i = (int)out.tries.size() - 1;
    if (progress) progress(t, i, n_targets);
    if (t.meets &&
        (out.chosen < 0 || r->mean_workers.mean < out.tries[out.chosen].replay.mean_workers.mean)) {
      out.chosen = i;
    }
    if (best_attaining < 0 ||
        r->met_fraction.mean > out.tries[best_attaining].replay.met_fraction.mean) {
      best_attaining = i;
    }
  }
  if (out.tries.empty()) return absl::InvalidArgumentError("autoscale: no target fits the batch");
  out.hpas = hpas_for(out.tries[out.chosen >= 0 ? out.chosen : best_attaining].sequences);
  return out;
}

}  // namespace pdq::sim
