// Reading and checking a `pdq eval` config (harness/eval_config.h).
#include "harness/eval_config.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "harness/json_fields.h"
#include "harness/load_generator.h"

namespace pdq {

using json = nlohmann::json;
using json_fields::ReadFieldsOrError;

// The fields read by name (harness/json_fields.h); what needs more than a
// type check is checked in Parse*. Static: found by argument-dependent
// lookup, private to this file.
static void Fields(auto& f, EvalDeployment& v) {
  PDQ_JSON_EACH(baseline, split, split_sticky, kv_transport)
}

static void Fields(auto& f, EvalWorkload& v) {
  PDQ_JSON_EACH(requests_per_client, requests, warmup, ttft_target_ms, tpot_target_ms, input_tokens,
                output_tokens, until_flat)
}

static void Fields(auto& f, EvalStability& v) {
  PDQ_JSON_EACH(deployment, cycles, high, low, input_tokens, output_tokens, max_rss_growth_mib)
}

static void Fields(auto& f, EvalConversations& v) {
  PDQ_JSON_EACH(deployments, sessions, turns, first_tokens, turn_tokens, output_tokens)
}

static void Fields(auto& f, EvalAccuracy& v) {
  PDQ_JSON_EACH(texts, ctx, chunks, threads, drift_prompts, drift_prompt_count, drift_tokens,
                conversation, conversation_turn_tokens, code, code_max_tokens)
}

static void Fields(auto& f, EvalLowbit& v) {
  PDQ_JSON_EACH(isas, threads, prompt_tokens, gen_tokens, repetitions)
}

static void Fields(auto& f, EvalCluster& v) { PDQ_JSON_EACH(nodes, pairs, workloads, seeds) }
static void Fields(auto& f, EvalAim& v) { PDQ_JSON_EACH(deployment, goodput_ratio) }

static void Fields(auto& f, EvalConfig& v) {
  PDQ_JSON_EACH(model, text, cores, price_per_core_hour, kv_transport)
}

namespace {

absl::Status Invalid(const std::string& why) { return absl::InvalidArgumentError(why); }

// A weight precision the workers and pdq plan take. The list is the
// engine's (ParsePrecision in engine/linear.h), repeated here because the
// harness talks to workers as a client and links no engine: a misspelt name
// is refused when the config is read, not when a step reaches it an hour in.
absl::Status CheckPrecision(const std::string& name, const std::string& where) {
  if (name == "fp16" || name == "w8a8" || name == "w4a16") return absl::OkStatus();
  return Invalid(absl::StrCat(where, "'", name, "' is not a precision (fp16, w8a8 or w4a16)"));
}

// An object field: absent is fine, anything but an object is not.
absl::Status CheckObject(const json& j, const char* key) {
  if (j.contains(key) && !j[key].is_object()) {
    return Invalid(absl::StrCat("'", key, "' must be an object"));
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalDeployment> ParseDeployment(const json& d, std::set<std::string>& names) {
  if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("workers") ||
      !d["workers"].is_array() || d["workers"].empty()) {
    return Invalid(
        "each deployment needs a 'name' and a non-empty 'workers' array (as in deploy/local/)");
  }
  EvalDeployment e;
  e.name = d["name"];
  if (e.name.empty() || e.name.find_first_of("/ ") != std::string::npos ||
      !names.insert(e.name).second) {
    return Invalid(
        absl::StrCat("deployment names must be unique, without '/' or spaces: '", e.name, "'"));
  }
  for (const char* k : {"prefill_precision", "decode_precision"}) {
    if (!d.contains(k) || !d[k].is_string()) {
      return Invalid(absl::StrCat("deployment ", e.name, " needs '", k,
                                  "' (its precision pair, for accuracy)"));
    }
  }
  e.prefill_precision = d["prefill_precision"];
  e.decode_precision = d["decode_precision"];
  for (const std::string* p : {&e.prefill_precision, &e.decode_precision}) {
    PDQ_RETURN_IF_ERROR(CheckPrecision(*p, absl::StrCat("deployment ", e.name, ": ")));
  }
  e.workers = d["workers"];
  for (const json& w : e.workers) {
    if (!w.is_object() || (w.contains("pool") && !w["pool"].is_string())) {
      return Invalid(absl::StrCat("deployment ", e.name,
                                  ": each worker must be an object, its 'pool' a string"));
    }
  }
  const std::string where = absl::StrCat("deployment ", e.name, ": ");
  if (d.contains("split") && !d["split"].is_string()) {
    return Invalid(where + "'split' must be a string (POOL=WEIGHT,...)");
  }
  PDQ_RETURN_IF_ERROR(ReadFieldsOrError(d, e, where));
  if (!e.split.empty()) {
    // Each pool the split names needs a worker in it.
    for (absl::string_view arm : absl::StrSplit(e.split, ',')) {
      const std::string pool(arm.substr(0, arm.find('=')));
      bool found = false;
      for (const json& w : e.workers) found = found || w.value("pool", "") == pool;
      if (!found) {
        return Invalid(
            absl::StrCat(where, "the split names pool '", pool, "', which no worker is in"));
      }
    }
  }
  return e;
}

absl::StatusOr<std::vector<EvalWorkload>> ParseWorkloads(const json& c) {
  std::vector<EvalWorkload> out;
  PDQ_RETURN_IF_ERROR(CheckObject(c, "workloads"));
  const json workloads = c.value("workloads", json::object());
  for (const auto& [name, spec] : workloads.items()) {
    if (name != "chat" && name != "summarize" && name != "analysis") {
      return Invalid(absl::StrCat("workload '", name, "' is not chat, summarize or analysis"));
    }
    if (!spec.is_object() || !spec.contains("concurrency") || !spec["concurrency"].is_array() ||
        spec["concurrency"].empty()) {
      return Invalid(absl::StrCat("workload ", name, " needs a 'concurrency' array"));
    }
    EvalWorkload w;
    w.name = name;
    for (const json& l : spec["concurrency"]) {
      if (!l.is_number_integer() || l.get<int>() < 1) {
        return Invalid(absl::StrCat("workload ", name, ": concurrency levels are integers >= 1"));
      }
      w.concurrency.push_back(l.get<int>());
    }
    PDQ_RETURN_IF_ERROR(ReadFieldsOrError(spec, w, absl::StrCat("workload ", name, ": ")));
    // Given, a count is at least 1 (0 would mean "the default" here and
    // nothing to pdq bench).
    for (const char* k : {"requests_per_client", "requests", "input_tokens", "output_tokens"}) {
      if (spec.contains(k) && !(spec[k].is_number_integer() && spec[k].get<int64_t>() >= 1)) {
        return Invalid(absl::StrCat("workload ", name, ": ", k, " must be an integer >= 1"));
      }
    }
    if (w.until_flat != 0 && !UntilFlatExtends(w.concurrency, w.until_flat)) {
      const int top = *std::max_element(w.concurrency.begin(), w.concurrency.end());
      return Invalid(absl::StrCat("workload ", name, ": until_flat (", w.until_flat,
                                  ") doubles the top concurrency level: the levels must end at "
                                  "their highest and until_flat be at least twice it (",
                                  2 * top, "), or 0"));
    }
    out.push_back(std::move(w));
  }
  return out;
}

absl::Status ParseStudies(const json& c, const std::set<std::string>& names, EvalConfig& e) {
  for (const char* k :
       {"stability", "conversation_bench", "accuracy", "lowbit", "cluster", "aim"}) {
    PDQ_RETURN_IF_ERROR(CheckObject(c, k));
  }
  if (c.contains("stability")) {
    EvalStability& st = e.stability.emplace();
    PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c["stability"], st, "stability."));
    if (!names.count(st.deployment)) {
      return Invalid(
          absl::StrCat("stability.deployment '", st.deployment, "' is not one of the deployments"));
    }
  }
  if (c.contains("conversation_bench")) {
    EvalConversations& cb = e.conversations.emplace();
    PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c["conversation_bench"], cb, "conversation_bench."));
    for (const std::string& d : cb.deployments) {
      if (!names.count(d)) {
        return Invalid(absl::StrCat("conversation_bench.deployments: '", d,
                                    "' is not one of the deployments"));
      }
    }
  }
  e.accuracy.texts = {e.text};
  if (c.contains("accuracy")) {
    PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c["accuracy"], e.accuracy, "accuracy."));
  }
  if (c.contains("lowbit")) {
    EvalLowbit& lb = e.lowbit.emplace();
    bool ok = ReadFieldsOrError(c["lowbit"], lb, "").ok();
    for (const json& t : c["lowbit"].value("threads", json::array())) {
      ok = ok && t.is_number_integer() && t.get<int>() >= 1;
    }
    if (!ok) {
      return Invalid(
          "'lowbit' must be an object: {\"isas\": [\"scalar\", \"avx2\", ...], \"threads\": "
          "[1, 2], \"prompt_tokens\", \"gen_tokens\", \"repetitions\"}");
    }
  }
  if (c.contains("cluster")) {
    EvalCluster& cl = e.cluster.emplace();
    PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c["cluster"], cl, "cluster."));
    if (cl.nodes.empty() || cl.pairs.empty() || cl.seeds < 1) {
      return Invalid("cluster: nodes and pairs must not be empty, seeds at least 1");
    }
    for (int n : cl.nodes) {
      if (n < 2 || n > 4096)
        return Invalid(absl::StrCat("cluster.nodes: ", n, " is not in 2..4096"));
    }
    for (const std::string& p : cl.pairs) {
      const size_t slash = p.find('/');
      if (slash == std::string::npos || slash == 0 || slash + 1 == p.size() ||
          p.find('/', slash + 1) != std::string::npos) {
        return Invalid(absl::StrCat("cluster.pairs: '", p, "' is not PREFILL/DECODE"));
      }
      PDQ_RETURN_IF_ERROR(CheckPrecision(p.substr(0, slash), "cluster.pairs: "));
      PDQ_RETURN_IF_ERROR(CheckPrecision(p.substr(slash + 1), "cluster.pairs: "));
    }
    for (const std::string& w : cl.workloads) {
      bool known = false;
      for (const EvalWorkload& x : e.workloads) known = known || x.name == w;
      if (!known) {
        return Invalid(absl::StrCat("cluster.workloads: '", w, "' is not one of the workloads"));
      }
    }
    if (cl.workloads.empty()) {
      for (const EvalWorkload& x : e.workloads) cl.workloads.push_back(x.name);
    }
  }
  if (c.contains("aim")) PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c["aim"], e.aim.emplace(), "aim."));
  return absl::OkStatus();
}

}  // namespace

bool EvalConversations::Includes(const std::string& deployment) const {
  for (const std::string& d : deployments) {
    if (d == deployment) return true;
  }
  return false;
}

const EvalDeployment* EvalConfig::Deployment(const std::string& name) const {
  for (const EvalDeployment& d : deployments) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

absl::StatusOr<EvalConfig> ParseEvalConfig(const json& c) {
  if (!c.is_object()) return Invalid("the config must be a JSON object");
  if (!c.contains("deployments") || !c["deployments"].is_array() || c["deployments"].empty()) {
    return Invalid("the config needs a non-empty 'deployments' array");
  }
  EvalConfig e;
  e.source = c;
  e.cores = std::thread::hardware_concurrency();
  PDQ_RETURN_IF_ERROR(ReadFieldsOrError(c, e, ""));
  if (c.contains("notes")) {
    for (const json& n : c["notes"]) {
      if (n.is_string()) e.notes.push_back(n);
    }
  }
  std::set<std::string> names;
  for (const json& d : c["deployments"]) {
    PDQ_ASSIGN_OR_RETURN(EvalDeployment dep, ParseDeployment(d, names));
    e.deployments.push_back(std::move(dep));
  }
  PDQ_ASSIGN_OR_RETURN(e.workloads, ParseWorkloads(c));
  PDQ_RETURN_IF_ERROR(ParseStudies(c, names, e));
  return e;
}

absl::StatusOr<EvalConfig> ReadEvalConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the config '", path, "'"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(absl::StrCat(path, " is not JSON"));
  absl::StatusOr<EvalConfig> config = ParseEvalConfig(j);
  if (!config.ok()) return Invalid(absl::StrCat(path, ": ", config.status().message()));
  config->source_text = std::move(text);
  return config;
}

absl::Status WriteEvalConfigCopy(const EvalConfig& config, const std::string& path) {
  const std::string text =
      config.source_text.empty() ? config.source.dump(2) + "\n" : config.source_text;
  std::ifstream old(path, std::ios::binary);
  if (old) {
    std::string had((std::istreambuf_iterator<char>(old)), std::istreambuf_iterator<char>());
    if (had == text) return absl::OkStatus();  // the config read from this file
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pdq
