#include <httplib.h>

#include <chrono>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "harness/bench_target.h"

namespace pdq {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Url {
  std::string scheme, host, path;  // path without a trailing slash
  int port = 80;
};

absl::StatusOr<Url> ParseUrl(const std::string& url) {
  Url u;
  std::string rest;
  if (absl::StartsWith(url, "http://")) {
    u.scheme = "http";
    rest = url.substr(7);
  } else if (absl::StartsWith(url, "https://")) {
    u.scheme = "https";
    u.port = 443;
    rest = url.substr(8);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--openai '", url, "' must start with http:// or https://"));
  }
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  u.path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.path.empty() && u.path.back() == '/') u.path.pop_back();
  const size_t colon = hostport.rfind(':');
  u.host = hostport.substr(0, colon);
  if (colon != std::string::npos && !absl::SimpleAtoi(hostport.substr(colon + 1), &u.port)) {
    return absl::InvalidArgumentError(absl::StrCat("--openai '", url, "': bad port"));
  }
  if (u.host.empty())
    return absl::InvalidArgumentError(absl::StrCat("--openai '", url, "': no host"));
  return u;
}

httplib::Headers Headers(const std::string& api_key) {
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  return h;
}

// A client for `url`; over https the server's certificate is checked
// against `ca_path` (empty: the system's CAs).
std::unique_ptr<httplib::Client> Connect(const Url& url, const std::string& ca_path) {
  auto client =
      std::make_unique<httplib::Client>(absl::StrCat(url.scheme, "://", url.host, ":", url.port));
  if (!ca_path.empty()) client->set_ca_cert_path(ca_path.c_str());
  client->set_connection_timeout(10);
  return client;
}

// An integer at `path` in `j`, or nullopt where a step is missing or not
// of the right type (servers differ; none of this may throw).
std::optional<int> IntAt(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object()) return std::nullopt;
    auto it = at->find(key);
    if (it == at->end()) return std::nullopt;
    at = &*it;
  }
  if (!at->is_number()) return std::nullopt;
  return (int)at->get<double>();
}

// The prompt tokens a server says came from its prefix cache, wherever it
// puts them: OpenAI's usage.prompt_tokens_details.cached_tokens, a flat
// usage.cached_tokens, or llama-server's timings.cache_n.
std::optional<int> CachedTokens(const json& event) {
  if (std::optional<int> n = IntAt(event, {"usage", "prompt_tokens_details", "cached_tokens"})) {
    return n;
  }
  if (std::optional<int> n = IntAt(event, {"usage", "cached_tokens"})) return n;
  return IntAt(event, {"timings", "cache_n"});
}

class OpenAiTarget : public BenchTarget {
 public:
  OpenAiTarget(Url url, std::string model, std::string api_key, std::string ca_path,
               double temperature)
      : url_(std::move(url)),
        model_(std::move(model)),
        api_key_(std::move(api_key)),
        ca_path_(std::move(ca_path)),
        temperature_(temperature) {}

  BenchRecord Run(const BenchPrompt& prompt, int64_t output_tokens, int64_t timeout_s,
                  const std::string& request_id, const std::string& client_id) override {
    BenchRecord r;
    std::unique_ptr<httplib::Client> connection = Connect(url_, ca_path_);
    httplib::Client& client = *connection;
    client.set_read_timeout((time_t)timeout_s);
    httplib::Request req;
    req.method = "POST";
    req.path = url_.path + "/completions";
    req.headers = Headers(api_key_);
    req.headers.emplace("X-Request-Id", request_id);
    req.headers.emplace("Content-Type", "application/json");
    json fields = {{"model", model_},
                   {"prompt", prompt.text},
                   {"max_tokens", output_tokens},
                   {"temperature", temperature_},
                   {"stream", true},
                   {"ignore_eos", true},
                   {"stream_options", {{"include_usage", true}}}};
    if (!client_id.empty()) fields["user"] = client_id;
    // A prompt cut at a token count may end inside a UTF-8 character: that
    // byte is replaced, not thrown on.
    req.body = fields.dump(-1, ' ', false, json::error_handler_t::replace);
    const Clock::time_point start = Clock::now();
    Clock::time_point last = start;
    std::string pending, body;
    int status = 0, chunks = 0;
    bool done = false;
    req.response_handler = [&](const httplib::Response& res) {
      status = res.status;
      return true;
    };
    // Events are separated by a blank line; each chunk with text is a token.
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        body.append(data, n);
        return true;
      }
      pending.append(data, n);
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (!absl::StartsWith(event, "data: ")) continue;  // comments (keep-alives)
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(payload, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) {
          r.error = j["error"].value("message", j["error"].dump());
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          r.prompt_tokens = IntAt(j, {"usage", "prompt_tokens"}).value_or(0);
          r.output_tokens = IntAt(j, {"usage", "completion_tokens"}).value_or(0);
        }
        if (std::optional<int> cached = CachedTokens(j)) r.cached_tokens = *cached;
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        if (!c.contains("text") || !c["text"].is_string() || c["text"].get<std::string>().empty()) {
          continue;
        }
        r.output_text += c["text"].get<std::string>();
        const Clock::time_point now = Clock::now();
        if (chunks == 0) {
          r.ttft = Since(start, now);
        } else {
          r.gaps.push_back(Since(last, now));
        }
        ++chunks;
        last = now;
      }
      return true;
    };
    httplib::Result res = client.send(req);
    r.e2e = Since(start, Clock::now());
    if (r.output_tokens == 0) r.output_tokens = chunks;  // no usage block
    if (r.prompt_tokens == 0) r.prompt_tokens = (int)prompt.ids.size();
    if (!res) {
      r.error = absl::StrCat("POST ", req.path, ": ", httplib::to_string(res.error()));
    } else if (status != 200) {
      r.refused = status == 429;
      const json j = json::parse(body, nullptr, false);
      if (r.refused && !j.is_discarded() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("code") && j["error"]["code"].is_string()) {
        r.refusal = j["error"]["code"].get<std::string>();
      }
      r.error = absl::StrCat(
          "HTTP ", status, ": ",
          !j.is_discarded() && j.contains("error") ? j["error"].value("message", body) : body);
    } else if (r.error.empty() && !done) {
      r.error = "the stream ended without [DONE]";
    }
    r.ok = r.error.empty();
    if (chunks > 1) r.tpot = Since(start, last) - r.ttft, r.tpot /= chunks - 1;
    return r;
  }

 private:
  const Url url_;
  const std::string model_, api_key_, ca_path_;
  const double temperature_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchTarget>> OpenAiBenchTarget(
    const std::string& base_url, const std::string& model, const std::string& api_key,
    const std::string& ca_path, std::string* model_used, double temperature) {
  absl::StatusOr<Url> url = ParseUrl(base_url);
  if (!url.ok()) return url.status();
  // Reach the server once: an unreachable one fails here, not 100 times.
  std::unique_ptr<httplib::Client> client = Connect(*url, ca_path);
  client->set_read_timeout(10);
  httplib::Result res = client->Get(url->path + "/models", Headers(api_key));
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("GET ", base_url, "/models: ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", base_url, "/models: HTTP ", res->status, ": ", res->body));
  }
  const json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array()) {
    return absl::UnavailableError(
        absl::StrCat("GET ", base_url, "/models did not answer an OpenAI model list"));
  }
  std::string chosen = model, listed;
  bool found = false;
  for (const json& m : j["data"]) {
    if (!m.contains("id") || !m["id"].is_string()) continue;
    absl::StrAppend(&listed, listed.empty() ? "" : ", ", m["id"].get<std::string>());
    found = found || m["id"] == model;
  }
  if (!model.empty() && !found) {
    return absl::InvalidArgumentError(
        absl::StrCat(base_url, " does not serve the model '", model, "' (it lists: ", listed, ")"));
  }
  if (chosen.empty()) {
    if (j["data"].empty() || !j["data"][0].contains("id")) {
      return absl::UnavailableError(absl::StrCat(base_url, " serves no model"));
    }
    chosen = j["data"][0]["id"].get<std::string>();
  }
  *model_used = chosen;
  return std::make_unique<OpenAiTarget>(*url, chosen, api_key, ca_path, temperature);
}

}  // namespace pdq
