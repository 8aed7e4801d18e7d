// The flags every model-running program shares (the workers and the `pdq`
// commands), and the load they describe: a model at a precision with the
// measured defaults, on one thread pool, logged to stderr.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/context.h"
#include "engine/model.h"
#include "flags/flags.h"
#include "kernels/cpu/thread_pool.h"
#include "quant/quantized_load.h"

namespace pdq {

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
  int64_t group_size = 0;                   // 0: the default (quant/quantized_load.h)
  int64_t w4a8_rows = kDefaultW4A8MinRows;  // W4A8 batched decode from this many rows; 0: never
  // bf16 AMX tiles from this many rows; 0: never; -1: the default
  // (kDefaultBf16MinRows, or kBatchInvariantBf16MinRows with batch_invariant).
  int64_t bf16_rows = -1;
  bool fp16_output = false;
  bool batch_invariant = false;  // decode steps of up to 64 rows on the int16 kernels
  bool bf16_attention = true;  // prompt attention on bf16 AMX tiles where the CPU has them
  std::string kv_dtype = "fp16";
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
  // The flags Register declares whose values differ from their defaults,
  // as a worker's command line takes them ("--name=value"; --model,
  // --precision and --threads left out): what a worker needs to load the
  // model these flags load.
  std::vector<std::string> Args() const;

 private:
  mutable std::shared_ptr<ThreadPool> pool_;
};

std::string DefaultModelPath();

// Where calibration statistics are cached: $PDQ_CACHE_DIR ("none": nowhere),
// else $XDG_CACHE_HOME/pdq, else ~/.cache/pdq.
std::string CacheDir();
}  // namespace pdq
