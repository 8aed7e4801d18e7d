// The report's serving sections: deployments, goodput, cost, each workload,
// one-process and A/B deployments, conversations, stability.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "harness/report_internal.h"

namespace pdq::report {
namespace {

std::string Interpretation(const Dep& d, const Dep& base, const std::string& w) {
  const BenchResult* bench = d.Bench(w);
  const BenchResult* bb = base.Bench(w);
  if (bench == nullptr || bb == nullptr) return "";
  // The lowest concurrency both measured: latency without queueing.
  int level = -1;
  for (const LevelResult& l : bench->levels) {
    const int c = l.concurrency;
    if (LevelAt(*bb, c) && (level < 0 || c < level)) level = c;
  }
  if (level < 0) return "";
  const LevelResult& a = *LevelAt(*bench, level);
  const LevelResult& b = *LevelAt(*bb, level);
  const double ttft = a.ttft_s.p50 / b.ttft_s.p50;
  const double tpot = a.tpot_s.p50 / b.tpot_s.p50;
  auto change = [](double r) {
    return r < 0.9   ? absl::StrFormat("fell (×%.2f)", r)
           : r > 1.1 ? absl::StrFormat("rose (×%.2f)", r)
                     : absl::StrFormat("flat (×%.2f)", r);
  };
  std::string reading;
  if (tpot < 0.9) {
    reading = "the decode quantization freed memory bandwidth";
  } else if (ttft < 0.9) {
    reading = "the prefill strategy works and decode bandwidth is still the limit";
  } else if (ttft > 1.1) {
    reading = absl::StrFormat("the prefill is slower here: it runs on %d thread(s) against %d",
                              Threads(d.workers, "prefill"), Threads(base.workers, "prefill"));
  } else {
    reading = "no gain at this concurrency";
  }
  return absl::StrFormat("- **%s** at concurrency %d: TTFT p50 %s, TPOT p50 %s: %s.\n", d.name,
                         level, change(ttft), change(tpot), reading);
}

std::string ResourceLines(const Dep& d, const std::string& w) {
  const BenchResult* bench = d.Bench(w);
  const LevelResult* top = bench ? TopLevel(*bench) : nullptr;
  if (top == nullptr) return "";
  std::string out = absl::StrFormat("| %s | %d |", d.name, top->concurrency);
  std::vector<std::string> parts;
  for (const WorkerUsage& wk : top->workers) {
    std::string p =
        absl::StrFormat("%s %s: %.2f cores busy", wk.role, wk.precision, wk.cpu_cores_busy);
    if (std::isfinite(wk.prefill_compute_utilization)) {
      absl::StrAppendFormat(&p, ", prefill %.0f%% of peak ops",
                            100 * wk.prefill_compute_utilization);
    }
    if (std::isfinite(wk.decode_bandwidth_utilization)) {
      absl::StrAppendFormat(&p, ", decode %.0f%% of read bandwidth",
                            100 * wk.decode_bandwidth_utilization);
    }
    parts.push_back(p);
  }
  return absl::StrCat(out, " ", absl::StrJoin(parts, "; "), " |\n");
}

// Where each deployment's output tokens/s stops rising with concurrency
// (FindSaturation), and what its highest level got against the most; and
// where its goodput peaks, which in a closed loop can come well before: more
// streams keep the batches fuller while every request waits longer.
std::string SaturationTable(const std::vector<Dep>& deps, const std::string& w) {
  constexpr double kWithin = 0.95;
  std::string rows;
  for (const Dep& d : deps) {
    const BenchResult* bench = d.Bench(w);
    const std::optional<Saturation> s = bench ? FindSaturation(*bench, kWithin) : std::nullopt;
    if (!s) continue;
    const double top = s->top->output_tokens_per_s;
    std::string tokens;
    const double below = s->below_top->output_tokens_per_s;
    if (s->at == s->top && s->refused != nullptr) {
      // Output still rose, but admission control was already refusing:
      // the deployment's bound, where more clients are turned away.
      const LevelResult& r = *s->refused;
      tokens = absl::StrFormat(
          "| its admission bound: c=%d refused %lld of %lld requests (output ×%.2f c=%d for the "
          "rest) | c=%d: %.1f tok/s, the most |",
          r.concurrency, (long long)r.requests_refused,
          (long long)(r.requests_ok + r.requests_failed), below > 0 ? top / below : INFINITY,
          s->below_top->concurrency, s->top->concurrency, top);
    } else if (s->at == s->top) {
      tokens = absl::StrFormat("| not reached: still rising at c=%d (×%.2f c=%d) | – |",
                               s->top->concurrency, below > 0 ? top / below : INFINITY,
                               s->below_top->concurrency);
    } else {
      const LevelResult& t = *s->top;
      tokens = absl::StrFormat(
          "| c=%d, %.1f tok/s | c=%d: %.1f tok/s, ×%.2f the most%s%s |", s->at->concurrency,
          s->at->output_tokens_per_s, t.concurrency, top, top / s->most,
          top < kWithin * s->most ? " (fell)" : "",
          t.requests_refused > 0
              ? absl::StrFormat("; %lld of %lld refused", (long long)t.requests_refused,
                                (long long)(t.requests_ok + t.requests_failed))
              : "");
    }
    std::string goodput = "none met the targets";
    if (const LevelResult* g = MostGoodput(*bench)) {
      goodput = g == s->top ? absl::StrFormat("not passed: most at c=%d, %.2f req/s",
                                              g->concurrency, g->goodput_requests_per_s)
                            : absl::StrFormat("c=%d, %.2f req/s; c=%d: %.2f", g->concurrency,
                                              g->goodput_requests_per_s, s->top->concurrency,
                                              s->top->goodput_requests_per_s);
    }
    absl::StrAppend(&rows, "| ", d.name, " ", tokens, " ", goodput, " |\n");
  }
  if (rows.empty()) return "";
  return absl::StrCat(
      "\nWhere output tokens/s stops rising with concurrency (the lowest level within 5% of the "
      "most the deployment reached: past it clients only queue; or, where output still rose, the "
      "first level at which admission control refused requests: past it clients are turned "
      "away), the highest level against that "
      "most, and the level of the most goodput (requests/s meeting the workload's TTFT and TPOT "
      "targets) against the highest level's:\n\n| deployment | output tokens/s saturates at | "
      "highest level | goodput peaks at |\n| --- | --- | --- | --- |\n",
      rows);
}

}  // namespace

// The deployments compared: processes, precisions, peak memory.
std::string DeploymentsSection(const ReportInput& in) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  absl::StrAppend(
      &md,
      "## Deployments\n\nPeak resident memory of all the deployment's processes over every "
      "workload, and what they reported holding at most (MiB): weights, KV that held data (blocks "
      "in use, and those the prefix cache keeps for later requests until the cache's "
      "`--kv-tokens` are needed: resident once touched) and activation workspaces.\n\n"
      "| deployment | processes | prefill / decode precision | peak resident memory (all "
      "processes) | weights | KV held | workspaces |\n| --- | --- | --- | ---: | ---: | ---: | "
      "---: |\n");
  for (const Dep& d : deps) {
    const HeldMiB held = MostHeldMiB(d);
    absl::StrAppend(&md, "| ", d.name, d.baseline ? " (baseline)" : "", " | ", Processes(d.workers),
                    " | ", d.prefill_precision, " / ", d.decode_precision, " | ",
                    F(PeakResidentMiB(d), 0), " MiB | ", F(held.weights, 0), " | ", F(held.kv, 0),
                    " | ", F(held.workspaces, 0), " |\n");
  }
  absl::StrAppend(&md, "\n");
  return md;
}

// The headline: goodput at the latency targets per workload and deployment,
// and its short form for the terminal (`summary_out`).
std::string GoodputSection(const ReportInput& in, std::string* summary_out) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  const Dep* base = &in.base();
  const std::vector<EvalWorkload>& workloads = in.config.workloads;
  absl::StrAppend(&md, "## Goodput at the latency targets\n\n",
                  "Goodput: requests per second that met both targets (TTFT and mean TPOT), at "
                  "the best concurrency level of the sweep; in brackets, the ratio to ",
                  base->name,
                  ". \"Max concurrency\" is the highest level whose p90 TTFT and p90 TPOT were "
                  "within the targets.\n\n| workload | targets |");
  for (const Dep& d : deps) absl::StrAppend(&md, " ", d.name, " |");
  absl::StrAppend(&md, "\n| --- | --- |");
  for (size_t i = 0; i < deps.size(); ++i) absl::StrAppend(&md, " ---: |");
  absl::StrAppend(&md, "\n");
  (*summary_out) += absl::StrFormat("%-10s", "goodput");
  for (const Dep& d : deps) (*summary_out) += absl::StrFormat(" %18s", d.name);
  (*summary_out) += "\n";
  for (const EvalWorkload& spec : workloads) {
    const std::string& w = spec.name;
    absl::StrAppendFormat(&md, "| %s | TTFT ≤ %.0f ms, TPOT ≤ %.0f ms |", w, spec.ttft_target_ms,
                          spec.tpot_target_ms);
    (*summary_out) += absl::StrFormat("%-10s", w);
    const BenchResult* bb = base->Bench(w);
    const LevelResult* bbest = bb ? BestLevel(*bb) : nullptr;
    const double bgood = bbest ? bbest->goodput_requests_per_s : NAN;
    for (const Dep& d : deps) {
      const BenchResult* bench = d.Bench(w);
      const LevelResult* best = bench ? BestLevel(*bench) : nullptr;
      if (best == nullptr) {
        absl::StrAppend(&md, " not measured |");
        (*summary_out) += absl::StrFormat(" %18s", "-");
        continue;
      }
      const double good = best->goodput_requests_per_s;
      const std::string ratio = bgood > 0 ? absl::StrFormat(" (×%.2f)", good / bgood) : "";
      absl::StrAppendFormat(&md, " %.3f/s%s at c=%d; max concurrency %d |", good, ratio,
                            best->concurrency, MaxConcurrencyWithinTargets(*bench));
      (*summary_out) += absl::StrFormat(" %11.3f/s%6s", good,
                                        bgood > 0 ? absl::StrFormat("x%.2f", good / bgood) : "");
    }
    absl::StrAppend(&md, "\n");
    (*summary_out) += "\n";
  }
  absl::StrAppend(&md, "\n");
  return md;
}

// The aims the config states: goodput ratios of one deployment to the
// baseline, with what bounded it where one was missed.
std::string AimSection(const ReportInput& in) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  const Dep* base = &in.base();
  if (!in.config.aim) return md;
  const EvalAim& aim = *in.config.aim;
  for (const Dep& d : deps) {
    if (d.name != aim.deployment) continue;
    for (const auto& [w, want] : aim.goodput_ratio) {
      const BenchResult* bench = d.Bench(w);
      const BenchResult* bb = base->Bench(w);
      const LevelResult* best = bench ? BestLevel(*bench) : nullptr;
      const LevelResult* bbest = bb ? BestLevel(*bb) : nullptr;
      if (!best || !bbest || !(bbest->goodput_requests_per_s > 0)) {
        absl::StrAppend(&md, "Aim for ", w, ": not measured.\n\n");
        continue;
      }
      const double ratio = best->goodput_requests_per_s / bbest->goodput_requests_per_s;
      absl::StrAppendFormat(&md, "**Aim: %s goodput ≥ %.1f× %s on `%s`: %s (×%.2f).**", d.name,
                            want, base->name, w, ratio >= want ? "met" : "missed", ratio);
      if (ratio < want) {
        // The busiest process (CPU time against its threads) at that level.
        std::string busiest;
        double share = -1;
        for (const WorkerUsage& wk : best->workers) {
          int threads = 1;
          for (const json& cw : d.workers) {
            if (cw.value("role", "both") == wk.role) threads = std::max(1, cw.value("threads", 1));
          }
          const double s = wk.cpu_cores_busy / threads;
          if (s > share) {
            share = s;
            busiest =
                absl::StrFormat("the %s worker (%s), %.0f%% busy on its %d thread(s)%s", wk.role,
                                wk.precision, 100 * s, threads,
                                std::isfinite(wk.decode_bandwidth_utilization)
                                    ? absl::StrFormat(", decode at %.0f%% of the read bandwidth",
                                                      100 * wk.decode_bandwidth_utilization)
                                : std::isfinite(wk.prefill_compute_utilization)
                                    ? absl::StrFormat(", prefill at %.0f%% of peak ops",
                                                      100 * wk.prefill_compute_utilization)
                                    : "");
          }
        }
        if (!busiest.empty())
          absl::StrAppend(&md, " At its best level the bound is ", busiest, ".");
      }
      absl::StrAppend(&md, "\n\n");
    }
  }
  return md;
}

// Cost per million output tokens at the level of best goodput.
std::string CostSection(const ReportInput& in) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  const std::vector<EvalWorkload>& workloads = in.config.workloads;
  const double cores = in.config.cores;
  const double price = in.config.price_per_core_hour;
  if (price > 0) {
    absl::StrAppendFormat(
        &md,
        "## Cost per million output tokens\n\nAt $%.3f per core-hour × %.0f cores, "
        "at the level of best goodput (the throughput a deployment sustains "
        "within the targets).\n\n| workload |",
        price, cores);
    for (const Dep& d : deps) absl::StrAppend(&md, " ", d.name, " |");
    absl::StrAppend(&md, "\n| --- |");
    for (size_t i = 0; i < deps.size(); ++i) absl::StrAppend(&md, " ---: |");
    absl::StrAppend(&md, "\n");
    for (const EvalWorkload& spec : workloads) {
      const std::string& w = spec.name;
      absl::StrAppend(&md, "| ", w, " |");
      for (const Dep& d : deps) {
        const BenchResult* bench = d.Bench(w);
        const LevelResult* best = bench ? BestLevel(*bench) : nullptr;
        const double tps = best ? best->output_tokens_per_s : NAN;
        absl::StrAppend(&md, " ",
                        tps > 0 ? absl::StrFormat("$%.3f", price * cores / 3600 / tps * 1e6) : "–",
                        " |");
      }
      absl::StrAppend(&md, "\n");
    }
    absl::StrAppend(&md, "\n");
  }
  return md;
}

// One workload: every level of every deployment, the latency-throughput
// and distribution plots, the reading against the baseline and what bounds
// each deployment.
std::string WorkloadSection(const ReportInput& in, Plotter& plot, const std::string& w) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  const Dep* base = &in.base();
  absl::StrAppend(&md, "## Workload `", w, "`\n\n");
  std::string data, ttft_cdf, tpot_cdf;
  std::vector<std::string> curves, cdf_curves;
  int block = 0, cdf_block = 0;
  absl::StrAppend(&md,
                  "| deployment | conc | ok/all | TTFT p50 | p90 | p99 | TPOT p50 | p90 | p99 | "
                  "E2E p50 | req/s | out tok/s | goodput/s |\n| --- | ---: | ---: | ---: | ---: "
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int top_common = 1 << 30;
  for (const Dep& d : deps) {
    const BenchResult* bench = d.Bench(w);
    if (bench == nullptr || bench->levels.empty()) continue;
    int top = 0;
    absl::StrAppendFormat(&data, "# %s\n", d.name);
    for (const LevelResult& l : bench->levels) {
      const int c = l.concurrency;
      top = std::max(top, c);
      absl::StrAppendFormat(&md,
                            "| %s | %d | %d/%d | %.0f ms | %.0f | %.0f | %.1f ms | %.1f | %.1f | "
                            "%.2f s | %.3f | %.1f | %.3f |\n",
                            d.name, c, (int)l.requests_ok, (int)(l.requests_ok + l.requests_failed),
                            1e3 * l.ttft_s.p50, 1e3 * l.ttft_s.p90, 1e3 * l.ttft_s.p99,
                            1e3 * l.tpot_s.p50, 1e3 * l.tpot_s.p90, 1e3 * l.tpot_s.p99, l.e2e_s.p50,
                            l.requests_per_s, l.output_tokens_per_s, l.goodput_requests_per_s);
      absl::StrAppendFormat(&data, "%d %g %g %g\n", c, l.output_tokens_per_s, 1e3 * l.ttft_s.p50,
                            1e3 * l.tpot_s.p50);
    }
    absl::StrAppend(&data, "\n\n");
    curves.push_back(absl::StrCat("datafile index ", block, " using 2:COL with linespoints title ",
                                  Quote(d.name)));
    ++block;
    top_common = std::min(top_common, top);
  }
  if (block == 0) {
    absl::StrAppend(&md, "\nNot measured.\n\n");
    return md;
  }
  // Failed requests, by deployment and reason: a result in themselves.
  for (const Dep& d : deps) {
    const BenchResult* bench = d.Bench(w);
    if (bench == nullptr) continue;
    std::map<std::pair<int, std::string>, int> failed;
    for (const RequestResult& r : bench->requests) {
      if (!r.ok) ++failed[{r.concurrency, r.error}];
    }
    for (const auto& [key, n] : failed) {
      absl::StrAppendFormat(&md, "\n**%d request(s) of %s failed at concurrency %d**: %s\n", n,
                            d.name, key.first, key.second);
    }
  }
  absl::StrAppend(&md, SaturationTable(deps, w));
  // Distributions at the highest level every deployment measured.
  for (const Dep& d : deps) {
    const BenchResult* bench = d.Bench(w);
    if (bench == nullptr || bench->requests.empty()) continue;
    std::vector<double> t, p;
    for (const RequestResult& r : bench->requests) {
      if (r.concurrency != top_common || !r.ok) continue;
      t.push_back(1e3 * r.ttft_s);
      if (r.output_tokens > 1) p.push_back(1e3 * r.tpot_s);
    }
    AppendCdf(d.name, std::move(t), &ttft_cdf);
    AppendCdf(d.name, std::move(p), &tpot_cdf);
    cdf_curves.push_back(absl::StrCat("datafile index ", cdf_block++,
                                      " using 1:2 with steps title ", Quote(d.name)));
  }
  std::string lines = absl::StrJoin(curves, ", ");
  auto col = [&](int c) { return absl::StrReplaceAll(lines, {{"COL", std::to_string(c)}}); };
  absl::StrAppend(
      &md, "\n",
      plot.Draw(w + "-latency-throughput", data,
                SideBySide(absl::StrCat("Workload ", w,
                                        ": latency against throughput (points: concurrency "
                                        "levels)"),
                           // Room around the points, so the top level is not drawn
                           // on the frame (both panels: set once, before the first).
                           absl::StrCat("set offsets graph 0.03, graph 0.03, graph 0.06, "
                                        "0\nset yrange [0:*]\nset xlabel 'output tokens/s'\n"
                                        "set ylabel 'TTFT p50 (ms)'\nplot ",
                                        col(3)),
                           absl::StrCat("set ylabel 'TPOT p50 (ms)'\nplot ", col(4))),
                absl::StrCat(w, ": latency against throughput"), 960, 520),
      "\n");
  const std::string cdfs = absl::StrJoin(cdf_curves, ", ");
  auto cdf = [&](const char* metric, const char* xlabel, const std::string& data) {
    return plot.Draw(
        absl::StrCat(w, "-", absl::AsciiStrToLower(metric), "-cdf"), data,
        absl::StrCat("set title 'Workload ", w, ": ", metric, " distribution at concurrency ",
                     top_common, "'\nset xlabel '", xlabel,
                     "'\nset ylabel 'fraction of requests'\nplot ", cdfs, "\n"),
        absl::StrCat(w, ": ", metric, " distribution"));
  };
  absl::StrAppend(&md, cdf("TTFT", "TTFT (ms)", ttft_cdf), "\n",
                  cdf("TPOT", "mean TPOT per request (ms)", tpot_cdf), "\n");
  absl::StrAppend(&md, "Against ", base->name, ", at the lowest concurrency both measured:\n\n");
  for (const Dep& d : deps) {
    if (&d != base) absl::StrAppend(&md, Interpretation(d, *base, w));
  }
  absl::StrAppend(
      &md,
      "\nWhat bounds each deployment at its highest level (from the workers' own counters: CPU "
      "time, prefill operations against the peak measured at start-up, decode bytes against the "
      "measured read bandwidth):\n\n| deployment | conc | per process |\n| --- | ---: | --- |\n");
  for (const Dep& d : deps) absl::StrAppend(&md, ResourceLines(d, w));
  absl::StrAppend(&md, "\n");
  return md;
}

// Deployments of one process holding both precisions, against the others.
std::string DualPrecisionSection(const ReportInput& in) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  for (const Dep& d : deps) {
    if (!DualPrecision(d)) continue;
    absl::StrAppend(
        &md, "## Both precisions in one process: `", d.name, "`\n\n", "One worker holds the ",
        d.prefill_precision, " and the ", d.decode_precision,
        " weights and one KV cache, and interleaves prefill chunks with decode steps in one "
        "scheduler. Peak resident memory of one process (the largest over every level), and "
        "TPOT jitter: p99 / p50 of the gaps between consecutive tokens at each deployment's "
        "highest level, where long prompts arrive while others decode.\n\n"
        "| deployment | peak MiB of its largest process | workload | ITL p50 ms | ITL p99 ms | "
        "p99/p50 | goodput req/s (best level) |\n| --- | ---: | --- | ---: | ---: | ---: | ---: "
        "|\n");
    for (const Dep& e : deps) {
      const bool single_mono = e.workers.size() == 1 && !DualPrecision(e);
      const bool same_pair = e.prefill_precision == d.prefill_precision &&
                             e.decode_precision == d.decode_precision && e.split.empty();
      if (&e != &d && !single_mono && !same_pair) continue;
      double process_peak = 0;
      for (const auto& [w, b] : e.bench) {
        for (const LevelResult& l : b.levels) {
          for (const WorkerUsage& p : l.workers) {
            process_peak = std::max(process_peak, p.peak_resident_bytes / 1048576);
          }
        }
      }
      for (const auto& [w, b] : e.bench) {
        const LevelResult* top = TopLevel(b);
        const LevelResult* best = BestLevel(b);
        if (top == nullptr) continue;
        const double p50 = top->itl_s.p50 * 1e3, p99 = top->itl_s.p99 * 1e3;
        absl::StrAppend(&md, "| ", e.name, " | ", F(process_peak > 0 ? process_peak : NAN, 0),
                        " | ", w, " (conc ", top->concurrency, ") | ", F(p50, 1), " | ", F(p99, 1),
                        " | ", F(p50 > 0 ? p99 / p50 : NAN, 1), " | ",
                        F(best ? best->goodput_requests_per_s : NAN, 3), " |\n");
      }
    }
    // Which wins, workload by workload, against the split with the same pair.
    for (const auto& [w, b] : d.bench) {
      const Dep* rival = nullptr;
      for (const Dep& e : deps) {
        if (&e != &d && e.prefill_precision == d.prefill_precision &&
            e.decode_precision == d.decode_precision && e.split.empty() && e.bench.count(w)) {
          rival = &e;
        }
      }
      const LevelResult* mine = BestLevel(b);
      if (rival == nullptr || mine == nullptr || BestLevel(rival->bench.at(w)) == nullptr) continue;
      const LevelResult* theirs = BestLevel(rival->bench.at(w));
      const double g1 = mine->goodput_requests_per_s, g2 = theirs->goodput_requests_per_s;
      absl::StrAppend(&md, "\n- `", w, "`: ",
                      g1 == g2  ? std::string("neither wins")
                      : g1 > g2 ? absl::StrCat(d.name, " wins")
                                : absl::StrCat(rival->name, " wins"),
                      absl::StrFormat(" (%.3f against %.3f req/s of %s within the targets).", g1,
                                      g2, rival->name));
    }
    absl::StrAppend(
        &md,
        "\n\nWhy: one process lets both phases use every core, so each prompt and each decode "
        "step runs on twice the threads the split gives it; the price is that a decode step "
        "waits behind whatever prefill chunk is running (the p99/p50 jitter above: a gap as long "
        "as a whole prompt's prefill where the worker's `--prefill-budget`, 2048 tokens by "
        "default, takes a long prompt in one chunk), and that both weight sets are resident "
        "(the memory column). The split keeps decode steps regular at the cost of each phase "
        "having only its own cores.\n\n");
  }
  return md;
}

// A/B splits: the router's per-pool counts and the bench's per-pool percentiles.
std::string AbSplitSection(const ReportInput& in) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  for (const Dep& d : deps) {
    if (d.split.empty()) continue;
    absl::StrAppend(
        &md, "## A/B split: `", d.name, "` (", d.split, ")\n\n",
        "The router sends each request to one pool by weight and labels its metrics by pool. "
        "Counts and means are the router's own (`pdq_requests_total`, `pdq_ttft_seconds`, "
        "`pdq_tpot_seconds` by `pool`, read from its /metrics around each workload, warm-up "
        "included); percentiles are the bench's requests at the highest level, grouped by the "
        "pool each answer named.\n\n"
        "| workload | pool | requests OK / failed | fallbacks | mean TTFT ms | mean TPOT ms | "
        "TTFT p90 ms | TPOT p90 ms | goodput req/s |\n| --- | --- | ---: | ---: | ---: | ---: | "
        "---: | ---: | ---: |\n");
    for (const auto& [w, b] : d.bench) {
      const LevelResult* top = TopLevel(b);
      for (const auto& [pool, m] : b.router_pools) {
        auto get = [&](const char* k) {
          auto it = m.find(k);
          return it == m.end() ? 0.0 : it->second;
        };
        LevelFigures level_pool;  // NaN figures where the top level has none for the pool
        level_pool.ttft_s = level_pool.tpot_s = Distribution{};
        if (top != nullptr) {
          if (auto it = top->pools.find(pool); it != top->pools.end()) level_pool = it->second;
        }
        absl::StrAppend(&md, "| ", w, " | ", pool, " | ", F(get("requests_ok"), 0), " / ",
                        F(get("requests_failed"), 0), " | ", F(get("fallbacks"), 0), " | ",
                        F(get("ttft_seconds_count") > 0
                              ? 1e3 * get("ttft_seconds_sum") / get("ttft_seconds_count")
                              : NAN,
                          1),
                        " | ",
                        F(get("tpot_seconds_count") > 0
                              ? 1e3 * get("tpot_seconds_sum") / get("tpot_seconds_count")
                              : NAN,
                          2),
                        " | ", F(level_pool.ttft_s.p90 * 1e3, 1), " | ",
                        F(level_pool.tpot_s.p90 * 1e3, 2), " | ",
                        F(level_pool.goodput_requests_per_s, 3), " |\n");
      }
    }
    absl::StrAppend(&md, "\n");
  }
  return md;
}

// `pdq bench --workload conversation` on the deployments the config names,
// with their prefix caches on and off (conversation-cache-{on,off}.json).
std::string ConversationSection(const EvalConfig& config, const std::string& raw) {
  if (!config.conversations || config.conversations->deployments.empty()) return "";
  const EvalConversations& conv = *config.conversations;
  std::string md = absl::StrCat(
      "## Conversations: KV reuse across turns\n\n", conv.sessions, " concurrent conversations of ",
      conv.turns,
      " turns (`pdq bench --workload "
      "conversation`): turn 1 sends ",
      conv.first_tokens,
      " tokens of text, every later turn the whole conversation so far (prompt and answer) and ",
      conv.turn_tokens, " new tokens; ", conv.output_tokens,
      " tokens per answer. Each deployment runs it with its workers' prefix caches on (the "
      "default) and off (`--prefix-cache off`). Cached is the share of later turns' prompt "
      "tokens the workers reused.\n\n"
      "| deployment | prefix cache | conversations done in (s) | TTFT p50 turn 1 (ms) | TTFT p50 "
      "turns 2+ (ms) | TTFT p50 turn ",
      conv.turns,
      " (ms) | cached | off / on |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const std::string& name : conv.deployments) {
    double on_seconds = NAN;
    for (const char* cache : {"on", "off"}) {
      const absl::StatusOr<BenchResult> j =
          ReadBenchResult(absl::StrCat(raw, "/", name, "/conversation-cache-", cache, ".json"));
      if (!j.ok() || !j->conversation) {
        absl::StrAppend(&md, "| ", name, " | ", cache, " | not measured | | | | | |\n");
        continue;
      }
      const ConversationResult& c = *j->conversation;
      const std::vector<TurnResult>& turns = c.per_turn;
      double prompt = 0, cached = 0;
      for (size_t t = 1; t < turns.size(); ++t) {
        prompt += turns[t].prompt_tokens_mean;
        cached += turns[t].cached_tokens_mean;
      }
      const double seconds = c.seconds;
      if (std::string(cache) == "on") on_seconds = seconds;
      const bool failed = c.requests_failed > 0;
      absl::StrAppend(&md, "| ", name, " | ", cache, " | ", F(seconds, 1),
                      failed ? " (requests failed)" : "", " | ",
                      turns.empty() ? "–" : F(1e3 * turns[0].ttft_s.p50, 0), " | ",
                      F(1e3 * c.ttft_later_turns_s.p50, 0), " | ",
                      turns.empty() ? "–" : F(1e3 * turns.back().ttft_s.p50, 0), " | ",
                      prompt > 0 ? F(100 * cached / prompt, 0) + "%" : "–", " | ",
                      std::string(cache) == "off" ? F(seconds / on_seconds, 2) + "x" : "", " |\n");
    }
  }
  return md + "\n";
}

// Stability under alternating load: memory and free KV blocks per cycle.
std::string StabilitySection(const ReportInput& in, Plotter& plot) {
  std::string md;
  const std::vector<Dep>& deps = in.deps;
  absl::StrAppend(&md, "## Stability under alternating load\n\n");
  bool any_stability = false;
  for (const Dep& d : deps) {
    if (!d.stability) continue;
    any_stability = true;
    const PatternResult p = d.stability->pattern.value_or(PatternResult{});
    absl::StrAppendFormat(
        &md, "%s: **%s**%s.\n\n", d.name, p.pass ? "PASS" : "FAIL",
        p.pass ? absl::StrFormat(" over %d cycles (KV blocks back, resident memory within the "
                                 "bound besides the KV pages the prefix cache filled, which "
                                 "level off below --kv-tokens, the greedy probe identical, no "
                                 "request failed)",
                                 (int)d.stability->cycles.size())
               : ": " + p.reason);
    std::string mem, kv;
    std::map<std::string, std::string> mem_rows, kv_rows;
    for (const CycleState& c : d.stability->cycles) {
      for (const CycleWorker& w : c.workers) {
        absl::StrAppendFormat(&mem_rows[w.worker_id], "%d %g\n", c.cycle,
                              w.resident_bytes / 1048576);
        absl::StrAppendFormat(&kv_rows[w.worker_id], "%d %g\n", c.cycle,
                              w.kv_blocks_free / std::max(1.0, w.kv_blocks_total));
      }
    }
    // One colour per worker in both panels; the legend is the top panel's.
    std::vector<std::string> mc, kc;
    int i = 0;
    for (const auto& [id, rows] : mem_rows) {
      absl::StrAppend(&mem, "# ", id, "\n", rows, "\n\n", kv_rows[id], "\n\n");
      mc.push_back(absl::StrCat("datafile index ", 2 * i, " using 1:2 with linespoints lt ", i + 1,
                                " title ", Quote(id)));
      kc.push_back(absl::StrCat("datafile index ", 2 * i + 1, " using 1:2 with linespoints lt ",
                                i + 1, " notitle"));
      ++i;
    }
    if (i > 0) {
      absl::StrAppend(
          &md,
          plot.Draw(d.name + "-stability", mem,
                    Stacked("Resident memory and free KV blocks after each low phase",
                            "set ylabel 'resident MiB'\nset yrange [0:*]\n"
                            "set offsets 0, 0, graph 0.15, 0\nset format x ''\nplot " +
                                absl::StrJoin(mc, ", "),
                            "set xlabel 'cycle'\nset format x '%g'\nset ylabel 'KV blocks free "
                            "(fraction)'\nset yrange [0:1.05]\nplot " +
                                absl::StrJoin(kc, ", ")),
                    d.name + ": stability", 820, 560),
          "\n");
    }
  }
  if (!any_stability) absl::StrAppend(&md, "Not measured.\n\n");
  return md;
}

}  // namespace pdq::report
