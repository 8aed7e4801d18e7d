// The emulation tier: a worker that runs the real scheduler, KV cache, KV
// transport, gRPC services and router protocol, but whose forward passes
// compute nothing and take the time a `pdq profile` measured for the same
// work. Dozens of such workers fit on a few cores, so the simulator's
// control plane (routing, admission, batching, transfers, autoscaling) can
// be checked at a scale the real engine cannot reach on one machine
// (`pdq-prefill --emulate PROFILE ...`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/context.h"
#include "engine/model.h"
#include "policy/step_plan.h"
#include "sim/profile.h"

namespace pdq::emulate {

// What a planned pass computes, in the step models' terms: each prompt entry
// (IsPromptEntry: marked so, or of 2 tokens or more) a prompt chunk, every
// other entry a decode row, as the scheduler counts them (a prompt's last
// token alone after a prefix-cache hit is a 1-token chunk).
policy::StepWork PassWork(std::span<const BatchEntry> batch, const ForwardPlan& plan);

struct TimedPassOptions {
  policy::StepCoefficients time;  // seconds of a pass by its work
  double time_scale = 1;          // every pass takes this many times the model's time
  int num_layers = 1;
  int vocab_size = 0;
  // The tokens the emulated model "predicts", by position (cycled); each
  // logit row is one-hot on script[position % size].
  std::vector<int32_t> script;
  // Waits until a time; null: absl::SleepFor. Tests inject a fake clock
  // together with `now`.
  std::function<void(absl::Time)> sleep_until;
  std::function<absl::Time()> now;
};

// A ForwardBackend whose pass takes options.time.Seconds(PassWork(...)),
// spread evenly over the layers: each layer's K/V is reported done (for
// the layer-by-layer KV transfer) at its share of the pass. Reads and
// writes no KV bytes (the cache lives in host memory, so the transports
// still move real bytes) and no weights. One caller at a time, like the
// Context that owns it.
class TimedBackend : public ForwardBackend {
 public:
  explicit TimedBackend(TimedPassOptions options);
  std::string name() const override { return "emulated"; }
  std::shared_ptr<KvAllocator> kv_allocator() const override { return nullptr; }
  absl::Status Run(std::span<const BatchEntry> batch, const ForwardPlan& plan, KvCache& kv,
                   const std::function<void(int)>& layer_done, Logits* logits) override;

 private:
  TimedPassOptions o_;
};

struct EmulatedModel {
  std::unique_ptr<Model> model;  // shape and tokenizer, no weights
  std::unique_ptr<Context> ctx;  // on a TimedBackend
  sim::PassProfile pass;         // the profile's pass it follows
};

// The model `spec` at `precision` (an engine precision name: fp16, w8a8,
// w4a16) emulated by `profile`'s pass of that precision at `threads`
// (0: the most threads measured), `time_scale` times slower, its KV cache
// of `kv_dtype` (the worker's --kv-dtype). NotFound when the profile has no
// such pass; InvalidArgument when it was measured on a model of another
// shape (its layer count or KV bytes per token differ) or on a KV cache of
// another element type (the passes' attention ran on that one).
absl::StatusOr<EmulatedModel> LoadEmulated(const sim::Profile& profile, const std::string& spec,
                                           const std::string& precision, int threads,
                                           double time_scale, const CpuContext& cpu,
                                           KvDtype kv_dtype);

}  // namespace pdq::emulate
