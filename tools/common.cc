// Shared plumbing of the pdq subcommands: model flags, loading, errors.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "eval/calibrate.h"
#include "kernels/cpu/cpu_features.h"
#include "tools/commands.h"

namespace pdq {

std::string DefaultModelPath() {
  const char* env = std::getenv("PDQ_MODEL");
  return env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void ModelFlags::Register(FlagParser& flags) {
  model = DefaultModelPath();
  flags.String("model", &model,
               "GGUF model file, or synthetic:NAME (tiny, smollm2-135m, smollm2-360m, llama-1b)");
  flags.String("precision", &precision, "weight precision: fp16, w8a8 or w4a16 (quantized at load)");
  flags.Int("group-size", &group_size, 32, 128, "W4A16 inputs per scale: 32, 64 or 128");
  flags.Bool("fp16-output", &fp16_output,
             "keep the output projection in FP16 when quantizing (same as --fp16-layers output)");
  flags.String("fp16-layers", &fp16_layers,
               "comma-separated layers kept FP16 when quantizing, '*' wildcards over "
               "blk.N.{qkv,out,gate_up,down} and output (e.g. output,blk.*.down)");
  flags.String("calib", &calib,
               "calibration text (not the text you score) for W8A8 SmoothQuant and the "
               "calibrated W4 methods");
  flags.Float("smooth-alpha", &smooth_alpha, 0.0, 1.0,
              "W8A8 SmoothQuant migration strength, used with --calib");
  flags.String("w4-method", &w4_method,
               "W4A16 codes: rtn (round to nearest), awq (activation-aware channel scales), "
               "gptq (Hessian error compensation) or awq+gptq; all but rtn need --calib");
  flags.String("weights", &weights,
               "quantized weights from `pdq quantize` for this model (sets the precision)");
  flags.Int("threads", &threads, 0, 1024, "worker threads; 0 means every core");
}

absl::StatusOr<std::unique_ptr<Model>> ModelFlags::Load(
    bool quiet, const std::string& precision_override) const {
  PDQ_ASSIGN_OR_RETURN(const Precision p, ParsePrecision(precision_override.empty()
                                                             ? precision
                                                             : precision_override));
  std::error_code ec;
  if (model.rfind("synthetic:", 0) != 0 && !std::filesystem::exists(model, ec) && !ec) {
    return absl::NotFoundError(absl::StrCat(
        "model file '", model, "' not found",
        model == DefaultModelPath() ? " (run `make model` to fetch the default model)" : ""));
  }
  LoadOptions options;
  options.threads = (int)threads;
  options.precision = p;
  options.w4_group = (int)group_size;
  if (fp16_output) options.fp16_layers.push_back("output");
  for (absl::string_view pattern : absl::StrSplit(fp16_layers, ',', absl::SkipEmpty())) {
    options.fp16_layers.emplace_back(pattern);
  }
  options.quantized_weights = weights;
  PDQ_ASSIGN_OR_RETURN(options.w4_method, ParseW4Method(w4_method));
  const bool calibrated_w4 =
      p == Precision::kW4A16 && options.w4_method != W4Method::kRtn && weights.empty();
  if (calibrated_w4 && calib.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--w4-method ", w4_method, " needs --calib FILE (a calibration text, not the text you score)"));
  }
  // SmoothQuant and calibrated W4: statistics from the FP16 reference over
  // the calibration text; Gram matrices only for the layers W4 quantizes.
  ActivationStats stats;
  if (!calib.empty() && (p == Precision::kW8A8 || calibrated_w4) && weights.empty()) {
    PDQ_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(calib, "calibration text"));
    LoadOptions ref_options;
    ref_options.threads = (int)threads;
    PDQ_ASSIGN_OR_RETURN(std::unique_ptr<Model> reference, Model::Load(model, ref_options));
    CalibrationOptions co;
    co.progress = [quiet](int64_t done, int64_t total) {
      if (!quiet) std::fprintf(stderr, "pdq: calibrating, window %lld/%lld\n", (long long)done, (long long)total);
    };
    if (calibrated_w4) {
      co.want_gram = [&options](const std::string& name) {
        for (const std::string& pattern : options.fp16_layers) {
          if (MatchesLayerPattern(pattern, name)) return false;
        }
        return true;
      };
    }
    const auto c0 = std::chrono::steady_clock::now();
    PDQ_ASSIGN_OR_RETURN(stats, CollectActivationStats(*reference, text, co));
    if (!quiet) {
      std::fprintf(stderr, "pdq: calibrated in %.1f s\n",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    }
    options.smooth_alpha = (float)smooth_alpha;
    options.activation_stats = &stats;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = Model::Load(model, options);
  if (!loaded.ok()) return loaded.status();
  if (!quiet) {
    const ModelConfig& c = (*loaded)->config();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "pdq: loaded %s (%s, %d layers, d=%d, vocab %d) as %s in %.2f s; "
                 "%d threads, %s kernels\n",
                 c.name.c_str(), c.arch.c_str(), c.num_layers, c.d_model, c.vocab_size,
                 PrecisionName((*loaded)->precision()), s, (*loaded)->num_threads(),
                 KernelIsaName().c_str());
  }
  return loaded;
}

int Fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "pdq %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return 1;
}

int ParseOrExit(FlagParser& flags, int argc, char** argv) {
  absl::Status s = flags.Parse(argc, argv, 2);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "pdq %s: error: %s\n", argv[1], std::string(s.message()).c_str());
    return 2;
  }
  return -1;
}

}  // namespace pdq
