#include "router/router.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/prefix_hash.h"
#include "gguf/gguf.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "pdq/v1/worker.grpc.pb.h"
#include "policy/route.h"
#include "policy/traffic_split.h"
#include "router/admission.h"
#include "router/kv_books.h"
#include "router/openai_http.h"
#include "server/grpc_util.h"
#include "server/metrics.h"
#include "server/response_stream.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace pdq::router {
namespace {

using server::ToGrpc;
namespace v1 = pdq::v1;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// "prefill" for ROLE_PREFILL; "w4a16" for PRECISION_W4A16.
std::string RoleLabel(v1::Role r) { return absl::AsciiStrToLower(v1::Role_Name(r).substr(5)); }
std::string PrecisionLabel(v1::Precision p) {
  return absl::AsciiStrToLower(v1::Precision_Name(p).substr(10));
}

// ---- Registry ----------------------------------------------------------------

struct Worker {
  v1::WorkerInfo info;
  v1::WorkerLoad load;
  absl::Time last_seen;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::DecodeWorker::Stub> decode;
  std::unique_ptr<v1::PrefillWorker::Stub> prefill;
  // Requests the router sent and not yet finished; at a prefill worker, until
  // their Prefill call answered (guarded by the registry).
  int64_t in_flight = 0;
  // The router's books of its KV blocks (prompt + max_tokens, less the
  // cached prefix, of each request sent) and streams between heartbeats
  // (router/kv_books.h; Registry::RoomFor).
  KvBooks books;
  // The block hashes its prefix cache holds, as its heartbeats said.
  absl::flat_hash_set<uint64_t> cached;
};

// A request's KV blocks counted against a decode worker's free ones until
// a heartbeat lists them as taken (Registry::Pick, Heartbeat, Done).
struct KvBooking {
  std::string request_id;
  int64_t blocks = 0;
};

// What the router knows of a request when it picks workers for it: its
// prompt's block hashes (for the workers' prefix caches), its KV blocks and
// its client.
struct RouteRequest {
  std::vector<uint64_t> hashes;
  int64_t prompt_tokens = 0;
  int64_t block_tokens = 16;
  int64_t kv_blocks = 0;  // prompt + max_tokens, in blocks
  std::string client_id;
  std::string request_id;  // the router's id for it (KvBooking)
};

class Registry {
 public:
  Registry(const RouterOptions& o, server::Dialing workers)
      : options_(o), dial_(std::move(workers)) {}

  absl::Status Register(const v1::WorkerInfo& info) {
    if (info.worker_id().empty() || info.worker_id().size() > 128) {
      return absl::InvalidArgumentError("worker_id must have 1 to 128 bytes");
    }
    if (!v1::Role_IsValid(info.role()) || info.role() == v1::ROLE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("unknown role ", info.role()));
    }
    if (!v1::Precision_IsValid(info.precision()) || info.precision() == v1::PRECISION_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("unknown precision ", info.precision()));
    }
    if (info.address().empty()) return absl::InvalidArgumentError("address is required");
    if (info.role() != v1::ROLE_BOTH && info.kv_address().empty()) {
      return absl::InvalidArgumentError("kv_address is required for prefill and decode workers");
    }
    if (info.vocab_size() <= 0 || info.max_context() <= 0) {
      return absl::InvalidArgumentError("vocab_size and max_context must be positive");
    }
    if (!info.pool().empty() && !policy::ValidPoolName(info.pool())) {
      return absl::InvalidArgumentError("pool must have 1 to 64 characters of A-Z a-z 0-9 . _ -");
    }
    auto w = std::make_shared<Worker>();
    w->info = info;
    w->last_seen = absl::Now();
    w->channel = server::Dial(info.address(), dial_);
    w->decode = v1::DecodeWorker::NewStub(w->channel);
    w->prefill = v1::PrefillWorker::NewStub(w->channel);
    std::lock_guard lock(mu_);
    if (!workers_.empty()) {
      const v1::WorkerInfo& any = workers_.begin()->second->info;
      if (any.vocab_size() != info.vocab_size() || any.kv_layout() != info.kv_layout()) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker ", info.worker_id(),
                         " serves another model or KV cache (its vocabulary or KV layout: model, "
                         "shape, RoPE, --kv-dtype or block size, differs) than the workers "
                         "already registered"));
      }
    }
    workers_[info.worker_id()] = std::move(w);
    LogLine(absl::StrCat("worker ", info.worker_id(), " registered: ", v1::Role_Name(info.role()),
                         " ", v1::Precision_Name(info.precision()),
                         info.pool().empty() ? "" : absl::StrCat(" in pool ", info.pool()), " at ",
                         info.address(),
                         info.kv_address().empty()
                             ? ""
                             : absl::StrCat(", KV ", info.kv_transport(), " ", info.kv_address())));
    return absl::OkStatus();
  }

  bool Heartbeat(const std::string& id, const v1::WorkerLoad& load,
                 const v1::PrefixCacheUpdate& cache) {
    std::lock_guard lock(mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return false;
    Worker& w = *it->second;
    w.load = load;
    w.load.clear_kv_taken_request_ids();
    w.load.clear_kv_released_request_ids();
    w.books.Heartbeat(load.kv_taken_request_ids(), load.kv_taken_reported(),
                      load.kv_released_request_ids(), load.kv_released_reported());
    absl::flat_hash_set<uint64_t>& held = it->second->cached;
    if (cache.full()) held.clear();
    for (uint64_t h : cache.removed()) held.erase(h);
    held.insert(cache.stored().begin(), cache.stored().end());
    it->second->last_seen = absl::Now();
    return true;
  }

  void Deregister(const std::string& id) {
    std::lock_guard lock(mu_);
    if (workers_.erase(id) > 0) LogLine(absl::StrCat("worker ", id, " deregistered"));
  }

  // A decode worker that left rotation to drain and asked for its streams
  // to be moved: a stream of it that starts decoding later moves too.
  // Remembered for an hour (worker ids are unique per process start).
  void MarkDraining(const std::string& id) {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    absl::erase_if(draining_, [&](const auto& e) { return now - e.second > absl::Hours(1); });
    draining_[id] = now;
  }
  bool Draining(const std::string& id) const {
    std::lock_guard lock(mu_);
    return draining_.contains(id);
  }

  bool Alive(const Worker& w, absl::Time now) const {
    return now - w.last_seen <= options_.heartbeat_interval * options_.missed_heartbeats_allowed;
  }

  // Live workers of `role`; of every role when unspecified.
  int live(v1::Role role = v1::ROLE_UNSPECIFIED) const {
    std::lock_guard lock(mu_);
    int n = 0;
    const absl::Time now = absl::Now();
    for (const auto& [id, w] : workers_) {
      n += Alive(*w, now) && (role == v1::ROLE_UNSPECIFIED || w->info.role() == role);
    }
    return n;
  }

  // Every live worker, as last heard from.
  std::vector<v1::WorkerStatus> Statuses() const {
    std::lock_guard lock(mu_);
    std::vector<v1::WorkerStatus> out;
    const absl::Time now = absl::Now();
    for (const auto& [id, w] : workers_) {
      if (!Alive(*w, now)) continue;
      v1::WorkerStatus& st = out.emplace_back();
      st.set_worker_id(id);
      st.set_role(RoleLabel(w->info.role()));
      st.set_precision(PrecisionLabel(w->info.precision()));
      st.set_address(w->info.address());
      st.set_metrics_address(w->info.metrics_address());
      st.set_pool(w->info.pool());
      st.set_kv_blocks_free(w->load.kv_blocks_free());
      st.set_kv_blocks_total(w->info.kv_blocks_total());
      st.set_queued_prompt_tokens(w->load.queued_prompt_tokens());
      st.set_active_sequences(w->load.active_sequences());
      st.set_weight_bytes(w->load.weight_bytes());
      st.set_kv_used_bytes(w->load.kv_used_bytes());
      st.set_workspace_bytes(w->load.workspace_bytes());
      st.set_resident_bytes(w->load.resident_bytes());
      st.set_peak_resident_bytes(w->load.peak_resident_bytes());
    }
    return out;
  }

  // Any live worker's description of the model.
  std::optional<v1::WorkerInfo> Model() const {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    for (const auto& [id, w] : workers_) {
      if (Alive(*w, now)) return w->info;
    }
    return std::nullopt;
  }

  // The live worker of one of `roles` (in `pool`, unless that is empty)
  // that the request costs least (policy/route.h: the prompt its
  // prefix cache lacks against its work), preferring those not in `avoid`
  // and whose connection works; with `wanted_only`, none rather than one of
  // those. Prefill workers are not decoding. Counts the pick as one more
  // request in flight.
  std::shared_ptr<Worker> Pick(std::initializer_list<v1::Role> roles,
                               const absl::flat_hash_set<std::string>& avoid, bool by_tokens,
                               const std::string& pool, const RouteRequest& request,
                               bool wanted_only = false, KvBooking* booking = nullptr) {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    const double load_tokens = options_.cache_load_tokens;
    std::vector<std::shared_ptr<Worker>> workers;
    std::vector<policy::RouteCandidate> candidates;
    for (const auto& [id, w] : workers_) {
      if (!Alive(*w, now) || std::find(roles.begin(), roles.end(), w->info.role()) == roles.end() ||
          (!pool.empty() && w->info.pool() != pool)) {
        continue;
      }
      policy::RouteCandidate& c = candidates.emplace_back();
      // A worker whose connection just broke (killed, restarting) is still
      // "alive" until its heartbeats lapse; use it only if nothing else is.
      c.unwanted = avoid.contains(id) ||
                   w->channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE;
      c.cached_tokens = policy::CachedPrefixTokens(request.hashes, w->cached, request.block_tokens);
      c.queued_tokens = w->load.queued_prompt_tokens();
      c.load = (by_tokens ? 0.0 : (double)w->load.active_sequences()) + (double)w->in_flight;
      c.kv_blocks_free = w->load.kv_blocks_free();
      c.affinity = policy::Affinity(request.client_id, id);
      // A stream for a worker with a full decode batch: only if none has room.
      if (booking != nullptr && StreamRoomLocked(*w) == 0) c.unwanted = true;
      workers.push_back(w);
    }
    const int i = policy::BestCandidate(candidates, request.prompt_tokens, load_tokens);
    if (i < 0 || (wanted_only && candidates[i].unwanted)) return nullptr;
    ++workers[i]->in_flight;
    if (booking != nullptr) {
      // What it reserves: the blocks its prefix cache lacks.
      const int64_t blocks =
          std::max<int64_t>(0, request.kv_blocks - candidates[i].cached_tokens /
                                                       std::max<int64_t>(1, request.block_tokens));
      *booking = {request.request_id, blocks};
      workers[i]->books.Book(request.request_id, blocks);
    }
    return workers[i];
  }

  // The most of `request`'s prompt that one live worker computing prompts
  // (role both or prefill) holds in its prefix cache, in tokens: what
  // admission leaves out of the request's work (routing prefers that
  // worker, policy/route.h).
  int64_t MostCached(const RouteRequest& request) const {
    if (request.hashes.empty()) return 0;
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    int64_t most = 0;
    for (const auto& [id, w] : workers_) {
      if (!Alive(*w, now) ||
          (w->info.role() != v1::ROLE_BOTH && w->info.role() != v1::ROLE_PREFILL)) {
        continue;
      }
      most = std::max(most,
                      policy::CachedPrefixTokens(request.hashes, w->cached, request.block_tokens));
    }
    return most;
  }

  // AdmissionSnapshot's kv_room_blocks and stream_room for `request`: the
  // most streams a live worker that decodes could take (StreamRoomLocked),
  // and the most KV blocks one of those with room for a stream could give
  // it, its last heartbeat's free blocks corrected by the router's books
  // (Worker::kv_*).
  struct Room {
    int64_t kv_blocks = -1, streams = -1;
  };
  Room RoomFor(const RouteRequest& request) const {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    Room most;
    bool unbounded = false;
    for (const auto& [id, w] : workers_) {
      if (!Alive(*w, now) ||
          (w->info.role() != v1::ROLE_BOTH && w->info.role() != v1::ROLE_DECODE)) {
        continue;
      }
      const int64_t streams = StreamRoomLocked(*w);
      if (streams < 0) {
        unbounded = true;
      } else {
        most.streams = std::max(most.streams, streams);
      }
      if (streams == 0 || w->load.kv_blocks_total() <= 0) continue;
      // The prompt's cached blocks count as room (a sequence may hold
      // them; else they are among the free ones, and this is optimistic:
      // the worker's own check is exact). Never below 0 (overbooked: none)
      // nor above the worker's total.
      const int64_t cached =
          policy::CachedPrefixTokens(request.hashes, w->cached, request.block_tokens) /
          std::max<int64_t>(1, request.block_tokens);
      const int64_t room =
          w->load.kv_blocks_free() - w->books.booked_blocks() + w->books.credited_blocks() + cached;
      most.kv_blocks =
          std::max(most.kv_blocks, std::clamp<int64_t>(room, 0, w->load.kv_blocks_total()));
    }
    if (unbounded) most.streams = -1;
    return most;
  }

  // `w` is computing or receiving the prompt: count its blocks as cached
  // there, so a follow-up sent before the worker's next heartbeat says so
  // still finds them (heartbeats correct this when the request fails or the
  // blocks are evicted).
  void NoteCached(const std::shared_ptr<Worker>& w, const RouteRequest& request) {
    std::lock_guard lock(mu_);
    w->cached.insert(request.hashes.begin(), request.hashes.end());
  }

  // The leading tokens of `request`'s prompt that `w`'s prefix cache
  // holds, as the router knows it.
  int64_t CachedTokens(const Worker& w, const RouteRequest& request) const {
    std::lock_guard lock(mu_);
    return policy::CachedPrefixTokens(request.hashes, w.cached, request.block_tokens);
  }

  // The pools of the live workers, sorted.
  std::vector<std::string> Pools() const {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    std::set<std::string> pools;
    for (const auto& [id, w] : workers_) {
      if (Alive(*w, now)) pools.insert(w->info.pool());
    }
    return std::vector<std::string>(pools.begin(), pools.end());
  }

  const RouterOptions& options() const { return options_; }

  // What the live workers that compute prompts (prefill and both) measured
  // they prefill a second, together.
  double PrefillRate() const {
    std::lock_guard lock(mu_);
    const absl::Time now = absl::Now();
    double rate = 0;
    for (const auto& [id, w] : workers_) {
      if (Alive(*w, now) &&
          (w->info.role() == v1::ROLE_PREFILL || w->info.role() == v1::ROLE_BOTH)) {
        rate += w->load.prefill_tokens_per_second();
      }
    }
    return rate;
  }

  // The request Pick gave `w` ended there; `booking`: its KV blocks, which
  // stop counting against the worker's free ones (credited until a
  // heartbeat lists them freed, when one had listed them taken: KvBooks).
  void Done(const std::shared_ptr<Worker>& w, const KvBooking& booking = {}) {
    if (w == nullptr) return;
    std::lock_guard lock(mu_);
    --w->in_flight;
    if (booking.request_id.empty()) return;
    w->books.Done(booking.request_id, booking.blocks);
  }

 private:
  // How many more streams `w` takes before it holds the bound
  // (RouterOptions::max_streams_per_worker; -1: no bound): by its last
  // heartbeat and the books since, and never fewer than the requests this
  // router has in flight there.
  int64_t StreamRoomLocked(const Worker& w) const {
    const int64_t bound = options_.max_streams_per_worker == 0  ? w.info.max_decode_batch()
                          : options_.max_streams_per_worker > 0 ? options_.max_streams_per_worker
                                                                : 0;
    if (bound <= 0) return -1;
    int64_t held = w.in_flight;
    if (w.load.kv_taken_reported()) {
      held = std::max(
          held, w.load.sequences_held() + w.books.booked_streams() - w.books.credited_streams());
    }
    return std::max<int64_t>(0, bound - held);
  }

  const RouterOptions options_;
  const server::Dialing dial_;  // how the router reaches workers
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Worker>> workers_;
  absl::flat_hash_map<std::string, absl::Time> draining_;
};

class GenerateCall;

// The Generate calls in flight, so that the streams a decode worker serves
// can be moved to others (live migration) when it drains or an operator
// asks.
class LiveCalls {
 public:
  void Add(const std::shared_ptr<GenerateCall>& call);
  // Starts moving every stream served by `worker_id`; how many started.
  int MigrateFrom(const std::string& worker_id);

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<GenerateCall>> calls_;  // guarded by mu_
  size_t prune_at_ = 64;
};

// With TLS, only peers holding a certificate signed by the CA (workers) may
// register, heartbeat or deregister: anyone else could take requests or
// drop workers from rotation.
class RegistryService : public v1::Registry::CallbackService {
 public:
  RegistryService(Registry& r, LiveCalls& calls, const RouterOptions& o,
                  bool require_certificates)
      : r_(r), calls_(calls), o_(o), require_certificates_(require_certificates) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, "register", req->worker().worker_id(), reactor)) return reactor;
    absl::Status s = r_.Register(req->worker());
    resp->set_heartbeat_interval_ms((int32_t)absl::ToInt64Milliseconds(o_.heartbeat_interval));
    resp->set_missed_heartbeats_allowed(o_.missed_heartbeats_allowed);
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, "heartbeat", req->worker_id(), reactor)) return reactor;
    resp->set_registered(r_.Heartbeat(req->worker_id(), req->load(), req->cache()));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* ctx,
                                       const v1::DeregisterRequest* req,
                                       v1::DeregisterResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, "deregister", req->worker_id(), reactor)) return reactor;
    r_.Deregister(req->worker_id());
    if (req->migrate_streams()) {
      r_.MarkDraining(req->worker_id());
      const int n = calls_.MigrateFrom(req->worker_id());
      resp->set_migrating(n);
      LogLine(absl::StrCat("worker ", req->worker_id(), " is draining: moving ", n,
                           " of its streams to other decode workers"));
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // An operator's call (pdq migrate): with TLS, a client certificate.
  grpc::ServerUnaryReactor* MigrateStreams(grpc::CallbackServerContext* ctx,
                                           const v1::MigrateStreamsRequest* req,
                                           v1::MigrateStreamsResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, "migrate the streams of", req->worker_id(), reactor)) return reactor;
    const int n = calls_.MigrateFrom(req->worker_id());
    resp->set_migrating(n);
    LogLine(absl::StrCat("asked to move the streams of worker ", req->worker_id(), ": moving ", n));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // Finishes the call with UNAUTHENTICATED when a certificate is required
  // and the peer showed none.
  bool Authorized(const grpc::CallbackServerContext& ctx, const char* what,
                  const std::string& worker_id, grpc::ServerUnaryReactor* reactor) {
    if (!require_certificates_ || server::PeerHasCertificate(ctx)) return true;
    LogLine(absl::StrCat("refused to ", what, " worker '",
                         absl::CHexEscape(worker_id.substr(0, 128)), "' from ", ctx.peer(),
                         ": no client certificate"));
    reactor->Finish(grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "workers must present a certificate signed by the router's CA (--tls-cert, --tls-key)"));
    return false;
  }

  Registry& r_;
  LiveCalls& calls_;
  const RouterOptions o_;
  const bool require_certificates_;
};

// ---- One Generate call ---------------------------------------------------------

// The router's own figures (server/metrics.h has those every process keeps).
struct RouterMetrics {
  server::Gauge& in_flight = server::Metrics::Global().GetGauge(
      "pdq_requests_in_flight", "Generate calls started and not yet answered.");
  server::Counter& retries = server::Metrics::Global().GetCounter(
      "pdq_retries_total", "Attempts retried on other workers after a failure before any token.");
  server::Counter& prompt_tokens = server::Metrics::Global().GetCounter(
      "pdq_prompt_tokens_total", "Prompt tokens of the requests answered OK.");
  server::Counter& output_tokens = server::Metrics::Global().GetCounter(
      "pdq_output_tokens_total", "Tokens streamed to clients.");
  server::Counter& refused(Refusal r) {
    return server::Metrics::Global().GetCounter(
        "pdq_requests_refused_total",
        "Requests refused at admission (RESOURCE_EXHAUSTED / HTTP 429), by reason: queue_full "
        "(the bound on requests waiting for their first token), ttft (predicted time to first "
        "token over the target or the deadline), rate_limit (the client's token bucket), kv_full "
        "(no worker's KV cache has room for prompt + max_tokens), batch_full (every worker that "
        "decodes holds a full decode batch of streams).",
        {{"reason", RefusalName(r)}});
  }
  server::Counter& pool_fallbacks(const std::string& pool) {
    return server::Metrics::Global().GetCounter(
        "pdq_split_fallbacks_total",
        "Requests whose A/B pool had no live decode worker, served by another pool.",
        {{"pool", pool}});
  }
  server::Counter& migrations(const char* outcome) {
    return server::Metrics::Global().GetCounter(
        "pdq_migrations_total",
        "Decoding streams the router set out to move to another decode worker (live "
        "migration), by outcome: moved (with its KV), stayed (no other decode worker took it; it "
        "decodes on where it was), failed (the request failed while moving).",
        {{"outcome", outcome}});
  }
  server::Counter& recomputes = server::Metrics::Global().GetCounter(
      "pdq_recomputes_total",
      "Streams whose decode worker was lost mid-stream, computed again on another worker from "
      "the prompt and the tokens sent (the client sees a pause, not an error).");
  server::Histogram& migration_pause = server::Metrics::Global().GetHistogram(
      "pdq_migration_pause_seconds",
      "A moved stream's pause: from suspending it on its decode worker to its KV verified on "
      "the new one.",
      server::LatencyBuckets());
  static RouterMetrics& Get() {
    static RouterMetrics* m = new RouterMetrics;
    return *m;
  }
};

// Admission's books (router/admission.h): the requests admitted and not
// yet at their first token, and each client's rate-limit bucket.
class AdmissionBook {
 public:
  AdmissionBook(const AdmissionOptions& o, const Registry& registry)
      : o_(o), registry_(registry), limiter_(o) {}

  // Decides on a request and, when it is taken, books its prompt as waiting.
  // `room`: the workers' room for this request (AdmissionSnapshot's
  // kv_room_blocks and stream_room).
  AdmissionDecision Admit(const AdmissionRequest& r, const std::string& client,
                          double request_tokens, const Registry::Room& room) {
    const double rate = registry_.PrefillRate();
    std::lock_guard lock(mu_);
    AdmissionSnapshot snap = snap_;
    snap.prefill_tokens_per_second = rate;
    snap.kv_room_blocks = room.kv_blocks;
    snap.stream_room = room.streams;
    AdmissionDecision d = router::Admit(o_, snap, r);
    if (d.admitted()) {
      AdmissionDecision limited = limiter_.Take(client, request_tokens, absl::Now());
      if (!limited.admitted()) return limited;
      CountWaitingLocked(r, +1);
    }
    return d;
  }
  // An admitted request's first token came `actual` after it arrived.
  void ObserveFirstToken(absl::Duration uncorrected, absl::Duration actual) {
    std::lock_guard lock(mu_);
    router::ObserveTtft(uncorrected, actual, &snap_.ttft_correction);
  }
  // The request booked with `r` has its first token or ended.
  void Unbook(const AdmissionRequest& r) {
    std::lock_guard lock(mu_);
    CountWaitingLocked(r, -1);
  }

 private:
  // Adds (+1) or takes away (-1) a request from those waiting.
  void CountWaitingLocked(const AdmissionRequest& r, int sign) {
    snap_.waiting_requests += sign;
    (r.priority == Priority::kBatch ? snap_.waiting_batch_tokens
                                    : snap_.waiting_interactive_tokens) += sign * r.prompt_tokens;
  }

  const AdmissionOptions o_;
  const Registry& registry_;
  std::mutex mu_;
  AdmissionSnapshot snap_;  // guarded by mu_
  RateLimiter limiter_;     // guarded by mu_
};


// One try at serving the request: a decode worker (and, unless it runs both
// phases, a reservation there and a prefill worker).
struct Attempt {
  int number = 0;
  std::shared_ptr<Worker> decode, prefill;
  KvBooking kv;  // at the decode worker
  grpc::ClientContext reserve_ctx, prefill_ctx, decode_ctx;
  v1::ReserveRequest reserve_req;
  v1::ReserveResponse reserve_resp;
  v1::PrefillRequest prefill_req;
  v1::PrefillResponse prefill_resp;
  v1::DecodeRequest decode_req;
  bool failed = false;
  bool reserved = false;  // the decode worker holds a reservation for it
  bool prefilled = false;  // the Prefill call answered OK
  // The prefill worker counts this attempt in flight (from its pick until
  // the Prefill call answers: its prompt is no longer that worker's work).
  bool prefill_counted = false;
  // The decode worker no longer counts it (Registry::Done): from its
  // summary on, before the call completes and the client hears.
  bool decode_released = false;
  int open_calls = 0;     // worker calls not yet completed
  // The Reserve call is left to complete: cancelling it could lose a
  // reservation the worker made; OnReserved releases it instead.
  void CancelAll() {
    prefill_ctx.TryCancel();
    decode_ctx.TryCancel();
  }
};

// What routing and admission know of `prompt` (the request's, or one to
// compute again): its block hashes under the workers' KV layout and the
// request's cache salt, as the workers' prefix caches name blocks, and its
// KV blocks with `max_tokens` more (what a worker reserves for it).
RouteRequest RouteFor(const Registry& registry, const std::vector<int32_t>& prompt,
                      const v1::GenerateRequest& req, int64_t max_tokens) {
  RouteRequest route;
  route.prompt_tokens = (int64_t)prompt.size();
  route.client_id = req.client_id();
  // Every live worker shares one KV layout (Register checks).
  if (std::optional<v1::WorkerInfo> m = registry.Model(); m && m->block_tokens() > 0) {
    route.block_tokens = m->block_tokens();
    route.kv_blocks =
        (route.prompt_tokens + max_tokens + route.block_tokens - 1) / route.block_tokens;
    route.hashes =
        PrefixBlockHashes(PrefixSeed(m->kv_layout(), req.cache_salt()), prompt, route.block_tokens);
  }
  return route;
}

class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  // `pool`: the arm of an A/B split this request was given; empty when
  // there is no split.
  GenerateCall(Registry& registry, AdmissionBook& book, AdmissionRequest booked,
               absl::Duration predicted_ttft, std::shared_ptr<server::ResponseStream> out,
               std::string request_id, std::vector<int32_t> prompt, v1::GenerateRequest req,
               std::chrono::system_clock::time_point deadline, std::string pool, RouteRequest route)
      : registry_(registry),
        book_(book),
        booked_(booked),
        predicted_ttft_(predicted_ttft),
        out_(std::move(out)),
        request_id_(std::move(request_id)),
        prompt_(std::move(prompt)),
        req_(std::move(req)),
        deadline_(deadline),
        start_(absl::Now()),
        pool_(std::move(pool)),
        served_pool_(pool_),
        route_(std::move(route)) {}

  void Start() {
    RouterMetrics::Get().in_flight.Add(1);
    std::lock_guard lock(mu_);
    StartAttemptLocked();
  }

  // The client cancelled or took a message.
  void OnClientChange() {
    if (!out_->cancelled()) return;
    std::lock_guard lock(mu_);
    // A cancel can come after the call finished: the client's RST_STREAM
    // racing the status, or the summary's write failing. Its attempt is
    // then done (or was abandoned when it failed), and one whose calls all
    // ended has let go of its decode worker (EndAttemptIfIdleLocked):
    // nothing is left to stop or release.
    if (finished_) return;
    if (attempt_) AbandonLocked(attempt_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
  }

  // Live migration: when this stream is decoding on decode worker
  // `worker_id`, starts moving it, with its KV, to another decode worker
  // with room; false when there is nothing to move.
  bool MigrateFrom(const std::string& worker_id) {
    std::lock_guard lock(mu_);
    return MigrateLocked(worker_id);
  }

 private:
  // One move of the stream (live migration).
  struct Migration {
    std::shared_ptr<Attempt> source, target;
    grpc::ClientContext suspend_ctx, send_ctx;
    bool source_ended = false;  // the source ended its stream: it let go
    int64_t generated = 0;      // tokens the source sent (Suspend's account)
    v1::SuspendRequest suspend_req;
    v1::SuspendResponse suspend_resp;
    v1::SendKvRequest send_req;
    v1::SendKvResponse send_resp;
    absl::Time start;
  };

  class DecodeReader : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    DecodeReader(std::shared_ptr<GenerateCall> call, std::shared_ptr<Attempt> a)
        : call_(std::move(call)), a_(std::move(a)) {}
    void Start() {
      a_->decode->decode->async()->Decode(&a_->decode_ctx, &a_->decode_req, this);
      StartRead(&msg_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      call_->OnDecodeMessage(*a_, msg_);
      StartRead(&msg_);
    }
    void OnDone(const grpc::Status& s) override {
      call_->OnDecodeDone(a_, s);
      delete this;
    }

   private:
    std::shared_ptr<GenerateCall> call_;
    std::shared_ptr<Attempt> a_;
    v1::GenerateResponse msg_;
  };

  // Picks an attempt's workers from one pool (any pool without a split): a
  // decode worker, and a prefill worker unless the decode worker does both.
  // With `wanted_only`, none of those the last attempt avoided or whose
  // connection is failing. False, holding no worker, when the pool cannot
  // serve the request whole; `*missing` then names the phase it lacks.
  bool PickInPoolLocked(Attempt& a, const std::string& pool, bool wanted_only,
                        const char** missing) {
    a.decode = registry_.Pick({v1::ROLE_DECODE, v1::ROLE_BOTH}, avoid_, false, pool, route_,
                              wanted_only, &a.kv);
    if (a.decode == nullptr) {
      *missing = "decode";
      return false;
    }
    if (a.decode->info.role() == v1::ROLE_BOTH) return true;
    // Under a split both phases come from one pool: an arm is a precision
    // pair, and mixing arms would measure neither.
    a.prefill = registry_.Pick({v1::ROLE_PREFILL}, avoid_, true,
                               pool_.empty() ? "" : a.decode->info.pool(), route_, wanted_only);
    a.prefill_counted = a.prefill != nullptr;
    if (a.prefill != nullptr) return true;
    registry_.Done(a.decode, a.kv);
    a.decode = nullptr;
    *missing = "prefill";
    return false;
  }

  // The prompt an attempt computes: the client's, or after a lost decode
  // worker the client's plus every token sent (RecomputeLocked).
  const std::vector<int32_t>& AttemptPromptLocked() const {
    return recompute_prompt_.empty() ? prompt_ : recompute_prompt_;
  }

  // `retry`: after a failed attempt (counted in pdq_retries_total when a
  // worker takes it).
  void StartAttemptLocked(bool retry = false) {
    const std::vector<int32_t>& prompt = AttemptPromptLocked();
    if (route_.prompt_tokens == 0) {
      // A recomputed prompt holds the tokens sent: they come off max_tokens
      // (as in its reservation).
      route_ = RouteFor(registry_, prompt, req_, req_.max_tokens() - (int64_t)sent_tokens_.size());
    }
    route_.request_id = request_id_;  // its KV bookings' key
    auto a = std::make_shared<Attempt>();
    a->number = ++attempts_;
    attempt_ = a;
    const char* missing = "decode";
    bool picked;
    // After a refusal for want of room, only a worker that has not refused.
    const bool elsewhere_only = !refused_.ok();
    if (pool_.empty()) {
      picked = PickInPoolLocked(*a, "", elsewhere_only, &missing);
    } else {
      picked = PickInPoolLocked(*a, pool_, true, &missing);
      const char* arm_missing = missing;
      if (!picked) {
        // The request's arm cannot serve it (a phase with no live worker, or
        // only one that just failed): another pool serves it rather than
        // fail it (availability first), and the metrics say which did.
        for (const std::string& other : registry_.Pools()) {
          if (other != pool_ && (picked = PickInPoolLocked(*a, other, true, &missing))) break;
        }
      }
      if (!picked && !elsewhere_only) {
        // Nothing better: a worker the last attempt avoided, own pool first.
        picked = PickInPoolLocked(*a, pool_, false, &missing);
        for (const std::string& other : registry_.Pools()) {
          if (picked) break;
          if (other != pool_) picked = PickInPoolLocked(*a, other, false, &missing);
        }
      }
      if (picked && a->decode->info.pool() != pool_) {
        RouterMetrics::Get().pool_fallbacks(pool_).Add();
        LogLine(absl::StrCat("request ", request_id_, ": pool ", pool_, " has no usable ",
                             arm_missing, " worker; pool '", a->decode->info.pool(),
                             "' serves it"));
      }
      if (!picked) missing = arm_missing;
    }
    if (!picked && elsewhere_only) {
      FinishLocked(refused_);  // no other worker: the refusal, as it came
      return;
    }
    if (!picked) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                pool_.empty()
                                    ? absl::StrCat("no ", missing, " worker is available")
                                    : absl::StrCat("no ", missing, " worker is available in pool '",
                                                   pool_, "' or any other")));
      return;
    }
    if (retry) RouterMetrics::Get().retries.Add();
    if (!pool_.empty()) served_pool_ = a->decode->info.pool();
    for (grpc::ClientContext* c : {&a->reserve_ctx, &a->prefill_ctx, &a->decode_ctx}) {
      if (deadline_ != std::chrono::system_clock::time_point::max()) c->set_deadline(deadline_);
    }
    v1::DecodeRequest& d = a->decode_req;
    d.set_request_id(request_id_);
    *d.mutable_sampling() = req_.sampling();
    d.set_max_tokens(req_.max_tokens());
    *d.mutable_stop() = req_.stop();
    *d.mutable_stop_token_ids() = req_.stop_token_ids();
    d.set_ignore_eos(req_.ignore_eos());
    d.set_priority(req_.priority());
    d.set_stream_key(stream_key_);
    if (!recompute_prompt_.empty()) {
      v1::ResumeState* resume = d.mutable_resume();
      resume->set_prompt_tokens((int32_t)prompt_.size());
      resume->mutable_generated()->Add(sent_tokens_.begin(), sent_tokens_.end());
      resume->set_recomputed(true);
    }
    if (a->decode->info.role() == v1::ROLE_BOTH) {
      for (int32_t t : prompt) d.add_prompt(t);
      d.set_cache_salt(req_.cache_salt());
      StartDecodeLocked(a);
      return;
    }
    a->reserve_req.set_request_id(request_id_);
    a->reserve_req.set_prompt_tokens((int64_t)prompt.size());
    a->reserve_req.set_max_tokens(req_.max_tokens() - (int32_t)sent_tokens_.size());
    a->reserve_req.set_kv_layout(a->prefill->info.kv_layout());
    for (int32_t t : prompt) a->reserve_req.add_prompt(t);
    a->reserve_req.set_cache_salt(req_.cache_salt());
    a->reserve_req.set_local_prefill_max_tokens(registry_.options().local_prefill_tokens);
    a->reserve_req.set_kv_writer(PrecisionLabel(a->prefill->info.precision()));
    a->reserve_req.set_prefill_cached_tokens(registry_.CachedTokens(*a->prefill, route_));
    // A fresh stream: a local prefill may start with the reservation (a
    // resumed one's first pick depends on its Decode call's resume state).
    if (recompute_prompt_.empty()) {
      *a->reserve_req.mutable_first_sampling() = req_.sampling();
      a->reserve_req.set_priority(req_.priority());
    }
    ++a->open_calls;
    auto self = shared_from_this();
    a->decode->decode->async()->Reserve(&a->reserve_ctx, &a->reserve_req, &a->reserve_resp,
                                        [self, a](grpc::Status s) { self->OnReserved(a, s); });
  }

  void OnReserved(std::shared_ptr<Attempt> a, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    --a->open_calls;
    if (finished_ || a != attempt_ || a->failed) {
      if (s.ok()) ReleaseLocked(a);
      return EndAttemptIfIdleLocked(a);
    }
    if (!s.ok()) {
      FailAttemptLocked(a, s, "decode worker " + a->decode->info.worker_id() + " reserve", false);
      return;
    }
    a->reserved = true;
    a->decode_req.set_reservation_id(a->reserve_resp.reservation_id());
    if (a->reserve_resp.local_prefill()) {
      // The decode worker holds all but a short suffix and prefills it.
      ReleasePrefillLocked(*a);
      a->prefill = nullptr;
      StartDecodeLocked(a);
      return;
    }
    v1::PrefillRequest& p = a->prefill_req;
    p.set_request_id(request_id_);
    for (int32_t t : AttemptPromptLocked()) p.add_prompt(t);
    // A recomputed stream's next pick continues its sampled sequence.
    if (!recompute_prompt_.empty()) p.set_skip_samples((int32_t)sent_tokens_.size());
    *p.mutable_sampling() = req_.sampling();
    p.set_decode_kv_address(a->reserve_resp.kv_address());
    p.set_decode_kv_transport(a->reserve_resp.kv_transport());
    p.set_reservation_id(a->reserve_resp.reservation_id());
    p.set_transfer_token(a->reserve_resp.transfer_token());
    p.set_decode_cached_tokens(a->reserve_resp.cached_tokens());
    p.set_cache_salt(req_.cache_salt());
    p.set_priority(req_.priority());
    // Prefill and decode start together: neither waits on the other here.
    registry_.NoteCached(a->prefill, route_);
    ++a->open_calls;
    auto self = shared_from_this();
    a->prefill->prefill->async()->Prefill(&a->prefill_ctx, &a->prefill_req, &a->prefill_resp,
                                          [self, a](grpc::Status s) { self->OnPrefilled(a, s); });
    StartDecodeLocked(a);
  }

  // Stops an attempt's worker calls and frees its reservation: a Decode
  // call cancelled before it reached the worker would leave the
  // reservation waiting out its lease.
  void AbandonLocked(const std::shared_ptr<Attempt>& a) {
    a->CancelAll();
    // (An attempt with no call open has let go of its decode worker: its
    // Decode call used or freed the reservation, or its lease frees it.)
    if (a->reserved && a->decode != nullptr) ReleaseLocked(a);
    a->reserved = false;
  }

  // Frees a reservation nobody will use (fire and forget: its lease frees
  // it anyway if this is lost; one already gone is NotFound, harmlessly).
  void ReleaseLocked(const std::shared_ptr<Attempt>& a) {
    struct Release {
      grpc::ClientContext ctx;
      v1::ReleaseRequest req;
      v1::ReleaseResponse resp;
    };
    auto r = std::make_shared<Release>();
    r->req.set_reservation_id(a->reserve_resp.reservation_id());
    r->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ++a->open_calls;
    auto self = shared_from_this();
    a->decode->decode->async()->Release(&r->ctx, &r->req, &r->resp, [self, a, r](grpc::Status) {
      std::lock_guard lock(self->mu_);
      --a->open_calls;
      self->EndAttemptIfIdleLocked(a);
    });
  }

  void StartDecodeLocked(const std::shared_ptr<Attempt>& a) {
    registry_.NoteCached(a->decode, route_);
    ++a->open_calls;
    (new DecodeReader(shared_from_this(), a))->Start();
  }

  void OnPrefilled(std::shared_ptr<Attempt> a, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    --a->open_calls;
    ReleasePrefillLocked(*a);
    a->prefilled = s.ok();
    if (s.ok() && migrations_ == 0 && recomputes_ == 0) {
      prefill_cached_tokens_ = a->prefill_resp.cached_tokens();
    }
    if (!s.ok() && !finished_ && a == attempt_ && !relayed_) {
      FailAttemptLocked(a, s, "prefill worker " + a->prefill->info.worker_id(), true);
      return;
    }
    EndAttemptIfIdleLocked(a);
  }

  void OnDecodeMessage(const Attempt& a, const v1::GenerateResponse& m) {
    std::lock_guard lock(mu_);
    if (finished_ || a.failed) return;
    const bool current = &a == attempt_.get();
    const bool tail = source_ && &a == source_.get() && output_tokens_ < handoff_tokens_;
    const bool incoming = migration_ && migration_->target && &a == migration_->target.get();
    if (!current && !tail && !incoming) return;
    if (incoming || (current && output_tokens_ < handoff_tokens_)) {
      held_.push_back(m);
      return;
    }
    RelayLocked(m);
    if (tail && output_tokens_ >= handoff_tokens_) FlushHeldLocked();
  }

  // To the client: a delta, or the summary kept for the end.
  void RelayLocked(const v1::GenerateResponse& m) {
    if (m.has_delta()) {
      const absl::Time now = absl::Now();
      const int n = m.delta().token_ids_size();
      const bool first = n > 0 && output_tokens_ == 0;
      if (n > 0) {
        if (first) {
          first_token_ = now;
          book_.Unbook(booked_);  // no longer waiting
          book_.ObserveFirstToken(predicted_ttft_, now - start_);
        }
        last_token_ = now;
        output_tokens_ += n;
        sent_tokens_.insert(sent_tokens_.end(), m.delta().token_ids().begin(),
                            m.delta().token_ids().end());
        RouterMetrics::Get().output_tokens.Add(n);
      }
      relayed_ = true;
      out_->SendDelta({m.delta().token_ids().begin(), m.delta().token_ids().end()},
                      m.delta().text());
      // Its decode worker is draining: move it as soon as it decodes.
      if (first && attempt_ && attempt_->decode &&
          registry_.Draining(attempt_->decode->info.worker_id())) {
        MigrateLocked(attempt_->decode->info.worker_id());
      }
    } else if (m.has_summary()) {
      summary_ = m.summary();
      have_summary_ = true;
    }
  }

  // The source's last tokens all came: what the target sent meanwhile, and
  // its end if that came too.
  void FlushHeldLocked() {
    std::vector<v1::GenerateResponse> held;
    held.swap(held_);
    for (const v1::GenerateResponse& m : held) RelayLocked(m);
    if (deferred_done_) {
      std::shared_ptr<Attempt> a = std::move(deferred_done_);
      deferred_done_ = nullptr;
      OnDecodeDoneLocked(a, deferred_status_);
    }
  }

  void OnDecodeDone(std::shared_ptr<Attempt> a, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    --a->open_calls;
    OnDecodeDoneLocked(a, s);
  }

  void OnDecodeDoneLocked(const std::shared_ptr<Attempt>& a, const grpc::Status& s) {
    if (source_ && a == source_ && a != attempt_) {
      // A moved-from stream ends (ABORTED, "migrated") after its last
      // tokens, which must all have come.
      if (!finished_ && output_tokens_ < handoff_tokens_) {
        if (attempt_) AbandonLocked(attempt_);
        FinishLocked(grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("decode worker ", a->decode->info.worker_id(),
                         " ended the stream before its last tokens came (", s.error_message(),
                         ") while it moved to another worker")));
      }
      return EndAttemptIfIdleLocked(a);
    }
    if (migration_ && a == migration_->source &&
        s.error_code() == grpc::StatusCode::ABORTED) {
      // The source let go of the stream (its KV verified on the target)
      // before its SendKv answer came here: OnKvSent goes on.
      migration_->source_ended = true;
      return EndAttemptIfIdleLocked(a);
    }
    if (migration_ && a == migration_->target) {
      // The worker taking the stream over failed before the move was done:
      // the move fails (OnKvSent), the source goes on.
      a->failed = true;
      AbandonLocked(a);
      held_.clear();
      return EndAttemptIfIdleLocked(a);
    }
    if (finished_ || a != attempt_ || a->failed) return EndAttemptIfIdleLocked(a);
    if (output_tokens_ < handoff_tokens_) {
      // Moved here, but the source's last tokens are still on their way.
      deferred_done_ = a;
      deferred_status_ = s;
      return;
    }
    if (!s.ok()) {
      FailAttemptLocked(a, s, "decode worker " + a->decode->info.worker_id(), false);
      return;
    }
    if (!have_summary_) {
      FinishLocked(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the decode stream ended without a summary"));
      return EndAttemptIfIdleLocked(a);
    }
    // The client's view of the timings, not the worker's.
    v1::GenerateSummary& sum = summary_;
    sum.set_request_id(request_id_);
    sum.set_ttft_seconds(output_tokens_ > 0 ? absl::ToDoubleSeconds(first_token_ - start_) : 0.0);
    sum.set_mean_tpot_seconds(output_tokens_ > 1
                                  ? absl::ToDoubleSeconds(last_token_ - first_token_) /
                                        (output_tokens_ - 1)
                                  : 0.0);
    sum.set_pool(served_pool_);
    // Prompt tokens nobody computed: the prefill worker's reuse when one
    // ran (the decode worker's then only saves the transfer), else the
    // decode worker's own.
    if (a->prefilled) sum.set_cached_tokens(a->prefill_resp.cached_tokens());
    if (migrations_ > 0 || recomputes_ > 0) sum.set_cached_tokens(prefill_cached_tokens_);
    v1::GenerateResponse m;
    *m.mutable_summary() = sum;
    out_->Send(std::move(m));
    server::ObserveLatencies(sum.ttft_seconds(), sum.mean_tpot_seconds(), output_tokens_,
                             served_pool_);
    RouterMetrics::Get().prompt_tokens.Add(sum.prompt_tokens());
    LogLine(absl::StrFormat(
        "request %s: %s, %d prompt + %d output tokens, ttft %.1f ms, "
        "tpot %.2f ms",
        request_id_, v1::FinishReason_Name(sum.finish_reason()), sum.prompt_tokens(),
        sum.output_tokens(), sum.ttft_seconds() * 1e3, sum.mean_tpot_seconds() * 1e3));
    // The worker ended the stream before it sent the summary: its place in
    // the batch and its KV are free there before the client hears (a
    // client that sends its next request at once is not refused for the
    // call still completing).
    ReleaseDecodeLocked(*a);
    FinishLocked(grpc::Status::OK);
    EndAttemptIfIdleLocked(a);
  }

  // The attempt failed: retry once (no token reached the client and the
  // failure was a lost or overloaded worker), else fail the call. A worker
  // that refused for want of room (RESOURCE_EXHAUSTED: KV cache full, queue
  // bound) is asked again only if another can take it: the same worker a
  // moment later would refuse again, and the refusal would reach the client
  // a loaded worker's round trip later (90 ms at 4x the sustainable rate).
  void FailAttemptLocked(const std::shared_ptr<Attempt>& a, const grpc::Status& s,
                         const std::string& who, bool prefill_failed) {
    a->failed = true;
    AbandonLocked(a);
    LogLine(absl::StrCat("request ", request_id_, ": ", who, " failed: ", s.error_message(), " (",
                         (int)s.error_code(), ")"));
    const bool retryable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    if (!relayed_ && retryable && attempts_ < 2 && !out_->cancelled()) {
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        refused_ = s;
        avoid_.insert(prefill_failed ? a->prefill->info.worker_id() : a->decode->info.worker_id());
      } else {
        avoid_.insert(a->decode->info.worker_id());
        if (a->prefill) avoid_.insert(a->prefill->info.worker_id());
      }
      EndAttemptIfIdleLocked(a);
      StartAttemptLocked(/*retry=*/true);
      return;
    }
    // Lost mid-stream (a decode worker killed, one whose drain ran out, or
    // a worker of a recomputing attempt): computed again elsewhere from the
    // prompt and the tokens sent.
    if (relayed_ && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
        recomputes_ < kMaxRecomputes && !out_->cancelled() && !sent_tokens_.empty() &&
        (int64_t)sent_tokens_.size() < req_.max_tokens() && output_tokens_ >= handoff_tokens_) {
      if (a->decode) avoid_.insert(a->decode->info.worker_id());
      if (a->prefill) avoid_.insert(a->prefill->info.worker_id());
      EndAttemptIfIdleLocked(a);
      RecomputeLocked(s.error_message());
      return;
    }
    grpc::Status client = s;
    if (relayed_ && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
        s.error_code() != grpc::StatusCode::CANCELLED) {
      client = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat(who, " failed mid-stream: ", s.error_message()));
    }
    FinishLocked(client);
    EndAttemptIfIdleLocked(a);
  }

  // ---- Live migration (worker/scheduler.h: Suspend, SendKv, Resume) ----

  bool MigrateLocked(const std::string& worker_id) {
    if (finished_ || migration_ || !attempt_ || attempt_->failed || attempt_->decode == nullptr ||
        attempt_->decode->info.worker_id() != worker_id ||
        attempt_->decode->info.role() != v1::ROLE_DECODE || output_tokens_ == 0 ||
        output_tokens_ < handoff_tokens_) {
      return false;
    }
    auto m = std::make_shared<Migration>();
    m->source = attempt_;
    m->start = absl::Now();
    migration_ = m;
    m->suspend_req.set_request_id(request_id_);
    m->suspend_req.set_stream_key(stream_key_);
    m->suspend_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ++m->source->open_calls;
    auto self = shared_from_this();
    m->source->decode->decode->async()->Suspend(
        &m->suspend_ctx, &m->suspend_req, &m->suspend_resp,
        [self, m](grpc::Status s) { self->OnSuspended(m, s); });
    return true;
  }

  void OnSuspended(std::shared_ptr<Migration> m, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    --m->source->open_calls;
    if (finished_ || migration_ != m) return EndAttemptIfIdleLocked(m->source);
    const std::string& from = m->source->decode->info.worker_id();
    if (!s.ok()) {
      // It finished, or is not decoding: nothing to move.
      migration_ = nullptr;
      LogLine(absl::StrCat("request ", request_id_, ": not moved from ", from, ": ",
                           s.error_message()));
      return EndAttemptIfIdleLocked(m->source);
    }
    const v1::SuspendResponse& r = m->suspend_resp;
    m->generated = r.tokens_size() - r.prompt_tokens();
    if (r.kv_tokens() != r.tokens_size() - 1 || m->generated < 1 ||
        m->generated >= req_.max_tokens()) {
      return ResumeSourceLocked(m, "the worker's account of the stream does not add up");
    }
    // The target: another decode worker of the same KV transport (and
    // pool, under a split), the usual cost function choosing.
    auto t = std::make_shared<Attempt>();
    t->number = m->source->number;
    absl::flat_hash_set<std::string> avoid = avoid_;
    avoid.insert(from);
    t->decode = registry_.Pick({v1::ROLE_DECODE}, avoid, false, m->source->decode->info.pool(),
                               route_, /*wanted_only=*/true, &t->kv);
    if (t->decode != nullptr &&
        t->decode->info.kv_transport() != m->source->decode->info.kv_transport()) {
      registry_.Done(t->decode, t->kv);
      t->decode = nullptr;
    }
    if (t->decode == nullptr) {
      return ResumeSourceLocked(m, "no other decode worker can take it");
    }
    m->target = t;
    // (The Reserve call's deadline is the request's there. A target that
    // hangs holds the move until then; the source decodes on by itself
    // after its suspension's lease meanwhile.)
    for (grpc::ClientContext* c : {&t->reserve_ctx, &t->decode_ctx}) {
      if (deadline_ != std::chrono::system_clock::time_point::max()) c->set_deadline(deadline_);
    }
    v1::ReserveRequest& q = t->reserve_req;
    q.set_request_id(request_id_);
    q.set_prompt_tokens(r.kv_tokens());
    // Room for the token the source sampled last and all still to come.
    q.set_max_tokens(req_.max_tokens() - (int32_t)m->generated + 1);
    q.set_kv_layout(m->source->decode->info.kv_layout());
    q.mutable_prompt()->Add(r.tokens().begin(), r.tokens().end() - 1);
    q.set_cache_salt(req_.cache_salt());
    q.set_kv_writer(r.kv_writer());
    ++t->open_calls;
    auto self = shared_from_this();
    t->decode->decode->async()->Reserve(&t->reserve_ctx, &t->reserve_req, &t->reserve_resp,
                                        [self, m](grpc::Status s) {
                                          self->OnMigrationReserved(m, s);
                                        });
  }

  void OnMigrationReserved(std::shared_ptr<Migration> m, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    const std::shared_ptr<Attempt>& t = m->target;
    --t->open_calls;
    if (finished_ || migration_ != m || t->failed) {
      if (s.ok()) ReleaseLocked(t);
      return EndAttemptIfIdleLocked(t);
    }
    if (!s.ok()) {
      const std::string why = absl::StrCat("decode worker ", t->decode->info.worker_id(),
                                           " refused it: ", s.error_message());
      EndAttemptIfIdleLocked(t);
      return ResumeSourceLocked(m, why);
    }
    t->reserved = true;
    const v1::SuspendResponse& r = m->suspend_resp;
    // The source sends the KV; the target's Decode call waits for it and
    // goes on from the last token the client has.
    v1::SendKvRequest& k = m->send_req;
    k.set_request_id(request_id_);
    k.set_kv_address(t->reserve_resp.kv_address());
    k.set_kv_transport(t->reserve_resp.kv_transport());
    k.set_reservation_id(t->reserve_resp.reservation_id());
    k.set_transfer_token(t->reserve_resp.transfer_token());
    k.set_target_cached_tokens(t->reserve_resp.cached_tokens());
    k.set_stream_key(stream_key_);
    if (deadline_ != std::chrono::system_clock::time_point::max()) {
      m->send_ctx.set_deadline(deadline_);
    }
    ++m->source->open_calls;
    auto self = shared_from_this();
    m->source->decode->decode->async()->SendKv(
        &m->send_ctx, &m->send_req, &m->send_resp,
        [self, m](grpc::Status s) { self->OnKvSent(m, s); });
    t->decode_req = m->source->decode_req;
    t->decode_req.set_reservation_id(t->reserve_resp.reservation_id());
    t->decode_req.clear_resume();  // (a stream moved before)
    v1::ResumeState* resume = t->decode_req.mutable_resume();
    resume->set_prompt_tokens(r.prompt_tokens());
    resume->mutable_generated()->Add(r.tokens().begin() + r.prompt_tokens(), r.tokens().end());
    StartDecodeLocked(t);
  }

  void OnKvSent(std::shared_ptr<Migration> m, const grpc::Status& s) {
    std::lock_guard lock(mu_);
    --m->source->open_calls;
    if (finished_ || migration_ != m) return EndAttemptIfIdleLocked(m->source);
    migration_ = nullptr;
    const std::string& from = m->source->decode->info.worker_id();
    const std::string& to = m->target->decode->info.worker_id();
    if (!s.ok() || m->target->failed) {
      // The source decodes on (it does so by itself when the transfer
      // failed); the target's reservation goes.
      if (!m->target->failed) {
        m->target->failed = true;
        AbandonLocked(m->target);
      }
      held_.clear();
      RouterMetrics::Get().migrations("stayed").Add();
      LogLine(absl::StrCat("request ", request_id_, ": not moved from ", from, " to ", to, ": ",
                           s.ok() ? "the target failed" : s.error_message(),
                           "; it decodes on where it was"));
      if (s.ok()) {
        // The KV got there but the target is gone, and the source let go.
        FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  absl::StrCat("decode worker ", to,
                                               " failed while taking the stream over")));
      }
      EndAttemptIfIdleLocked(m->target);
      return EndAttemptIfIdleLocked(m->source);
    }
    // Moved: the target carries the stream from here.
    const absl::Duration pause = absl::Now() - m->start;
    source_ = m->source;
    handoff_tokens_ = m->generated;
    attempt_ = m->target;
    ++migrations_;
    RouterMetrics::Get().migrations("moved").Add();
    RouterMetrics::Get().migration_pause.Observe(absl::ToDoubleSeconds(pause));
    LogLine(absl::StrFormat(
        "request %s: moved from %s to %s after %d tokens (%d tokens of KV, %d bytes, sent in "
        "%.1f ms); paused %.1f ms",
        request_id_, from, to, m->generated, m->suspend_resp.kv_tokens(), m->send_resp.kv_bytes(),
        m->send_resp.transfer_seconds() * 1e3, absl::ToDoubleMilliseconds(pause)));
    if (output_tokens_ >= handoff_tokens_) {
      FlushHeldLocked();
    } else if (m->source_ended) {
      // Its stream ended short of the tokens it said it had sent.
      AbandonLocked(attempt_);
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                absl::StrCat("decode worker ", from,
                                             " ended the stream before its last tokens came")));
    }
    EndAttemptIfIdleLocked(m->source);
  }

  // Nowhere to move it: the source decodes on (it would by itself after
  // its suspension's lease; this saves the wait).
  void ResumeSourceLocked(const std::shared_ptr<Migration>& m, const std::string& why) {
    migration_ = nullptr;
    RouterMetrics::Get().migrations("stayed").Add();
    LogLine(absl::StrCat("request ", request_id_, ": not moved from ",
                         m->source->decode->info.worker_id(), ": ", why,
                         "; it decodes on where it was"));
    struct Call {
      grpc::ClientContext ctx;
      v1::ResumeRequest req;
      v1::ResumeResponse resp;
    };
    auto c = std::make_shared<Call>();
    c->req.set_request_id(request_id_);
    c->req.set_stream_key(stream_key_);
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::shared_ptr<Attempt> a = m->source;
    ++a->open_calls;
    auto self = shared_from_this();
    a->decode->decode->async()->Resume(&c->ctx, &c->req, &c->resp, [self, a, c](grpc::Status) {
      std::lock_guard lock(self->mu_);
      --a->open_calls;
      self->EndAttemptIfIdleLocked(a);
    });
  }

  // A new attempt for the prompt plus every token sent: the new decode
  // worker's first token is the stream's next (DecodeRequest.resume).
  static constexpr int kMaxRecomputes = 2;
  void RecomputeLocked(const std::string& why) {
    ++recomputes_;
    recompute_prompt_ = prompt_;
    recompute_prompt_.insert(recompute_prompt_.end(), sent_tokens_.begin(), sent_tokens_.end());
    route_ = RouteRequest{};  // routed again, for the longer prompt
    refused_ = grpc::Status::OK;  // a refusal before the first token is past
    RouterMetrics::Get().recomputes.Add();
    LogLine(absl::StrCat("request ", request_id_, ": decode worker lost after ",
                         sent_tokens_.size(), " tokens (", why, "); computing the ",
                         recompute_prompt_.size(), " tokens again elsewhere"));
    StartAttemptLocked();
  }

  // The prefill worker no longer counts the attempt (once).
  void ReleasePrefillLocked(Attempt& a) {
    if (a.prefill_counted) registry_.Done(a.prefill);
    a.prefill_counted = false;
  }

  // The decode worker no longer counts the attempt (once).
  void ReleaseDecodeLocked(Attempt& a) {
    if (!a.decode_released) registry_.Done(a.decode, a.kv);
    a.decode_released = true;
  }

  void EndAttemptIfIdleLocked(const std::shared_ptr<Attempt>& a) {
    if (a->open_calls > 0) return;
    ReleaseDecodeLocked(*a);
    ReleasePrefillLocked(*a);
    a->decode = a->prefill = nullptr;
  }

  void FinishLocked(const grpc::Status& s) {
    if (finished_) return;
    finished_ = true;
    if (migration_) {
      if (migration_->target) AbandonLocked(migration_->target);
      RouterMetrics::Get().migrations("failed").Add();
      migration_ = nullptr;
    }
    // A request that got a token left the waiting ones then (no token
    // comes after the finish).
    if (output_tokens_ == 0) book_.Unbook(booked_);
    if (!s.ok()) LogLine(absl::StrCat("request ", request_id_, ": ", s.error_message()));
    RouterMetrics::Get().in_flight.Add(-1);
    server::CountRequest(static_cast<absl::StatusCode>(s.error_code()), served_pool_);
    out_->Finish(s);
  }

  Registry& registry_;
  AdmissionBook& book_;
  const AdmissionRequest booked_;
  const absl::Duration predicted_ttft_;  // uncorrected (AdmissionDecision)
  std::shared_ptr<server::ResponseStream> out_;
  const std::string request_id_;
  const std::vector<int32_t> prompt_;
  const v1::GenerateRequest req_;
  const std::chrono::system_clock::time_point deadline_;
  const absl::Time start_;
  const std::string pool_;
  std::string served_pool_;  // the pool of the decode worker that took it (guarded by mu_)
  std::mutex mu_;
  std::shared_ptr<Attempt> attempt_;
  int attempts_ = 0;
  absl::flat_hash_set<std::string> avoid_;
  grpc::Status refused_;  // a worker's RESOURCE_EXHAUSTED that this call retries
  RouteRequest route_;
  bool relayed_ = false, finished_ = false, have_summary_ = false;
  int64_t output_tokens_ = 0;
  absl::Time first_token_, last_token_;
  v1::GenerateSummary summary_;
  int64_t prefill_cached_tokens_ = 0;  // the first prefill's reuse, for a moved stream
  std::vector<int32_t> sent_tokens_;   // every token relayed to the client
  // The secret its decode workers want before they move it (16 bytes from
  // the OS's random source).
  const std::string stream_key_ = [] {
    std::random_device rd;
    std::string key(16, '\0');
    for (size_t i = 0; i < key.size(); i += 4) {
      const uint32_t r = rd();
      std::memcpy(&key[i], &r, 4);
    }
    return key;
  }();
  // After a decode worker was lost mid-stream: the prompt + sent_tokens_,
  // computed again elsewhere (RecomputeLocked); empty before.
  std::vector<int32_t> recompute_prompt_;
  int recomputes_ = 0;

  // Live migration. The source is attempt_ until the KV is verified on the
  // target; then the target becomes attempt_, and the source's last
  // messages (written before it was suspended, perhaps not yet read here)
  // are relayed until the client has `handoff_tokens_`, while the target's
  // wait in `held_`: no token lost, repeated or reordered.
  std::shared_ptr<Migration> migration_;  // one at a time
  std::shared_ptr<Attempt> source_;       // the last attempt moved from
  int64_t handoff_tokens_ = 0;
  std::vector<v1::GenerateResponse> held_;
  // The moved-to attempt's stream ended while the source's last tokens
  // were still on their way: its end waits for them.
  std::shared_ptr<Attempt> deferred_done_;
  grpc::Status deferred_status_;
  int migrations_ = 0;
};

void LiveCalls::Add(const std::shared_ptr<GenerateCall>& call) {
  std::lock_guard lock(mu_);
  if (calls_.size() >= prune_at_) {
    std::erase_if(calls_, [](const std::weak_ptr<GenerateCall>& c) { return c.expired(); });
    prune_at_ = std::max<size_t>(64, 2 * calls_.size());
  }
  calls_.push_back(call);
}

int LiveCalls::MigrateFrom(const std::string& worker_id) {
  std::vector<std::shared_ptr<GenerateCall>> live;
  {
    std::lock_guard lock(mu_);
    for (const std::weak_ptr<GenerateCall>& c : calls_) {
      if (auto p = c.lock()) live.push_back(std::move(p));
    }
  }
  int n = 0;
  for (const auto& c : live) n += c->MigrateFrom(worker_id);
  return n;
}

// ---- The public service ------------------------------------------------------

// Generate and Tokenize take their requests raw, so that one protobuf
// refuses gets a message (server/grpc_util.h).
using PdqBase = v1::Pdq::WithRawCallbackMethod_Generate<
    v1::Pdq::WithRawCallbackMethod_Tokenize<v1::Pdq::CallbackService>>;

class PdqService : public PdqBase {
 public:
  PdqService(Registry& r, LiveCalls& calls, const Tokenizer& tok, server::ApiKeys keys,
             policy::TrafficSplit split, bool split_sticky, const AdmissionOptions& admission)
      : r_(r),
        calls_(calls),
        tok_(tok),
        keys_(std::move(keys)),
        split_(std::move(split)),
        split_sticky_(split_sticky),
        book_(admission, r) {}

  server::ResponseStream::Reactor* Generate(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* raw) override {
    auto holder = std::make_shared<std::weak_ptr<GenerateCall>>();
    auto [reactor, out] = server::ResponseStream::Create([holder] {
      if (auto call = holder->lock()) call->OnClientChange();
    });
    v1::GenerateRequest request;
    grpc::Status valid = ToGrpc(keys_.Check(*ctx));
    if (valid.ok()) valid = server::ParseRequest(*raw, &request);
    const v1::GenerateRequest* req = &request;
    std::string id = req->request_id();
    if (id.empty()) id = absl::StrFormat("req-%s-%d", id_prefix_, ++next_id_);
    std::vector<int32_t> prompt;
    if (valid.ok()) valid = Validate(*req, &prompt);
    if (!valid.ok()) {
      LogLine(absl::StrCat("request ", id, ": refused: ", valid.error_message()));
      server::CountRequest(static_cast<absl::StatusCode>(valid.error_code()));
      out->Finish(valid);
      return reactor;
    }
    // Admission (router/admission.h): taken now, or refused at once.
    // What the prompt costs is what the best-placed worker's prefix cache
    // lacks (at least its last token is computed).
    RouteRequest route = RouteFor(r_, prompt, *req, req->max_tokens());
    const int64_t cached = std::clamp<int64_t>(r_.MostCached(route), 0,
                                               std::max<int64_t>(0, (int64_t)prompt.size() - 1));
    AdmissionRequest ar;
    ar.prompt_tokens = (int64_t)prompt.size() - cached;
    ar.priority = req->priority() == v1::PRIORITY_BATCH ? Priority::kBatch : Priority::kInteractive;
    if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
      ar.time_left = absl::FromChrono(ctx->deadline()) - absl::Now();
    }
    // Rate limits are per API key where keys are required, else per
    // client_id (OpenAI's "user"), else one bucket for all.
    std::string client = req->client_id();
    if (keys_.required()) {
      auto it = ctx->client_metadata().find("authorization");
      client = it == ctx->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
    }
    ar.kv_blocks = route.kv_blocks;
    const AdmissionDecision admit = book_.Admit(
        ar, client, double(prompt.size()) + double(req->max_tokens()), r_.RoomFor(route));
    if (!admit.admitted()) {
      RouterMetrics::Get().refused(admit.refusal).Add();
      LogLine(absl::StrCat("request ", id, ": refused (", RefusalName(admit.refusal),
                           "): ", admit.message));
      server::CountRequest(absl::StatusCode::kResourceExhausted);
      ctx->AddTrailingMetadata(
          server::kRetryAfterTrailer,
          absl::StrCat((int64_t)std::ceil(absl::ToDoubleMilliseconds(admit.retry_after))));
      ctx->AddTrailingMetadata(server::kRefusalTrailer, RefusalName(admit.refusal));
      out->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, admit.message));
      return reactor;
    }
    std::string pool;
    if (!split_.empty()) {
      thread_local absl::BitGen rng;
      pool = split_.Choose(req->client_id(), split_sticky_, rng);
    }
    LogLine(absl::StrCat("request ", id, ": ", prompt.size(), " prompt tokens",
                         cached > 0 ? absl::StrCat(" (", cached, " cached on a worker)") : "",
                         ", max_tokens ", req->max_tokens(),
                         ar.priority == Priority::kBatch ? ", batch" : "",
                         pool.empty() ? "" : absl::StrCat(", pool ", pool),
                         admit.predicted_ttft > absl::ZeroDuration()
                             ? absl::StrFormat(", predicted ttft %.0f ms",
                                               absl::ToDoubleMilliseconds(admit.predicted_ttft))
                             : ", no prefill rate measured yet"));
    auto call = std::make_shared<GenerateCall>(r_, book_, ar, admit.uncorrected_ttft, out, id,
                                               std::move(prompt), *req, ctx->deadline(),
                                               std::move(pool), std::move(route));
    *holder = call;
    calls_.Add(call);
    call->Start();
    return reactor;
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* out) override {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status key = keys_.Check(*ctx); !key.ok()) {
      reactor->Finish(ToGrpc(key));
      return reactor;
    }
    v1::TokenizeRequest req;
    if (grpc::Status parsed = server::ParseRequest(*raw, &req); !parsed.ok()) {
      reactor->Finish(parsed);
      return reactor;
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        req.has_chat() ? EncodeChat(req.chat()) : Encode(req.text());
    if (ids.ok()) {
      v1::TokenizeResponse resp;
      for (int32_t t : *ids) resp.add_ids(t);
      *out = server::ToByteBuffer(resp);
    }
    reactor->Finish(ToGrpc(ids.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest*,
                                         v1::ModelInfo* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status key = keys_.Check(*ctx); !key.ok()) {
      reactor->Finish(ToGrpc(key));
      return reactor;
    }
    std::optional<v1::WorkerInfo> w = r_.Model();
    if (!w) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is registered"));
      return reactor;
    }
    resp->set_name(w->model_name());
    resp->set_vocab_size(w->vocab_size());
    resp->set_max_context(w->max_context());
    resp->set_kv_layout(w->kv_layout());
    resp->set_live_workers(r_.live());
    for (v1::WorkerStatus& st : r_.Statuses()) *resp->add_workers() = std::move(st);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const {
    if (text.empty()) return absl::InvalidArgumentError("the prompt is empty");
    return tok_.Encode(text, tok_.add_bos(), /*parse_special=*/false);
  }

  absl::StatusOr<std::vector<int32_t>> EncodeChat(const v1::ChatPrompt& chat) const {
    if (chat.messages_size() == 0) return absl::InvalidArgumentError("the chat has no messages");
    std::vector<ChatMessage> messages;
    for (const v1::ChatMessage& m : chat.messages()) {
      if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
        return absl::InvalidArgumentError(
            absl::StrCat("chat role '", m.role(), "' is not system, user or assistant"));
      }
      messages.push_back({m.role(), m.content()});
    }
    absl::StatusOr<std::string> text = tok_.ApplyChatTemplate(messages, true);
    if (!text.ok()) return text.status();
    return tok_.Encode(*text, tok_.add_bos(), /*parse_special=*/true);
  }

  grpc::Status Validate(const v1::GenerateRequest& req, std::vector<int32_t>* prompt) const {
    std::optional<v1::WorkerInfo> w = r_.Model();
    if (!w) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker is registered");
    if (req.request_id().size() > 128) return Invalid("request_id is longer than 128 bytes");
    absl::StatusOr<std::vector<int32_t>> ids;
    switch (req.prompt_case()) {
      case v1::GenerateRequest::kText:
        ids = Encode(req.text());
        break;
      case v1::GenerateRequest::kChat:
        ids = EncodeChat(req.chat());
        break;
      case v1::GenerateRequest::kTokens:
        ids = std::vector<int32_t>(req.tokens().ids().begin(), req.tokens().ids().end());
        if (ids->empty()) return Invalid("the prompt is empty");
        for (int32_t t : *ids) {
          if (t < 0 || t >= w->vocab_size()) {
            return Invalid(absl::StrCat("token id ", t, " is outside the vocabulary [0, ",
                                        w->vocab_size(), ")"));
          }
        }
        break;
      default:
        return Invalid("a prompt is required: text, tokens or chat");
    }
    if (!ids.ok()) return ToGrpc(ids.status());
    const int64_t n = (int64_t)ids->size(), ctx = w->max_context();
    if (n >= ctx) {
      return Invalid(absl::StrCat("the prompt has ", n, " tokens; the model's context is ", ctx,
                                  " (at least one must be left to generate)"));
    }
    if (req.max_tokens() < 1) {
      return Invalid(absl::StrCat("max_tokens must be at least 1, got ", req.max_tokens()));
    }
    if (n + req.max_tokens() > ctx) {
      return Invalid(absl::StrCat("max_tokens ", req.max_tokens(), " goes beyond the context: ", n,
                                  " prompt tokens + ", req.max_tokens(), " > ", ctx));
    }
    const v1::SamplingParams& s = req.sampling();
    if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
      return Invalid(absl::StrCat("temperature must be >= 0, got ", s.temperature()));
    }
    if (s.top_k() < 0) return Invalid(absl::StrCat("top_k must be >= 0, got ", s.top_k()));
    if (!std::isfinite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
      return Invalid(absl::StrCat("top_p must be in [0, 1], got ", s.top_p()));
    }
    if (req.stop_size() > 16) return Invalid("at most 16 stop strings");
    for (const std::string& stop : req.stop()) {
      if (stop.empty() || stop.size() > 256)
        return Invalid("stop strings must have 1 to 256 bytes");
    }
    if (req.stop_token_ids_size() > 64) return Invalid("at most 64 stop token ids");
    if (req.client_id().size() > 256) return Invalid("client_id must have at most 256 bytes");
    if (req.cache_salt().size() > 256) return Invalid("cache_salt must have at most 256 bytes");
    for (int32_t t : req.stop_token_ids()) {
      if (t < 0 || t >= w->vocab_size()) {
        return Invalid(absl::StrCat("stop token id ", t, " is outside the vocabulary [0, ",
                                    w->vocab_size(), ")"));
      }
    }
    *prompt = std::move(*ids);
    return grpc::Status::OK;
  }

  Registry& r_;
  LiveCalls& calls_;
  const Tokenizer& tok_;
  const server::ApiKeys keys_;
  const policy::TrafficSplit split_;
  const bool split_sticky_;
  AdmissionBook book_;
  // Request ids are req-PREFIX-N, the prefix random per router process, so
  // the ids of several router replicas (or of one restarted) never meet in
  // a worker's log.
  const std::string id_prefix_ = [] {
    std::random_device rd;
    return absl::StrFormat("%06x", rd() & 0xffffff);
  }();
  std::atomic<uint64_t> next_id_{0};
};

class RouterImpl : public Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Start(const RouterOptions& o) {
    absl::StatusOr<std::optional<server::TlsPem>> tls = server::LoadServerTls(o.tls);
    if (!tls.ok()) return tls.status();
    absl::StatusOr<policy::TrafficSplit> split = policy::TrafficSplit::Parse(o.split);
    if (!split.ok()) return split.status();
    server::ApiKeys keys;
    if (!o.api_key_file.empty()) {
      absl::StatusOr<server::ApiKeys> loaded = server::ApiKeys::Load(o.api_key_file);
      if (!loaded.ok()) return loaded.status();
      keys = std::move(*loaded);
    }
    auto r = std::unique_ptr<RouterImpl>(
        new RouterImpl(o, server::Dialing{*tls, o.worker_tls_name, ""}));
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(o.model);
    if (!file.ok()) return file.status();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
    if (!tok.ok()) return tok.status();
    r->tokenizer_ = std::move(*tok);
    r->pdq_ = std::make_unique<PdqService>(r->registry_, r->calls_, *r->tokenizer_, std::move(keys),
                                           std::move(*split), o.split_sticky, o.admission);
    r->registry_service_ = std::make_unique<RegistryService>(
        r->registry_, r->calls_, o, /*require_certificates=*/tls->has_value());
    server::GrpcServerOptions go;
    go.listen = o.listen;
    go.credentials = server::ServerCredentials(*tls, server::ClientCerts::kVerifiedIfPresented);
    go.health_listen = o.health_listen;
    absl::StatusOr<server::GrpcServer> g =
        server::StartGrpcServer(go, {r->pdq_.get(), r->registry_service_.get()});
    if (!g.ok()) return g.status();
    r->grpc_ = std::move(*g);
    if (!o.http_listen.empty()) {
      OpenAiHttpOptions http;
      http.listen = o.http_listen;
      http.max_connections = o.http_max_connections;
      http.model_id = std::filesystem::path(o.model).stem().string();
      if (tls->has_value()) {
        http.tls_cert_path = o.tls.cert;
        http.tls_key_path = o.tls.key;
      }
      absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> h =
          ServeOpenAiHttp(http, r->grpc_.server->InProcessChannel(grpc::ChannelArguments()));
      if (!h.ok()) return h.status();
      r->http_ = std::move(*h);
    }
    for (v1::Role role : {v1::ROLE_PREFILL, v1::ROLE_DECODE, v1::ROLE_BOTH}) {
      server::Metrics::Global().SetGaugeFunction(
          "pdq_workers_live", "Registered workers that are heartbeating, by role.",
          [r = r.get(), role] { return r->registry_.live(role); },
          {{"role", RoleLabel(role)}});
    }
    return r;
  }
  ~RouterImpl() override {
    server::Metrics::Global().ClearGaugeFunctions("pdq_workers_live");
    grpc_.Shutdown(std::chrono::seconds(5));
    // HTTP requests are calls on the gRPC server, which has now ended them
    // all, so its threads can be joined.
    http_.reset();
  }
  const std::string& address() const override { return grpc_.address; }
  const std::string& http_address() const override {
    static const std::string none;
    return http_ ? http_->address() : none;
  }
  const std::string& health_address() const override { return grpc_.health_address; }
  int live_workers() const override { return registry_.live(); }
  bool Drain(absl::Duration timeout) override {
    grpc_.SetServing(false);
    const absl::Time start = absl::Now(), end = start + timeout;
    absl::Time next_log = start;
    for (;;) {
      const double n = RouterMetrics::Get().in_flight.value();
      const absl::Time now = absl::Now();
      if (n <= 0) {
        LogLine(absl::StrFormat("drained in %.1f s", absl::ToDoubleSeconds(now - start)));
        return true;
      }
      if (now >= end) {
        LogLine(absl::StrFormat("not drained after %.0f s: %.0f requests in flight; ending them",
                                absl::ToDoubleSeconds(timeout), n));
        return false;
      }
      if (now >= next_log) {
        LogLine(absl::StrFormat("draining: %.0f requests in flight", n));
        next_log = now + absl::Seconds(5);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

 private:
  RouterImpl(const RouterOptions& o, server::Dialing workers) : registry_(o, std::move(workers)) {}
  Registry registry_;
  LiveCalls calls_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PdqService> pdq_;
  std::unique_ptr<RegistryService> registry_service_;
  server::GrpcServer grpc_;
  std::unique_ptr<OpenAiHttpServer> http_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Router>> Router::Start(const RouterOptions& options) {
  return RouterImpl::Start(options);
}

}  // namespace pdq::router
