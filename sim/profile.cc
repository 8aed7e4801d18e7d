#include "sim/profile.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/check.h"
#include "nlohmann/json.hpp"
#include "policy/traffic_split.h"

namespace pdq::sim {

using nlohmann::json;

absl::StatusOr<PassProfile> Profile::Pass(const std::string& precision, int threads) const {
  const PassProfile* best = nullptr;
  for (const PassProfile& p : passes) {
    if (p.precision != precision) continue;
    if (threads > 0 ? p.threads == threads : (best == nullptr || p.threads > best->threads)) {
      best = &p;
    }
  }
  if (best == nullptr) {
    std::string have;
    for (const PassProfile& p : passes) absl::StrAppend(&have, " ", p.precision, "@", p.threads);
    return absl::NotFoundError(
        absl::StrCat("the profile has no ", precision, " pass",
                     threads > 0 ? absl::StrCat(" at ", threads, " threads") : "",
                     "; it has:", have.empty() ? " none" : have));
  }
  return *best;
}

absl::StatusOr<LinkProfile> Profile::Link(const std::string& transport) const {
  for (const LinkProfile& l : links) {
    if (l.transport == transport) return l;
  }
  return absl::NotFoundError(absl::StrCat("the profile has no ", transport, " link"));
}

absl::StatusOr<SplitProfile> Profile::Split(const std::string& prefill_precision,
                                            const std::string& decode_precision,
                                            int threads) const {
  const SplitProfile* best = nullptr;
  for (const SplitProfile& s : splits) {
    if (s.prefill_precision != prefill_precision || s.decode_precision != decode_precision) {
      continue;
    }
    if (threads > 0 ? s.threads == threads : (best == nullptr || s.threads > best->threads)) {
      best = &s;
    }
  }
  if (best == nullptr) {
    std::string have;
    for (const SplitProfile& s : splits) {
      absl::StrAppend(&have, " ", s.prefill_precision, "/", s.decode_precision, "@", s.threads);
    }
    return absl::NotFoundError(absl::StrCat(
        "the profile has no split probe of ", prefill_precision, " prefill beside ",
        decode_precision, " decode", threads > 0 ? absl::StrCat(" at ", threads, " threads") : "",
        " (it has:", have.empty() ? " none" : have,
        "); measure one with pdq profile --split-pairs ", prefill_precision, "/", decode_precision,
        " --thread-counts ", threads > 0 ? threads : 1));
  }
  return *best;
}

absl::Status ParseDeployment(const std::string& text, Deployment* d) {
  d->monolithic = d->prefill = d->decode = 0;
  for (absl::string_view part : absl::StrSplit(text, '+')) {
    int n = 0;
    if (part.size() < 2 || !absl::SimpleAtoi(part.substr(0, part.size() - 1), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "deployment: '", part, "' is not a count and a role (P, D or M), as in 1P+2D or 4M"));
    }
    switch (part.back()) {
      case 'P':
        d->prefill += n;
        break;
      case 'D':
        d->decode += n;
        break;
      case 'M':
        d->monolithic += n;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("deployment: '", part, "' ends in neither P, D nor M"));
    }
  }
  return absl::OkStatus();
}

namespace {

// t with its attention times `pair` and the rest times f.
PassTime Scaled(const PassTime& t, double f, double pair) {
  PassTime served = {
      t.fixed * f, t.per_row * f, t.per_token * f, t.per_pair * pair, t.per_decode_pair * pair,
      t.row_steps};
  for (auto& [rows, seconds] : served.row_steps) seconds *= f;
  return served;
}

// A pass's time as the simulated worker takes it: served (times the
// profile's served_factor, where measured) unless the options say alone.
PassTime Served(const PassProfile& pass, const WorkerOptions& o) {
  if (o.idle_passes) return pass.time;
  const double f = pass.served_factor > 0 ? pass.served_factor : 1;
  PassTime t = Scaled(pass.time, f, pass.served_pair_factor > 0 ? pass.served_pair_factor : f);
  if (pass.served_prompt_factor > 0) {
    t.per_token = pass.time.per_token * pass.served_prompt_factor;
    t.per_pair = pass.time.per_pair * pass.served_prompt_factor;
  }
  return t;
}

absl::Status Spec(const Profile& p, const std::string& precision,
                  const std::string& prompt_precision, const WorkerOptions& o, WorkerSpec* w) {
  absl::StatusOr<PassProfile> pass = p.Pass(precision, o.threads);
  if (!pass.ok()) return pass.status();
  w->pass = Served(*pass, o);
  w->fused = true;
  w->step_overhead = o.idle_passes ? 0 : pass->step_overhead;
  w->step_overhead_per_row = o.idle_passes ? 0 : pass->step_overhead_per_row;
  w->stream_finish_seconds = o.idle_passes ? 0 : pass->stream_finish_seconds;
  // Over the served factors' fit: nothing without them (as the file keeps them).
  w->neighbour_idle.reset();  // SpecsFromProfile sets it where workers are co-located
  w->row_factors = o.idle_passes || !(pass->served_factor > 0)
                       ? std::vector<std::pair<double, double>>{}
                       : pass->served_row_factors;
  if (!prompt_precision.empty() && prompt_precision != precision) {
    absl::StatusOr<PassProfile> prompt = p.Pass(prompt_precision, o.threads);
    if (!prompt.ok()) return prompt.status();
    w->prompt_pass = Served(*prompt, o);
    w->fused = false;
  }
  w->batch.max_decode_batch = o.max_decode_batch;
  w->batch.token_budget = o.token_budget;
  w->batch.tpot_target = o.step_target_seconds;
  w->batch.prompt_share = o.step_target_seconds > 0 ? 0 : o.prompt_share;
  w->calibrate = o.step_target_seconds > 0 || o.prompt_share > 0;
  w->batch.block_tokens = p.block_tokens;
  w->kv_blocks = o.kv_blocks;
  w->max_context = p.max_context;
  w->noise = o.noise;
  return absl::OkStatus();
}

}  // namespace

absl::Status SpecsFromProfile(const Profile& p, const Precisions& precisions,
                              const WorkerOptions& o, Deployment* d) {
  if (d->monolithic > 0) {
    if (absl::Status s =
            Spec(p, precisions.monolithic, precisions.monolithic_prompt, o, &d->monolithic_worker);
        !s.ok()) {
      return s;
    }
  }
  d->co_located = false;
  if (d->prefill > 0 || d->decode > 0) {
    if (absl::Status s = Spec(p, precisions.prefill, "", o, &d->prefill_worker); !s.ok()) return s;
    if (absl::Status s = Spec(p, precisions.decode, "", o, &d->decode_worker); !s.ok()) return s;
    if (o.co_located && !o.idle_passes) {
      absl::StatusOr<SplitProfile> split = CoLocatedSplit(p, precisions, o);
      if (!split.ok()) return split.status();
      // The decode worker's steps while the prefill worker runs or starts
      // none: as the one-worker served probe measured them (Spec's); the
      // split probe's factors while it does. The prefill worker keeps the
      // split probe's on every pass: given the one-worker factors while the
      // decode worker was idle too, it lost latency cells net post hoc
      // (bench/RESULTS.md, "A co-located decode worker beside an idle
      // prefill worker").
      const WorkerSpec& w = d->decode_worker;
      d->decode_worker.neighbour_idle =
          WorkerSpec::Steps{w.pass, w.step_overhead, w.step_overhead_per_row, w.row_factors};
      d->co_located = true;
      // Spec found both passes.
      const PassProfile prefill = *p.Pass(precisions.prefill, o.threads);
      const PassProfile decode = *p.Pass(precisions.decode, o.threads);
      d->prefill_worker.pass = Scaled(prefill.time, split->prefill_factor, split->prefill_factor);
      d->decode_worker.pass = Scaled(decode.time, split->decode_factor, split->decode_pair_factor);
      d->decode_worker.step_overhead = split->decode_step_overhead;
      d->decode_worker.step_overhead_per_row = split->decode_step_overhead_per_row;
      d->decode_worker.row_factors.clear();  // the split's factors are fitted on its own levels
    }
    absl::StatusOr<LinkProfile> link = p.Link(o.transport);
    if (!link.ok()) return link.status();
    d->link = link->link;
  }
  d->kv_bytes_per_token = p.kv_bytes_per_token;
  d->num_layers = p.num_layers;
  d->router_seconds = p.router_seconds;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Precisions>> ArmsFromProfile(const Profile& p, const std::string& split,
                                                        const std::string& arms,
                                                        const WorkerOptions& o, Deployment* d) {
  absl::StatusOr<policy::TrafficSplit> pools = policy::TrafficSplit::Parse(split);
  if (!pools.ok()) return pools.status();
  if (pools->empty()) return absl::InvalidArgumentError("--split: no pools given");
  // POOL -> DEPLOYMENT:PREFILL/DECODE
  std::map<std::string, std::string> given;
  for (absl::string_view part : absl::StrSplit(arms, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--arms: '", part, "' is not POOL=DEPLOYMENT:PREFILL/DECODE (e.g. fp16=1M:fp16)"));
    }
    const std::string pool(absl::StripAsciiWhitespace(part.substr(0, eq)));
    if (!given.emplace(pool, std::string(part.substr(eq + 1))).second) {
      return absl::InvalidArgumentError(absl::StrCat("--arms: pool '", pool, "' is named twice"));
    }
  }
  std::vector<Precisions> out;
  d->arms.clear();
  for (const policy::TrafficSplit::Arm& s : pools->arms()) {
    auto it = given.find(s.pool);
    if (it == given.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--arms: pool '", s.pool,
                                                     "' of --split has no workers (", s.pool,
                                                     "=DEPLOYMENT:PREFILL/DECODE)"));
    }
    auto error = [&s](const absl::Status& e) {
      return absl::Status(e.code(), absl::StrCat("--arms: pool '", s.pool, "': ", e.message()));
    };
    const std::vector<std::string> fields = absl::StrSplit(it->second, ':');
    const std::vector<std::string> pair =
        fields.size() == 2 ? absl::StrSplit(fields[1], '/') : std::vector<std::string>{};
    if (fields.size() != 2 || pair.empty() || pair.size() > 2 || pair[0].empty() ||
        pair.back().empty()) {
      return error(absl::InvalidArgumentError(absl::StrCat(
          "'", it->second, "' is not DEPLOYMENT:PREFILL/DECODE (e.g. 1M:w8a8/w4a16, 1P+1D:fp16)")));
    }
    given.erase(it);
    Deployment one;
    if (absl::Status e = ParseDeployment(fields[0], &one); !e.ok()) return error(e);
    Precisions precisions;
    precisions.prefill = pair[0];
    precisions.decode = precisions.monolithic = pair.back();
    if (precisions.prefill != precisions.decode) precisions.monolithic_prompt = precisions.prefill;
    if (absl::Status e = SpecsFromProfile(p, precisions, o, &one); !e.ok()) return error(e);
    Arm arm;
    static_cast<Workers&>(arm) = one;
    arm.pool = s.pool;
    arm.weight = s.weight;
    d->arms.push_back(std::move(arm));
    if (one.prefill > 0) d->link = one.link;
    d->kv_bytes_per_token = one.kv_bytes_per_token;
    d->num_layers = one.num_layers;
    d->router_seconds = one.router_seconds;
    out.push_back(precisions);
  }
  if (!given.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arms: pool '", given.begin()->first, "' is not in --split"));
  }
  d->monolithic = d->prefill = d->decode = 0;
  return out;
}

absl::StatusOr<SplitProfile> CoLocatedSplit(const Profile& p, const Precisions& precisions,
                                            const WorkerOptions& o) {
  absl::StatusOr<PassProfile> prefill = p.Pass(precisions.prefill, o.threads);
  if (!prefill.ok()) return prefill.status();
  return p.Split(precisions.prefill, precisions.decode, prefill->threads);
}

absl::StatusOr<double> PodStartSeconds(const Profile& p, const Precisions& precisions,
                                       const WorkerOptions& o, const Deployment& d) {
  // (model, prompt model, whether it prefills) of each pool.
  std::vector<std::tuple<std::string, std::string, bool>> pools;
  if (d.monolithic > 0)
    pools.push_back({precisions.monolithic, precisions.monolithic_prompt, true});
  if (d.prefill > 0) pools.push_back({precisions.prefill, "", true});
  if (d.decode > 0) pools.push_back({precisions.decode, "", false});
  double slowest = 0;
  for (const auto& [precision, prompt_precision, prefills] : pools) {
    absl::StatusOr<PassProfile> pass = p.Pass(precision, o.threads);
    if (!pass.ok()) return pass.status();
    PassProfile prompt = *pass;
    double seconds = pass->load_seconds;
    if (!prompt_precision.empty() && prompt_precision != precision) {
      absl::StatusOr<PassProfile> second = p.Pass(prompt_precision, o.threads);
      if (!second.ok()) return second.status();
      if (second->load_seconds <= 0) seconds = 0;
      seconds += second->load_seconds;
      prompt = *second;
    }
    if (seconds <= 0) {
      return absl::NotFoundError(
          absl::StrCat("the profile has no load time for ", precision,
                       " (made before pdq profile measured it): give the pod start time"));
    }
    if (prefills) {
      for (int64_t tokens : {16, 128}) {
        policy::StepWork w;
        w.AddChunk(0, tokens);
        seconds += prompt.time.Seconds(w);
      }
    }
    slowest = std::max(slowest, seconds);
  }
  return slowest;
}

namespace {

json PromptLevelsJson(const std::vector<PromptLevel>& levels) {
  json a = json::array();
  for (const PromptLevel& l : levels) {
    a.push_back({{"clients", l.clients},
                 {"prompt_tokens", l.prompt_tokens},
                 {"passes", l.passes},
                 {"tokens_per_pass", l.tokens_per_pass},
                 {"pass_seconds", l.pass_seconds},
                 {"model_seconds", l.model_seconds}});
  }
  return a;
}

json ServedLevelsJson(const std::vector<ServedLevel>& levels) {
  json a = json::array();
  for (const ServedLevel& l : levels) {
    a.push_back({{"clients", l.clients},
                 {"prompt_tokens", l.prompt_tokens},
                 {"output_tokens", l.output_tokens},
                 {"model_pair_seconds", l.model_pair_seconds},
                 {"steps", l.steps},
                 {"rows_per_step", l.rows_per_step},
                 {"prompt_tokens_per_step", l.prompt_tokens_per_step},
                 {"step_seconds", l.step_seconds},
                 {"model_seconds", l.model_seconds}});
    if (l.overhead_seconds >= 0) a.back()["overhead_seconds"] = l.overhead_seconds;
    if (l.finish_seconds >= 0) {
      a.back()["streams_finished"] = l.streams_finished;
      a.back()["finish_seconds"] = l.finish_seconds;
    }
  }
  return a;
}

}  // namespace

std::string ProfileToJson(const Profile& p) {
  json j;
  j["pdq_profile"] = p.version;
  j["machine"] = {{"cpu", p.cpu}, {"isa", p.isa}, {"cores", p.cores}, {"hostname", p.hostname}};
  j["model"] = {{"path", p.model_path},
                {"num_layers", p.num_layers},
                {"kv_bytes_per_token", p.kv_bytes_per_token},
                {"block_tokens", p.block_tokens},
                {"max_context", p.max_context},
                {"kv_dtype", p.kv_dtype}};
  j["passes"] = json::array();
  for (const PassProfile& s : p.passes) {
    j["passes"].push_back({{"precision", s.precision},
                           {"threads", s.threads},
                           {"fixed", s.time.fixed},
                           {"per_row", s.time.per_row},
                           {"per_token", s.time.per_token},
                           {"per_pair", s.time.per_pair},
                           {"per_decode_pair", s.time.per_decode_pair},
                           {"points", s.points},
                           {"held_out", s.held_out},
                           {"held_out_median_error", s.held_out_median_error},
                           {"held_out_max_error", s.held_out_max_error},
                           {"load_seconds", s.load_seconds},
                           {"samples", json::array()}});
    for (const PassSample& x : s.samples) {
      j["passes"].back()["samples"].push_back({{"rows", x.rows},
                                               {"tokens", x.tokens},
                                               {"pairs", x.pairs},
                                               {"seconds", x.seconds},
                                               {"held_out", x.held_out}});
      if (x.decode_pairs >= 0)
        j["passes"].back()["samples"].back()["decode_pairs"] = x.decode_pairs;
    }
    if (!s.time.row_steps.empty()) {
      json& steps = j["passes"].back()["row_steps"] = json::array();
      for (const auto& [rows, seconds] : s.time.row_steps) steps.push_back({rows, seconds});
    }
    if (s.served_factor > 0) {
      json& e = j["passes"].back();
      e["served_factor"] = s.served_factor;
      if (s.served_pair_factor > 0) e["served_pair_factor"] = s.served_pair_factor;
      if (s.step_overhead > 0 || s.step_overhead_per_row > 0) {
        e["step_overhead"] = s.step_overhead;
        e["step_overhead_per_row"] = s.step_overhead_per_row;
      }
      e["served"] = ServedLevelsJson(s.served);
      if (!s.served_row_factors.empty()) {
        json& rows = e["served_row_factors"] = json::array();
        for (const auto& [n, f] : s.served_row_factors) rows.push_back({n, f});
      }
    }
    if (s.stream_finish_seconds > 0) {
      j["passes"].back()["stream_finish_seconds"] = s.stream_finish_seconds;
    }
    if (s.served_prompt_factor > 0) {
      json& e = j["passes"].back();
      e["served_prompt_factor"] = s.served_prompt_factor;
      e["served_prompts"] = PromptLevelsJson(s.served_prompts);
    }
  }
  if (!p.splits.empty()) {
    j["splits"] = json::array();
    for (const SplitProfile& s : p.splits) {
      json e = {{"prefill_precision", s.prefill_precision},
                {"decode_precision", s.decode_precision},
                {"threads", s.threads},
                {"prefill_factor", s.prefill_factor},
                {"decode_factor", s.decode_factor},
                {"decode_pair_factor", s.decode_pair_factor},
                {"decode_step_overhead", s.decode_step_overhead},
                {"decode_step_overhead_per_row", s.decode_step_overhead_per_row},
                {"prefill_levels", PromptLevelsJson(s.prefill_levels)},
                {"decode_levels", ServedLevelsJson(s.decode_levels)}};
      j["splits"].push_back(e);
    }
  }
  j["links"] = json::array();
  for (const LinkProfile& l : p.links) {
    j["links"].push_back({{"transport", l.transport},
                          {"bytes_per_second", l.link.bytes_per_second},
                          {"latency_seconds", l.link.latency_seconds}});
  }
  j["router_seconds"] = p.router_seconds;
  return j.dump(2) + "\n";
}

namespace {

// Reads j[key] into *out; an error names the path.
template <class T>
absl::Status Get(const json& j, const std::string& path, const char* key, T* out) {
  if (!j.is_object() || !j.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", path, ".", key, " is missing"));
  }
  const json& v = j.at(key);
  constexpr bool kText = std::is_same_v<T, std::string>, kBool = std::is_same_v<T, bool>,
                 kInt = std::is_integral_v<T> && !kBool;
  const bool ok = kText   ? v.is_string()
                  : kBool ? v.is_boolean()
                  : kInt  ? v.is_number_integer()
                          : v.is_number();
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", path, ".", key, " must be ",
                                                   kText   ? "a string"
                                                   : kBool ? "true or false"
                                                   : kInt  ? "an integer"
                                                           : "a number"));
  }
  *out = v.get<T>();
  return absl::OkStatus();
}

// j[key] as an array, empty where it is missing; an error names the path.
absl::Status GetArray(const json& j, const std::string& path, const char* key, json* out) {
  *out = json::array();
  if (!j.is_object() || !j.contains(key)) return absl::OkStatus();
  if (!j.at(key).is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: ", path, path.empty() ? "" : ".", key, " must be an array"));
  }
  *out = j.at(key);
  return absl::OkStatus();
}

#define PDQ_GET(j, path, key, out) \
  if (absl::Status s_ = Get(j, path, key, out); !s_.ok()) return s_
// A field profiles from before it was recorded lack: *out keeps its value
// where it is missing.
#define PDQ_GET_OPTIONAL(j, path, key, out) \
  if (j.contains(key)) PDQ_GET(j, path, key, out)
#define PDQ_GET_ARRAY(j, path, key, out) \
  if (absl::Status s_ = GetArray(j, path, key, out); !s_.ok()) return s_

// j[key]'s [x, y] number pairs, `what` naming them in the error (none
// where it is missing).
absl::Status ReadPairs(const json& j, const std::string& path, const char* key, const char* what,
                       std::vector<std::pair<double, double>>* out) {
  json pairs;
  PDQ_GET_ARRAY(j, path, key, &pairs);
  for (const json& x : pairs) {
    if (!x.is_array() || x.size() != 2 || !x[0].is_number() || !x[1].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".", key, " must be ", what, " pairs"));
    }
    out->push_back({x[0].get<double>(), x[1].get<double>()});
  }
  return absl::OkStatus();
}

// j[key]'s prompt levels (none where it is missing).
absl::Status ReadPromptLevels(const json& j, const std::string& path, const char* key,
                              std::vector<PromptLevel>* out) {
  json levels;
  PDQ_GET_ARRAY(j, path, key, &levels);
  for (size_t k = 0; k < levels.size(); ++k) {
    const std::string at = absl::StrCat(path, ".", key, "[", k, "]");
    PromptLevel l;
    PDQ_GET(levels[k], at, "clients", &l.clients);
    PDQ_GET(levels[k], at, "prompt_tokens", &l.prompt_tokens);
    PDQ_GET(levels[k], at, "passes", &l.passes);
    PDQ_GET(levels[k], at, "tokens_per_pass", &l.tokens_per_pass);
    PDQ_GET(levels[k], at, "pass_seconds", &l.pass_seconds);
    PDQ_GET(levels[k], at, "model_seconds", &l.model_seconds);
    if (l.passes < 1 || !(l.tokens_per_pass > 0) || !(l.pass_seconds > 0) ||
        !(l.model_seconds > 0) || !std::isfinite(l.pass_seconds + l.model_seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: ", at,
          ": passes must be >= 1 and tokens_per_pass, pass_seconds and model_seconds finite and "
          "> 0"));
    }
    out->push_back(l);
  }
  return absl::OkStatus();
}

// j[key]'s served levels (none where it is missing).
absl::Status ReadServedLevels(const json& j, const std::string& path, const char* key,
                              std::vector<ServedLevel>* out) {
  json served;
  PDQ_GET_ARRAY(j, path, key, &served);
  for (size_t k = 0; k < served.size(); ++k) {
    const std::string at = absl::StrCat(path, ".", key, "[", k, "]");
    ServedLevel l;
    PDQ_GET(served[k], at, "clients", &l.clients);
    PDQ_GET(served[k], at, "steps", &l.steps);
    PDQ_GET(served[k], at, "rows_per_step", &l.rows_per_step);
    PDQ_GET(served[k], at, "prompt_tokens_per_step", &l.prompt_tokens_per_step);
    PDQ_GET(served[k], at, "step_seconds", &l.step_seconds);
    PDQ_GET(served[k], at, "model_seconds", &l.model_seconds);
    // Recorded since the probe ran two request shapes.
    PDQ_GET_OPTIONAL(served[k], at, "prompt_tokens", &l.prompt_tokens);
    PDQ_GET_OPTIONAL(served[k], at, "output_tokens", &l.output_tokens);
    PDQ_GET_OPTIONAL(served[k], at, "model_pair_seconds", &l.model_pair_seconds);
    PDQ_GET_OPTIONAL(served[k], at, "overhead_seconds", &l.overhead_seconds);
    PDQ_GET_OPTIONAL(served[k], at, "streams_finished", &l.streams_finished);
    PDQ_GET_OPTIONAL(served[k], at, "finish_seconds", &l.finish_seconds);
    out->push_back(l);
  }
  return absl::OkStatus();
}

// One entry of "splits".
absl::Status ReadSplit(const json& e, const std::string& path, SplitProfile* s) {
  PDQ_GET(e, path, "prefill_precision", &s->prefill_precision);
  PDQ_GET(e, path, "decode_precision", &s->decode_precision);
  PDQ_GET(e, path, "threads", &s->threads);
  PDQ_GET(e, path, "prefill_factor", &s->prefill_factor);
  PDQ_GET(e, path, "decode_factor", &s->decode_factor);
  PDQ_GET(e, path, "decode_pair_factor", &s->decode_pair_factor);
  PDQ_GET(e, path, "decode_step_overhead", &s->decode_step_overhead);
  PDQ_GET(e, path, "decode_step_overhead_per_row", &s->decode_step_overhead_per_row);
  if (!(s->threads >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", path, ".threads must be >= 1"));
  }
  if (!(s->prefill_factor > 0) || !(s->decode_factor > 0) || !(s->decode_pair_factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: ", path, ".prefill_factor, .decode_factor and .decode_pair_factor must be > 0"));
  }
  if (!(s->decode_step_overhead >= 0) || !(s->decode_step_overhead_per_row >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: ", path, ".decode_step_overhead and .decode_step_overhead_per_row must be >= 0"));
  }
  PDQ_RETURN_IF_ERROR(ReadPromptLevels(e, path, "prefill_levels", &s->prefill_levels));
  return ReadServedLevels(e, path, "decode_levels", &s->decode_levels);
}

}  // namespace

absl::StatusOr<Profile> ProfileFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("profile: not a JSON object");
  }
  Profile p;
  PDQ_GET(j, "", "pdq_profile", &p.version);
  if (p.version < 1 || p.version > kProfileVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: version ", p.version, " is not one this pdq reads (1..", kProfileVersion, ")"));
  }
  const json& m = j.value("machine", json::object());
  PDQ_GET(m, "machine", "cpu", &p.cpu);
  PDQ_GET(m, "machine", "isa", &p.isa);
  PDQ_GET(m, "machine", "cores", &p.cores);
  PDQ_GET(m, "machine", "hostname", &p.hostname);
  const json& model = j.value("model", json::object());
  PDQ_GET(model, "model", "path", &p.model_path);
  PDQ_GET(model, "model", "num_layers", &p.num_layers);
  PDQ_GET(model, "model", "kv_bytes_per_token", &p.kv_bytes_per_token);
  PDQ_GET(model, "model", "block_tokens", &p.block_tokens);
  PDQ_GET(model, "model", "max_context", &p.max_context);
  if (model.contains("kv_dtype")) {
    PDQ_GET(model, "model", "kv_dtype", &p.kv_dtype);
    if (p.kv_dtype != "fp16" && p.kv_dtype != "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: model.kv_dtype is '", p.kv_dtype, "', not fp16 or bf16"));
    }
  }
  if (!j.contains("passes") || !j["passes"].is_array() || j["passes"].empty()) {
    return absl::InvalidArgumentError("profile: passes must be a non-empty array");
  }
  for (size_t i = 0; i < j["passes"].size(); ++i) {
    const json& e = j["passes"][i];
    const std::string path = absl::StrCat("passes[", i, "]");
    PassProfile s;
    PDQ_GET(e, path, "precision", &s.precision);
    PDQ_GET(e, path, "threads", &s.threads);
    PDQ_GET(e, path, "fixed", &s.time.fixed);
    PDQ_GET(e, path, "per_row", &s.time.per_row);
    PDQ_GET(e, path, "per_token", &s.time.per_token);
    PDQ_GET(e, path, "per_pair", &s.time.per_pair);
    // Priced apart since 2026-12; before, one price fitted for both.
    s.time.per_decode_pair = s.time.per_pair;
    PDQ_GET_OPTIONAL(e, path, "per_decode_pair", &s.time.per_decode_pair);
    PDQ_GET(e, path, "points", &s.points);
    PDQ_GET(e, path, "held_out", &s.held_out);
    PDQ_GET(e, path, "held_out_median_error", &s.held_out_median_error);
    PDQ_GET(e, path, "held_out_max_error", &s.held_out_max_error);
    PDQ_GET_OPTIONAL(e, path, "load_seconds", &s.load_seconds);
    if (!(s.load_seconds >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".load_seconds must be >= 0"));
    }
    // Recorded since pdq profile measured where passes leave the line.
    PDQ_RETURN_IF_ERROR(ReadPairs(e, path, "row_steps", "[rows, seconds]", &s.time.row_steps));
    if (!s.time.RowStepsValid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".", PassTime::kRowStepsRule));
    }
    json samples;
    PDQ_GET_ARRAY(e, path, "samples", &samples);
    for (size_t k = 0; k < samples.size(); ++k) {
      const std::string at = absl::StrCat(path, ".samples[", k, "]");
      PassSample x;
      PDQ_GET(samples[k], at, "rows", &x.rows);
      PDQ_GET(samples[k], at, "tokens", &x.tokens);
      PDQ_GET(samples[k], at, "pairs", &x.pairs);
      PDQ_GET_OPTIONAL(samples[k], at, "decode_pairs", &x.decode_pairs);
      PDQ_GET(samples[k], at, "seconds", &x.seconds);
      PDQ_GET_OPTIONAL(samples[k], at, "held_out", &x.held_out);
      s.samples.push_back(x);
    }
    if (e.contains("served_factor")) {
      PDQ_GET(e, path, "served_factor", &s.served_factor);
      if (!(s.served_factor > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("profile: ", path, ".served_factor must be > 0"));
      }
    }
    if (e.contains("served_pair_factor")) {
      PDQ_GET(e, path, "served_pair_factor", &s.served_pair_factor);
      if (!(s.served_pair_factor > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("profile: ", path, ".served_pair_factor must be > 0"));
      }
    }
    // Fitted since 2026-12-07 (FitServed's row factors).
    PDQ_RETURN_IF_ERROR(
        ReadPairs(e, path, "served_row_factors", "[rows, factor]", &s.served_row_factors));
    if (!RowFactorsValidFor(s.served_row_factors)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".served_", WorkerSpec::kRowFactorsRule));
    }
    // Measured since the probe read the stepping loop's time.
    PDQ_GET_OPTIONAL(e, path, "step_overhead", &s.step_overhead);
    PDQ_GET_OPTIONAL(e, path, "step_overhead_per_row", &s.step_overhead_per_row);
    if (!(s.step_overhead >= 0) || !(s.step_overhead_per_row >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: ", path, ".step_overhead and .step_overhead_per_row must be >= 0"));
    }
    PDQ_GET_OPTIONAL(e, path, "stream_finish_seconds", &s.stream_finish_seconds);
    if (!(s.stream_finish_seconds >= 0) || !std::isfinite(s.stream_finish_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".stream_finish_seconds must be >= 0"));
    }
    PDQ_RETURN_IF_ERROR(ReadServedLevels(e, path, "served", &s.served));
    // Measured since the served probe read its prompt passes.
    PDQ_GET_OPTIONAL(e, path, "served_prompt_factor", &s.served_prompt_factor);
    if (!(s.served_prompt_factor >= 0) || !std::isfinite(s.served_prompt_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".served_prompt_factor must be >= 0 (0: not measured)"));
    }
    PDQ_RETURN_IF_ERROR(ReadPromptLevels(e, path, "served_prompts", &s.served_prompts));
    for (double v : {s.time.fixed, s.time.per_row, s.time.per_token, s.time.per_pair,
                     s.time.per_decode_pair}) {
      if (!(v >= 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("profile: ", path, ": step time coefficients must be >= 0"));
      }
    }
    p.passes.push_back(s);
  }
  json links;
  PDQ_GET_ARRAY(j, "", "links", &links);
  for (size_t i = 0; i < links.size(); ++i) {
    const std::string path = absl::StrCat("links[", i, "]");
    LinkProfile l;
    PDQ_GET(links[i], path, "transport", &l.transport);
    PDQ_GET(links[i], path, "bytes_per_second", &l.link.bytes_per_second);
    PDQ_GET(links[i], path, "latency_seconds", &l.link.latency_seconds);
    if (!(l.link.bytes_per_second > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", path, ".bytes_per_second must be > 0"));
    }
    p.links.push_back(l);
  }
  PDQ_GET(j, "", "router_seconds", &p.router_seconds);
  json splits;
  PDQ_GET_ARRAY(j, "", "splits", &splits);
  for (size_t i = 0; i < splits.size(); ++i) {
    SplitProfile s;
    PDQ_RETURN_IF_ERROR(ReadSplit(splits[i], absl::StrCat("splits[", i, "]"), &s));
    p.splits.push_back(s);
  }
  return p;
}

#undef PDQ_GET

absl::StatusOr<Profile> ReadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the profile ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Profile> p = ProfileFromJson(ss.str());
  if (!p.ok())
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  return p;
}

}  // namespace pdq::sim
