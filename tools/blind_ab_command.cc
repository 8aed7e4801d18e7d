// `pdq eval blind-ab` and `pdq eval tally`: the human half of the accuracy
// evaluation. blind-ab asks two deployments the same prompts and writes a
// self-contained review page showing each prompt's two answers in random
// order (which side is which is kept apart, in key.json); reviewers pick
// the better answer or a tie and export their votes. tally joins votes with
// the key and counts them with a confidence interval.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "tools/commands.h"
#include "harness/local_run.h"

namespace pdq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The answers of one deployment ("router=HOST:PORT", reached as `remote`
// says, or a `pdq up` config that is started for the purpose, on loopback
// without TLS, and stopped after).
absl::StatusOr<std::vector<std::string>> Answers(const std::string& deployment,
                                                 const std::vector<std::string>& prompts,
                                                 int max_tokens, int concurrency,
                                                 const std::string& dir,
                                                 const server::Dialing& remote) {
  LocalDeployment local;
  std::string address;
  server::Dialing dialing;
  if (absl::StartsWith(deployment, "router=")) {
    address = deployment.substr(7);
    dialing = remote;
  } else {
    absl::StatusOr<std::string> text = ReadTextFile(deployment, "the deployment config");
    if (!text.ok()) return text.status();
    json config = json::parse(*text, nullptr, false);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(deployment, " is neither router=HOST:PORT nor a pdq up config (JSON)"));
    }
    config["listen"] = "127.0.0.1:0";  // whatever the file says: this run's own ports
    fs::create_directories(dir);
    std::fprintf(stderr, "pdq eval blind-ab: starting %s\n", deployment.c_str());
    if (absl::Status s = local.Start(config, dir); !s.ok()) return s;
    address = local.address();
  }
  auto stub = v1::Pdq::NewStub(server::Dial(address, dialing));
  std::vector<std::string> answers(prompts.size());
  std::vector<grpc::Status> errors(prompts.size());
  std::atomic<size_t> next{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < prompts.size() && !interrupted();) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
        v1::GenerateRequest req;
        req.set_request_id(absl::StrCat("blind-ab-", i));
        v1::ChatMessage* m = req.mutable_chat()->add_messages();
        m->set_role("user");
        m->set_content(prompts[i]);
        req.set_max_tokens(max_tokens);  // greedy: sampling left at its zero default
        auto reader = stub->Generate(&ctx, req);
        v1::GenerateResponse r;
        while (reader->Read(&r)) answers[i] += r.delta().text();
        errors[i] = reader->Finish();
        std::fprintf(stderr, "\rpdq eval blind-ab: %s: %zu/%zu answers", deployment.c_str(), ++done,
                     prompts.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::fprintf(stderr, "\n");
  if (interrupted()) return absl::CancelledError("interrupted");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!errors[i].ok()) {
      return absl::UnavailableError(
          absl::StrCat(deployment, ": prompt ", i + 1, " failed: ", errors[i].error_message()));
    }
  }
  return answers;
}

// The review page: the items are data; the page draws them, records votes
// in the browser's storage (a reviewer can stop and come back) and exports
// them as JSON. Nothing in it says which deployment wrote which answer.
constexpr char kPage[] = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pdq blind review</title>
<style>
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:1rem;color:#222}
header{position:sticky;top:0;background:#fff;padding:.5rem 0;border-bottom:1px solid #ddd;z-index:1}
.item{border:1px solid #ccc;border-radius:6px;margin:1rem 0;padding:.8rem}
.item.voted{border-color:#4a4}
.prompt{font-weight:600;margin-bottom:.6rem}
.answers{display:grid;grid-template-columns:1fr 1fr;gap:.8rem}
.answer{white-space:pre-wrap;background:#f7f7f7;padding:.6rem;border-radius:4px;min-height:3rem}
.choices{margin-top:.6rem;display:flex;gap:.5rem}
button{padding:.35rem .8rem;border:1px solid #888;border-radius:4px;background:#fff;cursor:pointer}
button.chosen{background:#2a6;color:#fff;border-color:#2a6}
#export{width:100%;height:8rem;font-family:monospace}
</style></head><body>
<header><h1 style="margin:.2rem 0">Which answer is better?</h1>
<p style="margin:.2rem 0">For each prompt pick the better answer, or a tie. Answers are shown in a random order. Votes are kept in this browser; press <b>Export</b> when done and send the file. Keys: <kbd>1</kbd> / <kbd>2</kbd> / <kbd>t</kbd> vote on the next unvoted item.</p>
<p style="margin:.2rem 0"><span id="progress"></span> <button id="download">Export votes</button>
<input id="reviewer" placeholder="your name (optional)"></p></header>
<main id="items"></main>
<h2>Votes (JSON)</h2><textarea id="export" readonly></textarea>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const storeKey = "pdq-blind-ab-" + data.review_id;
let votes = {};
try { votes = JSON.parse(localStorage.getItem(storeKey) || "{}"); } catch (e) { votes = {}; }
function exportJson() {
  const list = data.items.filter(it => votes[it.id]).map(it => ({id: it.id, choice: votes[it.id]}));
  return JSON.stringify({review_id: data.review_id, reviewer: document.getElementById("reviewer").value,
                         votes: list}, null, 1);
}
function refresh() {
  const n = Object.keys(votes).length;
  document.getElementById("progress").textContent = n + " of " + data.items.length + " voted";
  document.getElementById("export").value = exportJson();
  for (const el of document.querySelectorAll(".item")) {
    const v = votes[el.dataset.id];
    el.classList.toggle("voted", !!v);
    for (const b of el.querySelectorAll("button")) b.classList.toggle("chosen", b.dataset.choice === v);
  }
  try { localStorage.setItem(storeKey, JSON.stringify(votes)); } catch (e) {}
}
function vote(id, choice) { votes[id] = choice; refresh(); }
const main = document.getElementById("items");
data.items.forEach((it, k) => {
  const el = document.createElement("section");
  el.className = "item"; el.dataset.id = it.id;
  const p = document.createElement("div"); p.className = "prompt";
  p.textContent = (k + 1) + ". " + it.prompt; el.appendChild(p);
  const answers = document.createElement("div"); answers.className = "answers";
  for (const [label, text] of [["Answer 1", it.left], ["Answer 2", it.right]]) {
    const a = document.createElement("div");
    const h = document.createElement("div"); h.textContent = label; h.style.fontSize = "small";
    const t = document.createElement("div"); t.className = "answer"; t.textContent = text;
    a.appendChild(h); a.appendChild(t); answers.appendChild(a);
  }
  el.appendChild(answers);
  const choices = document.createElement("div"); choices.className = "choices";
  for (const [choice, label] of [["left", "1 is better"], ["tie", "Tie"], ["right", "2 is better"]]) {
    const b = document.createElement("button");
    b.dataset.choice = choice; b.textContent = label;
    b.addEventListener("click", () => vote(it.id, choice));
    choices.appendChild(b);
  }
  el.appendChild(choices);
  main.appendChild(el);
});
document.addEventListener("keydown", e => {
  if (e.target.tagName === "INPUT") return;
  const choice = {"1": "left", "2": "right", "t": "tie"}[e.key];
  const next = data.items.find(it => !votes[it.id]);
  if (choice && next) { vote(next.id, choice); }
});
document.getElementById("reviewer").addEventListener("input", refresh);
document.getElementById("download").addEventListener("click", () => {
  const blob = new Blob([exportJson()], {type: "application/json"});
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = "votes-" + data.review_id + ".json"; a.click();
});
refresh();
</script></body></html>
)HTML";

// JSON inside <script>: "</" would end the element.
std::string ScriptSafe(std::string s) {
  for (size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3)
    s.replace(at, 2, "<\\/");
  return s;
}

}  // namespace

int BlindAbCommand(int argc, char** argv) {
  std::string prompts_path, a, b, out;
  int64_t count = 100, max_tokens = 256, concurrency = 4, seed = 1;
  FlagParser flags(
      "eval blind-ab",
      "Asks two deployments the same prompts (chat, greedy) and writes OUT/review.html: "
      "a self-contained page showing each prompt's two answers in random order, where "
      "a reviewer picks the better one or a tie and exports the votes. Which side is "
      "which stays in OUT/key.json, for pdq eval tally.");
  flags.String("prompts", &prompts_path, "one prompt per line (eval/prompts/review-100.txt)");
  flags.String("a", &a, "deployment A: a pdq up config (deploy/local/*.json) or router=HOST:PORT");
  flags.String("b", &b, "deployment B: the same forms");
  flags.String("out", &out, "where review.html, key.json and answers.json go");
  flags.Int("count", &count, 1, 10000, "the first this many prompts");
  flags.Int("max-tokens", &max_tokens, 1, 4096, "answer length at most");
  flags.Int("concurrency", &concurrency, 1, 256, "requests in flight per deployment");
  flags.Int("seed", &seed, 0, INT64_MAX, "seeds the order of each pair");
  ConnectionFlags connection;  // for the router= forms
  connection.Register(flags);
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval blind-ab"); rc >= 0) return rc;
  absl::StatusOr<server::Dialing> remote = connection.Dialing();
  if (!remote.ok()) return Fail("eval blind-ab", remote.status());
  if (prompts_path.empty() || a.empty() || b.empty() || out.empty()) {
    return Fail("eval blind-ab",
                absl::InvalidArgumentError("--prompts, --a, --b and --out are all required"));
  }
  absl::StatusOr<std::string> text = ReadTextFile(prompts_path, "--prompts");
  if (!text.ok()) return Fail("eval blind-ab", text.status());
  std::vector<std::string> prompts;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    if ((int64_t)prompts.size() < count) prompts.emplace_back(line);
  }
  if (prompts.empty()) {
    return Fail("eval blind-ab",
                absl::InvalidArgumentError(absl::StrCat(prompts_path, " has no prompts")));
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return Fail("eval blind-ab", absl::UnavailableError(absl::StrCat("cannot create ", out)));
  CatchInterrupts();
  absl::StatusOr<std::vector<std::string>> answers_a =
      Answers(a, prompts, (int)max_tokens, (int)concurrency, out + "/deployment-a", *remote);
  if (!answers_a.ok()) return Fail("eval blind-ab", answers_a.status());
  absl::StatusOr<std::vector<std::string>> answers_b =
      Answers(b, prompts, (int)max_tokens, (int)concurrency, out + "/deployment-b", *remote);
  if (!answers_b.ok()) return Fail("eval blind-ab", answers_b.status());

  std::mt19937_64 rng((uint64_t)seed);
  const std::string review_id = absl::StrFormat("%016x", rng());
  json items = json::array(), key = json::array(), answers = json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const bool a_left = (rng() & 1) == 0;
    const std::string& left = a_left ? (*answers_a)[i] : (*answers_b)[i];
    const std::string& right = a_left ? (*answers_b)[i] : (*answers_a)[i];
    items.push_back({{"id", (int)i + 1}, {"prompt", prompts[i]}, {"left", left}, {"right", right}});
    key.push_back({{"id", (int)i + 1}, {"left", a_left ? "a" : "b"}});
    answers.push_back({{"id", (int)i + 1},
                       {"prompt", prompts[i]},
                       {"a", (*answers_a)[i]},
                       {"b", (*answers_b)[i]}});
  }
  std::string page = kPage;
  const json data = {{"review_id", review_id}, {"items", items}};
  page.replace(page.find("__DATA__"), 8, ScriptSafe(data.dump()));
  std::ofstream(out + "/review.html") << page;
  std::ofstream(out + "/key.json")
      << json({{"review_id", review_id}, {"a", a}, {"b", b}, {"key", key}}).dump(1) << "\n";
  std::ofstream(out + "/answers.json")
      << json({{"a", a}, {"b", b}, {"answers", answers}}).dump(1) << "\n";
  std::printf(
      "pdq eval blind-ab: %zu prompts; review page %s/review.html (send it to reviewers; "
      "keep key.json), then: pdq eval tally --key %s/key.json --votes VOTES.json[,...]\n",
      prompts.size(), out.c_str(), out.c_str());
  return 0;
}

int TallyCommand(int argc, char** argv) {
  std::string key_path, votes_flag, json_path;
  FlagParser flags("eval tally",
                   "Counts the votes of pdq eval blind-ab reviews: A wins, B wins and ties, with "
                   "B's share of the decisive votes and its 95% Wilson interval.");
  flags.String("key", &key_path, "the review's key.json");
  flags.String("votes", &votes_flag, "the exported votes, comma-separated files");
  flags.String("json", &json_path, "also write the counts here");
  if (int rc = ParseOrExit(flags, argc, argv, 3, "pdq eval tally"); rc >= 0) return rc;
  if (key_path.empty() || votes_flag.empty()) {
    return Fail("eval tally", absl::InvalidArgumentError("--key and --votes are required"));
  }
  absl::StatusOr<std::string> key_text = ReadTextFile(key_path, "--key");
  if (!key_text.ok()) return Fail("eval tally", key_text.status());
  const json key = json::parse(*key_text, nullptr, false);
  if (!key.is_object() || !key.contains("key") || !key.contains("review_id")) {
    return Fail("eval tally",
                absl::InvalidArgumentError(absl::StrCat(key_path, " is not a blind-ab key.json")));
  }
  std::map<int, std::string> left_is;
  for (const json& k : key["key"]) left_is[k.value("id", 0)] = k.value("left", "");
  int a_wins = 0, b_wins = 0, ties = 0;
  for (absl::string_view file : absl::StrSplit(votes_flag, ',', absl::SkipEmpty())) {
    absl::StatusOr<std::string> text = ReadTextFile(std::string(file), "--votes");
    if (!text.ok()) return Fail("eval tally", text.status());
    const json v = json::parse(*text, nullptr, false);
    if (!v.is_object() || !v.contains("votes") || !v["votes"].is_array()) {
      return Fail("eval tally",
                  absl::InvalidArgumentError(absl::StrCat(file, " is not an exported votes file")));
    }
    if (v.value("review_id", "") != key["review_id"]) {
      return Fail("eval tally", absl::InvalidArgumentError(absl::StrCat(
                                    file, " belongs to review ", v.value("review_id", "?"),
                                    ", the key to ", key["review_id"].get<std::string>())));
    }
    for (const json& vote : v["votes"]) {
      const int id = vote.value("id", 0);
      const std::string choice = vote.value("choice", "");
      if (!left_is.count(id) || (choice != "left" && choice != "right" && choice != "tie")) {
        return Fail("eval tally", absl::InvalidArgumentError(
                                      absl::StrCat(file, ": vote ", vote.dump(), " is not valid")));
      }
      if (choice == "tie") {
        ++ties;
      } else if ((choice == "left") == (left_is[id] == "a")) {
        ++a_wins;
      } else {
        ++b_wins;
      }
    }
  }
  // Wilson score interval for B's share of the decisive votes.
  const int n = a_wins + b_wins;
  const double z = 1.959964, p = n ? (double)b_wins / n : 0;
  const double centre = n ? (p + z * z / (2 * n)) / (1 + z * z / n) : 0;
  const double half =
      n ? z * std::sqrt(p * (1 - p) / n + z * z / (4.0 * n * n)) / (1 + z * z / n) : 0;
  std::printf("A (%s) better: %d\nB (%s) better: %d\nties: %d\n", key.value("a", "").c_str(),
              a_wins, key.value("b", "").c_str(), b_wins, ties);
  if (n > 0) {
    std::printf(
        "B preferred in %.1f%% of decisive votes (95%% interval %.1f%% to %.1f%%, Wilson)%s\n",
        100 * p, 100 * (centre - half), 100 * (centre + half),
        centre - half > 0.5   ? ": B is better"
        : centre + half < 0.5 ? ": A is better"
                              : ": no difference shown");
  } else {
    std::printf("no decisive votes\n");
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << json({{"a_better", a_wins},
                                      {"b_better", b_wins},
                                      {"ties", ties},
                                      {"b_share", p},
                                      {"b_share_low", centre - half},
                                      {"b_share_high", centre + half}})
                                    .dump(1)
                             << "\n";
  }
  return 0;
}

}  // namespace pdq
