#include "sim/sim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/arrivals.h"
#include "policy/route.h"
#include "policy/traffic_split.h"
#include "sim/worker_sim.h"

namespace pdq::sim {

std::string Workers::Name() const {
  std::string name;
  if (prefill > 0 || decode > 0) absl::StrAppend(&name, prefill, "P+", decode, "D");
  if (monolithic > 0) absl::StrAppend(&name, name.empty() ? "" : "+", monolithic, "M");
  return name;
}

std::string Deployment::Name() const {
  if (arms.empty()) return Workers::Name();
  std::vector<std::string> parts;
  for (const Arm& a : arms) parts.push_back(absl::StrCat(a.pool, "=", a.weight, ":", a.Name()));
  return absl::StrJoin(parts, ",");
}

std::vector<const Workers*> Deployment::Pools() const {
  if (arms.empty()) return {this};
  std::vector<const Workers*> pools;
  for (const Arm& a : arms) pools.push_back(&a);
  return pools;
}

bool RowFactorsValidFor(const std::vector<std::pair<double, double>>& points) {
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& [rows, factor] = points[i];
    if (!std::isfinite(rows) || rows < 1 || !std::isfinite(factor) || !(factor > 0)) return false;
    if (i > 0 && !(rows > points[i - 1].first)) return false;
  }
  return true;
}

namespace {

absl::StatusOr<policy::TrafficSplit> SplitOf(const Deployment& d) {
  std::vector<policy::TrafficSplit::Arm> arms;
  for (const Arm& a : d.arms) arms.push_back({a.pool, a.weight});
  return policy::TrafficSplit::Make(std::move(arms));
}

absl::Status CheckPass(const PassTime& p, const std::string& where) {
  for (double v : {p.fixed, p.per_row, p.per_token, p.per_pair, p.per_decode_pair}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": step time coefficients must be finite and >= 0"));
    }
  }
  if (!p.RowStepsValid()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", PassTime::kRowStepsRule));
  }
  return absl::OkStatus();
}

absl::Status CheckWorker(const WorkerSpec& s, const std::string& where, bool prompts,
                         bool decodes) {
  if (!s.RowFactorsValid()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", WorkerSpec::kRowFactorsRule));
  }
  if (s.neighbour_idle) {
    const WorkerSpec::Steps& n = *s.neighbour_idle;
    if (absl::Status st = CheckPass(n.pass, where + ".neighbour_idle.pass"); !st.ok()) return st;
    if (decodes && n.pass.fixed + n.pass.per_row <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".neighbour_idle: decode steps would take no time"));
    }
    if (!RowFactorsValidFor(n.row_factors)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".neighbour_idle: ", WorkerSpec::kRowFactorsRule));
    }
    if (!(n.step_overhead >= 0) || !(n.step_overhead_per_row >= 0) ||
        !std::isfinite(n.step_overhead + n.step_overhead_per_row)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ".neighbour_idle: step_overhead and step_overhead_per_row must be finite and >= 0"));
    }
  }
  if (prompts && !s.fused && s.prompt_pass.fixed + s.prompt_pass.per_token <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": prompt_pass is zero"));
  }
  if (absl::Status st = CheckPass(s.pass, where + ".pass"); !st.ok()) return st;
  if (absl::Status st = CheckPass(s.prompt_pass, where + ".prompt_pass"); !st.ok()) return st;
  const PassTime& p = s.fused ? s.pass : s.prompt_pass;
  if (prompts && p.fixed + p.per_token <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": prompts would take no time"));
  }
  if (decodes && s.pass.fixed + s.pass.per_row <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": decode steps would take no time"));
  }
  if (!(s.step_overhead >= 0) || !(s.step_overhead_per_row >= 0) ||
      !(s.stream_finish_seconds >= 0) ||
      !std::isfinite(s.step_overhead + s.step_overhead_per_row + s.stream_finish_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": step_overhead, step_overhead_per_row and stream_finish_seconds must be finite and "
        ">= 0"));
  }
  if (s.batch.max_decode_batch < 1 || s.batch.token_budget < 1 || s.batch.block_tokens < 1 ||
      s.kv_blocks < 1 || s.max_context < 2 || s.batch.tpot_target < 0 || s.noise < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": max_decode_batch, token_budget, block_tokens, kv_blocks must be >= 1, "
                     "max_context >= 2, tpot_target and noise >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Workload::Phase>> ParsePhases(const std::string& text) {
  std::vector<Workload::Phase> phases;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    Workload::Phase p;
    char colon = 0;
    std::stringstream one(item);
    if (!(one >> p.seconds >> colon >> p.rate) || colon != ':' || !(one >> std::ws).eof()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rate phases: '", item, "' is not SECONDS:RATE"));
    }
    phases.push_back(p);
  }
  if (phases.empty()) return absl::InvalidArgumentError("rate phases: none given");
  return phases;
}

namespace {

// One pool's counts and specs (the deployment's, or an A/B arm's: `where`
// names it, empty for the deployment's own).
absl::Status ValidateWorkers(const Workers& d, const std::string& where) {
  auto error = [&where](const std::string& m) {
    return absl::InvalidArgumentError(where.empty() ? m : absl::StrCat(where, ": ", m));
  };
  if (d.monolithic < 0 || d.prefill < 0 || d.decode < 0) {
    return error("worker counts must be >= 0");
  }
  if (d.monolithic == 0 && (d.prefill == 0 || d.decode == 0)) {
    return error("a deployment needs monolithic workers, or prefill and decode workers");
  }
  if (d.decode > 0 && d.prefill == 0) return error("decode workers need prefill workers");
  const std::string prefix = where.empty() ? "" : where + ": ";
  if (d.monolithic > 0) {
    if (absl::Status s = CheckWorker(d.monolithic_worker, prefix + "monolithic_worker", true, true);
        !s.ok())
      return s;
  }
  if (d.prefill > 0) {
    if (absl::Status s = CheckWorker(d.prefill_worker, prefix + "prefill_worker", true, false);
        !s.ok())
      return s;
    if (absl::Status s = CheckWorker(d.decode_worker, prefix + "decode_worker", false, true);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

// Whether the workload's longest request fits the pool's workers.
absl::Status CheckContext(const Workers& d, const Workload& w, const std::string& where) {
  const int64_t longest =
      (int64_t)std::ceil(double(w.prompt_tokens + w.output_tokens) * (1 + w.length_spread));
  for (const auto& [n, s, name] :
       {std::tuple{d.monolithic, &d.monolithic_worker, "monolithic_worker"},
        std::tuple{d.decode, &d.decode_worker, "decode_worker"}}) {
    if (n > 0 && longest > s->max_context) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the workload's longest request (",
                                                     longest, " tokens) exceeds ", name,
                                                     ".max_context (", s->max_context, ")"));
    }
  }
  return absl::OkStatus();
}

std::string ArmWhere(const Arm& a) { return absl::StrCat("arm '", a.pool, "'"); }

}  // namespace

absl::Status Validate(const Deployment& d, const Workload& w) {
  bool disaggregated = d.prefill > 0;
  if (d.arms.empty()) {
    if (absl::Status s = ValidateWorkers(d, ""); !s.ok()) return s;
  } else {
    if (d.monolithic != 0 || d.prefill != 0 || d.decode != 0) {
      return absl::InvalidArgumentError(
          "an A/B rollout's workers are its arms': the deployment's own counts must be 0");
    }
    if (d.prefill_hpa || d.decode_hpa || d.monolithic_hpa) {
      return absl::InvalidArgumentError("HPAs on an A/B rollout's pools are not modelled");
    }
    if (absl::StatusOr<policy::TrafficSplit> split = SplitOf(d); !split.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("arms: ", split.status().message()));
    }
    for (const Arm& a : d.arms) {
      if (absl::Status s = ValidateWorkers(a, ArmWhere(a)); !s.ok()) {
        return s;
      }
      disaggregated |= a.prefill > 0;
    }
  }
  if (disaggregated) {
    if (!(d.link.bytes_per_second > 0) || !(d.link.latency_seconds >= 0)) {
      return absl::InvalidArgumentError("link: bytes_per_second must be > 0, latency >= 0");
    }
    if (d.kv_bytes_per_token <= 0 || d.num_layers < 1) {
      return absl::InvalidArgumentError("kv_bytes_per_token and num_layers must be >= 1");
    }
  }
  if (!(d.router_seconds >= 0) || !std::isfinite(d.router_seconds) || !(d.load_tokens >= 0)) {
    return absl::InvalidArgumentError("router_seconds and load_tokens must be finite and >= 0");
  }
  for (const auto& [hpa, n, name] : {std::tuple{&d.prefill_hpa, d.prefill, "prefill"},
                                     std::tuple{&d.decode_hpa, d.decode, "decode"},
                                     std::tuple{&d.monolithic_hpa, d.monolithic, "monolithic"}}) {
    if (!hpa->has_value()) continue;
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("an HPA scales the ", name, " pool, which the deployment does not have"));
    }
    if (absl::Status s = ValidateHpa(**hpa); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " HPA: ", s.message()));
    }
  }
  if (!(d.pod_start_seconds >= 0) || !std::isfinite(d.pod_start_seconds)) {
    return absl::InvalidArgumentError("pod_start_seconds must be >= 0");
  }
  if (d.split_sticky && d.arms.empty()) {
    return absl::InvalidArgumentError("a sticky split needs an A/B rollout's arms");
  }
  if (w.client_ids && w.arrivals != Workload::Arrivals::kClosedLoop) {
    return absl::InvalidArgumentError(
        "client ids are closed-loop clients': not with open-loop arrivals");
  }
  if (w.requests < 1 || w.warmup < 0) {
    return absl::InvalidArgumentError("requests must be >= 1 and warmup >= 0");
  }
  if (w.prompt_tokens < 1 || w.output_tokens < 1) {
    return absl::InvalidArgumentError("prompt_tokens and output_tokens must be >= 1");
  }
  if (!(w.length_spread >= 0 && w.length_spread < 1)) {
    return absl::InvalidArgumentError("length_spread must be in [0, 1)");
  }
  if (w.arrivals == Workload::Arrivals::kClosedLoop
          ? w.concurrency < 1
          : w.phases.empty() && !(w.rate > 0 && std::isfinite(w.rate))) {
    return absl::InvalidArgumentError(w.arrivals == Workload::Arrivals::kClosedLoop
                                          ? "concurrency must be >= 1"
                                          : "rate must be > 0");
  }
  if (!w.phases.empty()) {
    if (w.arrivals == Workload::Arrivals::kClosedLoop) {
      return absl::InvalidArgumentError("rate phases are for open-loop arrivals");
    }
    bool busy = false;
    for (const Workload::Phase& p : w.phases) {
      if (!(p.seconds > 0) || !(p.rate >= 0) || !std::isfinite(p.seconds) ||
          !std::isfinite(p.rate)) {
        return absl::InvalidArgumentError("each rate phase needs seconds > 0 and a rate >= 0");
      }
      busy |= p.rate > 0;
    }
    if (!busy) return absl::InvalidArgumentError("no rate phase has arrivals");
  }
  if (w.arrivals == Workload::Arrivals::kGamma && !(w.burstiness > 0)) {
    return absl::InvalidArgumentError("burstiness must be > 0");
  }
  if (d.arms.empty()) return CheckContext(d, w, "");
  for (const Arm& a : d.arms) {
    if (absl::Status s = CheckContext(a, w, ArmWhere(a) + ": "); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// The event loop and the deployment's state for one run.
class Simulation {
 public:
  // `d` was validated.
  Simulation(const Deployment& d, const Workload& w, const RunOptions& o)
      : d_(d),
        w_(w),
        o_(o),
        rng_(w.seed),
        noise_rng_(w.seed ^ 0x6e6f697365ull),
        split_rng_(w.seed ^ 0x73706c6974ull),
        router_rng_(w.seed ^ 0x726f75746572ull),
        pools_(d.Pools()) {
    if (!d.arms.empty()) split_ = *SplitOf(d);
    for (int arm = 0; arm < (int)pools_.size(); ++arm) {
      const Workers& p = *pools_[arm];
      for (int i = 0; i < p.monolithic; ++i) AddWorker(Role::kBoth, arm, /*serving=*/true);
      const int first_prefill = (int)workers_.size();
      for (int i = 0; i < p.prefill; ++i) AddWorker(Role::kPrefill, arm, true);
      const int first_decode = (int)workers_.size();
      for (int i = 0; i < p.decode; ++i) AddWorker(Role::kDecode, arm, true);
      for (int k = 0; p.co_located && k < std::min(p.prefill, p.decode); ++k) {
        neighbour_[first_prefill + k] = first_decode + k;
        neighbour_[first_decode + k] = first_prefill + k;
      }
    }
    for (Role role : {Role::kPrefill, Role::kDecode, Role::kBoth}) {
      const std::optional<HpaSpec>& hpa = d.hpa(role);
      if (hpa) hpas_.push_back({role, HpaController(*hpa)});
    }
  }

  RunResult Run() {
    const int total = w_.warmup + w_.requests;
    result_.requests.resize(total);
    prefill_counted_.assign(total, false);
    if (w_.arrivals == Workload::Arrivals::kClosedLoop) {
      for (int c = 0; c < std::min(w_.concurrency, total); ++c) Send(0, c);
    } else if (w_.arrivals == Workload::Arrivals::kPoisson && w_.phases.empty()) {
      // What `pdq bench --rate --arrival-seed` sends for this seed.
      for (double t : PoissonArrivalTimes(w_.rate, total, w_.seed)) At(t, [this, t] { Send(t); });
    } else {
      double t = NextArrival(0);
      for (int i = 0; i < total; ++i) {
        At(t, [this, t] { Send(t); });
        t = NextArrival(t);
      }
    }
    if (!hpas_.empty()) Again(hpas_[0].controller.spec().sync_seconds, [this] { SyncHpas(); });
    // Workers that started apart heartbeat at phases spread over the
    // interval (deterministic, so a seed is the same run anywhere).
    if (d_.heartbeat_seconds > 0) {
      for (int w = 0; w < (int)workers_.size(); ++w) {
        const double phase = std::fmod(0.6180339887 * (w + 1), 1.0);
        Again(d_.heartbeat_seconds * phase, [this, w] { Heartbeat(w); });
      }
    }
    while (!events_.empty()) {
      Event e = events_.top();
      events_.pop();
      if (e.periodic) --periodic_pending_;
      now_ = e.time;
      e.fn();
    }
    result_.end_time = now_;
    for (WorkerRecord& wr : result_.workers) {
      if (wr.gone < 0) wr.gone = now_;
    }
    MarkWarmup();
    return std::move(result_);
  }

 private:
  struct Event {
    double time;
    uint64_t order;
    std::function<void()> fn;
    bool periodic = false;  // a heartbeat or an HPA sync: runs only while other events remain
    bool operator>(const Event& o) const {
      return time != o.time ? time > o.time : order > o.order;
    }
  };

  void At(double t, std::function<void()> fn) { events_.push({t, next_order_++, std::move(fn)}); }
  // A periodic event (first, or again) at `t` while requests remain and
  // something other than periodic events can still happen.
  void Again(double t, std::function<void()> fn) {
    if (ended_ >= (int64_t)result_.requests.size() || events_.size() <= periodic_pending_) return;
    events_.push({t, next_order_++, std::move(fn), true});
    ++periodic_pending_;
  }

  double Gap(double rate) {
    if (w_.arrivals == Workload::Arrivals::kPoisson) {
      return std::exponential_distribution<double>(rate)(rng_);
    }
    // Gamma gaps with mean 1/rate and coefficient of variation `burstiness`.
    const double k = 1 / (w_.burstiness * w_.burstiness);
    return std::gamma_distribution<double>(k, 1 / (k * rate))(rng_);
  }

  // The arrival after one at `t`. Under rate phases a gap that crosses the
  // phase's end is drawn again from there at the next phase's rate: exact
  // for Poisson arrivals (memoryless), an approximation for gamma gaps.
  double NextArrival(double t) {
    if (w_.phases.empty()) return t + Gap(w_.rate);
    double cycle = 0;
    for (const Workload::Phase& p : w_.phases) cycle += p.seconds;
    for (;;) {
      const double at = std::fmod(t, cycle);
      double end = 0;
      double rate = 0;
      for (const Workload::Phase& p : w_.phases) {
        end += p.seconds;
        rate = p.rate;
        if (at < end) break;
      }
      const double phase_end = t + std::max(end - at, 1e-9);
      if (rate > 0) {
        const double next = t + Gap(rate);
        if (next <= phase_end) return next;
      }
      t = phase_end;
    }
  }

  int64_t Length(int64_t mean) {
    if (w_.length_spread == 0) return mean;
    std::uniform_real_distribution<double> u(1 - w_.length_spread, 1 + w_.length_spread);
    return std::max<int64_t>(1, std::llround(double(mean) * u(rng_)));
  }

  // A client (closed loop: number `client`) sends its next request.
  void Send(double t, int client = -1) {
    if (sent_ >= (int64_t)result_.requests.size()) return;
    RequestRecord& r = result_.requests[sent_];
    r.id = sent_;
    r.client = client;
    r.arrival = t;
    r.prompt_tokens = Length(w_.prompt_tokens);
    r.output_tokens = Length(w_.output_tokens);
    ++sent_;
    const int64_t id = r.id;
    const double router =
        d_.random_router_time && d_.router_seconds > 0
            ? std::exponential_distribution<double>(1 / d_.router_seconds)(router_rng_)
            : d_.router_seconds;
    At(t + router, [this, id] { Route(id); });
  }

  void Done(int64_t id) {
    RequestRecord& r = result_.requests[id];
    r.finish = now_;
    ++ended_;
    // The router counts a request against its decode worker until it ends,
    // against its prefill worker until the Prefill call answers.
    --in_flight_[r.decode_worker];
    ReleasePrefill(id);
    MaybeRetire(r.decode_worker);
    if (w_.arrivals == Workload::Arrivals::kClosedLoop) {
      Send(now_, r.client);
      // Clients whose last request was refused try again now that room
      // may have come free.
      std::vector<int> parked;
      parked.swap(parked_);
      for (int c : parked) Send(now_, c);
    }
  }

  void ReleasePrefill(int64_t id) {
    const int pw = result_.requests[id].prefill_worker;
    if (pw >= 0 && prefill_counted_[id]) --in_flight_[pw];
    prefill_counted_[id] = false;
  }

  // The warm-up requests are the first `warmup` to end (answered or
  // refused), as pdq bench counts them, not the first sent: which of the
  // requests sent at once ends first is a race (the one a step took alone).
  // Requests never sent (records past sent_) stay unmeasured; one sent and
  // never ended (none should be: the run goes on until no event is left)
  // would count last, not hide among the warm-up. With
  // Workload::warmup_first_to_end false, the first sent.
  void MarkWarmup() {
    std::vector<int64_t> order(sent_);
    std::iota(order.begin(), order.end(), 0);
    auto end = [this](int64_t id) {
      const RequestRecord& r = result_.requests[id];
      return r.finish > 0 || r.refused() ? r.finish : INFINITY;
    };
    if (w_.warmup_first_to_end) {
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return end(a) < end(b); });
    }
    for (size_t i = 0; i < order.size(); ++i) {
      result_.requests[order[i]].measured = i >= (size_t)w_.warmup;
    }
  }

  // No worker has room for its KV or a place in its decode batch (or none
  // serves): the router refuses it at once.
  void Refuse(int64_t id, Refusal why) {
    RequestRecord& r = result_.requests[id];
    r.refusal = why;
    r.decode_worker = r.prefill_worker = -1;
    r.first_token = r.finish = now_;
    ++ended_;
    if (w_.arrivals != Workload::Arrivals::kClosedLoop) return;
    // The client tries again when a request ends (at once if none is in
    // flight, or it would wait forever).
    bool any = false;
    for (int64_t n : in_flight_) any |= n > 0;
    if (any) {
      parked_.push_back(r.client);
    } else {
      Send(now_, r.client);
    }
  }

  // The router's choice among workers of `roles` in the request's A/B
  // `arm` (policy::BestCandidate,
  // its candidates as router/router.cc builds them: a decode worker's load
  // is its decoding streams plus the requests in flight to it, a prefill
  // worker's the requests whose Prefill call has not answered; a worker's
  // queued prompt tokens, decoding streams and KV as of its last heartbeat,
  // the counts in flight current), then its KV reservation of
  // `reserve` tokens; a worker that refuses is avoided once more, as the
  // router retries an attempt once. -1: refused, and *why says why.
  int Pick(std::initializer_list<Role> roles, int arm, int64_t prompt_tokens, int64_t reserve,
           Refusal* why) {
    int avoid = -1;
    *why = Refusal::kNoWorker;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<policy::RouteCandidate> candidates;
      std::vector<int> index;
      for (int i = 0; i < (int)workers_.size(); ++i) {
        const WorkerSim& w = workers_[i];
        if (std::find(roles.begin(), roles.end(), w.role()) == roles.end()) continue;
        if (state_[i] != State::kServing || result_.workers[i].arm != arm) continue;
        const Seen seen = d_.heartbeat_seconds > 0 ? seen_[i] : Look(i);
        policy::RouteCandidate c;
        // The router's stream bound (its count in flight is exact here).
        const bool batch_full = d_.bound_streams && w.role() != Role::kPrefill &&
                                in_flight_[i] >= w.spec().batch.max_decode_batch;
        c.unwanted = i == avoid || batch_full;
        if (batch_full && i != avoid) *why = Refusal::kBatchFull;
        c.queued_tokens = seen.queued_tokens;
        c.load = double(in_flight_[i]) + (w.role() == Role::kPrefill ? 0 : double(seen.decoding));
        c.kv_blocks_free = w.spec().kv_blocks - seen.kv_blocks_used;
        candidates.push_back(c);
        index.push_back(i);
      }
      const int best = policy::BestCandidate(candidates, prompt_tokens, d_.load_tokens);
      // The best is unwanted only when every candidate is: all of them full
      // batches, or the retry's one worker that refused the reservation.
      if (best < 0 || candidates[best].unwanted) return -1;
      if (workers_[index[best]].Reserve(reserve)) return index[best];
      avoid = index[best];
      *why = Refusal::kKvFull;
    }
    return -1;
  }

  void Route(int64_t id) {
    RequestRecord& r = result_.requests[id];
    const int64_t kv = r.prompt_tokens + r.output_tokens;
    // The router draws the pool first (a client that sends an id, its
    // sticky pool); only its workers are candidates.
    if (split_) {
      r.arm = StickyClients(d_, w_)
                  ? split_->IndexOfClient(BenchClientId(r.client))
                  : split_->IndexAt(std::uniform_real_distribution<double>(0, 1)(split_rng_));
    }
    Refusal why = Refusal::kNone;
    const int dw = Pick({Role::kDecode, Role::kBoth}, r.arm, r.prompt_tokens, kv, &why);
    if (dw < 0) return Refuse(id, why);
    r.decode_worker = dw;
    SimStream s;
    s.id = id;
    s.prompt_tokens = r.prompt_tokens;
    s.output_tokens = r.output_tokens;
    if (workers_[dw].role() == Role::kBoth) {
      ++in_flight_[dw];
      workers_[dw].Add(s);
      Kick(dw);
      return;
    }
    s.stage = policy::StreamView::Stage::kOther;  // a reservation: waits for its KV
    workers_[dw].Add(s);
    ++in_flight_[dw];
    const int pw = Pick({Role::kPrefill}, r.arm, r.prompt_tokens, r.prompt_tokens, &why);
    if (pw < 0) {
      workers_[dw].Remove(id);
      workers_[dw].Unreserve(kv);
      --in_flight_[dw];
      Refuse(id, why);
      return;
    }
    r.prefill_worker = pw;
    ++in_flight_[pw];
    prefill_counted_[id] = true;
    SimStream p;
    p.id = id;
    p.prompt_tokens = r.prompt_tokens;
    p.output_tokens = 1;
    p.prefill_only = true;
    // The router sends the Prefill call once the decode worker has answered
    // its Reserve call, a command of that worker's loop.
    auto prefill = [this, pw, p] {
      workers_[pw].Add(p);
      Kick(pw);
    };
    if (const double reserved = NextCommand(dw); reserved > now_) {
      // A co-located decode worker's next step starts at that instant too,
      // beside this prompt's pass (Kick's neighbour_idle).
      prompt_due_[pw] = std::max(prompt_due_[pw], reserved);
      At(reserved, prefill);
    } else {
      prefill();
    }
  }

  // When worker w's loop next runs a command (a Reserve call, a transfer's
  // completion: worker/scheduler.cc runs them between steps): now when it is
  // idle, else at the end of its step in flight.
  double NextCommand(int w) const { return busy_[w] ? step_end_[w] : now_; }

  void Kick(int w) {
    if (busy_[w] || !workers_[w].HasWork()) return;
    SimStep step = workers_[w].Form();
    if (step.empty()) return;
    // A co-located worker whose neighbour runs no step as this one starts
    // and starts none at this instant (a prompt whose Prefill call waits for
    // this worker's step to end, or one queued), or one without a
    // neighbour (its spec has neighbour_idle only where co-located).
    const int n = neighbour_[w];
    const bool neighbour_idle =
        n < 0 || (!busy_[n] && !workers_[n].HasWork() && !(prompt_due_[n] >= now_));
    StepTimes times = workers_[w].ModelTimes(step, neighbour_idle);
    const double noise = workers_[w].spec().noise;
    if (noise > 0) {
      const double f =
          std::exp(noise * std::normal_distribution<double>(0, 1)(noise_rng_) - noise * noise / 2);
      times.pass *= f;
      times.prompt *= f;
    }
    // After the pass the loop samples and sends the rows' tokens row by
    // row (the step overhead's part per row), ending each stream whose last
    // token it was, before it takes new requests: EndStep runs that long
    // before the step ends.
    const double holds =
        double(workers_[w].Ending(step)) * workers_[w].spec().stream_finish_seconds;
    const double sending = times.overhead_per_row * double(step.rows.size()) + holds;
    const double seconds = times.total() + holds;
    busy_[w] = true;
    WorkerRecord& wr = result_.workers[w];
    wr.busy_seconds += seconds;
    ++wr.steps;
    if (o_.trace_steps) {
      result_.steps.push_back({w, now_, seconds, step.rows, step.chunks});
    }
    const double start = now_;
    step_end_[w] = now_ + seconds;
    At(now_ + seconds - sending,
       [this, w, start, times, step = std::move(step)] { EndStep(w, start, step, times); });
  }

  // After a step's pass (`start`: when the step began): its rows' tokens
  // leave one by one, each after its share of the per-row overhead, a row
  // whose stream ends holding the loop its stream_finish_seconds more after
  // its token; such a stream's KV is freed and its client sends its next
  // request as its last token leaves (so the next step may take it, as a
  // real worker's does when its loop comes round); the step ends after the
  // last, at step_end_ (Kick counted the same holds).
  void EndStep(int w, double start, const SimStep& step, const StepTimes& times) {
    WorkerSim& worker = workers_[w];
    const double per_row = times.overhead_per_row;
    const double finish = worker.spec().stream_finish_seconds;
    const StepOutcome out = worker.Finish(step, times);
    auto ended = [&](int64_t id) {
      return std::find(out.finished.begin(), out.finished.end(), id) != out.finished.end();
    };
    // When each row's token left; the loop comes round at the step's end.
    std::vector<double> sent(step.rows.size());
    double t = now_;
    for (size_t i = 0; i < step.rows.size(); ++i) {
      t += per_row;
      sent[i] = t;
      if (ended(step.rows[i])) t += finish;
    }
    const double end = step_end_[w];
    if (worker.role() == Role::kBoth) {
      // Two models: the first token comes after the prompt pass, before
      // the decode rows' pass.
      const double first = worker.spec().fused ? end : start + times.prompt;
      for (int64_t id : out.prefilled) result_.requests[id].first_token = first;
    }
    for (int64_t id : out.finished) {
      RequestRecord& r = result_.requests[id];
      if (worker.role() == Role::kPrefill) {
        SendKv(w, id, start);  // its blocks are held until the KV landed
        continue;
      }
      // A row's last token leaves at its place among the step's rows; a
      // stream that ends on its first token (from a prompt chunk), at the
      // step's end.
      const auto row = std::find(step.rows.begin(), step.rows.end(), id);
      const double at = row == step.rows.end() ? end : sent[row - step.rows.begin()];
      const int64_t kv = r.prompt_tokens + r.output_tokens;
      auto ends = [this, w, id, kv] {
        workers_[w].Unreserve(kv);
        Done(id);
      };
      if (at > now_) {
        At(at, ends);
      } else {
        ends();
      }
    }
    auto next = [this, w] {
      busy_[w] = false;
      Kick(w);
      MaybeRetire(w);
    };
    if (end > now_) {
      At(end, next);
    } else {
      next();
    }
  }

  // The prompt's KV streams out layer by layer while its last chunk
  // computes (from `start`), over the sender's and the receiver's links; the
  // last layer leaves when the pass ends.
  void SendKv(int pw, int64_t id, double start) {
    RequestRecord& r = result_.requests[id];
    const int dw = r.decode_worker;
    const double bytes = double(r.prompt_tokens) * double(d_.kv_bytes_per_token);
    const double wire = bytes / d_.link.bytes_per_second;
    const double begin = std::max({start, link_free_[pw], link_free_[dw]});
    const double end = std::max(now_ + wire / d_.num_layers, begin + wire);
    link_free_[pw] = link_free_[dw] = end;
    // Busy for the bytes' time on the wire (the transfer also holds the
    // link while the layers are still being computed).
    result_.workers[pw].link_busy_seconds += wire;
    result_.workers[dw].link_busy_seconds += wire;
    At(end + d_.link.latency_seconds, [this, pw, dw, id] {
      RequestRecord& q = result_.requests[id];
      workers_[pw].Unreserve(q.prompt_tokens);
      ReleasePrefill(id);  // the Prefill call answers once the KV landed
      Kick(pw);
      MaybeRetire(pw);
      // The decode worker takes the landed KV, and sends the first token
      // the prefill drew, as a command of its loop.
      q.first_token = NextCommand(dw);
      WorkerSim& d = workers_[dw];
      if (q.output_tokens <= 1) {
        d.Remove(id);
        d.Unreserve(q.prompt_tokens + q.output_tokens);
        Done(id);
        return;
      }
      d.KvLanded(id);
      Kick(dw);
    });
  }

  // A worker's pod: starting (no metric, takes no request), serving,
  // draining (removed by its HPA: finishes what it holds), gone.
  enum class State { kStarting, kServing, kDraining, kGone };

  int AddWorker(Role role, int arm, bool serving) {
    const Workers& pool = *pools_[arm];
    const WorkerSpec& spec = role == Role::kBoth      ? pool.monolithic_worker
                             : role == Role::kPrefill ? pool.prefill_worker
                                                      : pool.decode_worker;
    const int w = (int)workers_.size();
    workers_.emplace_back(role, spec);
    state_.push_back(serving ? State::kServing : State::kStarting);
    busy_.push_back(false);
    neighbour_.push_back(-1);
    prompt_due_.push_back(-1);
    step_end_.push_back(0);
    in_flight_.push_back(0);
    link_free_.push_back(0);
    seen_.push_back(Look(w));
    WorkerRecord wr;
    wr.role = role;
    wr.arm = arm;
    wr.created = now_;
    wr.ready = serving ? now_ : -1;
    result_.workers.push_back(wr);
    if (!serving) {
      At(now_ + d_.pod_start_seconds, [this, w] {
        if (state_[w] != State::kStarting) return;  // removed before it served
        state_[w] = State::kServing;
        result_.workers[w].ready = now_;
        // It heartbeats right after registering, then every interval.
        seen_[w] = Look(w);
        if (d_.heartbeat_seconds > 0) {
          Again(now_ + d_.heartbeat_seconds, [this, w] { Heartbeat(w); });
        }
      });
    }
    return w;
  }

  // What a worker's heartbeat reports: the router's view of it until the next.
  struct Seen {
    int64_t queued_tokens = 0, decoding = 0, kv_blocks_used = 0;
  };
  Seen Look(int w) const {
    const WorkerSim& x = workers_[w];
    return {x.queued_prompt_tokens(), x.decoding(), x.kv_blocks_used()};
  }
  void Heartbeat(int w) {
    if (state_[w] == State::kGone) return;
    seen_[w] = Look(w);
    Again(now_ + d_.heartbeat_seconds, [this, w] { Heartbeat(w); });
  }

  // A draining worker leaves once it holds nothing.
  void MaybeRetire(int w) {
    if (w < 0 || state_[w] != State::kDraining || busy_[w]) return;
    if (workers_[w].streams() > 0 || workers_[w].kv_blocks_used() > 0) return;
    state_[w] = State::kGone;
    result_.workers[w].gone = now_;
  }

  // A worker's metrics, as its HPA reads them.
  std::array<double, kPodMetrics> Metrics(int i) const {
    const WorkerSim& w = workers_[i];
    return {double(w.queued_prompt_tokens()), double(w.decoding()),
            double(w.kv_blocks_used()) / double(w.spec().kv_blocks)};
  }
  // Every HPA's sync: its pool's replicas are its starting and serving
  // pods; the serving ones report their metrics.
  void SyncHpas() {
    for (Autoscaler& h : hpas_) {
      std::vector<int> starting, serving;
      PoolMetrics m;
      for (int i = 0; i < (int)workers_.size(); ++i) {
        if (workers_[i].role() != h.role) continue;
        if (state_[i] == State::kStarting) {
          starting.push_back(i);
        } else if (state_[i] == State::kServing) {
          serving.push_back(i);
          m.ready.push_back(Metrics(i));
        }
      }
      m.missing = (int)starting.size();
      const int current = (int)(starting.size() + serving.size());
      const int desired = h.controller.Sync(now_, current, m);
      if (desired == current) continue;
      result_.scaling.push_back({now_, h.role, current, desired});
      // (HPAs scale deployments without arms: one pool, arm 0.)
      for (int i = current; i < desired; ++i) AddWorker(h.role, /*arm=*/0, /*serving=*/false);
      // A ReplicaSet removes pods that are not ready first, then the newest.
      for (int i = desired; i < current; ++i) {
        int victim;
        if (!starting.empty()) {
          victim = starting.back();
          starting.pop_back();
        } else {
          victim = serving.back();
          serving.pop_back();
        }
        if (state_[victim] == State::kStarting) {
          state_[victim] = State::kGone;
          result_.workers[victim].gone = now_;
        } else {
          state_[victim] = State::kDraining;
          MaybeRetire(victim);
        }
      }
    }
    // The controller runs while requests remain and anything else can
    // still happen.
    Again(now_ + hpas_[0].controller.spec().sync_seconds, [this] { SyncHpas(); });
  }

  const Deployment& d_;
  const Workload& w_;
  const RunOptions& o_;
  std::mt19937_64 rng_;        // arrivals and lengths: the workload
  std::mt19937_64 noise_rng_;  // step noise: so the same seed is the same workload anywhere
  std::mt19937_64 split_rng_;  // A/B draws: apart, for the same reason
  std::mt19937_64 router_rng_;  // router times (Deployment::random_router_time): apart too
  std::vector<const Workers*> pools_;          // by arm: the deployment's own, or its arms
  std::optional<policy::TrafficSplit> split_;  // with arms
  std::vector<WorkerSim> workers_;
  std::vector<State> state_;
  struct Autoscaler {
    Role role;
    HpaController controller;
  };
  std::vector<Autoscaler> hpas_;
  int64_t ended_ = 0;  // requests done or refused
  std::vector<bool> busy_;
  std::vector<int> neighbour_;    // the worker sharing w's machine (Workers::co_located), or -1
  std::vector<double> prompt_due_;  // the latest time a deferred Prefill call reaches w (-1: none)
  std::vector<double> step_end_;  // when each busy worker's step ends
  std::vector<int64_t> in_flight_;
  std::vector<Seen> seen_;             // by worker: as of its last heartbeat
  std::vector<bool> prefill_counted_;  // by request: counted in flight at its prefill worker
  size_t periodic_pending_ = 0;        // periodic events in the queue
  std::vector<double> link_free_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_order_ = 0;
  double now_ = 0;
  int64_t sent_ = 0;
  std::vector<int> parked_;  // closed-loop clients waiting to retry a refused request
  RunResult result_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double x = p * double(v.size() - 1);
  const size_t lo = (size_t)std::floor(x);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (x - double(lo));
}

// Student's t at 97.5% for `df` degrees of freedom.
double TQuantile(int df) {
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                  2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                  2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                  2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return 0;
  return df <= 30 ? kT[df - 1] : 1.96;
}

Estimate Estimated(const std::vector<double>& v) {
  Estimate e;
  if (v.empty()) return e;
  for (double x : v) e.mean += x;
  e.mean /= double(v.size());
  if (v.size() < 2) return e;
  double ss = 0;
  for (double x : v) ss += (x - e.mean) * (x - e.mean);
  const double sd = std::sqrt(ss / double(v.size() - 1));
  e.half_width = TQuantile((int)v.size() - 1) * sd / std::sqrt(double(v.size()));
  return e;
}

}  // namespace

absl::StatusOr<RunResult> Simulate(const Deployment& d, const Workload& w, const RunOptions& o) {
  if (absl::Status s = Validate(d, w); !s.ok()) return s;
  return Simulation(d, w, o).Run();
}

void RefusalCounts::Add(Refusal r) {
  switch (r) {
    case Refusal::kKvFull:
      ++kv_full;
      break;
    case Refusal::kBatchFull:
      ++batch_full;
      break;
    case Refusal::kNoWorker:
      ++no_worker;
      break;
    case Refusal::kNone:
      break;
  }
}

void RefusalCounts::Add(const RefusalCounts& o) {
  kv_full += o.kv_full;
  batch_full += o.batch_full;
  no_worker += o.no_worker;
}

RunSummary Summarize(const RunResult& r, const Targets& t, int arm) {
  RunSummary s;
  std::vector<double> ttft, tpot;
  double first = INFINITY, last = 0, tokens = 0, met = 0, met_slower = 0, met_faster = 0;
  for (const RequestRecord& q : r.requests) {
    if (!q.measured || (arm >= 0 && q.arm != arm)) continue;
    if (q.refused()) {
      s.refusals.Add(q.refusal);
      continue;
    }
    ++s.measured;
    ttft.push_back(q.ttft());
    if (q.output_tokens > 1) tpot.push_back(q.tpot());
    first = std::min(first, q.arrival);
    last = std::max(last, q.finish);
    tokens += double(q.output_tokens);
    auto meets = [&](double scale) {
      return q.ttft() * scale <= t.ttft_seconds && q.tpot() * scale <= t.tpot_seconds;
    };
    met += meets(1);
    met_slower += meets(1 + kGoodputMargin);
    met_faster += meets(1 - kGoodputMargin);
  }
  s.ttft_p50 = Percentile(ttft, 0.5);
  s.ttft_p90 = Percentile(ttft, 0.9);
  s.ttft_p99 = Percentile(ttft, 0.99);
  s.tpot_p50 = Percentile(tpot, 0.5);
  s.tpot_p90 = Percentile(tpot, 0.9);
  s.tpot_p99 = Percentile(tpot, 0.99);
  const double span = last - first;
  if (s.measured > 0 && span > 0) {
    s.output_tokens_per_second = tokens / span;
    s.requests_per_second = double(s.measured) / span;
    s.goodput = met / span;
    s.goodput_if_slower = met_slower / span;
    s.goodput_if_faster = met_faster / span;
  }
  const int64_t all = s.measured + s.refusals.total();
  s.met_fraction = all > 0 ? met / double(all) : 0;
  s.busy = Busy(r, arm);
  // Workers alive over time: +1 at creation, -1 when gone.
  std::vector<std::pair<double, int>> changes;
  double alive = 0;
  for (const WorkerRecord& w : r.workers) {
    if (arm >= 0 && w.arm != arm) continue;
    changes.push_back({w.created, 1});
    changes.push_back({w.gone, -1});
    alive += w.gone - w.created;
  }
  std::sort(changes.begin(), changes.end());
  int n = 0;
  for (const auto& [t, c] : changes) s.peak_workers = std::max(s.peak_workers, n += c);
  s.mean_workers = r.end_time > 0 ? alive / r.end_time : double(r.workers.size());
  return s;
}

PoolBusy Busy(const RunResult& r, int arm) {
  PoolBusy b;
  if (!(r.end_time > 0)) return b;
  // Per role: seconds stepping, seconds of KV on the links, and the
  // workers' time serving (ready until gone; the whole run without an HPA).
  double step[3] = {}, link[3] = {}, serving[3] = {};
  int n[3] = {};
  for (const WorkerRecord& w : r.workers) {
    if (arm >= 0 && w.arm != arm) continue;
    const int i = static_cast<int>(w.role);
    step[i] += w.busy_seconds;
    link[i] += w.link_busy_seconds;
    if (w.ready >= 0) serving[i] += (w.gone < 0 ? r.end_time : w.gone) - w.ready;
    ++n[i];
  }
  auto share = [&](double seconds, int role) {
    return n[role] > 0 && serving[role] > 0 ? seconds / serving[role] : -1.0;
  };
  const int p = static_cast<int>(Role::kPrefill), d = static_cast<int>(Role::kDecode);
  const int m = static_cast<int>(Role::kBoth);
  b.prefill = share(step[p], p);
  b.decode = share(step[d], d);
  b.monolithic = share(step[m], m);
  // Links exist where KV moves: between prefill and decode workers.
  b.link = n[p] + n[d] > 0 && serving[p] + serving[d] > 0
               ? (link[p] + link[d]) / (serving[p] + serving[d])
               : -1.0;
  return b;
}

std::string NameBottleneck(const PoolBusy& b, const RefusalCounts& refused) {
  const std::pair<const char*, double> pools[] = {{"the prefill workers", b.prefill},
                                                  {"the decode workers", b.decode},
                                                  {"the monolithic workers", b.monolithic},
                                                  {"the KV links", b.link}};
  const auto* top = &pools[0];
  for (const auto& p : pools) {
    if (p.second > top->second) top = &p;
  }
  std::string out;
  std::vector<std::string> why;
  if (refused.batch_full > 0) {
    why.push_back(absl::StrCat("the decode batch (", refused.batch_full,
                               " requests found no place in a decode worker's batch)"));
  }
  if (refused.kv_full > 0) {
    why.push_back(absl::StrCat("KV memory (", refused.kv_full,
                               " requests found no worker with room for their KV)"));
  }
  if (refused.no_worker > 0) {
    why.push_back(absl::StrCat("starting pods (", refused.no_worker,
                               " requests came when no worker of a pool was serving)"));
  }
  if (!why.empty()) out = absl::StrCat(absl::StrJoin(why, " and "), "; then ");
  if (top->second < 0) return out + "no worker ran";
  const int percent = (int)std::lround(top->second * 100);
  if (top->second >= kSaturatedBusy) return absl::StrCat(out, top->first, ", ", percent, "% busy");
  return absl::StrCat(out, "no pool saturated (the busiest, ", top->first, ", ", percent,
                      "% busy): the arrivals set the pace");
}

namespace {

// The figures of runs of one seed each, as estimates over the seeds.
SeedFigures OverSeeds(const std::vector<RunSummary>& runs) {
  SeedFigures out;
  auto each = [&](auto field) {
    std::vector<double> v;
    for (const RunSummary& s : runs) v.push_back(double(s.*field));
    return Estimated(v);
  };
  out.ttft_p50 = each(&RunSummary::ttft_p50);
  out.ttft_p90 = each(&RunSummary::ttft_p90);
  out.ttft_p99 = each(&RunSummary::ttft_p99);
  out.tpot_p50 = each(&RunSummary::tpot_p50);
  out.tpot_p90 = each(&RunSummary::tpot_p90);
  out.tpot_p99 = each(&RunSummary::tpot_p99);
  out.output_tokens_per_second = each(&RunSummary::output_tokens_per_second);
  out.goodput = each(&RunSummary::goodput);
  out.met_fraction = each(&RunSummary::met_fraction);
  out.goodput_if_slower = each(&RunSummary::goodput_if_slower);
  out.goodput_if_faster = each(&RunSummary::goodput_if_faster);
  out.measured = each(&RunSummary::measured);
  for (const RunSummary& s : runs) out.refusals.Add(s.refusals);
  auto mean_busy = [&](double PoolBusy::*field) {
    double sum = 0;
    for (const RunSummary& s : runs) sum += s.busy.*field;
    return sum / double(runs.size());
  };
  out.busy = {mean_busy(&PoolBusy::prefill), mean_busy(&PoolBusy::decode),
              mean_busy(&PoolBusy::monolithic), mean_busy(&PoolBusy::link)};
  return out;
}

}  // namespace

absl::StatusOr<SeedSummary> RunSeeds(const Deployment& d, const Workload& w, const Targets& t,
                                     int seeds) {
  if (seeds < 1) return absl::InvalidArgumentError("seeds must be >= 1");
  std::vector<RunSummary> runs;
  std::vector<std::vector<RunSummary>> arm_runs(d.arms.size());
  int64_t scale_events = 0;
  std::vector<ScaleRecord> first_scaling;
  for (int i = 0; i < seeds; ++i) {
    Workload wi = w;
    wi.seed = w.seed + (uint64_t)i;
    absl::StatusOr<RunResult> r = Simulate(d, wi);
    if (!r.ok()) return r.status();
    runs.push_back(Summarize(*r, t));
    for (size_t a = 0; a < d.arms.size(); ++a) {
      arm_runs[a].push_back(Summarize(*r, t, (int)a));
    }
    scale_events += (int64_t)r->scaling.size();
    if (i == 0) first_scaling = std::move(r->scaling);
  }
  SeedSummary out;
  static_cast<SeedFigures&>(out) = OverSeeds(runs);
  out.seeds = seeds;
  for (size_t a = 0; a < d.arms.size(); ++a) {
    // An arm's latencies over the seeds that drew it a measured request (a
    // seed that drew it none has no percentile to average); its count over
    // all of them.
    std::vector<RunSummary> drawn;
    std::vector<double> measured;
    for (const RunSummary& s : arm_runs[a]) {
      if (s.measured > 0) drawn.push_back(s);
      measured.push_back(double(s.measured));
    }
    SeedSummary::ArmFigures f;
    if (!drawn.empty()) static_cast<SeedFigures&>(f) = OverSeeds(drawn);
    f.refusals = {};  // over every seed
    for (const RunSummary& s : arm_runs[a]) f.refusals.Add(s.refusals);
    f.measured = Estimated(measured);
    f.seeds = (int)drawn.size();
    f.pool = d.arms[a].pool;
    out.arms.push_back(std::move(f));
  }
  std::vector<double> workers;
  for (const RunSummary& s : runs) {
    workers.push_back(s.mean_workers);
    out.peak_workers = std::max(out.peak_workers, s.peak_workers);
  }
  out.mean_workers = Estimated(workers);
  out.scale_events = scale_events;
  out.first_seed_scaling = std::move(first_scaling);
  return out;
}

}  // namespace pdq::sim
