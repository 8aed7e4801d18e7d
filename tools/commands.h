// The `pdq` subcommands. Each returns the process exit code and prints its
// own errors.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "tools/flags.h"

namespace pdq {

int GenerateCommand(int argc, char** argv);
int PerplexityCommand(int argc, char** argv);
int BenchEngineCommand(int argc, char** argv);
int DriftCommand(int argc, char** argv);
int QuantizeCommand(int argc, char** argv);

// Flags every model-running command shares.
struct ModelFlags {
  std::string model;
  std::string precision = "fp16";
  int64_t threads = 0;
  int64_t group_size = 128;
  bool fp16_output = false;
  std::string fp16_layers;
  std::string weights;
  std::string calib;
  double smooth_alpha = 0.5;
  std::string w4_method = "rtn";
  void Register(FlagParser& flags);
  // Loads the model, logging what was loaded and how long it took to stderr.
  // `precision_override`, when not empty, replaces --precision.
  absl::StatusOr<std::unique_ptr<Model>> Load(bool quiet,
                                              const std::string& precision_override = "") const;
};

std::string DefaultModelPath();
// The whole file; NotFound naming `what` and the path when it cannot be read.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);
// Prints "pdq <command>: <status message>" to stderr and returns 1.
int Fail(const std::string& command, const absl::Status& status);
// Parses flags; returns -1 to continue, else an exit code (help or error).
int ParseOrExit(FlagParser& flags, int argc, char** argv);

}  // namespace pdq
