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
#include "common/check.h"
#include "harness/local_run.h"
#include "pdq/v1/pdq.grpc.pb.h"
#include "server/server.h"
#include "tools/commands.h"

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

// The processes of one `pdq up`: the router first (children_[0]), then
// the workers in the config's order.
class Supervisor {
 public:
  explicit Supervisor(int drain_s) : drain_s_(drain_s) {
    char dir_template[] = "/tmp/pdq-up-XXXXXX";
    dir_ = mkdtemp(dir_template);
  }
  ~Supervisor() { Stop(); }

  // Stops every process (workers first; each drains) and removes the files.
  void Stop() {
    StopAll(children_, drain_s_);
    children_.clear();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  // The children's command lines from the config (nothing started yet).
  absl::Status Configure(const nlohmann::json& cfg);
  // Starts the router, then the workers, and waits until every worker has
  // registered; the router's gRPC address.
  absl::StatusOr<std::string> Start();
  // Prints where each process serves and writes the address files the
  // flags asked for; the router restarts on the addresses it bound.
  void Announce(const std::string& address_file, const std::string& metrics_address_file,
                const std::string& http_address_file);
  // Until SIGINT or SIGTERM: each process that dies is started again. False
  // when the router could not be started again.
  bool Supervise();

 private:
  std::vector<std::string> RouterArgs(const std::string& listen, const std::string& http,
                                      const std::string& metrics) const;
  absl::StatusOr<Child> WorkerChild(const nlohmann::json& w, int index,
                                    const std::string& router_address) const;
  // One pass over the children: reaps the dead, restarts the due. False
  // when the router is given up on.
  bool Reap(std::chrono::steady_clock::time_point now);
  void AnnounceRestarts();

  const int drain_s_;
  std::string dir_, bin_, model_, transport_, host_, listen_, http_listen_;
  std::vector<std::string> router_flags_;
  nlohmann::json workers_;
  std::vector<Child> children_;
};

absl::Status Supervisor::Configure(const nlohmann::json& cfg) {
  // (read_symlink, not canonical: the binary may have been rebuilt since.)
  bin_ = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  model_ = cfg.value("model", DefaultModelPath());
  transport_ = cfg.value("kv_transport", std::string("tcp"));
  host_ = cfg.value("host", std::string("127.0.0.1"));
  listen_ = cfg.value("listen", host_ + ":50051");
  http_listen_ = cfg.value("http_listen", host_ + ":0");
  workers_ = cfg["workers"];
  const std::string router_file = dir_ + "/router";
  // The router's flags but its addresses; a restart gets the addresses the
  // first start bound, where the workers and clients know it.
  router_flags_ = {bin_ + "/pdq-router",
                   "--model",
                   model_,
                   "--address-file",
                   router_file,
                   "--metrics-address-file",
                   router_file + ".metrics",
                   "--http-address-file",
                   router_file + ".http",
                   "--drain-seconds",
                   std::to_string(drain_s_)};
  // An A/B rollout: "split": "POOL=WEIGHT,...", workers' "pool".
  if (cfg.contains("split")) {
    if (!cfg["split"].is_string()) {
      return absl::InvalidArgumentError("\"split\" must be a string (POOL=WEIGHT,...)");
    }
    router_flags_.insert(router_flags_.end(), {"--split", cfg["split"].get<std::string>()});
    if (cfg.value("split_sticky", false)) router_flags_.push_back("--split-sticky");
  }
  // More router flags: "router_args": ["--local-prefill-tokens", "0"].
  if (cfg.contains("router_args")) {
    const absl::Status bad =
        absl::InvalidArgumentError("\"router_args\" must be an array of strings");
    if (!cfg["router_args"].is_array()) return bad;
    for (const auto& a : cfg["router_args"]) {
      if (!a.is_string()) return bad;
      router_flags_.push_back(a.get<std::string>());
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Supervisor::RouterArgs(const std::string& listen, const std::string& http,
                                                const std::string& metrics) const {
  std::vector<std::string> args = router_flags_;
  args.insert(args.end(), {"--listen", listen, "--http-listen", http});
  if (!metrics.empty()) args.insert(args.end(), {"--metrics-listen", metrics});
  return args;
}

absl::StatusOr<Child> Supervisor::WorkerChild(const nlohmann::json& w, int index,
                                              const std::string& router_address) const {
  if (!w.is_object()) return absl::InvalidArgumentError("each worker must be a JSON object");
  const std::string role = w.value("role", std::string("both"));
  Child c;
  c.name = absl::StrCat("worker ", index, " (", role, ")");
  c.address_file = absl::StrCat(dir_, "/worker", index);
  c.args = {bin_ + (role == "prefill" ? "/pdq-prefill" : "/pdq-decode"),
            "--role",
            role,
            "--model",
            model_,
            "--precision",
            w.value("precision", std::string("fp16")),
            "--router",
            router_address,
            "--listen",
            host_ + ":0",
            "--kv-transport",
            transport_,
            "--address-file",
            c.address_file,
            "--metrics-address-file",
            c.address_file + ".metrics",
            "--worker-id",
            w.value("id", absl::StrCat(role, "-", index)),
            "--threads",
            std::to_string(w.value("threads", 0)),
            "--drain-seconds",
            std::to_string(drain_s_)};
  if (w.contains("prefill_precision")) {
    c.args.insert(c.args.end(), {"--prefill-precision", w["prefill_precision"].get<std::string>()});
  }
  if (w.contains("pool")) {
    if (!w["pool"].is_string()) {
      return absl::InvalidArgumentError("a worker's \"pool\" must be a string");
    }
    c.args.insert(c.args.end(), {"--pool", w["pool"].get<std::string>()});
  }
  if (w.contains("args") && w["args"].is_array()) {
    for (const auto& a : w["args"]) c.args.push_back(a.get<std::string>());
  }
  PDQ_ASSIGN_OR_RETURN(c.options.cpus, ParseCpus(w.value("cpus", std::string())));
  return c;
}

absl::StatusOr<std::string> Supervisor::Start() {
  Child router;
  router.name = "pdq-router";
  router.address_file = dir_ + "/router";
  router.args = RouterArgs(listen_, http_listen_, "");
  pdq::Start(router);
  if (router.pid < 0) return absl::UnavailableError("fork failed");
  children_.push_back(router);
  std::string router_address;
  if (!WaitForFile(children_[0], std::chrono::seconds(30), &router_address)) {
    return absl::UnavailableError("the router did not start (see its log above)");
  }
  int index = 0;
  for (const nlohmann::json& w : workers_) {
    PDQ_ASSIGN_OR_RETURN(Child c, WorkerChild(w, index++, router_address));
    pdq::Start(c);
    if (c.pid < 0) return absl::UnavailableError("fork failed");
    children_.push_back(std::move(c));
  }
  for (size_t i = 1; i < children_.size(); ++i) {
    std::string addr;
    if (!WaitForFile(children_[i], std::chrono::seconds(600), &addr)) {
      return absl::UnavailableError(
          absl::StrCat(children_[i].name, " did not start (see its log above)"));
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
        info.live_workers() == (int)children_.size() - 1) {
      return router_address;
    }
    if (std::chrono::steady_clock::now() > end) {
      return absl::UnavailableError("the workers did not all register");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Supervisor::Announce(const std::string& address_file, const std::string& metrics_address_file,
                          const std::string& http_address_file) {
  const Child& router = children_[0];
  std::string router_address;
  std::getline(std::ifstream(router.address_file), router_address);
  std::printf("pdq up: serving on %s (%zu workers); Ctrl-C stops everything\n",
              router_address.c_str(), children_.size() - 1);
  // Each process wrote its /metrics address before its gRPC address.
  for (const Child& c : children_) {
    std::string metrics;
    std::ifstream in(c.address_file + ".metrics");
    if (in && std::getline(in, metrics)) {
      std::printf("pdq up: %s metrics at http://%s/metrics\n", c.name.c_str(), metrics.c_str());
    }
  }
  std::string http_address, metrics;
  if (std::ifstream in(router.address_file + ".http"); in && std::getline(in, http_address)) {
    std::printf("pdq up: OpenAI-compatible API at http://%s/v1\n", http_address.c_str());
  }
  std::fflush(stdout);
  std::getline(std::ifstream(router.address_file + ".metrics"), metrics);
  // The HTTP address first: readers wait for the gRPC one.
  if (!http_address_file.empty() && !http_address.empty()) {
    server::WriteAddressFile(http_address_file, http_address);
  }
  if (!metrics_address_file.empty() && !metrics.empty()) {
    server::WriteAddressFile(metrics_address_file, metrics);
  }
  if (!address_file.empty()) server::WriteAddressFile(address_file, router_address);
  children_[0].args = RouterArgs(router_address, http_address, metrics);
}

bool Supervisor::Reap(std::chrono::steady_clock::time_point now) {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
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
          return false;
        }
      }
      c.backoff = ran >= kStableRun
                      ? std::chrono::seconds(1)
                      : std::min(kMaxBackoff, std::max(std::chrono::seconds(1), c.backoff * 2));
      c.restart_at = now + c.backoff;
      std::fprintf(stderr, "pdq up: %s exited (%s) after %.1f s; starting it again in %lld s\n",
                   c.name.c_str(), ExitDescription(status).c_str(),
                   std::chrono::duration<double>(ran).count(), (long long)c.backoff.count());
    } else if (c.pid < 0 && now >= c.restart_at) {
      pdq::Start(c);
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
  return true;
}

// A restarted worker listens on new ports (it tells the router; the
// router's own addresses stay): say where, as at the start.
void Supervisor::AnnounceRestarts() {
  for (Child& c : children_) {
    std::string addr, metrics;
    if (c.pid > 0 && c.restarts > 0 && !c.announced &&
        std::getline(std::ifstream(c.address_file), addr) && !addr.empty()) {
      c.announced = true;
      std::getline(std::ifstream(c.address_file + ".metrics"), metrics);
      std::printf("pdq up: %s serving again at %s\n", c.name.c_str(), addr.c_str());
      if (!metrics.empty()) {
        std::printf("pdq up: %s metrics at http://%s/metrics\n", c.name.c_str(), metrics.c_str());
      }
      std::fflush(stdout);
    }
  }
}

bool Supervisor::Supervise() {
  auto signalled = std::make_shared<std::atomic<bool>>(false);
  std::thread([signalled] {
    server::WaitForStopSignal();
    *signalled = true;
  }).detach();
  while (!*signalled) {
    if (!Reap(std::chrono::steady_clock::now())) return false;
    AnnounceRestarts();
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
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
  server::BlockStopSignals();
  Supervisor supervisor(drain_s);
  if (absl::Status s = supervisor.Configure(cfg); !s.ok()) return Fail("up", s);  // nothing started
  absl::StatusOr<std::string> router = supervisor.Start();
  if (!router.ok()) {
    supervisor.Stop();  // the started ones drain first; then the error, last on the terminal
    return Fail("up", router.status());
  }
  supervisor.Announce(address_file, metrics_address_file, http_address_file);
  const bool kept = supervisor.Supervise();
  supervisor.Stop();
  if (!address_file.empty()) std::filesystem::remove(address_file);
  std::printf("pdq up: stopped\n");
  return kept ? 0 : 1;
}

}  // namespace pdq
