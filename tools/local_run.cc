#include "tools/local_run.h"

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

#include "absl/strings/str_cat.h"

namespace pdq {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<pid_t> g_child{-1};

void OnSignal(int) {
  g_interrupted = true;
  const pid_t child = g_child.load();
  if (child > 0) kill(child, SIGTERM);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& stdout_path, bool stderr_too) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // The child: default signal dispositions, stdout (and stderr) to the file,
  // and SIGTERM when this process dies, however it dies: a deployment must
  // not outlive the run that started it (`pdq up` stops its own on SIGTERM).
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) _exit(127);  // the parent died before the line above
  if (!stdout_path.empty()) {
    if (std::freopen(stdout_path.c_str(), "w", stdout) == nullptr) _exit(127);
    if (stderr_too) dup2(fileno(stdout), fileno(stderr));
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  std::fprintf(stderr, "pdq: cannot run %s\n", argv[0]);
  _exit(127);
}

}  // namespace

std::string SelfPath() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

void CatchInterrupts() {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
}

bool interrupted() { return g_interrupted; }

int RunChild(const std::vector<std::string>& args, const std::string& stdout_path) {
  const pid_t pid = Spawn(args, stdout_path, false);
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
  pid_ = Spawn({SelfPath(), "up", "--config", cfg, "--address-file", addr, "--metrics-address-file",
                metrics},
               dir + "/up.log", /*stderr_too=*/true);
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
