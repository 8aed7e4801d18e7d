// The worker process: parses flags, loads the model(s), creates the KV cache
// and its transport, starts the scheduler and the gRPC server, and stops
// cleanly on SIGINT or SIGTERM.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "emulate/emulate.h"
#include "flags/flags.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"
#include "policy/traffic_split.h"
#include "probes/roofline.h"
#include "quant/model_flags.h"
#include "server/metrics.h"
#include "worker/router_targets.h"
#include "worker/worker_server.h"

namespace pdq::worker {
namespace {

pdq::v1::Precision ToProto(Precision p) {
  switch (p) {
    case Precision::kFp16:
      return pdq::v1::PRECISION_FP16;
    case Precision::kW8A8:
      return pdq::v1::PRECISION_W8A8;
    case Precision::kW4A16:
      return pdq::v1::PRECISION_W4A16;
  }
  return pdq::v1::PRECISION_UNSPECIFIED;
}

// The machine's rooflines, once before serving, so /metrics can express
// prefill compute and decode bandwidth as fractions of them: the peak that
// matches the prefill's arithmetic and the read bandwidth of all threads.
// W8A8 prompt rows run on int8 dot products, W4A16 ones on int16 dot
// products (the AVX2 and AVX-512 paths), FP16 on FP32 FMA. Where AMX's bf16
// tiles take W4A16 prompt rows, no probe measures their peak, and the FP32
// FMA one stands in (the fraction can then pass 1).
void MeasurePeaks(ThreadPool& pool, Precision prefill) {
  double gops = 0;
  const char* kind = "";
  if (prefill == Precision::kW8A8) {
    gops = MeasureIntPeakGops(pool, /*int8=*/true);
    kind = "int8 multiply-adds";
  } else if (prefill == Precision::kW4A16 && !Bf16TilesSupported()) {
    gops = MeasureIntPeakGops(pool, /*int8=*/false);
    kind = "int16 multiply-adds";
  }
  if (gops <= 0) {
    gops = MeasureFmaPeakGflops(pool);
    kind = "fp32 FMA";
  }
  const double gbps = MeasureReadBandwidthGBps(pool, int64_t{128} << 20);
  server::Metrics& m = server::Metrics::Global();
  m.GetGauge("pdq_machine_peak_ops_per_second",
             "Peak arithmetic rate of this worker's threads for its prefill precision, measured "
             "at start-up.")
      .Set(gops * 1e9);
  m.GetGauge("pdq_machine_read_bytes_per_second",
             "Read bandwidth of this worker's threads, measured at start-up.")
      .Set(gbps * 1e9);
  LogLine(absl::StrFormat("machine peaks: %.1f G ops/s (%s), %.1f GB/s read", gops, kind, gbps));
}

}  // namespace

int WorkerMain(int argc, char** argv, const char* program, Role default_role) {
  server::BlockStopSignals();
  LogProcessName() = program;
  ModelFlags model_flags;
  std::string role_name = RoleName(default_role), listen = "127.0.0.1:0", router, advertise,
              kv_transport = "tcp", kv_listen, prefill_precision, address_file, worker_id,
              metrics_listen = "127.0.0.1:0", metrics_address_file, router_tls_name, pool,
              decode_precision;
  ServerSecurityFlags security;
  int64_t kv_tokens = 65536, block_tokens = 16, budget = 2048, max_batch = 64, lease_s = 30,
          stall_s = 30, max_unsent = 64, drain_seconds = 30;
  FlagParser flags(program,
                   absl::StrCat("A pdq ", RoleName(default_role),
                                " worker: serves the DecodeWorker and PrefillWorker gRPC services "
                                "(with health and reflection) and registers with a router."),
                   /*program=*/true);
  model_flags.Register(flags);
  flags.String("role", &role_name,
               "prefill, decode, or both (one process runs both phases: the monolithic baseline)");
  flags.String("prefill-precision", &prefill_precision,
               "role both: the precision prompts are computed at (default: --precision), so "
               "one process can prefill at W8A8 and decode at W4A16");
  flags.String("listen", &listen, "gRPC host:port; port 0 picks a free one");
  flags.String("address-file", &address_file,
               "write the gRPC address here once serving (for scripts and pdq up)");
  flags.String("metrics-listen", &metrics_listen,
               "host:port for Prometheus /metrics over HTTP; port 0 picks a free one");
  flags.String("metrics-address-file", &metrics_address_file,
               "write the /metrics address here once serving");
  flags.String("router", &router,
               "register with these routers: a comma-separated list of gRPC addresses "
               "(host:port), where dns:///NAME:PORT stands for every address NAME has, looked "
               "up again every 5 s (a Kubernetes headless Service over router replicas); each "
               "router gets the heartbeats, so every router knows every worker");
  security.Register(flags);
  flags.String("decode-precision", &decode_precision,
               "the decode's precision: the same as --precision (for --role both beside "
               "--prefill-precision)");
  flags.String("pool", &pool,
               "the pool this worker joins, for a router splitting traffic between pools "
               "(pdq-router --split); labels its request metrics; empty: none");
  flags.String("router-tls-name", &router_tls_name,
               "with TLS, the name the router's certificate must carry (default: the host of "
               "--router)");
  flags.String("advertise-host", &advertise,
               "the host the router should use for this worker (default: the --listen host)");
  flags.String("worker-id", &worker_id, "this worker's name in the router (default: generated)");
  flags.String(
      "kv-transport", &kv_transport,
      "how KV caches travel: tcp, or ucx (IPv4; keep its port on a network only workers reach)");
  flags.String("kv-listen", &kv_listen,
               "host:port the KV transport listens on (default: the --listen host, port 0)");
  flags.Int("kv-tokens", &kv_tokens, 16, int64_t{1} << 30,
            "KV cache size in tokens, shared by all sequences");
  flags.Int("block-tokens", &block_tokens, 1, 1024,
            "tokens per KV block; the CPU attention kernels take multiples of 16, other sizes "
            "take the scalar attention (decode several times slower)");
  flags.Int("prefill-budget", &budget, 1, 1 << 20,
            "prompt tokens per prefill step; longer prompts run in chunks");
  flags.Int("max-batch", &max_batch, 1, 4096, "sequences per decode step");
  std::string tpot_target = "off";
  flags.String(
      "tpot-target-ms", &tpot_target,
      "while streams decode, how much prompt work a step may take (stall-free batching): "
      "'auto' (the steps' own measured costs: prompt work takes at most --prompt-share of a "
      "step, so a stream waits at most 1/(1 - share) times its decode step and prompts keep "
      "that share of their rate), N (ms: each step within N by the measured step times, prompts "
      "still advancing at least one KV block a step), or 'off' (each step takes the whole "
      "--prefill-budget and decoding waits for it); bench/RESULTS.md, 'Stall-free steps'");
  double prompt_share = 0.75;
  flags.Float("prompt-share", &prompt_share, 0.1, 0.95,
              "with --tpot-target-ms auto: the share of a step prompt work may take while "
              "streams decode");
  flags.Int("lease-seconds", &lease_s, 1, 3600,
            "how long a decode reservation waits for the prefill worker to connect (when it "
            "queues the prompt) and, once the KV landed, for the Decode call");
  flags.Int("stall-seconds", &stall_s, 1, 3600,
            "a stream whose client takes no tokens this long is cancelled");
  flags.Int("max-unsent", &max_unsent, 1, 1 << 20,
            "tokens a client may leave unread before its sequence pauses");
  flags.Int("drain-seconds", &drain_seconds, 0, 3600,
            "on SIGTERM, leave the router's rotation and let requests in flight finish for up "
            "to this long before ending them (0: end them at once); keep it below the "
            "orchestrator's grace period; the exit status is 3 when the time ran out");
  bool keep_streams = false;
  flags.Bool("keep-streams-on-drain", &keep_streams,
             "on SIGTERM, finish this decode worker's streams here (for up to --drain-seconds) "
             "instead of asking the routers to move them, with their KV, to other decode "
             "workers with room (live migration; a stream no worker can take stays here)");
  std::string prefix_cache = "on";
  flags.String("prefix-cache", &prefix_cache,
               "on: keep whole KV blocks of prompts and answers after requests end (until the "
               "memory is needed) and reuse them for prompts that start the same way, such as "
               "a conversation's next turn; off: compute every prompt whole (for comparisons)");
  bool reuse_any_precision = true;
  flags.Bool("reuse-kv-any-precision", &reuse_any_precision,
             "with --prefix-cache on, reuse cached KV whatever precision wrote it (default "
             "true: a W8A8 prefill reuses a W4A16-written answer, and a decode worker "
             "prefills short follow-ups at its own precision; the evaluation report measured "
             "no accuracy cost, README \"KV reuse across requests\"); "
             "--reuse-kv-any-precision=false reuses only KV written at the precision that "
             "would compute it, so greedy answers equal those without the cache");
  std::string emulate_profile;
  flags.String("emulate", &emulate_profile,
               "a `pdq profile` file: run no model, only its shape (from --model); every forward "
               "pass takes the time the profile's pass of this precision and --threads measured "
               "for its work, and everything else (scheduling, KV cache and transfers, gRPC, "
               "the router protocol) is real; the emulation tier, for checking `pdq sim` with "
               "more workers than the cores could compute for; answers are a fixed text; its KV "
               "cache (--kv-dtype) must be the element type the profile ran on");
  double emulate_time_scale = 1;
  flags.Float("emulate-time-scale", &emulate_time_scale, 0.01, 1000,
              "with --emulate: every pass takes this many times the profile's time");
  double emulate_load_seconds = -1;
  flags.Float("emulate-load-seconds", &emulate_load_seconds, -1, 3600,
              "with --emulate: wait this long before serving, as loading a model would take; "
              "-1: the profile's load time for this precision (0 where it has none)");
  bool skip_peaks = false;
  flags.Bool("skip-peaks", &skip_peaks,
             "do not measure the machine's compute peak and read bandwidth at start-up (about "
             "a second); /metrics then has no utilization baselines");
  if (int rc = ParseOrExit(flags, argc, argv, 1, program); rc >= 0) return rc;
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "%s: error: %s\n", program, std::string(s.message()).c_str());
    return 1;
  };
  if (prefix_cache != "on" && prefix_cache != "off") {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--prefix-cache must be on or off, not '", prefix_cache, "'")));
  }
  int64_t tpot_target_ms = 0;
  if (tpot_target != "auto" && tpot_target != "off" &&
      (!absl::SimpleAtoi(tpot_target, &tpot_target_ms) || tpot_target_ms < 0 ||
       tpot_target_ms > 60000)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--tpot-target-ms must be auto, off or milliseconds in [0, 60000], not '",
                     tpot_target, "'")));
  }
  absl::StatusOr<Role> role = ParseRole(role_name);
  if (!role.ok()) return fail(WithFlagNames(role.status(), {{"role", "--role"}}));
  if (!prefill_precision.empty() && *role != Role::kBoth) {
    return fail(absl::InvalidArgumentError("--prefill-precision needs --role both"));
  }
  if (!router.empty()) {
    if (absl::StatusOr<std::vector<RouterEntry>> r = ParseRouterList(router); !r.ok()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--router: ", r.status().message())));
    }
  }
  if (!pool.empty() && !policy::ValidPoolName(pool)) {
    return fail(
        absl::InvalidArgumentError("--pool must have 1 to 64 characters of A-Z a-z 0-9 . _ -"));
  }
  if (!decode_precision.empty()) {
    if (flags.Given("precision") && model_flags.precision != decode_precision) {
      return fail(absl::InvalidArgumentError(
          "--decode-precision and --precision name the same thing; give one"));
    }
    model_flags.precision = decode_precision;
  }
  // Certificates before the model: a wrong path should not cost a load.
  absl::StatusOr<std::optional<server::TlsPem>> tls =
      server::LoadServerTls({security.tls_cert, security.tls_key, security.tls_ca});
  if (!tls.ok()) return fail(tls.status());

  // Loading (calibrating, uncached, for minutes) holds no request: a stop
  // signal meanwhile ends the process at once.
  server::ExitOnStopSignalUntilServing("loading the model");

  // Models: one, or for role both at two precisions, two sharing one layout.
  std::optional<sim::Profile> profile;
  if (!emulate_profile.empty()) {
    absl::StatusOr<sim::Profile> p = sim::ReadProfile(emulate_profile);
    if (!p.ok()) {
      return fail(
          absl::Status(p.status().code(), absl::StrCat("--emulate: ", p.status().message())));
    }
    profile = std::move(*p);
  }
  double emulated_load = 0;
  auto load = [&](const std::string& precision) -> absl::StatusOr<LoadedModel> {
    if (!profile) return model_flags.Load(false, precision);
    absl::StatusOr<KvDtype> kv_dtype = ParseKvDtype(model_flags.kv_dtype);
    if (!kv_dtype.ok()) return kv_dtype.status();
    absl::StatusOr<emulate::EmulatedModel> m = emulate::LoadEmulated(
        *profile, model_flags.model, precision.empty() ? model_flags.precision : precision,
        (int)model_flags.threads, emulate_time_scale, CpuContext{&model_flags.pool()}, *kv_dtype);
    if (!m.ok())
      return absl::Status(m.status().code(), absl::StrCat("--emulate: ", m.status().message()));
    const policy::StepCoefficients& t = m->pass.time;
    LogLine(absl::StrFormat(
        "emulating %s at %s, %d threads, by %s: %.2f ms a pass + %.3f ms a decode row + %.3f ms "
        "a prompt token + %.3g ms a prompt attention pair + %.3g ms a decode one and steps by rows "
        "at %zu row counts, x%g",
        model_flags.model, m->pass.precision, m->pass.threads, emulate_profile, t.fixed * 1e3,
        t.per_row * 1e3, t.per_token * 1e3, t.per_pair * 1e3, t.per_decode_pair * 1e3,
        t.row_steps.size(), emulate_time_scale));
    emulated_load += m->pass.load_seconds;
    return LoadedModel{std::move(m->model), std::move(m->ctx)};
  };
  absl::StatusOr<LoadedModel> main_model = load("");
  if (!main_model.ok()) return fail(main_model.status());
  LoadedModel prefill_model;
  Context* prefill_ctx = main_model->ctx.get();
  if (!prefill_precision.empty() && prefill_precision != model_flags.precision) {
    absl::StatusOr<LoadedModel> m = load(prefill_precision);
    if (!m.ok()) return fail(m.status());
    prefill_model = std::move(*m);
    prefill_ctx = prefill_model.ctx.get();
  }
  if (profile) {
    const double wait = emulate_load_seconds >= 0 ? emulate_load_seconds : emulated_load;
    LogLine(absl::StrFormat("emulated model load: %.1f s", wait));
    absl::SleepFor(absl::Seconds(wait));
  }
  const Model& model = *main_model->model;
  if (!skip_peaks && !profile) MeasurePeaks(model_flags.pool(), prefill_ctx->model().precision());
  const KvLayout layout = model.kv_layout((int)block_tokens);
  const int64_t blocks = (kv_tokens + block_tokens - 1) / block_tokens;
  absl::StatusOr<std::unique_ptr<KvCache>> kv = KvCache::Create({layout, blocks});
  if (!kv.ok()) return fail(kv.status());

  std::unique_ptr<kvtransfer::Transport> transport;
  if (*role != Role::kBoth) {
    kvtransfer::TransportOptions to;
    to.listen_address = kv_listen.empty() ? listen.substr(0, listen.rfind(':')) + ":0" : kv_listen;
    to.layout = layout;
    to.regions = (*kv)->MemoryRegions();
    absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> t =
        kvtransfer::CreateTransport(kv_transport, to);
    if (!t.ok()) return fail(WithFlagNames(t.status(), {{"transport", "--kv-transport"}}));
    transport = std::move(*t);
  }

  // Loading freed its staging (dequantized tensors, calibration copies);
  // hand those pages back to the system rather than keep them in malloc's
  // free lists for the process's life.
  malloc_trim(0);

  SchedulerOptions so;
  so.role = *role;
  so.prefill_token_budget = budget;
  so.max_decode_batch = (int)max_batch;
  so.tpot_target = absl::Milliseconds(tpot_target_ms);
  if (tpot_target == "auto") so.prompt_share = prompt_share;
  so.calibrate_step_costs = tpot_target == "auto" || tpot_target_ms > 0;
  so.reservation_lease = absl::Seconds(lease_s);
  so.stalled_stream_timeout = absl::Seconds(stall_s);
  so.max_unsent_tokens = max_unsent;
  so.prefix_cache = prefix_cache == "on";
  so.reuse_any_precision = reuse_any_precision;
  so.pool = pool;
  Context* decode_ctx = *role == Role::kPrefill ? nullptr : main_model->ctx.get();
  if (*role == Role::kDecode) prefill_ctx = nullptr;
  auto scheduler =
      std::make_unique<Scheduler>(so, prefill_ctx, decode_ctx, std::move(*kv), transport.get());

  WorkerServerOptions wo;
  wo.listen = listen;
  wo.router = router;
  wo.advertise_host = advertise;
  wo.worker_id = worker_id;
  wo.role = *role;
  wo.precision = ToProto(model.precision());
  wo.model_name = model.config().name;
  wo.vocab_size = model.config().vocab_size;
  wo.max_context = (int)model.config().max_context;
  wo.tls = *tls;
  wo.router_tls_name = router_tls_name;
  wo.health_listen = security.health_listen;
  wo.pool = pool;
  wo.migrate_on_drain = !keep_streams;
  absl::StatusOr<std::unique_ptr<server::MetricsServer>> metrics =
      server::ServeMetrics(metrics_listen);
  if (!metrics.ok()) {
    return fail(absl::Status(metrics.status().code(),
                             absl::StrCat("--metrics-listen: ", metrics.status().message())));
  }
  wo.metrics_address = (*metrics)->address();
  if (!advertise.empty()) {
    wo.metrics_address = advertise + wo.metrics_address.substr(wo.metrics_address.rfind(':'));
  }
  // From here a stop signal drains what the server took.
  server::StopSignalsNowServing();
  absl::StatusOr<std::unique_ptr<WorkerServer>> server =
      WorkerServer::Start(wo, scheduler.get(), transport.get());
  if (!server.ok()) return fail(WithFlagNames(server.status(), {{"listen", "--listen"}}));
  LogLine(absl::StrCat(
      RoleName(*role), " worker serving on ", (*server)->address(),
      transport ? absl::StrCat(", KV over ", transport->name(), " at ", transport->address())
                : std::string(),
      ", ", blocks, " KV blocks of ", block_tokens, " tokens",
      block_tokens % 16 != 0 && main_model->ctx->device() == "cpu"
          ? " (the CPU attention kernels take multiples of 16 tokens: this size takes the "
            "scalar attention, several times slower)"
          : "",
      tls->has_value() ? ", mutual TLS" : ", plaintext", ", metrics at http://",
      (*metrics)->address(), "/metrics"));
  server::WriteAddressFiles(
      address_file, (*server)->address(),
      {{metrics_address_file, (*metrics)->address()},
       {(*server)->health_address().empty() ? "" : security.health_address_file,
        (*server)->health_address()}});
  const std::string sig = server::WaitForStopSignal();
  LogLine(absl::StrCat(sig, ": stopping", drain_seconds > 0 ? ", draining first" : ""));
  // Exit status 3: the drain ran out of time and requests were ended.
  const bool drained = drain_seconds == 0 || (*server)->Drain(absl::Seconds(drain_seconds));
  server->reset();    // deregister, stop accepting, finish calls
  scheduler.reset();  // fail what is left, free the KV
  transport.reset();
  LogLine("stopped");
  return drained ? 0 : 3;
}

}  // namespace pdq::worker
