// The calibrated quantized load: defaults, statistics, then the weights.
#include "quant/quantized_load.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/hash.h"
#include "engine/context.h"
#include "quant/artifact.h"

namespace pdq {

std::vector<std::string> DefaultFp16Layers(Precision precision) {
  switch (precision) {
    case Precision::kW8A8:
    case Precision::kW4A16:
    case Precision::kFp16:
      return {};
  }
  return {};
}

std::vector<std::string> DefaultW8Layers(Precision precision) {
  switch (precision) {
    case Precision::kW8A8:
      return {"output", "blk.*.down"};
    case Precision::kW4A16:
      return {"output"};
    case Precision::kFp16:
      return {};
  }
  return {};
}

bool NeedsCalibration(const QuantizedLoadOptions& o) {
  if (!o.quantized_weights.empty()) return false;
  return (o.precision == Precision::kW8A8 && o.smooth_alpha > 0.0f) ||
         (o.precision == Precision::kW4A16 && o.w4_method != W4Method::kRtn);
}

absl::StatusOr<std::unique_ptr<Model>> LoadQuantizedModel(const std::string& spec,
                                                          const QuantizedLoadOptions& o,
                                                          const CpuContext& cpu) {
  LoadOptions options;
  options.precision = o.precision;
  options.w4_group = o.w4_group == 0 ? 32 : o.w4_group;
  if (o.w4_group != 0 && o.w4_group != 32 && o.w4_group != 64 && o.w4_group != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("w4_group must be 32, 64 or 128 (or 0 for the default), got ", o.w4_group));
  }
  if (!(o.smooth_alpha >= 0.0f && o.smooth_alpha <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("smooth_alpha must be in [0, 1], got ", o.smooth_alpha));
  }
  options.w4_symmetric = o.w4_symmetric;
  options.w4_method = o.w4_method;
  if (o.w4_a8_min_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("w4_a8_min_rows must be 0 (never) or a row count, got ", o.w4_a8_min_rows));
  }
  options.w4_a8_min_rows = o.w4_a8_min_rows;
  if (o.bf16_min_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bf16_min_rows must be 0 (never) or a row count, got ", o.bf16_min_rows));
  }
  options.bf16_min_rows = o.bf16_min_rows;
  options.kv_dtype = o.kv_dtype;
  options.fp16_layers = o.fp16_layers ? *o.fp16_layers : DefaultFp16Layers(o.precision);
  options.w8_layers = o.w8_layers ? *o.w8_layers : DefaultW8Layers(o.precision);
  options.quantized_weights = o.quantized_weights;
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };

  ActivationStats stats;
  if (NeedsCalibration(o)) {
    const std::string_view text =
        o.calibration_text ? std::string_view(*o.calibration_text) : BuiltinCalibrationText();
    if (text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.precision == Precision::kW8A8 ? "SmoothQuant (smooth_alpha > 0)"
                                          : absl::StrCat("W4 method ", W4MethodName(o.w4_method)),
          " needs a calibration text, and the one given is empty"));
    }
    const auto t0 = std::chrono::steady_clock::now();
    CalibrationOptions co = o.calibration;
    std::string source(BuiltinCalibrationTextName());
    if (o.calibration_text) {
      source = o.calibration_name.empty()
                   ? absl::StrFormat("text:%016x", Hash64(*o.calibration_text))
                   : o.calibration_name;
    }
    if (!co.progress) {
      co.progress = [&](int64_t done, int64_t total) {
        if (done == 1 || done % 4 == 0 || done == total) {
          log(absl::StrFormat("calibrating on %s, window %d/%d", source, done, total));
        }
      };
    }
    const bool want_gram = o.precision == Precision::kW4A16;
    if (want_gram) {
      // Gram matrices only for the layers W4 quantizes.
      co.want_gram = [&options](const std::string& name) {
        for (const auto* patterns : {&options.fp16_layers, &options.w8_layers}) {
          for (const std::string& pattern : *patterns) {
            if (MatchesLayerPattern(pattern, name)) return false;
          }
        }
        return true;
      };
    }
    // Only statistics without Gram matrices are cached (those are k x k
    // floats per layer).
    std::string cache_path;
    if (!o.cache_dir.empty() && !want_gram) {
      PDQ_ASSIGN_OR_RETURN(const std::string fingerprint, SourceFingerprint(spec));
      const std::string key =
          absl::StrCat(fingerprint, "|", co.ctx, "|", co.max_windows, "|", co.chat_windows, "|");
      cache_path = absl::StrFormat("%s/calib-%016x.stats", o.cache_dir, Hash64(text, Hash64(key)));
    }
    absl::StatusOr<ActivationStats> cached = absl::NotFoundError("no cache");
    if (!cache_path.empty()) cached = LoadActivationStats(cache_path);
    if (cached.ok()) {
      stats = std::move(*cached);
      log(absl::StrCat("calibration statistics of ", source, " from ", cache_path));
    } else {
      if (cached.status().code() != absl::StatusCode::kNotFound) {
        log(absl::StrCat("ignoring the calibration cache: ", cached.status().message()));
      }
      PDQ_ASSIGN_OR_RETURN(std::unique_ptr<Model> reference, Model::Load(spec, LoadOptions{}, cpu));
      Context ctx(*reference, cpu);
      PDQ_ASSIGN_OR_RETURN(stats, CollectActivationStats(ctx, std::string(text), co));
      log(absl::StrFormat(
          "calibrated in %.1f s",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
      if (!cache_path.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(o.cache_dir, ec);
        if (absl::Status s = SaveActivationStats(stats, cache_path); !s.ok()) {
          log(absl::StrCat("could not cache the calibration statistics: ", s.message()));
        }
      }
    }
    options.smooth_alpha = o.precision == Precision::kW8A8 ? o.smooth_alpha : 0.0f;
    options.activation_stats = &stats;
    options.calibration = source;
  }
  return Model::Load(spec, options, cpu);
}

}  // namespace pdq
