#include "harness/local_run.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdq {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<pid_t> g_child{-1};

void OnSignal(int) {
  g_interrupted = true;
  const pid_t child = g_child.load();
  if (child > 0) kill(child, SIGTERM);
}

}  // namespace

std::string SelfPath() {
  const std::string path = std::filesystem::read_symlink("/proc/self/exe").string();
  // Rebuilt while running: the file is gone, but this process's /proc entry
  // still executes it for as long as this process lives, which is as long
  // as its children need it.
  if (absl::EndsWith(path, " (deleted)")) return absl::StrCat("/proc/", getpid(), "/exe");
  return path;
}

int Spawn(const std::vector<std::string>& args, const SpawnOptions& options) {
  const pid_t parent = getpid();
  std::vector<char*> argv;  // built before fork: the child only execs
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // The child: default signal dispositions and mask, the output files, the
  // CPUs, and SIGTERM when the parent dies (`pdq up` stops its own on it).
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127);  // the parent died before the line above
  if (!options.stdout_path.empty()) {
    if (std::freopen(options.stdout_path.c_str(), options.append ? "a" : "w", stdout) == nullptr) {
      _exit(127);
    }
    if (options.stderr_too) dup2(fileno(stdout), fileno(stderr));
  }
  if (!options.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : options.cpus) CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  execv(argv[0], argv.data());
  std::fprintf(stderr, "pdq: cannot run %s\n", argv[0]);
  _exit(127);
}

void CatchInterrupts() {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
}

bool interrupted() { return g_interrupted; }

int RunChild(const std::vector<std::string>& args, const std::string& stdout_path,
             bool stderr_too) {
  SpawnOptions options;
  options.stdout_path = stdout_path;
  options.stderr_too = stderr_too && !stdout_path.empty();
  const pid_t pid = Spawn(args, options);
  if (pid < 0) return -1;
  g_child = pid;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

absl::Status LocalDeployment::Start(const nlohmann::json& config, const std::string& dir) {
  const std::string cfg = dir + "/up.json", addr = dir + "/router.addr",
                    metrics = dir + "/router.metrics.addr";
  std::ofstream(cfg) << config.dump(1) << "\n";
  std::filesystem::remove(addr);
  std::filesystem::remove(metrics);
  SpawnOptions options;
  options.stdout_path = dir + "/up.log";
  options.stderr_too = true;
  options.append = true;  // a resumed evaluation keeps the earlier sittings' log
  std::ofstream(options.stdout_path, std::ios::app)
      << LogStamp() << " pdq eval: starts this deployment (pdq up --config " << cfg << ")\n";
  pid_ = Spawn({SelfPath(), "up", "--config", cfg, "--address-file", addr, "--metrics-address-file",
                metrics},
               options);
  if (pid_ < 0) return absl::InternalError("fork failed");
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(15);
  for (;;) {
    if (std::ifstream in(addr); in && std::getline(in, address_) && !address_.empty()) {
      std::getline(std::ifstream(metrics), metrics_address_);  // written before `addr`
      break;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat("pdq up exited before serving; its log: ", dir, "/up.log"));
    }
    if (g_interrupted) return absl::CancelledError("interrupted");
    if (std::chrono::steady_clock::now() > end) {
      return absl::DeadlineExceededError(
          absl::StrCat("pdq up did not serve within 15 minutes; its log: ", dir, "/up.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::OkStatus();
}

void LocalDeployment::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 600; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace pdq
