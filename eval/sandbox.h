// Runs untrusted code (a model's completion of a programming task) in a
// child process that cannot reach any network and is held to CPU, memory,
// file-size and wall-clock limits, in a temporary directory that is removed
// afterwards:
// - a network namespace of its own (unshare(CLONE_NEWNET), inside a user
//   namespace when not root), with no interface up, not even loopback;
// - setrlimit: CPU seconds, address space, file size, no core dumps;
// - its own process group, killed whole at the wall-clock limit;
// - an empty environment but PATH (/usr/bin:/bin, where argv[0] is looked
//   up), HOME and TMPDIR (the directory) and LANG.
// Where the network cannot be isolated the code is not run at all.
// Not a defence against kernel exploits: use a VM or gVisor for that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdq {

struct SandboxLimits {
  absl::Duration wall = absl::Seconds(10);
  int cpu_seconds = 5;
  int64_t memory_bytes = int64_t{1} << 30;  // address space
  int64_t file_bytes = int64_t{16} << 20;   // largest file it may write
  size_t output_bytes = 64 << 10;           // stdout+stderr kept (the rest is dropped)
};

struct SandboxResult {
  enum class Outcome {
    kPassed,    // exited 0
    kFailed,    // exited non-zero
    kTimedOut,  // past the wall-clock limit: killed
    kKilled,    // ended by a signal (the CPU limit's SIGXCPU/SIGKILL, a crash)
  };
  Outcome outcome = Outcome::kFailed;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  std::string output;  // stdout and stderr, interleaved, at most output_bytes
  double seconds = 0;
  bool passed() const { return outcome == Outcome::kPassed; }
};

// "passed", "failed", "timed out", "killed".
const char* OutcomeName(SandboxResult::Outcome o);

// Runs argv (argv[0] a path, or a name found in /usr/bin or /bin) with
// `stdin_text` as its input.
// FailedPrecondition when the sandbox cannot be set up (no network
// namespace: nothing was run); Internal for fork or pipe failures.
absl::StatusOr<SandboxResult> RunSandboxed(const std::vector<std::string>& argv,
                                           const std::string& stdin_text,
                                           const SandboxLimits& limits);

}  // namespace pdq
