// The `pdq` subcommands. Each returns the process exit code and prints its
// own errors.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "engine/model.h"
#include "eval/quantized_load.h"
#include "server/security.h"
#include "tools/flags.h"

namespace pdq {

int GenerateCommand(int argc, char** argv);
int PerplexityCommand(int argc, char** argv);
int BenchEngineCommand(int argc, char** argv);
int DriftCommand(int argc, char** argv);
int CodeEvalCommand(int argc, char** argv);
int QuantizeCommand(int argc, char** argv);
int ClientCommand(int argc, char** argv);
int UpCommand(int argc, char** argv);
int BenchCommand(int argc, char** argv);
int StatusCommand(int argc, char** argv);
int MigrateCommand(int argc, char** argv);
int PlanCommand(int argc, char** argv);
int EvalCommand(int argc, char** argv);
int BlindAbCommand(int argc, char** argv);  // pdq eval blind-ab
int TallyCommand(int argc, char** argv);    // pdq eval tally

// A loaded model with a context on the command's thread pool.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

// Flags every model-running command shares.
struct ModelFlags {
  std::string model;
  std::string precision = "fp16";
  int64_t threads = 0;
  int64_t group_size = 0;  // 0: the default (eval/quantized_load.h)
  int64_t w4a8_rows = kDefaultW4A8MinRows;  // W4A8 batched decode from this many rows; 0: never
  int64_t bf16_rows = kDefaultBf16MinRows;  // bf16 AMX tiles from this many rows; 0: never
  bool fp16_output = false;
  std::string fp16_layers = "default";
  std::string w8_layers = "default";
  std::string weights;
  std::string calib;  // empty: the built-in text; "none": no calibration
  double smooth_alpha = 0.75;
  std::string w4_method = "rtn";
  std::string device = "cpu";
  // With `device_flag`, also --device (for the commands whose forward pass
  // may run on a GPU; the others stay on the CPU).
  void Register(FlagParser& flags, bool device_flag = false);
  // Loads the model, logging what was loaded and how long it took to stderr.
  // `precision_override`, when not empty, replaces --precision. Every model
  // of a command (and copies of these flags) runs on one pool of --threads
  // threads, one model at a time.
  absl::StatusOr<LoadedModel> Load(bool quiet, const std::string& precision_override = "") const;
  ThreadPool& pool() const;

 private:
  mutable std::shared_ptr<ThreadPool> pool_;
};

std::string DefaultModelPath();

// How a command reaches a router: --tls-ca (TLS, checking the router's
// certificate against it), --tls-cert and --tls-key (this client's own,
// where the server asks for one), --tls-server-name, and --api-key (default
// $PDQ_API_KEY).
struct ConnectionFlags {
  server::TlsFiles tls;
  std::string server_name, api_key;
  void Register(FlagParser& flags);
  // Errors name the flag and the file.
  absl::StatusOr<server::Dialing> Dialing() const;
};
// Where calibration statistics are cached: $PDQ_CACHE_DIR ("none": nowhere),
// else $XDG_CACHE_HOME/pdq, else ~/.cache/pdq.
std::string CacheDir();
// The whole file; NotFound naming `what` and the path when it cannot be read.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);
// The status with the library's parameter names (whole words) replaced by
// the flags that set them: {{"ctx", "--ctx"}} turns "ctx must be ..." into
// "--ctx must be ...".
absl::Status WithFlagNames(const absl::Status& status,
                           std::initializer_list<std::pair<const char*, const char*>> names);
// Prints "pdq <command>: <status message>" to stderr and returns 1.
int Fail(const std::string& command, const absl::Status& status);
// Parses flags; returns -1 to continue, else an exit code (help or error).
int ParseOrExit(FlagParser& flags, int argc, char** argv);

}  // namespace pdq
