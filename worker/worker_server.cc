#include "worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "server/grpc_util.h"
#include "server/metrics.h"
#include "server/response_stream.h"
#include "worker/router_targets.h"

namespace pdq::worker {
namespace {

using server::DeadlineOf;
using server::ToGrpc;

// What heartbeats and GetLoad report.
void FillLoad(const SchedulerLoad& l, pdq::v1::WorkerLoad* out) {
  out->set_queued_prompt_tokens(l.queued_prompt_tokens);
  out->set_kv_blocks_free(l.kv_blocks_free);
  out->set_kv_blocks_total(l.kv_blocks_total);
  out->set_active_sequences((int32_t)l.active_sequences);
  out->set_sequences_held((int32_t)l.sequences_held);
  out->set_prefill_tokens_per_second(l.prefill_tokens_per_second);
  out->set_weight_bytes(l.weight_bytes);
  out->set_kv_used_bytes(l.kv_bytes_used);
  out->set_workspace_bytes(l.workspace_bytes);
  const server::ProcessMemory mem = server::ReadProcessMemory();
  out->set_resident_bytes(mem.resident);
  out->set_peak_resident_bytes(mem.peak);
}

SamplingParams FromProto(const pdq::v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0.0f ? 1.0f : p.top_p();
  s.seed = p.seed();
  return s;
}

pdq::v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
      return pdq::v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return pdq::v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return pdq::v1::FINISH_REASON_LENGTH;
    case FinishReason::kContextFull:
      return pdq::v1::FINISH_REASON_CONTEXT_FULL;
  }
  return pdq::v1::FINISH_REASON_UNSPECIFIED;
}

// The scheduler's view of a gRPC response stream.
class GrpcTokenStream : public TokenStream {
 public:
  GrpcTokenStream(std::shared_ptr<server::ResponseStream> s, std::string request_id,
                  const std::string& pool)
      : s_(std::move(s)), request_id_(std::move(request_id)), pool_(pool) {}
  void Send(const std::vector<int32_t>& ids, const std::string& text) override {
    s_->SendDelta(ids, text);
  }
  void Finish(const absl::Status& status, const Summary& summary) override {
    server::CountRequest(status.code(), pool_);
    if (status.ok()) {
      server::ObserveLatencies(summary.ttft_seconds, summary.mean_tpot_seconds,
                               summary.output_tokens, pool_);
      pdq::v1::GenerateResponse m;
      pdq::v1::GenerateSummary* sum = m.mutable_summary();
      sum->set_request_id(request_id_);
      sum->set_finish_reason(ToProto(summary.reason));
      sum->set_prompt_tokens((int32_t)summary.prompt_tokens);
      sum->set_output_tokens((int32_t)summary.output_tokens);
      sum->set_cached_tokens((int32_t)summary.cached_tokens);
      sum->set_ttft_seconds(summary.ttft_seconds);
      sum->set_mean_tpot_seconds(summary.mean_tpot_seconds);
      s_->Send(std::move(m));
    }
    s_->Finish(ToGrpc(status));
  }
  int64_t Unsent() const override { return s_->unsent_tokens(); }
  bool Cancelled() const override { return s_->cancelled(); }

 private:
  std::shared_ptr<server::ResponseStream> s_;
  std::string request_id_;
  const std::string pool_;
};

// Checks what the scheduler would otherwise only find out late.
absl::Status ValidateGeneration(const GenerationParams& p) {
  if (p.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be at least 1, got ", p.max_tokens));
  }
  return ValidateSamplingParams(p.sampling);
}

}  // namespace

// Decode writes through server::ResponseStream, which serves raw methods.
class WorkerServer::DecodeService : public pdq::v1::DecodeWorker::WithRawCallbackMethod_Decode<
                                        pdq::v1::DecodeWorker::CallbackService> {
 public:
  explicit DecodeService(WorkerServer& w) : w_(w) {}

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* ctx,
                                    const pdq::v1::ReserveRequest* req,
                                    pdq::v1::ReserveResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (w_.options_.role != Role::kDecode || w_.transport_ == nullptr) {
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                   absl::StrCat("this is a ", RoleName(w_.options_.role),
                                                " worker; reservations are for decode workers")));
      return reactor;
    }
    absl::StatusOr<KvLayout> layout = KvLayout::Deserialize(req->kv_layout());
    if (!layout.ok()) {
      reactor->Finish(ToGrpc(
          absl::InvalidArgumentError(absl::StrCat("kv_layout: ", layout.status().message()))));
      return reactor;
    }
    if (req->prompt_tokens() < 1 || req->max_tokens() < 1) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "prompt_tokens and max_tokens must be at least 1"));
      return reactor;
    }
    if (req->cache_salt().size() > 256) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "cache_salt must have at most 256 bytes"));
      return reactor;
    }
    ReserveArgs args;
    args.request_id = req->request_id();
    args.prompt_tokens = req->prompt_tokens();
    args.max_tokens = req->max_tokens();
    args.sender = *layout;
    args.deadline = DeadlineOf(*ctx);
    args.prompt.assign(req->prompt().begin(), req->prompt().end());
    args.cache_salt = req->cache_salt();
    args.local_prefill_max_tokens = std::max(0, req->local_prefill_max_tokens());
    args.kv_writer = req->kv_writer();
    args.prefill_cached_tokens = std::max<int64_t>(0, req->prefill_cached_tokens());
    if (req->has_first_sampling()) {
      args.first_sampling = FromProto(req->first_sampling());
      if (absl::Status v = ValidateSamplingParams(*args.first_sampling); !v.ok()) {
        reactor->Finish(
            ToGrpc(absl::InvalidArgumentError(absl::StrCat("first_sampling: ", v.message()))));
        return reactor;
      }
    }
    args.batch = req->priority() == pdq::v1::PRIORITY_BATCH;
    // ("mixed": a migrated stream's KV, its prompt written at another
    // precision than its answer.)
    if (!args.kv_writer.empty() && args.kv_writer != "mixed" &&
        !ParsePrecision(args.kv_writer).ok()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "kv_writer must be fp16, w8a8, w4a16 or mixed"));
      return reactor;
    }
    w_.scheduler_->Reserve(std::move(args), [this, reactor, resp](absl::StatusOr<Reservation> r) {
      if (r.ok()) {
        resp->set_reservation_id(r->id);
        resp->set_transfer_token(r->transfer_token);
        resp->set_kv_address(w_.transport_->address());
        resp->set_kv_transport(w_.transport_->name());
        resp->set_lease_ms(absl::ToInt64Milliseconds(r->lease));
        resp->set_cached_tokens(r->cached_tokens);
        resp->set_local_prefill(r->local_prefill);
      }
      reactor->Finish(ToGrpc(r.status()));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const pdq::v1::ReleaseRequest* req,
                                    pdq::v1::ReleaseResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    w_.scheduler_->Release(req->reservation_id(),
                           [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx,
                                    const pdq::v1::GetLoadRequest*,
                                    pdq::v1::WorkerLoad* resp) override {
    FillLoad(w_.scheduler_->load(), resp);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Live migration, source side (worker/scheduler.h).
  grpc::ServerUnaryReactor* Suspend(grpc::CallbackServerContext* ctx,
                                    const pdq::v1::SuspendRequest* req,
                                    pdq::v1::SuspendResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    w_.scheduler_->Suspend(req->request_id(), req->stream_key(),
                           [reactor, resp](absl::StatusOr<Suspended> r) {
      if (r.ok()) {
        resp->mutable_tokens()->Add(r->tokens.begin(), r->tokens.end());
        resp->set_kv_tokens(r->kv_tokens);
        resp->set_prompt_tokens((int32_t)r->prompt_tokens);
        resp->set_lease_ms(absl::ToInt64Milliseconds(r->lease));
        resp->set_kv_writer(r->kv_writer);
      }
      reactor->Finish(ToGrpc(r.status()));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* SendKv(grpc::CallbackServerContext* ctx,
                                   const pdq::v1::SendKvRequest* req,
                                   pdq::v1::SendKvResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (w_.transport_ == nullptr || req->kv_transport() != w_.transport_->name()) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("the target's KV transport is '", req->kv_transport(), "', this worker's '",
                       w_.transport_ != nullptr ? w_.transport_->name() : "none", "'")));
      return reactor;
    }
    MigrationTarget t;
    t.kv_address = req->kv_address();
    t.transfer_token = req->transfer_token();
    t.cached_tokens = req->target_cached_tokens();
    w_.scheduler_->SendKv(req->request_id(), req->stream_key(), std::move(t),
                          [reactor, resp](absl::StatusOr<KvSent> r) {
                            if (r.ok()) {
                              resp->set_transfer_seconds(r->seconds);
                              resp->set_kv_bytes(r->bytes);
                            }
                            reactor->Finish(ToGrpc(r.status()));
                          });
    return reactor;
  }

  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx,
                                   const pdq::v1::ResumeRequest* req,
                                   pdq::v1::ResumeResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    w_.scheduler_->Resume(req->request_id(), req->stream_key(),
                          [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
    return reactor;
  }

  server::ResponseStream::Reactor* Decode(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* raw) override {
    Scheduler* sched = w_.scheduler_;
    auto [reactor, stream] = server::ResponseStream::Create([sched] { sched->Wake(); });
    pdq::v1::DecodeRequest request;
    if (grpc::Status parsed = server::ParseRequest(*raw, &request); !parsed.ok()) {
      stream->Finish(parsed);
      return reactor;
    }
    const pdq::v1::DecodeRequest* req = &request;
    GenerationParams p;
    p.request_id = req->request_id();
    p.sampling = FromProto(req->sampling());
    p.max_tokens = req->max_tokens();
    p.stop.assign(req->stop().begin(), req->stop().end());
    p.stop_token_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
    p.ignore_eos = req->ignore_eos();
    p.deadline = DeadlineOf(*ctx);
    p.cache_salt = req->cache_salt();
    p.batch = req->priority() == pdq::v1::PRIORITY_BATCH;
    if (req->has_resume()) {
      p.resume = true;
      p.resume_prompt_tokens = req->resume().prompt_tokens();
      p.resume_generated.assign(req->resume().generated().begin(),
                                req->resume().generated().end());
      p.resume_recomputed = req->resume().recomputed();
    }
    p.stream_key = req->stream_key();
    absl::Status valid = ValidateGeneration(p);
    if (valid.ok() && p.resume &&
        (p.resume_generated.empty() || p.resume_prompt_tokens < 1 ||
         (req->prompt_size() > 0 && !p.resume_recomputed))) {
      valid = absl::InvalidArgumentError(
          "resume needs the tokens sent so far and the prompt's length; a moved (not "
          "recomputed) stream needs a reservation");
    }
    if (valid.ok() && p.cache_salt.size() > 256) {
      valid = absl::InvalidArgumentError("cache_salt must have at most 256 bytes");
    }
    const bool local = req->prompt_size() > 0;
    if (valid.ok() && local && w_.options_.role != Role::kBoth) {
      valid = absl::FailedPreconditionError(
          absl::StrCat("this is a ", RoleName(w_.options_.role),
                       " worker; a prompt needs a worker of role both"));
    }
    if (valid.ok() && !local && w_.options_.role != Role::kDecode) {
      valid = absl::FailedPreconditionError(absl::StrCat("this is a ", RoleName(w_.options_.role),
                                                         " worker; it has no reservations"));
    }
    if (!valid.ok()) {
      stream->Finish(ToGrpc(valid));
      return reactor;
    }
    auto tokens = std::make_shared<GrpcTokenStream>(stream, req->request_id(), w_.options_.pool);
    if (local) {
      sched->Generate({req->prompt().begin(), req->prompt().end()}, std::move(p), tokens);
    } else {
      sched->Decode(req->reservation_id(), std::move(p), tokens);
    }
    return reactor;
  }

 private:
  WorkerServer& w_;
};

class WorkerServer::PrefillService : public pdq::v1::PrefillWorker::CallbackService {
 public:
  explicit PrefillService(WorkerServer& w) : w_(w) {}

  // A unary call the scheduler can see cancelled.
  class Call : public grpc::ServerUnaryReactor {
   public:
    struct State : PrefillCall {
      std::mutex mu;
      Call* reactor = nullptr;
      pdq::v1::PrefillResponse* resp = nullptr;
      std::atomic<bool> cancelled{false};
      bool finished = false;
      std::string pool;  // this worker's, for the metrics
      void Finish(const absl::StatusOr<PrefillResult>& r) override {
        Call* call;
        {
          std::lock_guard lock(mu);
          if (finished || reactor == nullptr) return;
          finished = true;
          call = reactor;
          if (r.ok()) {
            resp->set_first_token(r->first_token);
            resp->set_prompt_tokens((int32_t)r->prompt_tokens);
            resp->set_cached_tokens((int32_t)r->cached_tokens);
            resp->set_prefill_seconds(r->prefill_seconds);
            resp->set_transfer_seconds(r->transfer_seconds);
          }
        }
        server::CountRequest(r.status().code(), pool);
        // Outside the lock: OnDone may run inline, and it cannot run before this.
        call->Finish(ToGrpc(r.status()));
      }
      bool Cancelled() const override { return cancelled.load(); }
    };
    Call(Scheduler* sched, pdq::v1::PrefillResponse* resp, const std::string& pool)
        : sched_(sched), state_(std::make_shared<State>()) {
      state_->reactor = this;
      state_->resp = resp;
      state_->pool = pool;
    }
    std::shared_ptr<State> state() { return state_; }
    void OnCancel() override {
      state_->cancelled = true;
      sched_->Wake();
    }
    void OnDone() override {
      {
        std::lock_guard lock(state_->mu);
        state_->reactor = nullptr;
      }
      delete this;
    }

   private:
    Scheduler* sched_;
    std::shared_ptr<State> state_;
  };

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx,
                                    const pdq::v1::PrefillRequest* req,
                                    pdq::v1::PrefillResponse* resp) override {
    auto* call = new Call(w_.scheduler_, resp, w_.options_.pool);
    absl::Status valid;
    if (w_.options_.role != Role::kPrefill) {
      valid = absl::FailedPreconditionError(
          absl::StrCat("this is a ", RoleName(w_.options_.role), " worker, not a prefill worker"));
    } else if (req->prompt_size() == 0) {
      valid = absl::InvalidArgumentError("the prompt is empty");
    } else if (req->decode_kv_address().empty() || req->transfer_token().empty()) {
      valid = absl::InvalidArgumentError("decode_kv_address and transfer_token are required");
    } else if (req->decode_kv_transport() != w_.transport_->name()) {
      valid = absl::FailedPreconditionError(
          absl::StrCat("the decode worker's KV transport is '", req->decode_kv_transport(),
                       "'; this worker's is '", w_.transport_->name(), "'"));
    } else {
      valid = ValidateSamplingParams(FromProto(req->sampling()));
    }
    if (!valid.ok()) {
      call->state()->Finish(valid);
      return call;
    }
    PrefillArgs args;
    args.request_id = req->request_id();
    args.prompt.assign(req->prompt().begin(), req->prompt().end());
    args.sampling = FromProto(req->sampling());
    args.kv_address = req->decode_kv_address();
    args.transfer_token = req->transfer_token();
    args.deadline = DeadlineOf(*ctx);
    args.decode_cached_tokens = req->decode_cached_tokens();
    args.cache_salt = req->cache_salt();
    args.batch = req->priority() == pdq::v1::PRIORITY_BATCH;
    args.skip_samples = std::max(0, req->skip_samples());
    w_.scheduler_->Prefill(std::move(args), call->state());
    return call;
  }

 private:
  WorkerServer& w_;
};

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(
    const WorkerServerOptions& options, Scheduler* scheduler, kvtransfer::Transport* transport) {
  auto w = std::unique_ptr<WorkerServer>(new WorkerServer());
  w->options_ = options;
  w->scheduler_ = scheduler;
  w->transport_ = transport;
  if (w->options_.worker_id.empty()) {
    std::random_device rd;
    w->options_.worker_id =
        absl::StrFormat("%s-%08x", RoleName(options.role), ((uint64_t)rd() << 16) ^ rd());
  }
  w->decode_ = std::make_unique<DecodeService>(*w);
  w->prefill_ = std::make_unique<PrefillService>(*w);
  server::GrpcServerOptions go;
  go.listen = options.listen;
  go.credentials = server::ServerCredentials(options.tls, server::ClientCerts::kRequired);
  go.health_listen = options.health_listen;
  absl::StatusOr<server::GrpcServer> g =
      server::StartGrpcServer(go, {w->decode_.get(), w->prefill_.get()});
  if (!g.ok()) return g.status();
  w->grpc_ = std::move(*g);
  w->address_ = w->grpc_.address;
  if (!options.advertise_host.empty()) {
    w->address_ = absl::StrCat(options.advertise_host, w->address_.substr(w->address_.rfind(':')));
  }
  w->ExportLoad();
  if (!options.router.empty())
    w->registration_ = std::thread([p = w.get()] { p->RegistrationLoop(); });
  return w;
}

namespace {

// What the autoscalers and the evaluation harness read, taken from the
// scheduler when scraped.
struct LoadGauge {
  const char* name;
  const char* help;
  double (*read)(const SchedulerLoad&);
};
constexpr LoadGauge kLoadGauges[] = {
    {"pdq_queued_prompt_tokens", "Prompt tokens waiting for prefill.",
     [](const SchedulerLoad& l) { return double(l.queued_prompt_tokens); }},
    {"pdq_kv_blocks_free", "KV cache blocks free.",
     [](const SchedulerLoad& l) { return double(l.kv_blocks_free); }},
    {"pdq_kv_blocks_total", "KV cache blocks in all.",
     [](const SchedulerLoad& l) { return double(l.kv_blocks_total); }},
    {"pdq_kv_blocks_used_ratio",
     "Fraction of the KV cache's blocks held by sequences or reservations.",
     [](const SchedulerLoad& l) {
       return l.kv_blocks_total > 0 ? 1.0 - double(l.kv_blocks_free) / l.kv_blocks_total : 0.0;
     }},
    {"pdq_prefill_tokens_per_second",
     "Prompt tokens a second computed while prompts waited, decode steps included (the rate "
     "the router predicts time to first token from); 0 until measured.",
     [](const SchedulerLoad& l) { return l.prefill_tokens_per_second; }},
    {"pdq_weight_bytes",
     "Bytes of model weights held (linear layers, embedding, norms; both weight sets of a "
     "process prefilling and decoding at two precisions).",
     [](const SchedulerLoad& l) { return double(l.weight_bytes); }},
    {"pdq_kv_cache_bytes", "Bytes of the KV cache, allocated (pages become resident when used).",
     [](const SchedulerLoad& l) { return double(l.kv_bytes_total); }},
    {"pdq_kv_used_bytes",
     "Bytes of KV blocks holding data now: in use by sequences or kept by the prefix cache.",
     [](const SchedulerLoad& l) { return double(l.kv_bytes_used); }},
    {"pdq_kv_used_peak_bytes",
     "The most KV bytes that held data at once since start (resident once touched).",
     [](const SchedulerLoad& l) { return double(l.kv_bytes_used_peak); }},
    {"pdq_workspace_bytes",
     "Bytes of the forward passes' activation workspaces (grown to the largest step run).",
     [](const SchedulerLoad& l) { return double(l.workspace_bytes); }},
    {"pdq_active_sequences", "Sequences decoding.",
     [](const SchedulerLoad& l) { return double(l.active_sequences); }},
    {"pdq_reservations", "Decode reservations waiting for their KV.",
     [](const SchedulerLoad& l) { return double(l.reservations); }},
};

}  // namespace

void WorkerServer::ExportLoad() {
  for (const LoadGauge& g : kLoadGauges) {
    server::Metrics::Global().SetGaugeFunction(
        g.name, g.help, [s = scheduler_, read = g.read] { return read(s->load()); });
  }
}

void WorkerServer::StopRegistration() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (registration_.joinable()) registration_.join();  // it deregisters
}

bool WorkerServer::Drain(absl::Duration timeout) {
  // A decode worker's routers move its streams to other decode workers
  // (live migration); what they cannot move finishes here.
  migrate_on_deregister_ = options_.migrate_on_drain && options_.role == Role::kDecode;
  StopRegistration();
  grpc_.SetServing(false);
  const absl::Time start = absl::Now(), end = start + timeout;
  absl::Time next_log = start;
  for (;;) {
    const SchedulerLoad l = scheduler_->load();
    if (l.queued_prompt_tokens == 0 && l.kv_blocks_free == l.kv_blocks_total) {
      LogLine(absl::StrFormat("drained in %.1f s", absl::ToDoubleSeconds(absl::Now() - start)));
      return true;
    }
    const absl::Time now = absl::Now();
    if (now >= end) {
      LogLine(absl::StrFormat(
          "not drained after %.0f s: %d sequences decoding, %d reservations, %d prompt tokens "
          "queued, %d KV blocks held; ending them",
          absl::ToDoubleSeconds(timeout), l.active_sequences, l.reservations,
          l.queued_prompt_tokens, l.kv_blocks_total - l.kv_blocks_free));
      return false;
    }
    if (now >= next_log) {
      LogLine(absl::StrFormat(
          "draining: %d sequences decoding, %d reservations, %d prompt tokens queued",
          l.active_sequences, l.reservations, l.queued_prompt_tokens));
      next_log = now + absl::Seconds(5);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

WorkerServer::~WorkerServer() {
  for (const LoadGauge& g : kLoadGauges) server::Metrics::Global().ClearGaugeFunctions(g.name);
  StopRegistration();
  grpc_.Shutdown(std::chrono::seconds(5));
}

pdq::v1::WorkerInfo WorkerServer::Info() const {
  pdq::v1::WorkerInfo info;
  info.set_worker_id(options_.worker_id);
  info.set_role(options_.role == Role::kPrefill  ? pdq::v1::ROLE_PREFILL
                : options_.role == Role::kDecode ? pdq::v1::ROLE_DECODE
                                                 : pdq::v1::ROLE_BOTH);
  info.set_precision(options_.precision);
  info.set_address(address_);
  if (transport_ != nullptr) {
    info.set_kv_transport(transport_->name());
    info.set_kv_address(transport_->address());
  }
  info.set_kv_layout(scheduler_->kv().layout().Serialize());
  info.set_kv_blocks_total(scheduler_->kv().num_blocks());
  info.set_block_tokens(scheduler_->kv().layout().block_tokens);
  info.set_model_name(options_.model_name);
  info.set_vocab_size(options_.vocab_size);
  info.set_max_context(options_.max_context);
  info.set_metrics_address(options_.metrics_address);
  info.set_pool(options_.pool);
  if (options_.role != Role::kPrefill) {
    info.set_max_decode_batch(scheduler_->max_decode_batch());
  }
  return info;
}

void WorkerServer::RegistrationLoop() {
  // Validated by WorkerMain; a library caller's bad list is logged.
  absl::StatusOr<std::vector<RouterEntry>> entries = ParseRouterList(options_.router);
  if (!entries.ok()) {
    LogLine(absl::StrCat("not registering: --router: ", entries.status().message()));
    return;
  }
  const bool lookups = std::any_of(entries->begin(), entries->end(),
                                   [](const RouterEntry& e) { return e.dns; });
  struct Loop {
    RouterTarget target;
    std::unique_ptr<std::atomic<bool>> gone;
    std::thread thread;
  };
  std::vector<Loop> loops;
  std::vector<RouterTarget> targets;
  std::string last_errors;
  for (;;) {
    std::vector<std::string> errors;
    targets = ResolveRouterTargets(*entries, SystemResolve, targets, &errors);
    if (std::string e = absl::StrJoin(errors, "; "); e != last_errors) {
      if (!e.empty()) LogLine(absl::StrCat("router lookup: ", e, "; keeping the routers known"));
      last_errors = e;
    }
    // A router no longer named is left (its loop deregisters, if it can);
    // a new one is registered with.
    for (Loop& l : loops) {
      if (std::find(targets.begin(), targets.end(), l.target) == targets.end() && !*l.gone) {
        LogLine(absl::StrCat("router ", l.target.address, " is no longer listed; leaving it"));
        std::lock_guard lock(mu_);
        *l.gone = true;
        cv_.notify_all();
      }
    }
    for (const RouterTarget& t : targets) {
      if (std::none_of(loops.begin(), loops.end(),
                       [&](const Loop& l) { return l.target == t && !*l.gone; })) {
        Loop l{t, std::make_unique<std::atomic<bool>>(false), {}};
        const std::string tls_name =
            options_.router_tls_name.empty() ? t.tls_name : options_.router_tls_name;
        l.thread = std::thread([this, t, tls_name, gone = l.gone.get()] {
          RegisterWith(t.address, tls_name, *gone);
        });
        loops.push_back(std::move(l));
      }
    }
    for (auto it = loops.begin(); it != loops.end();) {
      if (*it->gone) {
        it->thread.join();
        scheduler_->ForgetCacheRouter(it->target.address);
        it = loops.erase(it);
      } else {
        ++it;
      }
    }
    std::unique_lock lock(mu_);
    if (!lookups) {
      cv_.wait(lock, [&] { return stopping_; });
    } else {
      cv_.wait_for(lock, absl::ToChronoMilliseconds(kRouterLookupInterval),
                   [&] { return stopping_; });
    }
    if (stopping_) break;
  }
  for (Loop& l : loops) l.thread.join();  // each deregisters
}

void WorkerServer::RegisterWith(const std::string& router, const std::string& tls_name,
                                const std::atomic<bool>& gone) {
  auto channel = server::Dial(router, server::Dialing{options_.tls, tls_name, ""});
  auto stub = pdq::v1::Registry::NewStub(channel);
  bool registered = false;
  // The router's copy of the prefix cache's block set is whole only after
  // a full update reached it: after (re)registering or a failed heartbeat.
  bool cache_synced = false;
  // Now and then the whole set anyway: the router also guesses what a
  // worker will cache from where it sends requests, and a full update drops
  // guesses that did not come true.
  int heartbeats = 0;
  absl::Duration interval = absl::Seconds(1);
  std::string last_error;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (stopping_ || gone) break;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::Status s;
    // Right after registering, a heartbeat at once: the router learns the
    // worker's load (its measured prefill rate, for admission) before the
    // first requests reach it.
    bool heartbeat_now = false;
    if (!registered) {
      pdq::v1::RegisterRequest req;
      *req.mutable_worker() = Info();
      pdq::v1::RegisterResponse resp;
      s = stub->Register(&ctx, req, &resp);
      if (s.ok()) {
        registered = true;
        heartbeat_now = true;
        cache_synced = false;
        interval = absl::Milliseconds(std::max(50, resp.heartbeat_interval_ms()));
        LogLine(absl::StrCat("registered with the router at ", router, " as ",
                             options_.worker_id));
      }
    } else {
      pdq::v1::HeartbeatRequest req;
      req.set_worker_id(options_.worker_id);
      FillLoad(scheduler_->load(), req.mutable_load());
      CacheUpdate cache = scheduler_->TakeCacheUpdate(router, !cache_synced || ++heartbeats % 120 == 0);
      // A heartbeat stays far below gRPC's 4 MiB message limit: a router
      // that hears of fewer blocks only misses some hits.
      constexpr size_t kMaxHashes = 200000;
      if (cache.stored.size() > kMaxHashes) cache.stored.resize(kMaxHashes);
      if (cache.removed.size() > kMaxHashes) cache.removed.resize(kMaxHashes);
      pdq::v1::PrefixCacheUpdate* u = req.mutable_cache();
      u->set_full(cache.full);
      u->mutable_stored()->Add(cache.stored.begin(), cache.stored.end());
      u->mutable_removed()->Add(cache.removed.begin(), cache.removed.end());
      // The free blocks as counted with the requests they hold.
      if (cache.kv_blocks_free >= 0) req.mutable_load()->set_kv_blocks_free(cache.kv_blocks_free);
      if (cache.sequences_held >= 0) {
        req.mutable_load()->set_sequences_held((int32_t)cache.sequences_held);
      }
      for (std::string& id : cache.kv_taken)
        req.mutable_load()->add_kv_taken_request_ids(std::move(id));
      req.mutable_load()->set_kv_taken_reported(true);
      for (std::string& id : cache.kv_released)
        req.mutable_load()->add_kv_released_request_ids(std::move(id));
      req.mutable_load()->set_kv_released_reported(true);
      pdq::v1::HeartbeatResponse resp;
      s = stub->Heartbeat(&ctx, req, &resp);
      cache_synced = s.ok();
      if (s.ok() && !resp.registered()) registered = false;
    }
    if (!s.ok() && s.error_message() != last_error) {
      LogLine(absl::StrCat("router ", router, " unreachable (", s.error_message(),
                           "); retrying"));
      last_error = s.error_message();
      registered = false;
    } else if (s.ok()) {
      last_error.clear();
    }
    if (heartbeat_now) continue;
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(interval)),
                 [&] { return stopping_ || gone; });
  }
  if (registered) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    pdq::v1::DeregisterRequest req;
    req.set_worker_id(options_.worker_id);
    req.set_migrate_streams(migrate_on_deregister_);
    pdq::v1::DeregisterResponse resp;
    if (stub->Deregister(&ctx, req, &resp).ok() && resp.migrating() > 0) {
      LogLine(absl::StrCat("the router at ", router, " is moving ", resp.migrating(),
                           " of its streams here to other decode workers"));
    }
  }
}

}  // namespace pdq::worker
