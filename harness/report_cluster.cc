// The report's cluster-scale section: goodput per core and cost per million
// output tokens against the P:D split at several node counts, projected by
// the simulator from a profile of the machine (`pdq plan --sim
// --cluster-nodes`, sim/plan.h SweepCluster).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "harness/report_internal.h"

namespace pdq::report {
namespace {

std::string PairOf(const json& p) {
  return absl::StrCat(p.value("prefill_precision", "?"), "/", p.value("decode_precision", "?"));
}

// "M" for monolithic, else the split reduced: 2P+6D is "1:3".
std::string SplitOf(const json& p) {
  const int x = p.value("prefill", 0), y = p.value("decode", 0);
  if (x == 0 && y == 0) return "M";
  const int g = std::gcd(x, y);
  return absl::StrCat(x / g, ":", y / g);
}

double ShareOf(const std::string& split) {
  if (split == "M") return -1;
  const size_t colon = split.find(':');
  const double x = std::stod(split.substr(0, colon)), y = std::stod(split.substr(colon + 1));
  return x / (x + y);
}

}  // namespace

std::string ClusterSection(const EvalConfig& config, const std::string& raw, Plotter& plot) {
  const EvalCluster& cl = *config.cluster;
  std::string md = "## At cluster scale (projected)\n\n";
  const json profile = Load(raw + "/cluster/profile.json");
  std::vector<std::pair<std::string, json>> runs;
  for (const std::string& w : cl.workloads) {
    json j = Load(absl::StrCat(raw, "/cluster/", w, ".json"));
    if (j.is_object() && j.contains("points")) runs.emplace_back(w, std::move(j));
  }
  if (!profile.is_object() || runs.empty()) {
    return md +
           "Not projected (`pdq eval` without `--skip-cluster` profiles the machine and "
           "projects it).\n\n";
  }
  const json& first = runs.front().second;
  const json machine = profile.value("machine", json::object());
  absl::StrAppend(
      &md,
      "**Every figure in this section is a projection, not a measurement**: the simulator "
      "(`pdq sim`: the workers' batching and the router's routing are pdq's own policy code, "
      "the passes timed by a fitted model) on a profile of ",
      machine.value("cpu", std::string("an unnamed CPU")), " (", machine.value("isa", "?"), ", ",
      machine.value("cores", 0), " cores, ",
      // (A profile from before the cache's type was recorded ran on fp16.)
      profile.value("model", json::object()).value("kv_dtype", std::string("fp16")),
      " KV cache; `raw/cluster/profile.json`, `pdq profile`), where ",
      "each node is one worker of ", first.value("cores_per_node", 0),
      " cores. For each workload at its targets above, each precision pair as n monolithic "
      "workers (M) and as prefill:decode splits of n nodes: the most requests a second it serves "
      "open loop (Poisson) with ",
      F(Num(first, {"attainment"}) * 100, 0),
      "% of requests within both targets, none refused, at steady state (", first.value("seeds", 0),
      " seeds; each rate found to within ", F(Num(first, {"tolerance"}) * 100, 0),
      "%), and there the goodput per core (the rate's output tokens a second times the share of "
      "requests within the targets, over the cores) and the cost of a million of those tokens "
      "at ",
      F(config.price_per_core_hour, 3),
      " per core-hour. The simulator was validated against served runs of up to 32 emulated "
      "workers on the chat workload (bench/RESULTS.md, \"Cluster simulator\"); 128 nodes is "
      "beyond what was validated.\n\n");

  for (const auto& [name, j] : runs) {
    absl::StrAppend(&md, "### `", name, "` (", j.value("prompt_tokens", 0), " tokens in, ",
                    j.value("output_tokens", 0), " out; TTFT ≤ ", F(Num(j, {"ttft_target_ms"}), 0),
                    " ms, TPOT ≤ ", F(Num(j, {"tpot_target_ms"}), 0), " ms)\n\n");
    // The command that projected it (its printed table: raw/cluster/NAME.txt).
    std::vector<std::string> pairs;
    for (const json& p : j["points"]) {
      if (std::find(pairs.begin(), pairs.end(), PairOf(p)) == pairs.end())
        pairs.push_back(PairOf(p));
    }
    absl::StrAppend(&md, "`pdq plan --sim raw/cluster/profile.json --workload ", name,
                    " --input-tokens ", j.value("prompt_tokens", 0), " --output-tokens ",
                    j.value("output_tokens", 0), " --ttft-target-ms ",
                    F(Num(j, {"ttft_target_ms"}), 0), " --tpot-target-ms ",
                    F(Num(j, {"tpot_target_ms"}), 0), " --cluster-nodes ",
                    absl::StrJoin(j.value("nodes", std::vector<int>{}), ","), " --pairs ",
                    absl::StrJoin(pairs, ","), " --seeds ", j.value("seeds", 0),
                    " --worker-hour-price ", absl::StrFormat("%g", Num(j, {"worker_hour_price"})),
                    "` (its output: `raw/cluster/", name, ".txt`).\n\n");
    // Columns: monolithic, then the splits by prefill share.
    std::vector<std::string> splits;
    for (const json& p : j["points"]) {
      const std::string s = SplitOf(p);
      if (std::find(splits.begin(), splits.end(), s) == splits.end()) splits.push_back(s);
    }
    std::sort(splits.begin(), splits.end(),
              [](const std::string& a, const std::string& b) { return ShareOf(a) < ShareOf(b); });
    absl::StrAppend(&md,
                    "Output tokens a second per core within the targets (– : none of the rates "
                    "tried met them), by P:D split:\n\n| pair | nodes |");
    for (const std::string& s : splits) absl::StrAppend(&md, " ", s == "M" ? "all M" : s, " |");
    absl::StrAppend(&md, " best | its requests/s | its cost / M tokens |\n| --- | ---: |");
    for (size_t i = 0; i < splits.size(); ++i) absl::StrAppend(&md, " ---: |");
    absl::StrAppend(&md, " --- | ---: | ---: |\n");
    // Rows: pair x nodes, in the order run.
    std::vector<std::pair<std::string, int>> rows;
    for (const json& p : j["points"]) {
      const std::pair<std::string, int> r{PairOf(p), p.value("nodes", 0)};
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
    }
    // Across pairs, by nodes: as `pdq plan` marked them.
    std::map<int, const json*> best_of_size;
    for (const json& p : j["points"]) {
      if (p.value("best_of_size", false)) best_of_size[p.value("nodes", 0)] = &p;
    }
    // The plot: a curve per row, against the prefill share (all M at 0).
    std::string data, xtics;
    std::vector<std::string> curves;
    std::vector<std::string> pair_order;
    std::vector<int> node_order;
    for (const auto& [pair, nodes] : rows) {
      if (std::find(pair_order.begin(), pair_order.end(), pair) == pair_order.end()) {
        pair_order.push_back(pair);
      }
      if (std::find(node_order.begin(), node_order.end(), nodes) == node_order.end()) {
        node_order.push_back(nodes);
      }
    }
    for (const std::string& sp : splits) {
      absl::StrAppend(&xtics, xtics.empty() ? "" : ", ", Quote(sp == "M" ? "all M" : sp), " ",
                      F(std::max(0.0, ShareOf(sp)), 4));
    }
    for (const auto& [pair, nodes] : rows) {
      absl::StrAppend(&md, "| ", pair, " | ", nodes, " |");
      std::string block;
      const json* best = nullptr;
      for (const std::string& s : splits) {
        const json* cell = nullptr;
        for (const json& p : j["points"]) {
          if (PairOf(p) == pair && p.value("nodes", 0) == nodes && SplitOf(p) == s) cell = &p;
        }
        const double v = cell != nullptr && Num(*cell, {"rate"}) > 0
                             ? Num(*cell, {"tokens_per_second_per_core"})
                             : NAN;
        absl::StrAppend(&md, " ", F(v, 1), " |");
        if (std::isfinite(v)) {
          // (A blank line after the monolithic point: not joined to the splits.)
          absl::StrAppend(&block, F(std::max(0.0, ShareOf(s)), 4), " ", v,
                          s == "M" ? "\n\n" : "\n");
        }
        if (std::isfinite(v) &&
            (best == nullptr || v > Num(*best, {"tokens_per_second_per_core"}))) {
          best = cell;
        }
      }
      if (!block.empty()) {
        const size_t pi =
            std::find(pair_order.begin(), pair_order.end(), pair) - pair_order.begin();
        const size_t ni =
            std::find(node_order.begin(), node_order.end(), nodes) - node_order.begin();
        absl::StrAppend(&data, data.empty() ? "" : "\n\n", block);
        curves.push_back(absl::StrCat("datafile index ", curves.size(),
                                      " using 1:2 with linespoints linecolor ", pi + 1,
                                      " dashtype ", ni + 1, " pointtype ", ni + 5, " title ",
                                      Quote(absl::StrCat(pair, ", ", nodes, " nodes"))));
      }
      if (best == nullptr) {
        absl::StrAppend(&md, " none | – | – |\n");
        continue;
      }
      absl::StrAppend(&md, " ", best->value("deployment", "?"), " | ", F(Num(*best, {"rate"}), 2),
                      " | ", F(Num(*best, {"cost_per_million_output_tokens"}), 3), " |\n");
    }
    if (!curves.empty()) {
      absl::StrAppend(
          &md, "\n",
          plot.Draw(
              absl::StrCat("cluster-", name), data,
              absl::StrCat(
                  "set title 'Projected: ", name,
                  " output tokens/s per core within the targets, by P:D split'\n"
                  "set xlabel 'prefill : decode nodes (all M: every node monolithic, not joined)'\n"
                  "set ylabel 'tokens/s per core'\nset yrange [0:*]\n"
                  "set offsets graph 0.03, graph 0.03, graph 0.06, 0\n"  // points off the frame
                  "set xtics (",
                  xtics, ")\nplot ", absl::StrJoin(curves, ", "), "\n"),
              absl::StrCat("projected goodput per core of ", name, " by P:D split")),
          "\n");
    }
    absl::StrAppend(&md, "\nRecommended (the most goodput per core, so the lowest cost):");
    for (const auto& [nodes, b] : best_of_size) {
      // Against the best of the FP16 pair at that size.
      double fp16 = NAN;
      for (const json& p : j["points"]) {
        if (PairOf(p) == "fp16/fp16" && p.value("nodes", 0) == nodes && Num(p, {"rate"}) > 0) {
          fp16 = std::isfinite(fp16) ? std::max(fp16, Num(p, {"tokens_per_second_per_core"}))
                                     : Num(p, {"tokens_per_second_per_core"});
        }
      }
      absl::StrAppend(&md, absl::StrFormat(" at %d nodes **%s %s**, %s tokens/s per core", nodes,
                                           b->value("deployment", "?"), PairOf(*b),
                                           F(Num(*b, {"tokens_per_second_per_core"}), 1)));
      // A split at either end of those tried may not be the best there is.
      const std::string split = SplitOf(*b);
      if (split != "M" && splits.size() > 2 && (split == splits[1] || split == splits.back())) {
        absl::StrAppend(&md, ", the edge of the splits tried");
      }
      if (std::isfinite(fp16) && PairOf(*b) != "fp16/fp16") {
        absl::StrAppend(&md, absl::StrFormat(" (%.2f× FP16's best)",
                                             Num(*b, {"tokens_per_second_per_core"}) / fp16));
      }
      absl::StrAppend(&md, ";");
    }
    md.back() = '.';
    absl::StrAppend(&md, "\n\n");
  }
  return md;
}

}  // namespace pdq::report
