// `pdq profile`: measures what `pdq sim` runs on (sim/profile.h): for each
// precision, forward passes of this machine over a grid of prompt chunks,
// decode batches and mixes of the two, fitted to the step model the
// workers' own scheduler uses (policy::StepWork: a fixed part, per decode
// row, per prompt token, per prompt and per decode attention pair) with its
// error on points held out of the fit; the same passes served (a worker of
// each precision behind the router, closed-loop clients on this machine: how
// much longer its steps take than the model of the passes alone says, and
// the router's time to a first token); and the KV link: transfers of
// several sizes over a real transport on this machine, fitted to latency +
// bytes / bandwidth.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "common/host.h"
#include "harness/bench_result.h"
#include "harness/local_run.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "kvtransfer/transport.h"
#include "policy/step_plan.h"
#include "quant/quantized_load.h"
#include "sim/profile.h"
#include "tools/commands.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;

struct Point {
  policy::StepWork work;
  double seconds = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The non-negative fit of seconds on the step's parts, as the workers' cost
// model fits (policy::FitStepTime).
sim::PassTime Fit(const std::vector<Point>& points) {
  std::vector<policy::StepSample> samples;
  for (const Point& p : points) samples.push_back({p.work, p.seconds, 1});
  return policy::FitStepTime(samples);
}

// Where the passes without prompt tokens leave `line` (a fit without row
// steps), at each of their row counts: the mean of their departures
// (PassTime::row_steps).
std::vector<std::pair<double, double>> RowSteps(const sim::PassTime& line,
                                                const std::vector<Point>& points) {
  std::map<int64_t, std::pair<double, int>> at;
  for (const Point& p : points) {
    if (p.work.prefill_tokens > 0 || p.work.decode_rows < 1) continue;
    auto& [sum, n] = at[p.work.decode_rows];
    sum += p.seconds - line.Seconds(p.work);
    ++n;
  }
  std::vector<std::pair<double, double>> steps;
  for (const auto& [rows, sum_n] : at) steps.push_back({double(rows), sum_n.first / sum_n.second});
  return steps;
}

// The line through the points, with its row steps.
sim::PassTime FitWithSteps(const std::vector<Point>& points) {
  sim::PassTime t = Fit(points);
  t.row_steps = RowSteps(t, points);
  return t;
}

// One precision's passes over the grid.
class PassProbe {
 public:
  PassProbe(Context& ctx, KvCache& kv, int reps) : ctx_(ctx), kv_(kv), reps_(reps) {}

  // Times `rows` decode rows (one token each on sequences of their current
  // length) and `chunk` prompt tokens after `past` cached ones, as one pass;
  // every sequence is put back to its length after each repetition. The
  // same pass runs untimed first, for kWarmSeconds (at least once): a
  // worker runs its steps back to back, and on a CPU whose last-level cache
  // holds the weights (a 135M-parameter W4A16 model is 70 MB; the Emerald
  // Rapids guest's L3 is 300 MB) its steps read them from there, while a pass
  // timed cold, after the previous point's KV writes, reads them from
  // memory: one-row W4A16 steps on one thread took 8.6-10 ms in the
  // profile's passes and 5-6 ms served (bench/RESULTS.md).
  static constexpr double kWarmSeconds = 0.1;
  absl::StatusOr<Point> Time(const std::vector<SeqId>& rows, SeqId prompt_seq, int64_t past,
                             int64_t chunk) {
    const int vocab = ctx_.model().config().vocab_size;
    std::vector<int32_t> row_tokens(rows.size(), 1);
    const std::vector<int32_t> prompt = BenchTokens(chunk, vocab, (uint64_t)past * 7919 + chunk);
    Point p;
    std::vector<int64_t> lengths;
    for (SeqId s : rows) {
      PDQ_ASSIGN_OR_RETURN(const int64_t len, kv_.Length(s));
      lengths.push_back(len);
      p.work.AddDecodeRow(len);
    }
    if (chunk > 0) p.work.AddChunk(past, chunk);
    std::vector<double> times;
    double warm = 0;
    for (int r = 0; r < reps_; ++r) {
      std::vector<BatchEntry> batch;
      for (size_t i = 0; i < rows.size(); ++i) batch.push_back({rows[i], {&row_tokens[i], 1}, 1});
      if (chunk > 0) batch.push_back({prompt_seq, prompt, 1});
      const auto t0 = Clock::now();
      PDQ_RETURN_IF_ERROR(ctx_.Forward(kv_, batch, &logits_));
      for (const absl::Status& st : logits_.status) PDQ_RETURN_IF_ERROR(st);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      for (size_t i = 0; i < rows.size(); ++i)
        PDQ_RETURN_IF_ERROR(kv_.SetLength(rows[i], lengths[i]));
      if (chunk > 0) PDQ_RETURN_IF_ERROR(kv_.SetLength(prompt_seq, past));
      if (warm < kWarmSeconds) {  // still warming: this one does not count
        warm += seconds;
        --r;
        continue;
      }
      times.push_back(seconds);
    }
    p.seconds = Median(times);
    return p;
  }

  // A sequence holding `tokens` tokens (computed untimed).
  absl::StatusOr<SeqId> Filled(int64_t tokens, uint64_t salt) {
    const SeqId s = kv_.AddSequence();
    if (tokens == 0) return s;
    const std::vector<int32_t> ids = BenchTokens(tokens, ctx_.model().config().vocab_size, salt);
    BatchEntry e{s, ids, 1};
    PDQ_RETURN_IF_ERROR(ctx_.ForwardAll(kv_, {&e, 1}, &logits_));
    return s;
  }

 private:
  Context& ctx_;
  KvCache& kv_;
  int reps_;
  Logits logits_;
};

struct Grid {
  std::vector<int64_t> chunks = {32, 128, 384, 1024};
  std::vector<int64_t> pasts = {0, 512};
  // Decode batches up to a worker's default --max-batch (64). The decode
  // kernels change with the rows (on AMX-BF16 CPUs the bf16 tiles from 16),
  // so a step's time is a line on each side of the switch, not one line: the
  // fit's row steps (RowSteps) carry it between measured row counts, and
  // beyond the largest they hold its departure.
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> contexts = {64, 512};
  // The grid within a model's context (a small model's context may be
  // shorter than the default grid): lengths halved until they fit.
  Grid Within(int64_t max_context) const {
    Grid g = *this;
    auto fit = [&](std::vector<int64_t>& v, int64_t limit) {
      for (int64_t& x : v) {
        while (x > limit && x > 1) x /= 2;
      }
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    };
    fit(g.pasts, max_context / 2);
    fit(g.chunks, max_context - g.pasts.back());
    fit(g.contexts, max_context - 16);
    return g;
  }
};

absl::StatusOr<std::vector<Point>> MeasurePasses(Context& ctx, const Grid& g, int reps) {
  const int64_t most_rows = *std::max_element(g.rows.begin(), g.rows.end());
  // At most: the decode rows at the longest context (each one token longer
  // while timed) beside a prompt chunk, or a chunk after the longest past.
  const int64_t longest_context = *std::max_element(g.contexts.begin(), g.contexts.end());
  const int64_t longest_chunk = *std::max_element(g.chunks.begin(), g.chunks.end());
  const int64_t longest_past = *std::max_element(g.pasts.begin(), g.pasts.end());
  const int64_t block = ctx.model().kv_layout().block_tokens;
  PDQ_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      ctx.NewKvCache(most_rows * (longest_context + 2 * block) +
                     std::max(longest_past, longest_context) + longest_chunk + 4 * block + 64));
  PassProbe probe(ctx, *kv, reps);
  std::vector<Point> points;
  PDQ_ASSIGN_OR_RETURN(const SeqId warm, probe.Filled(64, 1));
  PDQ_RETURN_IF_ERROR(kv->RemoveSequence(warm));
  // Prompt chunks after each past.
  for (int64_t past : g.pasts) {
    PDQ_ASSIGN_OR_RETURN(const SeqId seq, probe.Filled(past, 2 + past));
    for (int64_t chunk : g.chunks) {
      PDQ_ASSIGN_OR_RETURN(Point p, probe.Time({}, seq, past, chunk));
      points.push_back(p);
    }
    PDQ_RETURN_IF_ERROR(kv->RemoveSequence(seq));
  }
  // Decode batches at each context, and some alongside a prompt chunk.
  for (int64_t context : g.contexts) {
    std::vector<SeqId> seqs;
    for (int64_t r = 0; r < most_rows; ++r) {
      PDQ_ASSIGN_OR_RETURN(const SeqId s, probe.Filled(context, 100 + r));
      seqs.push_back(s);
    }
    const SeqId prompt = kv->AddSequence();
    for (int64_t rows : g.rows) {
      const std::vector<SeqId> batch(seqs.begin(), seqs.begin() + rows);
      PDQ_ASSIGN_OR_RETURN(Point p, probe.Time(batch, prompt, 0, 0));
      points.push_back(p);
      if (rows == 4 || rows == most_rows) {
        for (int64_t chunk : {g.chunks.front(), g.chunks[g.chunks.size() / 2]}) {
          PDQ_ASSIGN_OR_RETURN(Point m, probe.Time(batch, prompt, 0, chunk));
          points.push_back(m);
        }
      }
    }
    for (SeqId s : seqs) PDQ_RETURN_IF_ERROR(kv->RemoveSequence(s));
    PDQ_RETURN_IF_ERROR(kv->RemoveSequence(prompt));
  }
  return points;
}

// The error of a fit without one point in four (not the largest of each
// series: those stay in, so the error measures interpolation), and the fit
// over every point, which is what the profile keeps. The fit keeps its row
// steps only where they cut the held-out median error: on a machine whose
// passes follow the line, steps from one timing a row count would fit its
// noise. `other_median_error`: the held-out median error of the choice not
// kept (with the steps, or without).
sim::PassProfile FitWithHoldout(const std::vector<Point>& points, double* other_median_error) {
  std::vector<Point> fit, held;
  sim::PassProfile p;
  for (size_t i = 0; i < points.size(); ++i) {
    const bool out = i % 4 == 1;
    (out ? held : fit).push_back(points[i]);
    const policy::StepWork& w = points[i].work;
    p.samples.push_back({w.decode_rows, w.prefill_tokens, w.attention + w.decode_attention,
                         w.decode_attention, points[i].seconds, out});
  }
  sim::PassTime without = FitWithSteps(fit);
  p.time = FitWithSteps(points);
  p.points = (int)points.size();
  p.held_out = (int)held.size();
  auto errors_of = [&](const sim::PassTime& t) {
    std::vector<double> errors;
    for (const Point& h : held) errors.push_back(std::abs(t.Seconds(h.work) / h.seconds - 1));
    return errors;
  };
  sim::PassTime line = without;
  line.row_steps.clear();
  std::vector<double> stepped = errors_of(without), straight = errors_of(line);
  *other_median_error = 0;
  if (!held.empty()) {
    if (Median(straight) <= Median(stepped)) {
      std::swap(stepped, straight);
      p.time.row_steps.clear();
    }
    p.held_out_median_error = Median(stepped);
    p.held_out_max_error = *std::max_element(stepped.begin(), stepped.end());
    *other_median_error = Median(straight);
  }
  return p;
}

// KV transfers of several sizes between two caches of this machine over
// `transport`, each timed from the sender's connect to the receiver's
// acknowledgement; fitted to latency + bytes / bandwidth.
absl::StatusOr<sim::LinkProfile> MeasureLink(const std::string& transport, const KvLayout& layout,
                                             int reps) {
  // About 1, 8 and 32 MB whatever the model, so that the sizes, not the
  // machine's noise, set the slope.
  const int64_t token_bytes = std::max<int64_t>(1, layout.bytes_per_token());
  std::vector<int64_t> sizes;
  for (int64_t mb : {1, 8, 32}) sizes.push_back(std::max<int64_t>(16, (mb << 20) / token_bytes));
  const int64_t most = sizes.back();
  const int64_t blocks = (most + layout.block_tokens - 1) / layout.block_tokens + 1;
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> send_kv, KvCache::Create({layout, blocks}));
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> recv_kv, KvCache::Create({layout, blocks}));
  kvtransfer::TransportOptions so, ro;
  so.layout = ro.layout = layout;
  so.regions = send_kv->MemoryRegions();
  ro.regions = recv_kv->MemoryRegions();
  PDQ_ASSIGN_OR_RETURN(auto sender, kvtransfer::CreateTransport(transport, so));
  PDQ_ASSIGN_OR_RETURN(auto receiver, kvtransfer::CreateTransport(transport, ro));
  std::vector<double> x, y;
  int n = 0;
  // The first round warms up; at least three are timed (one size is cheap).
  for (int rep = 0; rep < std::max(reps, 3) + 1; ++rep) {
    for (int64_t tokens : sizes) {
      const SeqId out = send_kv->AddSequence();
      PDQ_RETURN_IF_ERROR(send_kv->Reserve(out, tokens));
      PDQ_RETURN_IF_ERROR(send_kv->SetLength(out, tokens));
      PDQ_ASSIGN_OR_RETURN(const SeqId in, recv_kv->ImportSequence(layout, 0));
      PDQ_RETURN_IF_ERROR(recv_kv->Reserve(in, tokens));
      PDQ_RETURN_IF_ERROR(recv_kv->SetLength(in, tokens));
      std::mutex mu;
      std::condition_variable cv;
      int finished = 0;
      absl::Status first_error;
      auto done = [&](const absl::Status& s) {
        std::lock_guard lock(mu);
        if (!s.ok() && first_error.ok()) first_error = s;
        ++finished;
        cv.notify_all();
      };
      kvtransfer::InboundSpec spec;
      spec.token = absl::StrCat("profile-", ++n);
      spec.tokens = tokens;
      for (int l = 0; l < layout.num_layers; ++l) {
        PDQ_ASSIGN_OR_RETURN(std::vector<KvSpan> spans, recv_kv->LayerSpans(in, l, tokens));
        spec.layers.push_back(std::move(spans));
      }
      spec.done = [&](absl::Status s, const kvtransfer::KvNotice&) { done(s); };
      PDQ_ASSIGN_OR_RETURN(auto inbound, receiver->Expect(std::move(spec)));
      const auto t0 = Clock::now();
      auto outbound = sender->Connect(receiver->address(), absl::StrCat("profile-", n),
                                      absl::Now() + absl::Seconds(60), done);
      for (int l = 0; l < layout.num_layers; ++l) {
        PDQ_ASSIGN_OR_RETURN(std::vector<KvSpan> spans, send_kv->LayerSpans(out, l, tokens));
        outbound->PostLayer(l, std::move(spans));
      }
      outbound->PostDone({0, tokens, 0});
      {
        std::unique_lock lock(mu);
        if (!cv.wait_for(lock, std::chrono::seconds(60),
                         [&] { return finished == 2 || !first_error.ok(); })) {
          return absl::DeadlineExceededError("a profile transfer took over 60 s");
        }
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!first_error.ok()) return first_error;
      outbound.reset();
      inbound.reset();
      PDQ_RETURN_IF_ERROR(send_kv->RemoveSequence(out));
      PDQ_RETURN_IF_ERROR(recv_kv->RemoveSequence(in));
      if (rep == 0) continue;
      x.push_back(double(tokens) * double(layout.block_bytes()) * layout.num_layers /
                  layout.block_tokens);
      y.push_back(seconds);
    }
  }
  // Ordinary least squares of time on bytes.
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i], my += y[i];
  mx /= double(x.size());
  my /= double(y.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i)
    sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  const double per_byte = sxx > 0 ? sxy / sxx : 0;
  if (!(per_byte > 0)) {
    return absl::InternalError(
        "the transfer times did not grow with their size; rerun on an idle machine");
  }
  sim::LinkProfile l;
  l.transport = transport;
  l.link.bytes_per_second = 1 / per_byte;
  l.link.latency_seconds = std::max(0.0, my - per_byte * mx);
  return l;
}

// The served probe's requests: mostly decode steps (what a served worker
// runs most), at a short and a long context, so that the attention's part
// of a served step can be told from the rest.
struct ServedShape {
  int64_t prompt_tokens, output_tokens;
};
constexpr ServedShape kServedShapes[] = {{64, 128}, {512, 256}};

// `n` of the CPUs this process may run on, after the first `skip` of them,
// as pdq up's "cpus" takes them.
std::string Cpus(int skip, int n) {
  cpu_set_t set;
  std::vector<std::string> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE && (int)cpus.size() < n; ++c) {
      if (CPU_ISSET(c, &set) && skip-- <= 0) cpus.push_back(std::to_string(c));
    }
  }
  return absl::StrJoin(cpus, ",");
}

struct ServedResult {
  std::vector<sim::ServedLevel> levels;
  double factor = 0, pair_factor = 0;
  std::vector<std::pair<double, double>> row_factors;  // FitRowFactors'
  double finish_seconds = 0;  // the levels' mean loop time ending a stream (0: none read)
  std::vector<sim::PromptLevel> prompts;      // prompt passes at one client
  double prompt_factor = 0;                   // FitServedPromptFactor's (0: none)
  double overhead = 0, overhead_per_row = 0;  // FitOverhead's
  double router_seconds = -1;  // < 0: not measured (no one-client level)
};

// The levels' loop time outside the passes a step as a + b x its rows,
// least squares weighted by steps, a and b >= 0.
void FitOverhead(ServedResult* r) {
  double w = 0, wr = 0, wrr = 0, wo = 0, wro = 0;
  for (const sim::ServedLevel& l : r->levels) {
    if (l.overhead_seconds < 0) continue;
    const double n = double(l.steps), x = l.rows_per_step, y = l.overhead_seconds;
    w += n, wr += n * x, wrr += n * x * x, wo += n * y, wro += n * x * y;
  }
  if (w <= 0) return;
  const double det = w * wrr - wr * wr;
  double a = wo / w, b = 0;
  if (det > 1e-12 * w * wrr) {
    b = (w * wro - wr * wo) / det;
    a = (wo - b * wr) / w;
  }
  if (b < 0) {
    a = wo / w, b = 0;
  } else if (a < 0) {
    a = 0, b = wrr > 0 ? wro / wrr : 0;
  }
  r->overhead = std::max(0.0, a);
  r->overhead_per_row = b;
}

// The one-client levels' served steps against FitServed's fit, as row
// factors (sim::PassProfile::served_row_factors): max(step, model) / fit,
// weighted by steps, at one row, falling to 1 at the next client count's
// mean rows (4 with the default --served-clients); none without a
// one-client level and another. The other levels
// are left to the fit: given factors of their own too, they followed the
// probe's noise as much as the host (post hoc on eleven committed sets,
// with the split rule of FitServed: latency cells within the bound 494 of
// 624, throughput 96 of 156; one-row factors only 500 and 96; neither 497
// and 89: bench/RESULTS.md, "Served steps by their rows").
void FitRowFactors(ServedResult* r) {
  struct Sums {
    double steps = 0, rows = 0, ratio = 0;  // steps, and rows and ratio weighted by steps
  };
  std::map<int, Sums> by_clients;  // ascending client counts
  for (const sim::ServedLevel& l : r->levels) {
    const double fit = r->factor * (l.model_seconds - l.model_pair_seconds) +
                       r->pair_factor * l.model_pair_seconds;
    if (!(fit > 0) || !(l.steps > 0)) continue;
    Sums& c = by_clients[l.clients];
    const double n = double(l.steps);
    c.steps += n, c.rows += n * l.rows_per_step;
    c.ratio += n * std::max(l.step_seconds, l.model_seconds) / fit;
  }
  r->row_factors.clear();
  if (by_clients.size() < 2 || by_clients.begin()->first != 1) return;
  const Sums& one = by_clients.begin()->second;
  const Sums& next = std::next(by_clients.begin())->second;
  const double next_rows = next.rows / next.steps;
  if (!(next_rows > 1)) return;
  r->row_factors = {{1.0, one.ratio / one.steps}, {next_rows, 1.0}};
}

// FitRowFactors' points as "one-row decode steps x1.20 that (x1 from 3.0
// rows)".
std::string RowFactorsText(const std::vector<std::pair<double, double>>& row_factors) {
  if (row_factors.size() < 2) return "no one-row factor (no one-client level and another)";
  return absl::StrFormat("one-row decode steps x%.2f that (x1 from %.1f rows)",
                         row_factors[0].second, row_factors[1].first);
}

// The served levels' step time as a * (the model's time without attention)
// + b * (its attention's time), least squares on relative error, each level
// weighted by its steps, a and b >= 1: serving adds to a pass (the router,
// the gRPC threads and the clients on the same cores), it cannot take from
// it; a factor below 1 is the host's speed drifting between the profile's
// passes and the probe (on Zen 4 it made the predictions 11-22% short where
// the passes as timed alone held within 10%: bench/RESULTS.md). Fewer than
// three levels (the split probe's two) leave nothing to judge a second term
// by, and two levels whose attention was 7.5-9.4% of the model's step put
// x2.23 on attention where one factor fitted barely worse (Zen 4,
// bench/RESULTS.md, "Zen 4: the FP16 configurations with FP16's own speed
// probe"):
// they get one factor for both. Then the row factors over that fit
// (FitRowFactors).
void FitServed(ServedResult* r) {
  double nn = 0, nt = 0, tt = 0, ns = 0, ts = 0;
  for (const sim::ServedLevel& l : r->levels) {
    const double w = double(l.steps) / (l.step_seconds * l.step_seconds);
    const double n = l.model_seconds - l.model_pair_seconds, t = l.model_pair_seconds;
    nn += w * n * n, nt += w * n * t, tt += w * t * t;
    ns += w * n * l.step_seconds, ts += w * t * l.step_seconds;
  }
  if (!(nn > 0)) return;
  if (!(tt > 0) || r->levels.size() < 3) {  // one factor for both
    r->factor = r->pair_factor = std::max(1.0, (ns + ts) / (nn + 2 * nt + tt));
    FitRowFactors(r);
    return;
  }
  // The residual's part that depends on (a, b), and the best of the
  // candidates that keep a, b >= 1: the free optimum, or one of them at 1.
  auto residual = [&](double a, double b) {
    return a * a * nn + 2 * a * b * nt + b * b * tt - 2 * a * ns - 2 * b * ts;
  };
  std::vector<std::pair<double, double>> candidates = {{1, std::max(1.0, (ts - nt) / tt)},
                                                       {std::max(1.0, (ns - nt) / nn), 1}};
  const double det = nn * tt - nt * nt;
  if (det > 1e-12 * nn * tt) {
    const double a = (ns * tt - ts * nt) / det, b = (nn * ts - nt * ns) / det;
    if (a >= 1 && b >= 1) candidates.push_back({a, b});
  }
  std::pair<double, double> best = candidates[0];
  for (const auto& c : candidates) {
    if (residual(c.first, c.second) < residual(best.first, best.second)) best = c;
  }
  r->factor = best.first;
  r->pair_factor = best.second;
  FitRowFactors(r);
}

// `workers` (pdq up's entries) behind the router in a `pdq up` of the
// model, its logs under `dir`, with a text for pdq bench's prompts: its path.
absl::StatusOr<std::string> StartProbe(const std::string& model_path, const nlohmann::json& workers,
                                       const std::string& dir, LocalDeployment* dep) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string text = dir + "/text.txt";
  std::ofstream(text) << BuiltinCalibrationText();
  const nlohmann::json up = {{"model", model_path},
                             {"listen", "127.0.0.1:0"},
                             {"kv_transport", "tcp"},
                             {"workers", workers}};
  PDQ_RETURN_IF_ERROR(dep->Start(up, dir));
  return text;
}

// `pdq bench` against dep: requests of `shape` at each of `clients`, closed
// loop, two a client after one not counted; prompts from --prompt-seed
// `prompt_seed`. Its log and JSON under dir.
absl::StatusOr<BenchResult> BenchDeployment(const LocalDeployment& dep, const std::string& text,
                                            const ServedShape& shape,
                                            const std::vector<int64_t>& clients, int prompt_seed,
                                            const std::string& dir, int requests_per_client = 2,
                                            int warmup = 1) {
  const std::string base = absl::StrCat(dir, "/bench-", shape.prompt_tokens,
                                        warmup == 1 ? "" : absl::StrCat("-warmup", warmup));
  const int rc = RunChild({SelfPath(),
                           "bench",
                           "--router",
                           dep.address(),
                           "--text",
                           text,
                           "--json",
                           base + ".json",
                           "--workload",
                           "custom",
                           "--input-tokens",
                           std::to_string(shape.prompt_tokens),
                           "--output-tokens",
                           std::to_string(shape.output_tokens),
                           "--concurrency",
                           absl::StrJoin(clients, ","),
                           "--requests-per-client",
                           std::to_string(requests_per_client),
                           "--warmup",
                           std::to_string(warmup),
                           "--prompt-seed",
                           std::to_string(prompt_seed)},
                          base + ".log", /*stderr_too=*/true);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("pdq bench against the served deployment exited with ",
                                            rc, "; its log: ", base,
                                            ".log, the deployment's: ", dir, "/up.log"));
  }
  return ReadBenchResult(base + ".json");
}

// A worker's decode steps in one level of requests of `shape` against what
// `pass`'s model gives for the same mean work; none where the level ran
// too few steps to say much (or a worker of an older build reported no
// composition).
std::optional<sim::ServedLevel> ServedLevelOf(const WorkerUsage& w, int clients,
                                              const ServedShape& shape,
                                              const sim::PassProfile& pass) {
  if (!(w.decode_steps >= 8) || !(w.decode_rows > 0) || !(w.decode_step_seconds > 0)) {
    return std::nullopt;
  }
  sim::ServedLevel s;
  s.clients = clients;
  s.prompt_tokens = shape.prompt_tokens;
  s.output_tokens = shape.output_tokens;
  s.steps = (int64_t)w.decode_steps;
  s.rows_per_step = w.decode_rows / w.decode_steps;
  s.prompt_tokens_per_step =
      std::isfinite(w.decode_step_prompt_tokens) ? w.decode_step_prompt_tokens / w.decode_steps : 0;
  s.step_seconds = w.decode_step_seconds / w.decode_steps;
  const bool finishes = w.streams_finished >= 1 && std::isfinite(w.stream_finish_seconds);
  if (finishes) {
    s.streams_finished = (int64_t)w.streams_finished;
    s.finish_seconds = w.stream_finish_seconds / w.streams_finished;
  }
  if (std::isfinite(w.decode_step_overhead_seconds)) {
    // Less the streams' ends, which the loop's time outside the passes
    // holds too and the simulator adds apart (stream_finish_seconds).
    s.overhead_seconds =
        std::max(0.0, w.decode_step_overhead_seconds - (finishes ? w.stream_finish_seconds : 0)) /
        w.decode_steps;
  }
  // The mean step's work: rows over contexts from the prompt's length to
  // the answer's end, prompt tokens each over half its prompt.
  const double row_past = double(shape.prompt_tokens) + double(shape.output_tokens - 1) / 2;
  s.model_pair_seconds =
      pass.time.per_decode_pair * s.rows_per_step * row_past +
      pass.time.per_pair * s.prompt_tokens_per_step * double(shape.prompt_tokens) / 2;
  s.model_seconds = pass.time.fixed + pass.time.per_row * s.rows_per_step +
                    pass.time.per_token * s.prompt_tokens_per_step + s.model_pair_seconds +
                    pass.time.RowStep(s.rows_per_step + s.prompt_tokens_per_step);
  return s;
}

// The served probe's prompt passes at one client as the simulator prices
// them: the pass model's fixed part and row steps times the steps' served
// factor `f`, its prompt tokens and their attention times g, g fitted (least
// squares on relative error weighted by passes); 0 without levels or where
// the fixed part alone outruns the passes (g would not be positive).
double FitServedPromptFactor(const std::vector<sim::PromptLevel>& levels, const sim::PassTime& t,
                             double f) {
  double pp = 0, py = 0;
  for (const sim::PromptLevel& l : levels) {
    const double fixed = t.fixed + t.RowStep(l.tokens_per_pass);
    const double prompt = l.model_seconds - fixed, y = l.pass_seconds - fixed * f;
    const double w = double(l.passes) / (l.pass_seconds * l.pass_seconds);
    pp += w * prompt * prompt, py += w * prompt * y;
  }
  return pp > 0 && py > 0 ? py / pp : 0;
}

// The split probe's prefill_factor: the levels' prompt passes as a x their
// model's time (the whole pass), least squares on relative error weighted by
// passes, a at least 1 (as FitServed's factors); 0 without levels.
double FitPrefillFactor(const std::vector<sim::PromptLevel>& levels) {
  double mm = 0, ms = 0;
  for (const sim::PromptLevel& l : levels) {
    const double w = double(l.passes) / (l.pass_seconds * l.pass_seconds);
    mm += w * l.model_seconds * l.model_seconds, ms += w * l.model_seconds * l.pass_seconds;
  }
  return mm > 0 ? std::max(1.0, ms / mm) : 0;
}

// A level's prompt passes from a worker's counters: `prompt_tokens` a
// request, each pass's tokens whole prompts (a pass of several prompts holds
// each one's attention), against `t`'s time for that mean pass; nullopt with
// fewer than `min_passes`.
std::optional<sim::PromptLevel> PromptLevelOf(const WorkerUsage& w, int clients,
                                              int64_t prompt_tokens, const sim::PassTime& t,
                                              int min_passes) {
  if (!(w.prefill_passes >= min_passes) || !(w.prefill_busy_seconds > 0) ||
      !(w.prefill_tokens > 0)) {
    return std::nullopt;
  }
  sim::PromptLevel p;
  p.clients = clients;
  p.prompt_tokens = prompt_tokens;
  p.passes = (int64_t)w.prefill_passes;
  p.tokens_per_pass = w.prefill_tokens / w.prefill_passes;
  p.pass_seconds = w.prefill_busy_seconds / w.prefill_passes;
  policy::StepWork prompt;  // one prompt's attention
  prompt.AddChunk(0, prompt_tokens);
  p.model_seconds = t.fixed + t.per_token * p.tokens_per_pass +
                    t.per_pair * prompt.attention * p.tokens_per_pass / double(prompt_tokens) +
                    t.RowStep(p.tokens_per_pass);
  return p;
}

// One worker of `pass`'s precision and threads (role both, pinned to the
// first CPUs when it has fewer threads than the machine has cores) behind
// the router in a `pdq up`, and `pdq bench` against it at each of
// `clients`, closed loop, for each of kServedShapes; the worker's own
// counters, level by level, against what the pass model gives for the same
// work (FitServed). Logs under `dir`.
absl::StatusOr<ServedResult> MeasureServed(const ModelFlags& mf, const std::string& model_path,
                                           const sim::PassProfile& pass,
                                           const std::vector<int64_t>& clients,
                                           const std::string& dir) {
  nlohmann::json worker = {{"role", "both"},
                           {"precision", pass.precision},
                           {"threads", pass.threads},
                           {"args", mf.Args()}};
  if (pass.threads < ThreadPool::UsableCores()) worker["cpus"] = Cpus(0, pass.threads);
  LocalDeployment dep;
  PDQ_ASSIGN_OR_RETURN(const std::string text,
                       StartProbe(model_path, nlohmann::json::array({worker}), dir, &dep));
  ServedResult r;
  int shape_index = 0;
  for (const ServedShape& shape : kServedShapes) {
    // Another --prompt-seed per shape: no prompt starts where an earlier
    // one did, so none is answered from the prefix cache.
    PDQ_ASSIGN_OR_RETURN(const BenchResult bench,
                         BenchDeployment(dep, text, shape, clients, ++shape_index, dir));
    for (const LevelResult& l : bench.levels) {
      if (l.workers.size() != 1) continue;
      const WorkerUsage& w = l.workers[0];
      // One client: each prompt a pass of its own, nothing decoding beside
      // it (the closed loop's next request comes after the answer).
      if (l.concurrency == 1) {
        if (std::optional<sim::PromptLevel> p =
                PromptLevelOf(w, 1, shape.prompt_tokens, pass.time, /*min_passes=*/1)) {
          r.prompts.push_back(*p);
        }
      }
      std::optional<sim::ServedLevel> s = ServedLevelOf(w, l.concurrency, shape, pass);
      if (!s) continue;
      r.levels.push_back(*s);
    }
  }
  // The router's time: one client of the short shape, the worker warm by
  // now and no request left out (the levels above leave their first out of
  // the client's figures but not of the worker's counters, which set a
  // cold prompt pass against warm first tokens): nothing else runs while a
  // prompt computes, so its first token's wait beyond the prompt's compute
  // is the router's and gRPC's.
  if (std::find(clients.begin(), clients.end(), 1) != clients.end()) {
    constexpr int kRouterRequests = 4;
    PDQ_ASSIGN_OR_RETURN(const BenchResult bench,
                         BenchDeployment(dep, text, kServedShapes[0], {1}, ++shape_index, dir,
                                         kRouterRequests, /*warmup=*/0));
    for (const LevelResult& l : bench.levels) {
      if (l.workers.size() != 1 || l.requests_ok != kRouterRequests) continue;
      const WorkerUsage& w = l.workers[0];
      if (w.prefills == kRouterRequests && std::isfinite(w.prefill_seconds) && l.ttft_s.mean > 0) {
        r.router_seconds = std::max(0.0, l.ttft_s.mean - w.prefill_seconds / w.prefills);
      }
    }
  }
  dep.Stop();
  if (r.levels.empty()) {
    return absl::InternalError(absl::StrCat(
        "the served worker reported no decode steps to compare (its log: ", dir, "/up.log)"));
  }
  FitServed(&r);
  FitOverhead(&r);
  r.prompt_factor = FitServedPromptFactor(r.prompts, pass.time, r.factor);
  double finished = 0, finishing = 0;
  for (const sim::ServedLevel& l : r.levels) {
    if (l.finish_seconds < 0) continue;
    finished += double(l.streams_finished);
    finishing += l.finish_seconds * double(l.streams_finished);
  }
  if (finished > 0) r.finish_seconds = finishing / finished;
  return r;
}

// A new directory for a probe's deployments and logs, under $TMPDIR.
absl::StatusOr<std::string> ScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/pdq-profile-XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot make a directory like ", pattern));
  }
  return std::string(buf.data());
}

// The split probe's requests: a chat prompt, and answers long enough that
// the decode worker is busy while the prefill worker computes the next
// prompts.
constexpr ServedShape kSplitShape = {128, 256};

// A prefill worker of `prefill`'s precision and a decode worker of
// `decode`'s, `threads` each, pinned to CPUs apart, behind the router (the
// 1P+1D deployment on one machine), and `pdq bench` against them at each
// of `clients` with kSplitShape's requests: the prefill worker's prompt
// passes and the decode worker's steps, level by level, against their pass
// models. Logs under `dir`.
absl::StatusOr<sim::SplitProfile> MeasureSplit(const ModelFlags& mf, const std::string& model_path,
                                               const sim::PassProfile& prefill,
                                               const sim::PassProfile& decode,
                                               const std::vector<int64_t>& clients,
                                               const std::string& dir) {
  const int threads = prefill.threads;
  const nlohmann::json workers = nlohmann::json::array({{{"role", "prefill"},
                                                         {"precision", prefill.precision},
                                                         {"threads", threads},
                                                         {"cpus", Cpus(0, threads)},
                                                         {"args", mf.Args()}},
                                                        {{"role", "decode"},
                                                         {"precision", decode.precision},
                                                         {"threads", threads},
                                                         {"cpus", Cpus(threads, threads)},
                                                         {"args", mf.Args()}}});
  LocalDeployment dep;
  PDQ_ASSIGN_OR_RETURN(const std::string text, StartProbe(model_path, workers, dir, &dep));
  absl::StatusOr<BenchResult> bench = BenchDeployment(dep, text, kSplitShape, clients, 1, dir);
  dep.Stop();
  if (!bench.ok()) return bench.status();
  sim::SplitProfile split;
  split.prefill_precision = prefill.precision;
  split.decode_precision = decode.precision;
  split.threads = threads;
  ServedResult r;
  for (const LevelResult& l : bench->levels) {
    for (const WorkerUsage& w : l.workers) {
      if (w.role == "prefill") {
        if (std::optional<sim::PromptLevel> p = PromptLevelOf(
                w, l.concurrency, kSplitShape.prompt_tokens, prefill.time, /*min_passes=*/2)) {
          split.prefill_levels.push_back(*p);
        }
      } else if (w.role == "decode") {
        if (std::optional<sim::ServedLevel> s =
                ServedLevelOf(w, l.concurrency, kSplitShape, decode)) {
          r.levels.push_back(*s);
        }
      }
    }
  }
  if (split.prefill_levels.empty() || r.levels.empty()) {
    return absl::InternalError(absl::StrCat(
        "the split deployment's workers reported too few prompt passes or decode steps to compare "
        "(its log: ",
        dir, "/up.log)"));
  }
  split.prefill_factor = FitPrefillFactor(split.prefill_levels);
  FitServed(&r);
  FitOverhead(&r);
  split.decode_levels = r.levels;
  split.decode_factor = r.factor;
  split.decode_pair_factor = r.pair_factor;
  split.decode_step_overhead = r.overhead;
  split.decode_step_overhead_per_row = r.overhead_per_row;
  return split;
}

// --refit-served: the profile at in_path with each pass's served factors
// and each split probe's decode factors fitted again from the levels it
// recorded, by FitServed's rule (a profile measured before the factors were
// held at 1 or more, 85a16df, or before the row factors), written to
// out_path; nothing measured.
int RefitServedProfile(const std::string& in_path, const std::string& out_path) {
  auto fail = [](const absl::Status& s) { return Fail("profile", s); };
  absl::StatusOr<sim::Profile> read = sim::ReadProfile(in_path);
  if (!read.ok()) return fail(read.status());
  sim::Profile profile = *std::move(read);
  int refitted = 0;
  for (sim::PassProfile& p : profile.passes) {
    if (p.served.empty()) continue;
    ServedResult r;
    r.levels = p.served;
    r.factor = p.served_factor;
    r.pair_factor = p.served_pair_factor;
    FitServed(&r);
    std::fprintf(stderr,
                 "pdq profile: %s at %d threads: served factors x%.3f and x%.3f (attention) -> "
                 "x%.3f and x%.3f, %s, from %zu served levels\n",
                 p.precision.c_str(), p.threads, p.served_factor, p.served_pair_factor, r.factor,
                 r.pair_factor, RowFactorsText(r.row_factors).c_str(), p.served.size());
    p.served_factor = r.factor;
    p.served_pair_factor = r.pair_factor;
    p.served_row_factors = r.row_factors;
    if (!p.served_prompts.empty()) {
      p.served_prompt_factor = FitServedPromptFactor(p.served_prompts, p.time, r.factor);
    }
    ++refitted;
  }
  for (sim::SplitProfile& s : profile.splits) {
    if (s.decode_levels.empty()) continue;
    ServedResult r;
    r.levels = s.decode_levels;
    r.factor = s.decode_factor;  // kept where the levels give no fit
    r.pair_factor = s.decode_pair_factor;
    FitServed(&r);
    std::fprintf(stderr,
                 "pdq profile: split %s/%s at %d threads: decode factors x%.3f and x%.3f "
                 "(attention) -> x%.3f and x%.3f, from %zu levels\n",
                 s.prefill_precision.c_str(), s.decode_precision.c_str(), s.threads,
                 s.decode_factor, s.decode_pair_factor, r.factor, r.pair_factor,
                 s.decode_levels.size());
    s.decode_factor = r.factor;
    s.decode_pair_factor = r.pair_factor;
    ++refitted;
  }
  if (refitted == 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        in_path,
        " has no served levels to refit (its served probe did not run: --served-clients '' or a "
        "synthetic model)")));
  }
  std::ofstream out(out_path);
  out << sim::ProfileToJson(profile);
  if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", out_path)));
  std::fprintf(stderr, "pdq profile: wrote %s\n", out_path.c_str());
  return 0;
}

// The split probe of each pair at each thread count the profile measured
// both precisions at with two workers' cores to spare, into profile->splits.
absl::Status MeasureSplits(const ModelFlags& mf,
                           const std::vector<std::pair<std::string, std::string>>& pairs,
                           const std::vector<int64_t>& clients, sim::Profile* profile) {
  if (absl::StartsWith(profile->model_path, "synthetic:")) {
    std::fprintf(stderr, "pdq profile: split probe skipped: no router serves a synthetic model\n");
    return absl::OkStatus();
  }
  PDQ_ASSIGN_OR_RETURN(const std::string scratch, ScratchDir());
  for (const auto& [prefill_precision, decode_precision] : pairs) {
    for (const sim::PassProfile& prefill : profile->passes) {
      if (prefill.precision != prefill_precision) continue;
      if (2 * prefill.threads > ThreadPool::UsableCores()) {
        std::fprintf(stderr,
                     "pdq profile: no split probe of %s/%s at %d threads: two workers need %d "
                     "cores, this process has %d\n",
                     prefill_precision.c_str(), decode_precision.c_str(), prefill.threads,
                     2 * prefill.threads, ThreadPool::UsableCores());
        continue;
      }
      absl::StatusOr<sim::PassProfile> decode = profile->Pass(decode_precision, prefill.threads);
      if (!decode.ok()) continue;  // checked: both precisions are measured at every count
      const auto t0 = Clock::now();
      std::fprintf(stderr,
                   "pdq profile: split probe: %s prefill beside %s decode, %d threads each on "
                   "cores apart, served to %s clients ...\n",
                   prefill_precision.c_str(), decode_precision.c_str(), prefill.threads,
                   absl::StrJoin(clients, ",").c_str());
      const std::string dir = absl::StrCat(scratch, "/split-", prefill_precision, "-",
                                           decode_precision, "-t", prefill.threads);
      absl::StatusOr<sim::SplitProfile> split =
          MeasureSplit(mf, profile->model_path, prefill, *decode, clients, dir);
      if (!split.ok()) {
        std::fprintf(stderr, "pdq profile: the split probe's files are kept in %s\n",
                     scratch.c_str());
        return split.status();
      }
      std::string each;
      for (const sim::PromptLevel& l : split->prefill_levels) {
        absl::StrAppendFormat(&each, "%s%d clients: prompt passes of %.0f tokens %.1f/%.1f ms",
                              each.empty() ? "" : "; ", l.clients, l.tokens_per_pass,
                              l.pass_seconds * 1e3, l.model_seconds * 1e3);
      }
      for (const sim::ServedLevel& l : split->decode_levels) {
        absl::StrAppendFormat(&each, "; %d clients: decode steps of %.1f rows %.2f/%.2f ms",
                              l.clients, l.rows_per_step, l.step_seconds * 1e3,
                              l.model_seconds * 1e3);
      }
      std::fprintf(stderr,
                   "pdq profile: split %s/%s at %d threads: prefill passes x%.2f their model, "
                   "decode steps x%.2f and x%.2f (attention), the decode loop outside the passes "
                   "%.2f ms + %.3f ms a row a step (%s: served/model); %.0f s\n",
                   prefill_precision.c_str(), decode_precision.c_str(), prefill.threads,
                   split->prefill_factor, split->decode_factor, split->decode_pair_factor,
                   split->decode_step_overhead * 1e3, split->decode_step_overhead_per_row * 1e3,
                   each.c_str(), std::chrono::duration<double>(Clock::now() - t0).count());
      profile->splits.push_back(*std::move(split));
    }
  }
  std::filesystem::remove_all(scratch);
  return absl::OkStatus();
}

}  // namespace

int ProfileCommand(int argc, char** argv) {
  ModelFlags mf;
  std::string out_path = "profile.json", precisions = "fp16,w8a8,w4a16", transports = "tcp",
              thread_counts, served_clients = "1,4,16", refit_served, split_pairs = "auto",
              split_clients = "4,8", decode_rows = "1,2,4,8,16,32,64";
  int64_t reps = 3;
  double router_seconds = 0;
  FlagParser flags("profile",
                   "Measures the forward-pass times (per precision, over prompt chunks, decode "
                   "batches and mixes), fitted to the workers' step model with held-out error, and "
                   "the KV link of each transport on this machine; writes the profile pdq sim runs "
                   "on.");
  mf.Register(flags);
  flags.String("precisions", &precisions, "comma-separated precisions to measure");
  flags.String("transports", &transports, "comma-separated KV transports to measure ('' for none)");
  flags.Int("reps", &reps, 1, 100, "timings of each point (their median counts)");
  flags.String("decode-rows", &decode_rows,
               "comma-separated decode batch sizes the passes are timed at (each at a short and "
               "a long context; the largest and 4 beside prompt chunks too), at most 256; cover "
               "the workers' --max-batch: beyond the largest the fit extrapolates");
  flags.Float("router-seconds", &router_seconds, 0, 10,
              "the router's time per request; 0: measured by the served probe (the median of "
              "its one-client levels), or left out without one");
  flags.String("served-clients", &served_clients,
               "closed-loop client counts of the served probe: each precision and thread count "
               "served by one worker behind the router (64 tokens in and 128 out, then 512 and "
               "256), its steps' time against the passes' model (served_factor, "
               "served_pair_factor); '' skips it");
  flags.String("split-pairs", &split_pairs,
               "PREFILL/DECODE precision pairs of the split probe, comma-separated: at each "
               "measured thread count T with 2T cores to spare, a prefill worker and a decode "
               "worker of T threads pinned to cores apart behind the router (1P+1D on one box), "
               "each worker's passes against its model (pdq sim --co-located); auto: w8a8/w4a16 "
               "where --precisions has both; '' skips it");
  flags.String("split-clients", &split_clients,
               "closed-loop client counts of the split probe (128 tokens in, 256 out)");
  flags.String("thread-counts", &thread_counts,
               "comma-separated thread counts to measure the passes at (a 1P+1D deployment on 2 "
               "cores runs each worker on 1; pdq sim --threads picks); default: --threads");
  flags.String("out", &out_path, "where to write the profile");
  flags.String("refit-served", &refit_served,
               "a profile FILE to refit instead of measuring: each pass's served_factor, "
               "served_pair_factor and served_row_factors fitted again from its recorded served "
               "levels by today's rule (factors at least 1; one factor from fewer than three "
               "levels), its served_prompt_factor from its recorded prompt passes where it has "
               "them, and each split probe's decode factors from its levels, written to --out; "
               "for profiles measured before those rules");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (!refit_served.empty()) return RefitServedProfile(refit_served, out_path);
  auto fail = [](const absl::Status& s) { return Fail("profile", s); };
  Grid grid;
  {
    absl::StatusOr<std::vector<int64_t>> rows = IntList("decode-rows", decode_rows, 1, 256);
    if (!rows.ok()) return fail(rows.status());
    grid.rows = *std::move(rows);
    std::sort(grid.rows.begin(), grid.rows.end());
    grid.rows.erase(std::unique(grid.rows.begin(), grid.rows.end()), grid.rows.end());
  }
  // The served probe's levels (none: skipped), checked before any work.
  std::optional<std::vector<int64_t>> clients;
  if (!served_clients.empty()) {
    absl::StatusOr<std::vector<int64_t>> levels =
        IntList("served-clients", served_clients, 1, 1024);
    if (!levels.ok()) return fail(levels.status());
    clients = *std::move(levels);
  }
  // The split probe's pairs and levels, checked before any work too.
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<int64_t> pair_clients;
  if (!split_pairs.empty()) {
    const std::vector<std::string> measured = absl::StrSplit(precisions, ',', absl::SkipEmpty());
    if (split_pairs == "auto") {
      const bool both = std::find(measured.begin(), measured.end(), "w8a8") != measured.end() &&
                        std::find(measured.begin(), measured.end(), "w4a16") != measured.end();
      split_pairs = both ? "w8a8/w4a16" : "";
    }
    for (absl::string_view pair : absl::StrSplit(split_pairs, ',', absl::SkipEmpty())) {
      const std::vector<std::string> two = absl::StrSplit(pair, '/');
      if (two.size() != 2 ||
          std::find(measured.begin(), measured.end(), two[0]) == measured.end() ||
          std::find(measured.begin(), measured.end(), two[1]) == measured.end()) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "--split-pairs: '", pair, "' is not PREFILL/DECODE with both among --precisions (",
            precisions, ")")));
      }
      pairs.push_back({two[0], two[1]});
    }
    absl::StatusOr<std::vector<int64_t>> levels = IntList("split-clients", split_clients, 1, 1024);
    if (!levels.ok()) return fail(levels.status());
    pair_clients = *std::move(levels);
  }
  // Each count runs on its own pool: a copy of the flags made before any
  // pool exists gets its own (ModelFlags::pool).
  std::vector<ModelFlags> runs;
  if (thread_counts.empty()) {
    runs.push_back(mf);
  } else {
    absl::StatusOr<std::vector<int64_t>> counts = IntList("thread-counts", thread_counts, 1, 1024);
    if (!counts.ok()) return fail(counts.status());
    for (int64_t n : *counts) {
      ModelFlags f = mf;
      f.threads = n;
      runs.push_back(f);
    }
  }
  sim::Profile profile;
  profile.cpu = CpuModelName();
  profile.isa = KernelIsaName();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  profile.hostname = host;
  profile.model_path = mf.model.empty() ? DefaultModelPath() : mf.model;
  profile.router_seconds = router_seconds;
  profile.cores = ThreadPool::UsableCores();
  std::optional<KvLayout> layout;
  for (const ModelFlags& run : runs) {
    for (absl::string_view precision : absl::StrSplit(precisions, ',', absl::SkipEmpty())) {
      const auto load_start = Clock::now();
      absl::StatusOr<LoadedModel> m = run.Load(/*quiet=*/false, std::string(precision));
      if (!m.ok()) return fail(m.status());
      const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
      const ModelConfig& c = m->model->config();
      if (!layout) {
        layout = m->model->kv_layout();
        profile.num_layers = c.num_layers;
        profile.block_tokens = layout->block_tokens;
        profile.kv_bytes_per_token = layout->bytes_per_token();
        profile.max_context = c.max_context;
        profile.kv_dtype = KvDtypeName(layout->dtype);
      }
      const auto t0 = Clock::now();
      absl::StatusOr<std::vector<Point>> points =
          MeasurePasses(*m->ctx, grid.Within(c.max_context), (int)reps);
      if (!points.ok()) return fail(points.status());
      double other_error = 0;
      sim::PassProfile p = FitWithHoldout(*points, &other_error);
      p.precision = std::string(precision);
      p.threads = (int)run.pool().size();
      p.load_seconds = load_seconds;
      std::fprintf(
          stderr,
          "pdq profile: %s at %d threads: %.2f ms + %.3f ms/row + %.4f ms/token + %.3f "
          "ms/M prompt pairs + %.3f ms/M decode pairs%s (fitted to %d points; fitted without %d of "
          "them, it misses those "
          "by %.1f%% median (%s: %.1f%%), %.1f%% at most, held out; loaded in %.2f s; "
          "%.0f s)\n",
          p.precision.c_str(), p.threads, p.time.fixed * 1e3, p.time.per_row * 1e3,
          p.time.per_token * 1e3, p.time.per_pair * 1e9, p.time.per_decode_pair * 1e9,
          p.time.row_steps.empty()
              ? ""
              : absl::StrFormat(", with steps by rows at %zu row counts", p.time.row_steps.size())
                    .c_str(),
          p.points, p.held_out, p.held_out_median_error * 100,
          p.time.row_steps.empty() ? "with steps by rows, not kept" : "the line alone",
          other_error * 100, p.held_out_max_error * 100, load_seconds,
          std::chrono::duration<double>(Clock::now() - t0).count());
      profile.passes.push_back(p);
    }
  }
  if (!layout) return fail(absl::InvalidArgumentError("--precisions names none"));
  if (clients && absl::StartsWith(profile.model_path, "synthetic:")) {
    std::fprintf(stderr,
                 "pdq profile: served probe skipped: no router serves a synthetic model (it "
                 "reads the GGUF's tokenizer)\n");
  } else if (clients) {
    absl::StatusOr<std::string> dir = ScratchDir();
    if (!dir.ok()) return fail(dir.status());
    const std::string scratch = *dir;
    std::vector<double> routers;
    for (size_t i = 0; i < profile.passes.size(); ++i) {
      sim::PassProfile& p = profile.passes[i];
      const auto t0 = Clock::now();
      std::fprintf(stderr, "pdq profile: %s at %d threads, served to %s clients ...\n",
                   p.precision.c_str(), p.threads, served_clients.c_str());
      const std::string dir = absl::StrCat(scratch, "/", p.precision, "-t", p.threads);
      absl::StatusOr<ServedResult> r = MeasureServed(mf, profile.model_path, p, *clients, dir);
      if (!r.ok()) {
        std::fprintf(stderr, "pdq profile: the served probe's files are kept in %s\n",
                     scratch.c_str());
        return fail(r.status());
      }
      p.served = r->levels;
      p.served_factor = r->factor;
      p.served_pair_factor = r->pair_factor;
      p.served_row_factors = r->row_factors;
      p.served_prompt_factor = r->prompt_factor;
      p.served_prompts = r->prompts;
      p.stream_finish_seconds = r->finish_seconds;
      p.step_overhead = r->overhead;
      p.step_overhead_per_row = r->overhead_per_row;
      std::string each;
      for (const sim::ServedLevel& l : r->levels) {
        absl::StrAppendFormat(&each, "%s%lld+%lld tokens, %d clients, %.1f rows: %.2f/%.2f ms",
                              each.empty() ? "" : "; ", (long long)l.prompt_tokens,
                              (long long)l.output_tokens, l.clients, l.rows_per_step,
                              l.step_seconds * 1e3, l.model_seconds * 1e3);
      }
      std::fprintf(stderr,
                   "pdq profile: %s at %d threads served: steps x%.2f the passes' model without "
                   "attention and x%.2f its attention (%s: served/model), %s; prompt passes at one "
                   "client x%.2f; the loop outside the passes %.2f "
                   "ms + %.3f ms a row a step, %.3f ms ending a stream%s; %.0f s\n",
                   p.precision.c_str(), p.threads, r->factor, r->pair_factor, each.c_str(),
                   RowFactorsText(r->row_factors).c_str(), r->prompt_factor, r->overhead * 1e3,
                   r->overhead_per_row * 1e3, r->finish_seconds * 1e3,
                   r->router_seconds >= 0
                       ? absl::StrFormat("; first token %.1f ms after the prompt's compute",
                                         r->router_seconds * 1e3)
                             .c_str()
                       : "",
                   std::chrono::duration<double>(Clock::now() - t0).count());
      if (r->router_seconds >= 0) routers.push_back(r->router_seconds);
    }
    std::filesystem::remove_all(scratch);
    if (router_seconds == 0 && !routers.empty()) profile.router_seconds = Median(routers);
  }
  if (!pairs.empty()) {
    if (absl::Status s = MeasureSplits(mf, pairs, pair_clients, &profile); !s.ok()) return fail(s);
  }
  for (absl::string_view transport : absl::StrSplit(transports, ',', absl::SkipEmpty())) {
    absl::StatusOr<sim::LinkProfile> l = MeasureLink(std::string(transport), *layout, (int)reps);
    if (!l.ok()) return fail(l.status());
    std::fprintf(stderr, "pdq profile: KV over %s on this machine: %.2f GB/s, %.0f us latency\n",
                 l->transport.c_str(), l->link.bytes_per_second / 1e9,
                 l->link.latency_seconds * 1e6);
    profile.links.push_back(*l);
  }
  std::ofstream out(out_path);
  out << sim::ProfileToJson(profile);
  if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", out_path)));
  std::fprintf(stderr, "pdq profile: wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace pdq
