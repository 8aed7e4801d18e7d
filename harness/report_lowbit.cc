// The report's "where low-bit stops paying" section: decode speedups of the
// low-bit precisions predicted from the machine's balance and measured.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "harness/report_internal.h"

namespace pdq::report {
namespace {

namespace fs = std::filesystem;

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

}  // namespace

std::string LowbitSection(const EvalLowbit& lowbit, const std::string& raw) {
  std::string md =
      "## Where low-bit stops paying\n\n"
      "The engine alone (`pdq bench-engine --baseline fp16`, the same process alternating the two "
      "precisions) on each kernel path of the machine it ran on (`PDQ_ISA`), at each thread "
      "count; a resumed run adds the paths its machine has that an earlier one lacked, so the "
      "CPU column names each row's machine (\"not recorded\": a run from before bench-engine "
      "recorded it). Decode is batch 1 over a short context; prefill is one prompt. A speedup "
      "above 1 means the quantized weights pay on that path.\n\n"
      "| path | threads | CPU | FP16 decode tok/s | W4A16 decode × | W8A8 decode × | FP16 prefill "
      "tok/s | W8A8 prefill × | W4A16 prefill × | read GB/s | FMA GFLOP/s | int8 GOP/s | balance "
      "FLOP/B |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: |\n";
  struct Row {
    std::string isa;
    int threads = 0;
    json w4, w8;
  };
  std::vector<Row> rows;
  std::vector<std::string> absent;
  for (const std::string& isa : lowbit.isas) {
    for (int t : lowbit.threads) {
      const std::string stem = absl::StrCat(raw, "/lowbit/", isa, "-");
      const std::string tail = absl::StrCat("-t", t, ".json");
      Row r{isa, t, Load(stem + "w4a16" + tail), Load(stem + "w8a8" + tail)};
      if (r.w4.is_object() && r.w8.is_object()) {
        rows.push_back(std::move(r));
      } else if (fs::exists(stem + "w4a16" + tail + ".absent") &&
                 std::find(absent.begin(), absent.end(), isa) == absent.end()) {
        absent.push_back(isa);
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
        &md, "| ", r.isa, " | ", r.threads, " | ", r.w4.value("cpu", std::string("not recorded")),
        " | ", F(Num(b, {"decode_tokens_per_s"}), 1), " | ", pays(Num(r.w4, {"decode_speedup"})),
        " | ", pays(Num(r.w8, {"decode_speedup"})), " | ", F(Num(b, {"prefill_tokens_per_s"}), 1),
        " | ", pays(Num(r.w8, {"prefill_speedup"})), " | ", pays(Num(r.w4, {"prefill_speedup"})),
        " | ", F(bw, 1), " | ", F(peak, 1), " | ", i8 > 0 ? F(i8, 1) : "–", " | ", F(peak / bw, 2),
        " |\n");
  }
  if (!absent.empty()) {
    absl::StrAppend(&md, "\nNot on the machines these ran on: ", absl::StrJoin(absent, ", "),
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
      "and `Q` the machine's int8 multiply-add peak over its FP32 FMA peak. Within one run this "
      "is the measured ratio by construction, so the fewest threads of each path give the "
      "efficiencies, and the other thread counts are predicted from them and their own run's "
      "`Q`:\n\n");
  struct Efficiency {
    double eta8 = NAN, eta32 = NAN, q = NAN;
  };
  auto efficiency = [](const Row& r) {
    const double i8 = Num(r.w8, {"int8_peak_gops"}), peak = Num(r.w8, {"fma_peak_gflops"});
    const double flops = Num(r.w8, {"prefill_flops_per_token"});
    Efficiency e;
    if (!(i8 > 0) || !(peak > 0)) return e;
    e.eta8 = Num(r.w8, {"prefill_tokens_per_s"}) * flops / (i8 * 1e9);
    e.eta32 = Num(r.w8, {"baseline", "prefill_tokens_per_s"}) * flops / (peak * 1e9);
    e.q = i8 / peak;
    return e;
  };
  for (const Row& r : rows) {
    const Efficiency e = efficiency(r);
    if (!(e.eta32 > 0)) {
      absl::StrAppend(&md, "- ", r.isa, ", ", r.threads,
                      " thread(s): no int8 peak measured on this path; W8A8 prefill ",
                      pays(Num(r.w8, {"prefill_speedup"})), "×.\n");
      continue;
    }
    const Row* fit = &r;  // the same path's fewest threads
    for (const Row& q : rows) {
      if (q.isa == r.isa && q.threads < fit->threads) fit = &q;
    }
    const Efficiency f = efficiency(*fit);
    std::string prediction;
    if (fit == &r) {
      prediction = absl::StrFormat("measured %.2f× (the fit)", Num(r.w8, {"prefill_speedup"}));
    } else if (f.eta32 > 0) {
      prediction = absl::StrFormat(
          "predicted %.2f× from the %d-thread η8 / η32 and this run's Q; measured %.2f×",
          f.eta8 / f.eta32 * e.q, fit->threads, Num(r.w8, {"prefill_speedup"}));
    } else {
      prediction = absl::StrFormat("measured %.2f×", Num(r.w8, {"prefill_speedup"}));
    }
    // An efficiency above 1 means the run's probe read a lower peak than
    // the pass then reached: the machine's speed moved within the run.
    const std::string moved =
        e.eta8 > 1 || e.eta32 > 1
            ? " (an η above 1: this run's peak probe read less than its pass then reached, so "
              "the machine's speed moved within the run and so does this prediction)"
            : "";
    absl::StrAppend(
        &md, absl::StrFormat("- %s, %d thread(s): η8 %.2f, η32 %.2f, Q %.2f: %s%s; the ceiling, "
                             "were the int8 GEMM as efficient as the FP32 one (η8 = η32): "
                             "%.2f×.\n",
                             r.isa, r.threads, e.eta8, e.eta32, e.q, prediction, moved, e.q));
  }
  const bool vnni = std::any_of(rows.begin(), rows.end(),
                                [](const Row& r) { return r.isa.rfind("avx512", 0) == 0; });
  absl::StrAppend(
      &md,
      "\nOn AVX2, `Q` counts `vpmaddubsw` alone (32 int8 multiply-adds per 256-bit instruction "
      "against 8 FP32 FMAs, so about 4 at equal issue rates), but its int16 sums must be widened "
      "by `vpmaddwd` and added by `vpaddd`, which is where `η8` goes. AVX-512 VNNI's "
      "`vpdpbusd` does all three in one instruction into int32, so on such a CPU `η8` moves "
      "toward `η32` and W8A8 prefill toward the ceiling `Q`; ",
      vnni ? "the avx512 rows above measure how far.\n\n"
           : "how far is for a run there to measure (no row here ran on VNNI).\n\n");
  return md;
}

}  // namespace pdq::report
