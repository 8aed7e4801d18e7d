// Per-caller state for running a Model: the workspace the forward pass
// writes, the threads it runs on, and the calibration observer. llama.cpp's
// llama_model / llama_context split: one immutable Model, any number of
// Contexts, each used by one thread at a time. Two Contexts may run at once
// when they have separate thread pools.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv_cache.h"
#include "engine/model.h"

namespace pdq {

// One forward-pass request: append `tokens` to sequence `seq` of the cache.
struct BatchEntry {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  // Logits for the last num_logits new tokens (1: next-token prediction;
  // tokens.size(): every position, for scoring).
  int64_t num_logits = 1;
  // Prompt tokens rather than a decode step: the kernels' prompt paths
  // (CpuContext::prompt_rows), so a prompt's numbers do not depend on how
  // it was cut into passes. Entries of 2 or more tokens are prompt rows
  // whatever this says; set it for a one-token prompt chunk.
  bool prompt = false;
};
inline bool IsPromptEntry(const BatchEntry& b) { return b.prompt || b.tokens.size() >= 2; }

// Results of a Forward call, per batch entry: its status, and for the
// entries that ran, their logit rows (vocab_size floats each).
struct Logits {
  std::vector<absl::Status> status;  // per batch entry
  std::vector<float> data;
  std::vector<int64_t> first_row;  // per batch entry
  std::vector<int64_t> num_rows;   // per batch entry; 0 for entries that failed
  int vocab_size = 0;
  const float* Row(size_t entry, int64_t i) const {
    return data.data() + (first_row[entry] + i) * vocab_size;
  }
  // The first entry's error, or OK when every entry ran.
  absl::Status FirstError() const;
};

// The entries of a Forward call that run, once every check has passed and
// their KV blocks are reserved: what a backend executes.
struct ForwardPlan {
  // Batch indices: the decode entries, then the prompt entries
  // (IsPromptEntry), each in batch order; activation and logit rows follow
  // this order.
  std::vector<size_t> run;
  std::vector<int64_t> start;                    // per batch entry: tokens stored before
  std::vector<int64_t> offset;                   // per run entry: its first activation row
  std::vector<std::span<const int32_t>> tables;  // per run entry: its KV block table
  int64_t total = 0;                             // new tokens in all
  int64_t logit_rows = 0;
  int64_t decode_rows = 0;        // the first rows, the decode entries'
  int64_t decode_logit_rows = 0;  // the first logit rows, the decode entries'
  int64_t max_pos = 0;            // longest sequence after the call
};

// Runs planned forward passes off the CPU (engine/device.h makes one): it
// holds the model's weights in its device's memory and its own stream and
// workspace. It reads and writes caches made with its kv_allocator().
class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  virtual std::string name() const = 0;  // "cuda:0"
  // Where its caches live; null: host memory (a backend that reads no KV
  // bytes, such as an emulated worker's).
  virtual std::shared_ptr<KvAllocator> kv_allocator() const = 0;
  // Fills logits->data for the plan (first_row and num_rows are set) and
  // leaves the new tokens' K/V in the cache; calls `layer_done` (if set)
  // once each layer's K/V are written.
  virtual absl::Status Run(std::span<const BatchEntry> batch, const ForwardPlan& plan, KvCache& kv,
                           const std::function<void(int)>& layer_done, Logits* logits) = 0;
};

class Context {
 public:
  // `model` and `cpu.pool` must outlive the context. With a backend, the
  // forward pass runs there (the CPU threads only check and plan), on
  // caches from NewKvCache.
  Context(const Model& model, const CpuContext& cpu,
          std::unique_ptr<ForwardBackend> backend = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Model& model() const { return model_; }
  const CpuContext& cpu() const { return cpu_; }
  // "cpu", or the backend's device ("cuda:0").
  std::string device() const;
  // A KV cache for `tokens` tokens where this context's forward pass reads
  // it (host memory, or the backend's device).
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t tokens) const;

  // Runs every valid entry as one batch. Each entry is checked on its own
  // (known sequence, not twice in the batch, tokens present and inside the
  // vocabulary, context length, KV blocks left): one that fails gets its
  // error in logits->status, its sequence is left unchanged, and the
  // others run. Returns an error (and runs nothing) only when the whole
  // call is wrong: an empty batch, a cache laid out for another model or in
  // memory this context cannot read, or a backend that failed (then no
  // sequence's length moves; blocks reserved for the call stay reserved).
  // The cache may have been written by another Model with the same layout.
  absl::Status Forward(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits);
  // Forward, then the first entry's error: for callers that treat the
  // batch as one request.
  absl::Status ForwardAll(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits);

  // Called with every linear layer's input during Forward (name, rows, row
  // count, width); for calibration, on the CPU only (Forward fails with
  // FailedPrecondition on a backend while one is set). Null to stop.
  using ActivationObserver =
      std::function<void(const std::string&, const float*, int64_t, int64_t)>;
  void SetActivationObserver(ActivationObserver observer) { observer_ = std::move(observer); }
  // Called during Forward, on the calling thread, as soon as layer `layer`'s
  // K/V of every running entry are in the cache, so a KV transport can send
  // that layer while the later ones compute. Null to stop.
  using LayerObserver = std::function<void(int layer)>;
  void SetLayerObserver(LayerObserver observer) { layer_observer_ = std::move(observer); }

  // Bytes of the forward pass's workspace (activations of the largest batch
  // run so far; it grows and is kept). Only on the thread that runs Forward.
  int64_t workspace_bytes() const;

 private:
  struct Workspace;
  // Checks each entry, reserves the blocks of those that run, and sets the
  // per-entry parts of *logits; false when none runs.
  bool Plan(KvCache& kv, std::span<const BatchEntry> batch, Logits* logits, ForwardPlan* plan);
  void RunOnCpu(KvCache& kv, std::span<const BatchEntry> batch, const ForwardPlan& plan,
                Logits* logits);

  const Model& model_;
  const KvLayout layout_;  // the model's, for checking caches
  CpuContext cpu_;
  std::unique_ptr<ForwardBackend> backend_;
  std::unique_ptr<Workspace> ws_;
  ActivationObserver observer_;
  LayerObserver layer_observer_;
};

}  // namespace pdq
