// Loading a model at a precision with pdq's measured defaults, calibration
// included: FP16 reference -> activation statistics over a calibration text
// -> W8A8 (SmoothQuant) or W4A16 weights. What `pdq quantize`, every `pdq`
// command and the workers call; the defaults are the accurate
// configurations measured in bench/RESULTS.md.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "quant/calibrate.h"

namespace pdq {

// The measured default of QuantizedLoadOptions::w4_a8_min_rows: never, as
// W4A8 moved the top token against FP16 in about 4% of positions
// (bench/RESULTS.md, "AVX-512 and AMX kernels", W4A8's accuracy).
constexpr int kDefaultW4A8MinRows = 0;
// The default of QuantizedLoadOptions::bf16_min_rows: one whole tile. The
// bf16 tiles replace the fp32 tiles of prompts (3.8-5x), and decode steps
// of 16 rows or more take them too: measured against the int16 kernels at
// 2-24 rows, they lose at 8 (0.82-0.84x), tie at 12 and win from 16
// (1.33-1.45x), at KL 1e-4 against FP16 (bench/RESULTS.md, "Batched decode
// on the bf16 tiles by default"). A row's logits then depend on whether its
// step had 16 rows: kBatchInvariantBf16MinRows keeps decode steps of up to
// 64 rows on the int16 kernels, where each row's logits are its logits
// alone (`--batch-invariant`).
constexpr int kDefaultBf16MinRows = 16;
constexpr int kBatchInvariantBf16MinRows = kW4IntMaxRows + 1;

struct QuantizedLoadOptions {
  Precision precision = Precision::kFp16;
  // W4A16 inputs per scale (32, 64 or 128); 0 picks the default, 32: every
  // GGUF 4-, 5- and 8-bit format stores weights in (sub)blocks of 32, so 32
  // re-finds a quantized source's own grid, and on unquantized sources it
  // is the most accurate group measured.
  int w4_group = 0;
  bool w4_symmetric = false;
  W4Method w4_method = W4Method::kRtn;
  // W4A16: in calls of this many rows up to 64 (batched decode, short
  // prefill chunks), int8 activations per group (W4A8) where the kernel path
  // has it (W4A8Supported()); 0: never. A kernel choice, not a weight format.
  int w4_a8_min_rows = kDefaultW4A8MinRows;
  // W4A16 and W8A16 layers: in calls of this many rows or more (batched
  // decode, prefill), activations and dequantized weights meet as bf16 in
  // AMX tiles where the CPU has them (Bf16TilesSupported()); 0: never. A
  // kernel choice.
  int bf16_min_rows = kDefaultBf16MinRows;
  // The KV cache's element type (LoadOptions::kv_dtype).
  KvDtype kv_dtype = KvDtype::kFp16;
  // Layers kept FP16 (patterns, see LoadOptions::fp16_layers). Unset: the
  // measured default of the precision, DefaultFp16Layers().
  std::optional<std::vector<std::string>> fp16_layers;
  // Layers stored W8A16 (LoadOptions::w8_layers). Unset: the measured
  // default of the precision, DefaultW8Layers().
  std::optional<std::vector<std::string>> w8_layers;
  // W8A8 SmoothQuant migration strength; 0 turns it off. 0.75 measured best
  // with the built-in text (bench/RESULTS.md, "Accurate defaults").
  float smooth_alpha = 0.75f;
  // The text activation statistics come from (SmoothQuant, calibrated W4
  // methods). Unset: the text that ships with pdq (BuiltinCalibrationText).
  // Never the text a model is scored on.
  std::optional<std::string> calibration_text;
  // How artifacts name a given calibration text (a file name, say); unset:
  // "text:" and a hash of it.
  std::string calibration_name;
  // Windows of 512 tokens, at most 16, every other one chat-formatted.
  CalibrationOptions calibration{.chat_windows = true};
  // A folder where calibration statistics without Gram matrices (W8A8's)
  // are kept between loads, keyed by the model file's fingerprint, the text
  // and the window settings: the second load of a model skips the FP16
  // calibration pass. Empty: no cache.
  std::string cache_dir;
  // A `pdq quantize` artifact: its weights and recorded parameters are used
  // as they are, and nothing is calibrated.
  std::string quantized_weights;
  // Progress lines ("calibrating, window 3/16"); null for silence.
  std::function<void(const std::string&)> log;
};

// The layers a precision keeps FP16 by default: none (the layers int8
// activations or 4 bits cost too much on are W8A16 instead, below).
std::vector<std::string> DefaultFp16Layers(Precision precision);
// The layers a precision stores W8A16 (int8 weight groups, 16-bit
// activations) by default: W8A8's output and FFN down projections, whose
// activations SmoothQuant cannot tame for int8 (+0.6% perplexity against
// +1.7% with them int8), and W4A16's output projection (4 bits there:
// +5.8%). Against keeping them FP16, W8A16 moved the KL against FP16 by at
// most 1% of itself, at half the bytes, and runs prompts on bf16 tiles
// (bench/RESULTS.md, "W8A16 layers and bf16 tiles").
std::vector<std::string> DefaultW8Layers(Precision precision);

// The calibration text compiled into pdq (see data/calibration/README.md)
// and its name for logs and artifacts.
std::string_view BuiltinCalibrationText();
std::string_view BuiltinCalibrationTextName();

// True when `options` needs activation statistics, so loading runs the FP16
// reference over the calibration text first.
bool NeedsCalibration(const QuantizedLoadOptions& options);

// Loads `spec` as `options` say, on `cpu`'s threads. Errors name the option
// at fault (e.g. "w4_group must be 32, 64 or 128"); loading or calibration
// failures pass through with the model's own message.
absl::StatusOr<std::unique_ptr<Model>> LoadQuantizedModel(const std::string& spec,
                                                          const QuantizedLoadOptions& options,
                                                          const CpuContext& cpu);

}  // namespace pdq
