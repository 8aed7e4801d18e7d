#include "eval/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace pdq {
namespace {

// In the child, before exec: report `what` and errno to the parent through
// `fd` and exit. Only async-signal-safe calls here.
[[noreturn]] void ChildFail(int fd, const char* what, int code) {
  const int e = errno;
  (void)!write(fd, what, strlen(what));
  const char* why = strerror(e);
  (void)!write(fd, ": ", 2);
  (void)!write(fd, why, strlen(why));
  _exit(code);
}

bool WriteFile(const char* path, const char* text) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
  close(fd);
  return ok;
}

// A network namespace with nothing in it. Root makes one directly; anyone
// else inside a user namespace of their own, mapped to their own ids (so
// files it writes in the directory are theirs).
bool IsolateNetwork() {
  if (unshare(CLONE_NEWNET) == 0) return true;
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) return false;
  char map[64];
  WriteFile("/proc/self/setgroups", "deny");
  snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
  if (!WriteFile("/proc/self/uid_map", map)) return false;
  snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
  return WriteFile("/proc/self/gid_map", map);
}

void Limit(int resource, rlim_t soft, rlim_t hard) {
  rlimit r{soft, hard};
  setrlimit(resource, &r);
}

}  // namespace

const char* OutcomeName(SandboxResult::Outcome o) {
  switch (o) {
    case SandboxResult::Outcome::kPassed:
      return "passed";
    case SandboxResult::Outcome::kFailed:
      return "failed";
    case SandboxResult::Outcome::kTimedOut:
      return "timed out";
    case SandboxResult::Outcome::kKilled:
      return "killed";
  }
  return "?";
}

absl::StatusOr<SandboxResult> RunSandboxed(const std::vector<std::string>& argv,
                                           const std::string& stdin_text,
                                           const SandboxLimits& limits) {
  if (argv.empty()) return absl::InvalidArgumentError("nothing to run");
  char tmpl[] = "/tmp/pdq-sandbox-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};

  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // argv[0] on the sandbox's own PATH (Debian's directories, not this
  // process's PATH, which may hold shims that add to the environment).
  std::string program = argv[0];
  if (program.find('/') == std::string::npos) {
    for (const char* d : {"/usr/bin/", "/bin/"}) {
      if (access((d + argv[0]).c_str(), X_OK) == 0) {
        program = d + argv[0];
        break;
      }
    }
  }
  // Everything the child needs, prepared before fork (no allocation after).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string home = "HOME=" + dir, tmp = "TMPDIR=" + dir;
  std::vector<char*> env = {const_cast<char*>("PATH=/usr/bin:/bin"),
                            const_cast<char*>(home.c_str()), const_cast<char*>(tmp.c_str()),
                            const_cast<char*>("LANG=C.UTF-8"), nullptr};
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    if (!IsolateNetwork()) ChildFail(err[1], "cannot isolate the network", 126);
    const rlim_t cpu = (rlim_t)limits.cpu_seconds;
    Limit(RLIMIT_CPU, cpu, cpu + 1);
    Limit(RLIMIT_AS, (rlim_t)limits.memory_bytes, (rlim_t)limits.memory_bytes);
    Limit(RLIMIT_FSIZE, (rlim_t)limits.file_bytes, (rlim_t)limits.file_bytes);
    Limit(RLIMIT_CORE, 0, 0);
    if (chdir(dir.c_str()) != 0) ChildFail(err[1], "chdir", 126);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) {
      ChildFail(err[1], "dup2", 126);
    }
    // Every other descriptor is close-on-exec (pipe2 above), or this
    // process's own inherited ones: close those beyond the three and err.
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != err[1]) close(fd);
    }
    execve(program.c_str(), args.data(), env.data());
    ChildFail(err[1], "exec", 127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);

  // The child's setup: nothing (exec closed the pipe) or why it failed.
  std::string setup;
  char buf[4096];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    setup.append(buf, n);
  }
  close(err[0]);

  SandboxResult r;
  bool timed_out = false;
  if (setup.empty()) {
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    size_t written = 0;
    int in_fd = stdin_text.empty() ? -1 : in[1];
    if (in_fd < 0) close(in[1]);
    const auto deadline = start + absl::ToChronoNanoseconds(limits.wall);
    bool out_open = true;
    while (out_open) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        timed_out = true;
        break;
      }
      pollfd fds[2] = {{out[0], POLLIN, 0}, {in_fd, POLLOUT, 0}};
      const int wait_ms =
          (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      if (poll(fds, in_fd >= 0 ? 2 : 1, wait_ms) < 0 && errno != EINTR) break;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = read(out[0], buf, sizeof buf);
        if (n == 0) {
          out_open = false;
        } else if (n > 0 && r.output.size() < limits.output_bytes) {
          r.output.append(buf, std::min<size_t>(n, limits.output_bytes - r.output.size()));
        }
      }
      if (in_fd >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t n = write(in_fd, stdin_text.data() + written, stdin_text.size() - written);
        if (n > 0) written += n;
        if (n < 0 && errno != EAGAIN) written = stdin_text.size();  // it closed its input
        if (written == stdin_text.size()) {
          close(in_fd);
          in_fd = -1;
        }
      }
    }
    if (in_fd >= 0) close(in_fd);
  } else {
    close(in[1]);
  }
  close(out[0]);
  // Whatever is left of its process group goes now (a timed-out run, or
  // children it left behind).
  kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!setup.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 126) {
    return absl::FailedPreconditionError(
        absl::StrCat("the sandbox could not be set up, so nothing was run: ", setup));
  }
  if (!setup.empty()) r.output = setup;  // exec failed: say why
  if (timed_out) {
    r.outcome = SandboxResult::Outcome::kTimedOut;
  } else if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    r.outcome = r.exit_code == 0 && setup.empty() ? SandboxResult::Outcome::kPassed
                                                  : SandboxResult::Outcome::kFailed;
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
    r.outcome = SandboxResult::Outcome::kKilled;
  }
  return r;
}

}  // namespace pdq
