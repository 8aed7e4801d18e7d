// `pdq up --config FILE`: starts pdq-router and the configured workers on
// this machine (precision, threads and CPU pinning per worker), waits until
// every worker is registered, prints the address, and then supervises them:
// a process that dies is started again with backoff (the workers register
// anew; the router comes back on the addresses it had), and the rest serve
// meanwhile. It stops them all on SIGINT or SIGTERM, or when the router
// cannot be started again.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "server/server.h"
#include "tools/commands.h"
#include "harness/local_run.h"

namespace pdq {
namespace {

struct Child {
  std::string name;
  pid_t pid = -1;
  std::string address_file;
  // How to start it again.
  std::vector<std::string> args;
  SpawnOptions options;
  // Supervision: when it last started, how long to wait before the next
  // start after it dies, and when that start is due (pid -1 meanwhile).
  std::chrono::steady_clock::time_point started;
  std::chrono::seconds backoff{0};
  std::chrono::steady_clock::time_point restart_at;
  int restarts = 0;
  bool announced = true;  // a restart's new addresses were printed
  // The router only: starts in a row that died before serving.
  int failed_starts = 0;
};

// A process that ran this long before dying starts again at once; one that
// dies sooner waits twice as long as the last time, up to kMaxBackoff.
constexpr std::chrono::seconds kStableRun{60};
constexpr std::chrono::seconds kMaxBackoff{30};
// The router is given up on after this many starts in a row that did not
// serve (its address is taken, its flags are wrong...).
constexpr int kRouterStartAttempts = 3;

std::string ExitDescription(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("status ", status);
}

void Start(Child& c) {
  std::filesystem::remove(c.address_file);
  std::filesystem::remove(c.address_file + ".metrics");
  std::filesystem::remove(c.address_file + ".http");
  c.pid = Spawn(c.args, c.options);
  c.started = std::chrono::steady_clock::now();
  c.announced = false;
}

absl::StatusOr<std::vector<int>> ParseCpus(const std::string& list) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::vector<std::string> range = absl::StrSplit(part, '-');
    int a, b;
    if (range.size() > 2 || !absl::SimpleAtoi(range[0], &a) ||
        !absl::SimpleAtoi(range.back(), &b) || a < 0 || b < a || b >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("bad cpu list '", list, "' (want 0-3,6)"));
    }
    for (int c = a; c <= b; ++c) cpus.push_back(c);
  }
  return cpus;
}

// Waits for a file a child writes once it serves; false when the child
// exited first or the time ran out.
bool WaitForFile(const Child& c, std::chrono::seconds limit, std::string* content) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(c.address_file);
    if (in && std::getline(in, *content) && !content->empty()) return true;
    int status;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The processes drain for up to `drain_s` (--drain-seconds) before they
// stop; any still running 15 s after that is killed.
void StopAll(std::vector<Child>& children, int drain_s) {
  // Workers first (they deregister), the router last.
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(drain_s + 15);
  for (Child& c : children) {
    while (c.pid > 0) {
      int status;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = -1;
      } else if (std::chrono::steady_clock::now() > end) {
        std::fprintf(stderr, "pdq up: %s did not stop in %d s; killing it\n", c.name.c_str(),
                     drain_s + 15);
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

}  // namespace

int UpCommand(int argc, char** argv) {
  std::string config_path, address_file, http_address_file, metrics_address_file;
  FlagParser flags("up",
                   "Starts pdq-router and the workers of a config (deploy/local/*.json), waits "
                   "until all are registered, and prints the router's address. It then keeps "
                   "them running: a process that dies is started again (after 1 s, doubling "
                   "up to 30 s while it keeps dying within a minute) and the rest serve "
                   "meanwhile. Ctrl-C or SIGTERM stops them all (each drains first), as does "
                   "a router that cannot be started again.");
  flags.String("config", &config_path, "the deployment (JSON; see deploy/local/)");
  flags.String("address-file", &address_file, "also write the router's address here when ready");
  flags.String("metrics-address-file", &metrics_address_file,
               "also write the router's /metrics address here (before --address-file)");
  flags.String("http-address-file", &http_address_file,
               "also write the router's OpenAI-compatible HTTP address here (before "
               "--address-file)");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (config_path.empty()) return Fail("up", absl::InvalidArgumentError("--config is required"));
  absl::StatusOr<std::string> text = ReadTextFile(config_path, "config");
  if (!text.ok()) return Fail("up", text.status());
  nlohmann::json cfg = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object() || !cfg.contains("workers") ||
      !cfg["workers"].is_array() || cfg["workers"].empty()) {
    return Fail("up", absl::InvalidArgumentError(absl::StrCat(
                          config_path, ": want a JSON object with a non-empty \"workers\" list")));
  }
  server::BlockStopSignals();
  // (read_symlink, not canonical: the binary may have been rebuilt since.)
  const std::string bin = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  const std::string model = cfg.value("model", DefaultModelPath());
  const std::string transport = cfg.value("kv_transport", std::string("tcp"));
  const std::string host = cfg.value("host", std::string("127.0.0.1"));
  // How long each process lets requests in flight finish when stopped.
  int drain_s = 10;
  if (cfg.contains("drain_seconds")) {
    if (!cfg["drain_seconds"].is_number_integer() || cfg["drain_seconds"].get<int>() < 0 ||
        cfg["drain_seconds"].get<int>() > 3600) {
      return Fail("up", absl::InvalidArgumentError(
                            absl::StrCat(config_path, ": drain_seconds must be 0..3600")));
    }
    drain_s = cfg["drain_seconds"].get<int>();
  }
  char dir_template[] = "/tmp/pdq-up-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::vector<Child> children;
  auto fail = [&](const std::string& why) {
    StopAll(children, drain_s);
    std::filesystem::remove_all(dir);
    return Fail("up", absl::UnavailableError(why));
  };

  Child router;
  router.name = "pdq-router";
  router.address_file = dir + "/router";
  // The router's flags but its addresses; a restart gets the addresses the
  // first start bound, where the workers and clients know it.
  std::vector<std::string> router_flags = {bin + "/pdq-router",
                                           "--model",
                                           model,
                                           "--address-file",
                                           router.address_file,
                                           "--metrics-address-file",
                                           router.address_file + ".metrics",
                                           "--http-address-file",
                                           router.address_file + ".http",
                                           "--drain-seconds",
                                           std::to_string(drain_s)};
  // An A/B rollout: "split": "POOL=WEIGHT,...", workers' "pool".
  if (cfg.contains("split")) {
    if (!cfg["split"].is_string()) return fail("\"split\" must be a string (POOL=WEIGHT,...)");
    router_flags.insert(router_flags.end(), {"--split", cfg["split"].get<std::string>()});
    if (cfg.value("split_sticky", false)) router_flags.push_back("--split-sticky");
  }
  // More router flags: "router_args": ["--local-prefill-tokens", "0"].
  if (cfg.contains("router_args")) {
    if (!cfg["router_args"].is_array()) return fail("\"router_args\" must be an array of strings");
    for (const auto& a : cfg["router_args"]) {
      if (!a.is_string()) return fail("\"router_args\" must be an array of strings");
      router_flags.push_back(a.get<std::string>());
    }
  }
  auto router_args = [&](const std::string& listen, const std::string& http,
                         const std::string& metrics) {
    std::vector<std::string> args = router_flags;
    args.insert(args.end(), {"--listen", listen, "--http-listen", http});
    if (!metrics.empty()) args.insert(args.end(), {"--metrics-listen", metrics});
    return args;
  };
  router.args = router_args(cfg.value("listen", host + ":50051"),
                            cfg.value("http_listen", host + ":0"), "");
  Start(router);
  if (router.pid < 0) return fail("fork failed");
  children.push_back(router);
  std::string router_address;
  if (!WaitForFile(children[0], std::chrono::seconds(30), &router_address)) {
    return fail("the router did not start (see its log above)");
  }

  int index = 0;
  for (const nlohmann::json& w : cfg["workers"]) {
    if (!w.is_object()) return fail("each worker must be a JSON object");
    const std::string role = w.value("role", std::string("both"));
    Child c;
    c.name = absl::StrCat("worker ", index, " (", role, ")");
    c.address_file = absl::StrCat(dir, "/worker", index);
    std::vector<std::string> args = {bin + (role == "prefill" ? "/pdq-prefill" : "/pdq-decode"),
                                     "--role",
                                     role,
                                     "--model",
                                     model,
                                     "--precision",
                                     w.value("precision", std::string("fp16")),
                                     "--router",
                                     router_address,
                                     "--listen",
                                     host + ":0",
                                     "--kv-transport",
                                     transport,
                                     "--address-file",
                                     c.address_file,
                                     "--metrics-address-file",
                                     c.address_file + ".metrics",
                                     "--worker-id",
                                     w.value("id", absl::StrCat(role, "-", index)),
                                     "--threads",
                                     std::to_string(w.value("threads", 0)),
                                     "--drain-seconds",
                                     std::to_string(drain_s)};
    if (w.contains("prefill_precision")) {
      args.push_back("--prefill-precision");
      args.push_back(w["prefill_precision"].get<std::string>());
    }
    if (w.contains("pool")) {
      if (!w["pool"].is_string()) return fail("a worker's \"pool\" must be a string");
      args.insert(args.end(), {"--pool", w["pool"].get<std::string>()});
    }
    if (w.contains("args") && w["args"].is_array()) {
      for (const auto& a : w["args"]) args.push_back(a.get<std::string>());
    }
    absl::StatusOr<std::vector<int>> cpus = ParseCpus(w.value("cpus", std::string()));
    if (!cpus.ok()) return fail(std::string(cpus.status().message()));
    c.args = std::move(args);
    c.options.cpus = *cpus;
    Start(c);
    if (c.pid < 0) return fail("fork failed");
    children.push_back(c);
    ++index;
  }
  for (size_t i = 1; i < children.size(); ++i) {
    std::string addr;
    if (!WaitForFile(children[i], std::chrono::seconds(600), &addr)) {
      return fail(absl::StrCat(children[i].name, " did not start (see its log above)"));
    }
  }
  // Every worker registered with the router.
  auto stub = pdq::v1::Pdq::NewStub(
      grpc::CreateChannel(router_address, grpc::InsecureChannelCredentials()));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    pdq::v1::ModelInfo info;
    if (stub->GetModelInfo(&ctx, {}, &info).ok() &&
        info.live_workers() == (int)children.size() - 1) {
      break;
    }
    if (std::chrono::steady_clock::now() > end) return fail("the workers did not all register");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("pdq up: serving on %s (%zu workers); Ctrl-C stops everything\n",
              router_address.c_str(), children.size() - 1);
  // Each process wrote its /metrics address before its gRPC address.
  for (const Child& c : children) {
    std::string metrics;
    std::ifstream in(c.address_file + ".metrics");
    if (in && std::getline(in, metrics)) {
      std::printf("pdq up: %s metrics at http://%s/metrics\n", c.name.c_str(), metrics.c_str());
    }
  }
  std::string http_address;
  if (std::ifstream in(router.address_file + ".http"); in && std::getline(in, http_address)) {
    std::printf("pdq up: OpenAI-compatible API at http://%s/v1\n", http_address.c_str());
  }
  std::fflush(stdout);
  // The HTTP address first: readers wait for the gRPC one.
  if (!http_address_file.empty() && !http_address.empty()) {
    server::WriteAddressFile(http_address_file, http_address);
  }
  if (std::string m; !metrics_address_file.empty() &&
                     std::getline(std::ifstream(router.address_file + ".metrics"), m)) {
    server::WriteAddressFile(metrics_address_file, m);
  }
  if (!address_file.empty()) {
    server::WriteAddressFile(address_file, router_address);
  }

  {
    std::string metrics;
    std::getline(std::ifstream(router.address_file + ".metrics"), metrics);
    children[0].args = router_args(router_address, http_address, metrics);
  }

  // Until a signal: each process that dies is started again.
  auto signalled = std::make_shared<std::atomic<bool>>(false);
  std::thread([signalled] {
    server::WaitForStopSignal();
    *signalled = true;
  }).detach();
  bool give_up = false;
  while (!*signalled && !give_up) {
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      int status;
      if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
        const auto ran = now - c.started;
        // A router that died before writing its address never served.
        if (i == 0) {
          std::string addr;
          const bool served = std::getline(std::ifstream(c.address_file), addr) && !addr.empty();
          c.failed_starts = served ? 0 : c.failed_starts + 1;
          if (c.failed_starts >= kRouterStartAttempts) {
            std::fprintf(stderr,
                         "pdq up: %s exited (%s) and could not be started again (%d starts in a "
                         "row did not serve); stopping the rest\n",
                         c.name.c_str(), ExitDescription(status).c_str(), c.failed_starts);
            give_up = true;
            break;
          }
        }
        c.backoff = ran >= kStableRun ? std::chrono::seconds(1)
                                      : std::min(kMaxBackoff, std::max(std::chrono::seconds(1),
                                                                       c.backoff * 2));
        c.restart_at = now + c.backoff;
        std::fprintf(stderr, "pdq up: %s exited (%s) after %.1f s; starting it again in %lld s\n",
                     c.name.c_str(), ExitDescription(status).c_str(),
                     std::chrono::duration<double>(ran).count(), (long long)c.backoff.count());
      } else if (c.pid < 0 && now >= c.restart_at) {
        Start(c);
        if (c.pid < 0) {
          c.restart_at = now + kMaxBackoff;
          std::fprintf(stderr, "pdq up: cannot fork to start %s again; trying in %lld s\n",
                       c.name.c_str(), (long long)kMaxBackoff.count());
          continue;
        }
        ++c.restarts;
        std::fprintf(stderr, "pdq up: started %s again (restart %d, pid %d)%s\n", c.name.c_str(),
                     c.restarts, (int)c.pid,
                     i == 0 ? "; the workers register with it again within a heartbeat" : "");
      }
    }
    // A restarted worker listens on new ports (it tells the router; the
    // router's own addresses stay): say where, as at the start.
    for (Child& c : children) {
      std::string addr, metrics;
      if (c.pid > 0 && c.restarts > 0 && !c.announced && std::getline(std::ifstream(c.address_file), addr) &&
          !addr.empty()) {
        c.announced = true;
        std::getline(std::ifstream(c.address_file + ".metrics"), metrics);
        std::printf("pdq up: %s serving again at %s\n", c.name.c_str(), addr.c_str());
        if (!metrics.empty()) {
          std::printf("pdq up: %s metrics at http://%s/metrics\n", c.name.c_str(), metrics.c_str());
        }
        std::fflush(stdout);
      }
    }
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  StopAll(children, drain_s);
  std::filesystem::remove_all(dir);
  if (!address_file.empty()) std::filesystem::remove(address_file);
  std::printf("pdq up: stopped\n");
  return give_up ? 1 : 0;
}

}  // namespace pdq
