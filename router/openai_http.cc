#include "router/openai_http.h"

#include <httplib.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "server/grpc_util.h"
#include "server/http_server.h"

namespace pdq::router {
namespace {

using json = nlohmann::json;

// Model text is valid UTF-8 (deltas never split a character), but nothing
// here may throw on a byte that is not: it is replaced.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// ---- Errors in OpenAI's shape ------------------------------------------------

struct HttpError {
  int status = 400;
  std::string type, message, param, code;
};

HttpError BadRequest(std::string message, std::string param = "") {
  return {400, "invalid_request_error", std::move(message), std::move(param), ""};
}

json ErrorJson(const HttpError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", or_null(e.param)},
            {"code", or_null(e.code)}}}};
}

void SendError(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

HttpError FromGrpc(const grpc::Status& s) {
  const std::string& m = s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return BadRequest(m);
    case grpc::StatusCode::NOT_FOUND:
      return {404, "invalid_request_error", m, "", "not_found"};
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return {429, "server_overloaded", m, "", "resource_exhausted"};
    case grpc::StatusCode::UNAVAILABLE:
      return {503, "service_unavailable", m, "", "unavailable"};
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return {504, "timeout", m, "", "deadline_exceeded"};
    case grpc::StatusCode::CANCELLED:
      return {499, "cancelled", m, "", "cancelled"};
    case grpc::StatusCode::UNAUTHENTICATED:
      return {401, "authentication_error", m, "", ""};
    case grpc::StatusCode::PERMISSION_DENIED:
      return {403, "permission_error", m, "", ""};
    default:
      return {500, "server_error", m, "", ""};
  }
}

std::string FinishReason(v1::FinishReason r) {
  return r == v1::FINISH_REASON_LENGTH || r == v1::FINISH_REASON_CONTEXT_FULL ? "length" : "stop";
}

// ---- One generation over the in-process channel --------------------------------

// A Generate call whose messages are taken one at a time by the HTTP thread:
// the next read starts only when the last message was taken, so a slow HTTP
// client slows its stream (the worker's unsent-token bound applies) instead
// of filling memory.
class GenerateStream : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  enum class Event { kMessage, kTimeout, kDone };

  GenerateStream(v1::Pdq::Stub& stub, v1::GenerateRequest req, absl::Duration timeout,
                 const std::string& authorization)
      : req_(std::move(req)) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!authorization.empty()) ctx_.AddMetadata("authorization", authorization);
    stub.async()->Generate(&ctx_, &req_, this);
    AddHold();  // released once reads end: reads may start from the HTTP thread
    reading_ = true;
    StartRead(&incoming_);
    StartCall();
  }
  ~GenerateStream() override {
    ctx_.TryCancel();
    std::unique_lock lock(mu_);
    if (!reading_ && !reads_ended_) {
      // A message was taken and no read is outstanding: one more read ends
      // the reads (the call is cancelled), releasing the hold.
      reading_ = true;
      lock.unlock();
      StartRead(&incoming_);
      lock.lock();
    }
    cv_.wait(lock, [&] { return done_; });
  }

  // The next message (into *out), or kTimeout after `wait`, or kDone (then
  // status() is final).
  Event Next(absl::Duration wait, v1::GenerateResponse* out) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] { return have_ || done_; })) {
      return Event::kTimeout;
    }
    if (!have_) return Event::kDone;
    *out = std::move(incoming_);
    have_ = false;
    reading_ = true;
    lock.unlock();
    StartRead(&incoming_);
    return Event::kMessage;
  }
  // Whether a message or the end is ready, waiting up to `wait`.
  bool Ready(absl::Duration wait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] { return have_ || done_; });
  }
  bool HasMessage() {
    std::lock_guard lock(mu_);
    return have_;
  }
  void Cancel() { ctx_.TryCancel(); }
  grpc::Status status() {
    std::lock_guard lock(mu_);
    return status_;
  }
  // A refusal's Retry-After in whole seconds (the router's retry-after-ms
  // trailer, rounded up); empty when there is none. After the call ended.
  std::string RetryAfterSeconds() {
    std::lock_guard lock(mu_);
    if (!done_) return "";
    int64_t ms = 0;
    if (!absl::SimpleAtoi(server::Trailer(ctx_, server::kRetryAfterTrailer), &ms) || ms < 0) {
      return "";
    }
    return absl::StrCat((ms + 999) / 1000);
  }
  // A refusal's reason (the router's pdq-refusal trailer: "kv_full", ...);
  // empty when there is none. After the call ended.
  std::string RefusalReason() {
    std::lock_guard lock(mu_);
    if (!done_) return "";
    return server::Trailer(ctx_, server::kRefusalTrailer);
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard lock(mu_);
      reading_ = false;
      if (ok) {
        have_ = true;
      } else {
        reads_ended_ = true;
      }
    }
    cv_.notify_all();
    if (!ok) RemoveHold();
  }
  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard lock(mu_);
      status_ = s;
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  v1::GenerateRequest req_;
  grpc::ClientContext ctx_;
  v1::GenerateResponse incoming_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool reading_ = false, reads_ended_ = false, have_ = false, done_ = false;
  grpc::Status status_;
};

// ---- Request bodies ------------------------------------------------------------

struct Parsed {
  v1::GenerateRequest req;
  std::string model;
  bool stream = false, include_usage = false, max_tokens_given = false;
};

bool Present(const json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

std::optional<HttpError> ReadNumber(const json& body, const char* key, double lo, double hi,
                                    double* out) {
  if (!Present(body, key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_number()) return BadRequest(absl::StrCat("'", key, "' must be a number"), key);
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi)) {
    return BadRequest(absl::StrFormat("'%s' must be between %g and %g, got %g", key, lo, hi, d),
                      key);
  }
  *out = d;
  return std::nullopt;
}

std::optional<HttpError> ReadInt(const json& body, const char* key, int64_t lo, int64_t hi,
                                 int64_t* out) {
  if (!Present(body, key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_number_integer())
    return BadRequest(absl::StrCat("'", key, "' must be an integer"), key);
  const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)INT64_MAX
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (i < lo || i > hi) {
    return BadRequest(absl::StrCat("'", key, "' must be between ", lo, " and ", hi, ", got ", i),
                      key);
  }
  *out = i;
  return std::nullopt;
}

std::optional<HttpError> ReadBool(const json& body, const char* key, bool* out) {
  if (!Present(body, key)) return std::nullopt;
  if (!body[key].is_boolean())
    return BadRequest(absl::StrCat("'", key, "' must be a boolean"), key);
  *out = body[key].get<bool>();
  return std::nullopt;
}

// A field pdq does not implement: refused when set to anything but its
// neutral value, rather than silently ignored.
std::optional<HttpError> Unsupported(const json& body, const char* key) {
  if (!Present(body, key)) return std::nullopt;
  const json& v = body[key];
  const bool neutral = (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v == 0) ||
                       ((v.is_object() || v.is_array() || v.is_string()) && v.empty());
  if (neutral) return std::nullopt;
  return BadRequest(absl::StrCat("'", key, "' is not supported by pdq"), key);
}

std::optional<HttpError> ReadChatMessages(const json& body, v1::ChatPrompt* chat) {
  if (!Present(body, "messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return BadRequest("'messages' must be a non-empty array", "messages");
  }
  for (const json& m : body["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return BadRequest("each message needs a string 'role'", "messages");
    }
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      return BadRequest(
          absl::StrCat("message role '", role, "' is not supported (system, user, assistant)"),
          "messages");
    }
    std::string content;
    const json c = m.value("content", json(nullptr));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return BadRequest("only text content parts are supported", "messages");
        }
        content += part["text"].get<std::string>();
      }
    } else {
      return BadRequest("each message needs 'content': a string or text parts", "messages");
    }
    v1::ChatMessage* out = chat->add_messages();
    out->set_role(role);
    out->set_content(std::move(content));
  }
  return std::nullopt;
}

std::optional<HttpError> ReadPrompt(const json& body, v1::GenerateRequest* req) {
  if (!Present(body, "prompt")) return BadRequest("'prompt' is required", "prompt");
  const json& p = body["prompt"];
  if (p.is_string()) {
    req->set_text(p.get<std::string>());
    return std::nullopt;
  }
  if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    req->set_text(p[0].get<std::string>());
    return std::nullopt;
  }
  if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX) {
        return BadRequest("a token-id prompt must hold integers only", "prompt");
      }
      req->mutable_tokens()->add_ids((int32_t)t.get<int64_t>());
    }
    return std::nullopt;
  }
  if (p.is_array() && p.size() > 1) {
    return BadRequest("batched prompts are not supported: send one prompt per request", "prompt");
  }
  return BadRequest("'prompt' must be a string, or an array of token ids", "prompt");
}

std::optional<HttpError> ParseBody(const json& body, bool chat, Parsed* p) {
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  if (!Present(body, "model") || !body["model"].is_string()) {
    return BadRequest("'model' is required (GET /v1/models lists it)", "model");
  }
  p->model = body["model"].get<std::string>();
  v1::GenerateRequest& req = p->req;
  if (auto e = chat ? ReadChatMessages(body, req.mutable_chat()) : ReadPrompt(body, &req)) return e;
  for (const char* key : {"logprobs", "top_logprobs", "echo", "presence_penalty",
                          "frequency_penalty", "logit_bias", "tools", "functions", "suffix"}) {
    if (auto e = Unsupported(body, key)) return e;
  }
  if (Present(body, "response_format") && !(body["response_format"].is_object() &&
                                            body["response_format"].value("type", "") == "text")) {
    return BadRequest("only the text response_format is supported", "response_format");
  }
  int64_t n = 1, best_of = 1, max_tokens = 0, top_k = 0, seed = 0;
  if (auto e = ReadInt(body, "n", 1, 1, &n)) return e;
  if (auto e = ReadInt(body, "best_of", 1, 1, &best_of)) return e;
  const char* max_key =
      chat && Present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = ReadInt(body, max_key, 1, INT32_MAX, &max_tokens)) return e;
  p->max_tokens_given = max_tokens > 0;
  req.set_max_tokens((int32_t)(p->max_tokens_given ? max_tokens : 16));
  double temperature = 1.0, top_p = 1.0;
  if (auto e = ReadNumber(body, "temperature", 0, 2, &temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0, 1, &top_p)) return e;
  // Extensions other servers (vLLM, SGLang) accept too.
  if (auto e = ReadInt(body, "top_k", -1, INT32_MAX, &top_k)) return e;
  if (auto e = ReadInt(body, "seed", INT64_MIN, INT64_MAX, &seed)) return e;
  req.mutable_sampling()->set_temperature((float)temperature);
  req.mutable_sampling()->set_top_p((float)top_p);
  req.mutable_sampling()->set_top_k(top_k < 0 ? 0 : (int32_t)top_k);
  req.mutable_sampling()->set_seed((uint64_t)seed);
  // OpenAI's end-user id: the client id of a sticky A/B split.
  if (Present(body, "user")) {
    if (!body["user"].is_string()) return BadRequest("'user' must be a string", "user");
    req.set_client_id(body["user"].get<std::string>());
  }
  // vLLM's tenant isolation for the prefix cache.
  if (Present(body, "cache_salt")) {
    if (!body["cache_salt"].is_string()) {
      return BadRequest("'cache_salt' must be a string", "cache_salt");
    }
    req.set_cache_salt(body["cache_salt"].get<std::string>());
  }
  // pdq's admission classes: interactive (the default) before batch.
  if (Present(body, "priority")) {
    const json& v = body["priority"];
    if (!v.is_string() || (v != "interactive" && v != "batch")) {
      return BadRequest("'priority' must be \"interactive\" or \"batch\"", "priority");
    }
    req.set_priority(v == "batch" ? v1::PRIORITY_BATCH : v1::PRIORITY_INTERACTIVE);
  }
  bool ignore_eos = false;
  if (auto e = ReadBool(body, "ignore_eos", &ignore_eos)) return e;
  req.set_ignore_eos(ignore_eos);
  if (Present(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      req.add_stop(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) return BadRequest("'stop' must hold strings", "stop");
        req.add_stop(x.get<std::string>());
      }
    } else {
      return BadRequest("'stop' must be a string or an array of strings", "stop");
    }
  }
  if (auto e = ReadBool(body, "stream", &p->stream)) return e;
  if (Present(body, "stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) return BadRequest("'stream_options' must be an object", "stream_options");
    if (!p->stream) return BadRequest("'stream_options' needs 'stream': true", "stream_options");
    if (auto e = ReadBool(o, "include_usage", &p->include_usage)) return e;
  }
  return std::nullopt;
}

// ---- The server ----------------------------------------------------------------

std::string RandomHex(int n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  while ((int)s.size() < n) s += absl::StrFormat("%016x", rng());
  return s.substr(0, n);
}

// The error a Generate call ended with, and when to retry a refusal.
void SendStreamError(httplib::Response& res, GenerateStream& stream) {
  HttpError e = FromGrpc(stream.status());
  // A refusal's code is its reason ("queue_full", "ttft", "rate_limit",
  // "kv_full", "batch_full"), so clients can tell them apart.
  if (const std::string reason = stream.RefusalReason(); e.status == 429 && !reason.empty()) {
    e.code = reason;
  }
  SendError(res, e);
  if (const std::string after = stream.RetryAfterSeconds(); !after.empty()) {
    res.set_header("Retry-After", after);
  }
}

class Server : public OpenAiHttpServer {
 public:
  Server(const OpenAiHttpOptions& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o),
        stub_(v1::Pdq::NewStub(std::move(channel))),
        server_(o.tls_cert_path.empty()
                    ? std::make_unique<server::HttpServer>()
                    : std::make_unique<server::HttpServer>(o.tls_cert_path, o.tls_key_path)) {}
  const std::string& address() const override { return server_->address(); }

  absl::Status Start() {
    httplib::Server& http = server_->http();
    http.set_payload_max_length(4 << 20);
    http.Get("/v1/models",
             [this](const httplib::Request& req, httplib::Response& res) { Models(req, res, ""); });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      Models(req, res, req.matches[1]);
    });
    // The body is read here, whatever its Content-Type: curl's default
    // (form-urlencoded) would otherwise meet cpp-httplib's 8 KiB form
    // limit; OpenAI-compatible servers read JSON regardless.
    auto post = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
        std::string body;
        const bool read = reader([&](const char* data, size_t n) {
          body.append(data, n);
          return true;
        });
        if (!read) {
          // cpp-httplib set 413 when the body passed the payload limit.
          return SendError(res, res.status == 413
                                    ? HttpError{413, "invalid_request_error",
                                                "the request body is larger than 4 MiB", "",
                                                "request_too_large"}
                                    : BadRequest("the request body could not be read"));
        }
        Complete(req, body, res, chat);
      };
    };
    http.Post("/v1/completions", post(/*chat=*/false));
    http.Post("/v1/chat/completions", post(/*chat=*/true));
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      HttpError e{res.status, "invalid_request_error",
                  absl::StrCat("no route for ", req.method, " ", req.path), "", "unknown_url"};
      if (res.status == 413) {
        e.message = "the request body is larger than 4 MiB";
        e.code = "request_too_large";
      } else if (res.status != 404 && res.status != 405) {
        e.message = absl::StrCat("the request could not be read (HTTP ", res.status, ")");
        e.code = "bad_request";
      }
      res.set_content(Dump(ErrorJson(e)), "application/json");
    });
    return server_->Start(o_.listen, o_.max_connections, "the HTTP API");
  }

 private:
  // A context for a call on the client's behalf: the Pdq service checks the
  // API key the client sent.
  static void Authorize(const httplib::Request& http, grpc::ClientContext* ctx) {
    const std::string key = http.get_header_value("Authorization");
    if (!key.empty()) ctx->AddMetadata("authorization", key);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  std::optional<v1::ModelInfo> Info(const httplib::Request& http, HttpError* error) {
    grpc::ClientContext ctx;
    Authorize(http, &ctx);
    v1::ModelInfo info;
    grpc::Status s = stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      *error = FromGrpc(s);
      return std::nullopt;
    }
    return info;
  }

  std::string ModelId(const v1::ModelInfo& info) const {
    return o_.model_id.empty() ? info.name() : o_.model_id;
  }
  bool Serves(const v1::ModelInfo& info, const std::string& model) const {
    return model == ModelId(info) || model == info.name();
  }

  // gRPC metadata takes printable ASCII only (a tab or a byte above 0x7e
  // there aborts the call): an Authorization header with anything else is
  // refused here, before it reaches a call.
  static std::optional<HttpError> BadAuthorization(const httplib::Request& http) {
    const std::string key = http.get_header_value("Authorization");
    bool printable = key.size() <= 4096;
    for (char c : key) printable = printable && c >= 0x20 && c <= 0x7e;
    if (printable) return std::nullopt;
    return HttpError{401, "authentication_error",
                     "the Authorization header must be 'Bearer KEY' in printable ASCII", "",
                     "invalid_api_key"};
  }

  void Models(const httplib::Request& http, httplib::Response& res, const std::string& id) {
    if (auto e = BadAuthorization(http)) return SendError(res, *e);
    HttpError error;
    std::optional<v1::ModelInfo> info = Info(http, &error);
    if (!info) return SendError(res, error);
    const json model = {{"id", ModelId(*info)},
                        {"object", "model"},
                        {"created", created_},
                        {"owned_by", "pdq"},
                        {"max_model_len", info->max_context()}};
    if (!id.empty()) {
      if (!Serves(*info, id)) {
        return SendError(
            res, {404, "invalid_request_error", absl::StrCat("the model '", id, "' does not exist"),
                  "model", "model_not_found"});
      }
      return res.set_content(Dump(model), "application/json");
    }
    res.set_content(Dump(json({{"object", "list"}, {"data", json::array({model})}})),
                    "application/json");
  }

  void Complete(const httplib::Request& http, const std::string& raw, httplib::Response& res,
                bool chat) {
    if (auto e = BadAuthorization(http)) return SendError(res, *e);
    const json body = json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return SendError(res, BadRequest("the body is not valid JSON"));
    auto p = std::make_shared<Parsed>();
    if (auto e = ParseBody(body, chat, p.get())) return SendError(res, *e);
    HttpError error;
    std::optional<v1::ModelInfo> info = Info(http, &error);
    if (!info) return SendError(res, error);
    if (!Serves(*info, p->model)) {
      return SendError(res, {404, "invalid_request_error",
                             absl::StrCat("the model '", p->model,
                                          "' does not exist; this server "
                                          "serves '",
                                          ModelId(*info), "' (GET /v1/models)"),
                             "model", "model_not_found"});
    }
    std::string rid = http.get_header_value("X-Request-Id");
    if (rid.empty() || rid.size() > 100) rid = RandomHex(24);
    p->req.set_request_id(rid);
    if (chat && !p->max_tokens_given) {
      // OpenAI's default for chat is as long as the context allows; pdq
      // reserves KV for prompt + max_tokens up front, so it is capped.
      grpc::ClientContext ctx;
      Authorize(http, &ctx);
      v1::TokenizeRequest treq;
      *treq.mutable_chat() = p->req.chat();
      v1::TokenizeResponse tresp;
      grpc::Status s = stub_->Tokenize(&ctx, treq, &tresp);
      if (!s.ok()) return SendError(res, FromGrpc(s));
      p->req.set_max_tokens(std::max<int32_t>(
          1,
          std::min<int32_t>(o_.default_chat_max_tokens, info->max_context() - tresp.ids_size())));
    }
    const std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", rid);
    LogLine(
        absl::StrCat("request ", rid, ": HTTP POST ", http.path, p->stream ? ", streamed" : ""));
    auto stream = std::make_shared<GenerateStream>(*stub_, p->req, o_.request_timeout,
                                                   http.get_header_value("Authorization"));
    const Reply reply{id, ModelId(*info), absl::ToUnixSeconds(absl::Now()), chat};
    if (!p->stream) return Collect(*stream, reply, res);
    // Errors the router finds at once (validation, no worker) get their HTTP
    // status; after that the stream has begun and errors go in it.
    if (stream->Ready(absl::Milliseconds(250)) && !stream->HasMessage() && !stream->status().ok()) {
      return SendStreamError(res, *stream);
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Request-Id", rid);
    res.set_chunked_content_provider("text/event-stream",
                                     [this, stream, p, reply](size_t, httplib::DataSink& sink) {
                                       return StreamEvents(*stream, *p, reply, sink);
                                     });
  }

  struct Reply {
    std::string id, model;
    int64_t created;
    bool chat;
    json Envelope(bool chunk) const {
      return {{"id", id},
              {"object",
               chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", model}};
    }
    json Choice(const std::string& text, const json& finish, bool chunk) const {
      json c = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
      if (!chat) {
        c["text"] = text;
      } else if (chunk) {
        c["delta"] = finish.is_null() ? json({{"content", text}}) : json::object();
      } else {
        c["message"] = {{"role", "assistant"}, {"content", text}};
      }
      return c;
    }
    static json Usage(const v1::GenerateSummary& s) {
      return {{"prompt_tokens", s.prompt_tokens()},
              {"completion_tokens", s.output_tokens()},
              {"total_tokens", s.prompt_tokens() + s.output_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens()}}}};
    }
  };

  void Collect(GenerateStream& stream, const Reply& reply, httplib::Response& res) {
    std::string text;
    v1::GenerateSummary summary;
    v1::GenerateResponse m;
    // The request's deadline bounds this loop.
    for (GenerateStream::Event e;
         (e = stream.Next(absl::Seconds(60), &m)) != GenerateStream::Event::kDone;) {
      if (e == GenerateStream::Event::kTimeout) continue;
      if (m.has_delta()) text += m.delta().text();
      if (m.has_summary()) summary = m.summary();
    }
    if (!stream.status().ok()) return SendStreamError(res, stream);
    json out = reply.Envelope(false);
    out["choices"] =
        json::array({reply.Choice(text, FinishReason(summary.finish_reason()), false)});
    out["usage"] = Reply::Usage(summary);
    res.set_header("X-Request-Id", summary.request_id());
    res.set_content(Dump(out), "application/json");
  }

  bool StreamEvents(GenerateStream& stream, const Parsed& p, const Reply& reply,
                    httplib::DataSink& sink) {
    auto send = [&](const json& event) {
      const std::string s = absl::StrCat("data: ", Dump(event), "\n\n");
      return sink.write(s.data(), s.size());
    };
    auto gone = [&] {
      LogLine(absl::StrCat("request ", p.req.request_id(), ": the HTTP client left; cancelling"));
      stream.Cancel();
      return false;
    };
    if (reply.chat) {
      json first = reply.Envelope(true);
      json choice = {{"index", 0},
                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                     {"finish_reason", nullptr},
                     {"logprobs", nullptr}};
      first["choices"] = json::array({choice});
      if (!send(first)) return gone();
    }
    v1::GenerateSummary summary;
    v1::GenerateResponse m;
    for (;;) {
      const GenerateStream::Event e = stream.Next(o_.keepalive, &m);
      if (e == GenerateStream::Event::kDone) break;
      if (e == GenerateStream::Event::kTimeout) {
        if (!sink.write(": keep-alive\n\n", 14)) return gone();
        continue;
      }
      if (m.has_summary()) summary = m.summary();
      if (!m.has_delta() || m.delta().text().empty()) continue;
      json chunk = reply.Envelope(true);
      chunk["choices"] = json::array({reply.Choice(m.delta().text(), nullptr, true)});
      if (!send(chunk)) return gone();
    }
    if (const grpc::Status s = stream.status(); !s.ok()) {
      send(ErrorJson(FromGrpc(s)));
    } else {
      json last = reply.Envelope(true);
      last["choices"] =
          json::array({reply.Choice("", FinishReason(summary.finish_reason()), true)});
      if (!send(last)) return false;
      if (p.include_usage) {
        json usage = reply.Envelope(true);
        usage["choices"] = json::array();
        usage["usage"] = Reply::Usage(summary);
        if (!send(usage)) return false;
      }
    }
    static constexpr char kDone[] = "data: [DONE]\n\n";
    sink.write(kDone, sizeof kDone - 1);
    sink.done();
    return true;
  }

  const OpenAiHttpOptions o_;
  std::unique_ptr<v1::Pdq::Stub> stub_;
  const int64_t created_ = absl::ToUnixSeconds(absl::Now());
  std::unique_ptr<server::HttpServer> server_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> ServeOpenAiHttp(
    const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> pdq) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("max_connections must be at least 1");
  }
  auto server = std::make_unique<Server>(options, std::move(pdq));
  if (absl::Status s = server->Start(); !s.ok()) return s;
  return server;
}

}  // namespace pdq::router
