// The model flags and the load they describe (quant/model_flags.h).
#include "quant/model_flags.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "engine/device.h"
#include "engine/synthetic.h"
#include "kernels/cpu/cpu_features.h"

namespace pdq {

std::string DefaultModelPath() {
  const char* env = std::getenv("PDQ_MODEL");
  return env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string CacheDir() {
  const char* dir = std::getenv("PDQ_CACHE_DIR");
  if (dir != nullptr) return std::string(dir) == "none" ? std::string() : std::string(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/pdq";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/pdq";
  }
  return "";
}

void ModelFlags::Register(FlagParser& flags, bool device_flag) {
  if (device_flag) {
    flags.String("device", &device,
                 absl::StrCat("where the forward pass runs: ", DeviceChoices(),
                              " (CUDA where pdq was built with it and a GPU is present)"));
  }
  model = DefaultModelPath();
  flags.String("model", &model,
               absl::StrCat("GGUF model file, or synthetic:NAME (",
                            absl::StrJoin(SyntheticModelNames(), ", "), ")"));
  flags.String("precision", &precision,
               "weight precision: fp16, w8a8 or w4a16 (quantized at load)");
  flags.Int("group-size", &group_size, 0, 128,
            "W4A16 inputs per scale: 32, 64 or 128; 0 is the default, 32 (the grid of GGUF's\n"
            "4-, 5- and 8-bit formats, and the most accurate measured)");
  flags.Bool("fp16-output", &fp16_output,
             "keep the output projection in FP16 when quantizing (adds output to --fp16-layers)");
  flags.String("fp16-layers", &fp16_layers,
               "comma-separated layers kept FP16 when quantizing, '*' wildcards over\n"
               "blk.N.{qkv,out,gate_up,down} and output; 'default' is the measured best of\n"
               "the precision (none: see --w8-layers), 'none' keeps none");
  flags.String("w8-layers", &w8_layers,
               "comma-separated layers stored W8A16 when quantizing (int8 weights per 32\n"
               "inputs, 16-bit activations; half of FP16's bytes), patterns as --fp16-layers,\n"
               "which wins where both match; 'default' is the measured best of the precision\n"
               "(w8a8: output,blk.*.down; w4a16: output), 'none' stores none");
  flags.String("calib", &calib,
               "calibration text for W8A8 SmoothQuant and the calibrated W4 methods (never\n"
               "the text you score); empty: the text built into pdq, 'none': no calibration\n"
               "(W8A8 then rounds to nearest without SmoothQuant)");
  flags.Float("smooth-alpha", &smooth_alpha, 0.0, 1.0,
              "W8A8 SmoothQuant migration strength; 0 turns SmoothQuant off");
  flags.String("w4-method", &w4_method,
               "W4A16 codes: rtn (round to nearest), awq (activation-aware channel scales), "
               "gptq (Hessian error compensation) or awq+gptq; all but rtn calibrate");
  flags.Int("w4a8-rows", &w4a8_rows, 0, 1 << 20,
            "W4A16: in decode steps of this many rows up to 64 (batched decode; prompt\n"
            "rows never) the activations are int8 per group (W4A8) where the kernels have\n"
            "it (AVX-512); 0: never");
  flags.Int("bf16-rows", &bf16_rows, -1, 1 << 20,
            "W4A16 and W8A16 layers, on CPUs with AMX-BF16: prompt rows (any number) and\n"
            "decode steps of this many rows or more meet the dequantized weights as bf16\n"
            "in AMX tiles (fp32 sums; KL 1e-4 against FP16; 1.1-1.7x the int16 kernels\n"
            "at 16-32 rows, slower below 12); 0: never (prompt rows then take int16); -1:\n"
            "16, or 65 with --batch-invariant");
  flags.Bool("batch-invariant", &batch_invariant,
             "a decode row's logits are its logits alone, bit for bit, in steps of up to 64\n"
             "rows (W4A16, W8A16 and W8A8 layers; FP16's GEMM is not): those steps stay on\n"
             "the int16 kernels (--bf16-rows 65), so on CPUs with AMX-BF16 batched decode\n"
             "runs 1.1-1.7x slower. For reproducible answers whatever shares the step");
  flags.Bool("bf16-attention", &bf16_attention,
             "prompt attention on AMX-BF16 tiles, on CPUs with AMX-BF16 (Q and K as two\n"
             "bf16 parts each, a bf16 cache's K as one; softmax weights and V as bf16, fp32\n"
             "sums; decode rows stay fp32): 1.5x prefill at 2048 tokens, KL 1e-5 against\n"
             "fp32 attention. On by default; --bf16-attention=false computes it in fp32");
  flags.String("kv-dtype", &kv_dtype,
               "the KV cache's element type: fp16, or bf16 (3 fewer mantissa bits; decode\n"
               "attention of a GQA group of 3 or 4 queries, head_dim 32 or 64, on\n"
               "AVX512_BF16's dot products where the CPU has them; a prefill and a decode\n"
               "worker must agree)");
  flags.String("weights", &weights,
               "quantized weights from `pdq quantize` for this model (sets the precision)");
  flags.Int("threads", &threads, 0, 1024, "worker threads; 0 means every core");
}

std::vector<std::string> ModelFlags::Args() const {
  // The flags as Register declares them, holding their defaults when
  // registered, then this one's values.
  ModelFlags current;
  FlagParser flags("model flags", "");
  current.Register(flags);
  current = *this;
  std::vector<std::string> args;
  for (std::string& arg : flags.Changed()) {
    if (!absl::StartsWith(arg, "--model=") && !absl::StartsWith(arg, "--precision=") &&
        !absl::StartsWith(arg, "--threads=")) {
      args.push_back(std::move(arg));
    }
  }
  return args;
}

ThreadPool& ModelFlags::pool() const {
  if (!pool_) pool_ = std::make_shared<ThreadPool>((int)threads);
  return *pool_;
}

absl::StatusOr<LoadedModel> ModelFlags::Load(bool quiet,
                                             const std::string& precision_override) const {
  PDQ_RETURN_IF_ERROR(CheckDevice(device));  // before a long load, not after
  QuantizedLoadOptions o;
  PDQ_ASSIGN_OR_RETURN(o.precision,
                       ParsePrecision(precision_override.empty() ? precision : precision_override));
  std::error_code ec;
  if (model.rfind("synthetic:", 0) != 0 && !std::filesystem::exists(model, ec) && !ec) {
    return absl::NotFoundError(absl::StrCat(
        "model file '", model, "' not found",
        model == DefaultModelPath() ? " (run `make model` to fetch the default model)" : ""));
  }
  PDQ_ASSIGN_OR_RETURN(o.kv_dtype, ParseKvDtype(kv_dtype));
  o.w4_group = (int)group_size;
  o.w4_a8_min_rows = (int)w4a8_rows;
  o.bf16_min_rows = bf16_rows >= 0    ? (int)bf16_rows
                    : batch_invariant ? kBatchInvariantBf16MinRows
                                      : kDefaultBf16MinRows;
  if (batch_invariant) {
    if (w4a8_rows > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch-invariant and --w4a8-rows ", w4a8_rows,
                       ": decode steps of W4A8 rows answer differently from smaller ones; "
                       "drop one of the two"));
    }
    if (bf16_rows > 0 && bf16_rows < kBatchInvariantBf16MinRows) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch-invariant and --bf16-rows ", bf16_rows,
                       ": decode steps of that many rows would take the bf16 tiles; drop "
                       "--bf16-rows, or give it 0 or ",
                       kBatchInvariantBf16MinRows, " or more"));
    }
  }
  // A --*-layers value: "default" (the precision's), "none", or patterns.
  auto layer_list = [](const std::string& value, std::vector<std::string> defaults) {
    if (value == "default") return defaults;
    std::vector<std::string> layers;
    if (value != "none") {
      for (absl::string_view p : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        layers.emplace_back(p);
      }
    }
    return layers;
  };
  if (fp16_layers != "default" || fp16_output) {
    o.fp16_layers = layer_list(fp16_layers, DefaultFp16Layers(o.precision));
    if (fp16_output) o.fp16_layers->push_back("output");
  }
  if (w8_layers != "default") o.w8_layers = layer_list(w8_layers, {});
  o.quantized_weights = weights;
  PDQ_ASSIGN_OR_RETURN(o.w4_method, ParseW4Method(w4_method));
  o.smooth_alpha = (float)smooth_alpha;
  if (calib == "none") {
    if (o.w4_method != W4Method::kRtn && o.precision == Precision::kW4A16) {
      return absl::InvalidArgumentError(
          absl::StrCat("--w4-method ", w4_method, " needs a calibration text; drop --calib none"));
    }
    o.smooth_alpha = 0.0f;
  } else if (!calib.empty()) {
    PDQ_ASSIGN_OR_RETURN(o.calibration_text, ReadTextFile(calib, "calibration text"));
    o.calibration_name = std::filesystem::path(calib).filename().string();
  }
  o.cache_dir = CacheDir();
  if (!quiet)
    o.log = [](const std::string& line) { std::fprintf(stderr, "pdq: %s\n", line.c_str()); };
  const auto t0 = std::chrono::steady_clock::now();
  const CpuContext cpu{&pool(), bf16_attention};
  auto loaded = LoadQuantizedModel(model, o, cpu);
  if (!loaded.ok()) {
    return WithFlagNames(loaded.status(),
                         {{"w4_group", "--group-size"}, {"smooth_alpha", "--smooth-alpha"}});
  }
  LoadedModel out;
  out.model = std::move(*loaded);
  PDQ_ASSIGN_OR_RETURN(std::unique_ptr<ForwardBackend> backend, MakeBackend(*out.model, device));
  out.ctx = std::make_unique<Context>(*out.model, cpu, std::move(backend));
  if (!quiet) {
    const ModelConfig& c = out.model->config();
    const LoadOptions& lo = out.model->options();
    std::string detail;
    if (out.model->precision() == Precision::kW4A16) {
      detail = absl::StrCat(", group ", lo.w4_group, ", ", W4MethodName(lo.w4_method));
      if (lo.w4_a8_min_rows > 0) {
        absl::StrAppend(&detail, ", W4A8 from ", lo.w4_a8_min_rows, " rows",
                        W4A8Supported() ? "" : " (not on these kernels: int16 activations)");
      }
      if (lo.bf16_min_rows > 0) {
        absl::StrAppend(&detail, ", bf16 tiles from ", lo.bf16_min_rows, " rows",
                        Bf16TilesSupported() ? "" : " (not on these kernels: no AMX-BF16)");
      }
    } else if (out.model->precision() == Precision::kW8A8) {
      detail = lo.smooth_alpha > 0 ? absl::StrCat(", SmoothQuant ", lo.smooth_alpha)
                                   : ", no SmoothQuant";
    }
    if (batch_invariant) {
      detail += out.model->precision() == Precision::kFp16
                    ? ", --batch-invariant not taken (FP16's GEMM blocks k by the step's rows)"
                    : ", batch-invariant decode steps up to 64 rows";
    }
    if (out.model->precision() != Precision::kW4A16 && lo.w4_a8_min_rows > 0) {
      absl::StrAppend(&detail, ", --w4a8-rows ", lo.w4_a8_min_rows,
                      " not taken (W4A8 is for W4A16 layers)");
    }
    if (out.model->precision() != Precision::kFp16) {
      detail += lo.fp16_layers.empty()
                    ? ", no FP16 layers"
                    : absl::StrCat(", FP16 ", absl::StrJoin(lo.fp16_layers, ","));
      if (!lo.w8_layers.empty())
        absl::StrAppend(&detail, ", W8A16 ", absl::StrJoin(lo.w8_layers, ","));
    }
    if (lo.kv_dtype != KvDtype::kFp16) {
      absl::StrAppend(&detail, ", ", KvDtypeName(lo.kv_dtype), " KV cache",
                      lo.kv_dtype == KvDtype::kBf16 && !GetCpuFeatures().avx512bf16
                          ? " (decode attention in fp32: no AVX512_BF16)"
                          : "");
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string where =
        device == "cpu" ? absl::StrCat(pool().size(), " threads, ", KernelIsaName(), " kernels")
                        : absl::StrCat("running on ", out.ctx->device());
    std::fprintf(stderr, "pdq: loaded %s (%s, %d layers, d=%d, vocab %d) as %s%s in %.2f s; %s\n",
                 c.name.c_str(), c.arch.c_str(), c.num_layers, c.d_model, c.vocab_size,
                 PrecisionName(out.model->precision()), detail.c_str(), s, where.c_str());
  }
  return out;
}

}  // namespace pdq
