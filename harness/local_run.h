// Child processes of the `pdq` executable for the commands that orchestrate
// others (pdq up, pdq eval, pdq eval blind-ab): start one, run a step to its
// end, or hold a deployment started with `pdq up` while it is measured. SIGINT and SIGTERM
// set interrupted() and stop the running step, so the caller can keep what
// it has and clean up.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pdq {

// This executable's path (children run `pdq <command>` with it); when the
// file has been replaced since this process started (a rebuild), a /proc
// path that still runs this process's own binary.
std::string SelfPath();

struct SpawnOptions {
  std::string stdout_path;  // empty: this process's stdout
  bool stderr_too = false;  // stderr to stdout_path as well
  bool append = false;      // add to stdout_path rather than replace it
  std::vector<int> cpus;    // pinned to these; empty: not pinned
};
// Starts `args` (args[0]: the program) with default signal handling and no
// blocked signals. The child gets SIGTERM when the thread that started it
// dies, however it dies: nothing started here outlives its starter. -1 when
// fork fails.
int Spawn(const std::vector<std::string>& args, const SpawnOptions& options = {});
// Catches SIGINT and SIGTERM from here on (see interrupted()).
void CatchInterrupts();
bool interrupted();

// Runs `args` (args[0]: the program) to its end, stdout (and with
// `stderr_too` stderr) to `stdout_path` when given; its exit status, or -1
// when it was signalled or could not run.
int RunChild(const std::vector<std::string>& args, const std::string& stdout_path = "",
             bool stderr_too = false);

// A `pdq up` of `config` (its JSON), logging to DIR/up.log (added after a
// line that marks this start: earlier runs' lines stay above it); stopped (SIGTERM,
// then SIGKILL after 60 s) by Stop or the destructor.
class LocalDeployment {
 public:
  LocalDeployment() = default;
  LocalDeployment(const LocalDeployment&) = delete;
  LocalDeployment& operator=(const LocalDeployment&) = delete;
  ~LocalDeployment() { Stop(); }
  // Starts it and waits (up to 15 minutes) until every worker registered.
  absl::Status Start(const nlohmann::json& config, const std::string& dir);
  const std::string& address() const { return address_; }  // the router's gRPC address
  const std::string& metrics_address() const { return metrics_address_; }  // the router's /metrics
  void Stop();

 private:
  int pid_ = -1;
  std::string address_, metrics_address_;
};

}  // namespace pdq
