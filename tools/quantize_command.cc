// `pdq quantize`: writes a quantized weight artifact that workers load with
// --weights instead of quantizing at start-up.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tools/commands.h"

namespace pdq {

int QuantizeCommand(int argc, char** argv) {
  FlagParser flags("quantize",
                   "Quantizes a model's linear layers from the FP16 reference with the same\n"
                   "defaults as --precision (w8a8: SmoothQuant calibrated on the built-in text,\n"
                   "output and blk.*.down FP16; w4a16: groups of 32, output FP16) and writes\n"
                   "them with their scheme, parameters and a fingerprint of the source model.\n"
                   "Load it with --weights PATH.");
  ModelFlags mf;
  mf.Register(flags);
  std::string scheme, out;
  flags.String("scheme", &scheme, "w8a8 or w4a16 (required)");
  flags.String("out", &out, "artifact path to write (required)");
  if (int rc = ParseOrExit(flags, argc, argv); rc >= 0) return rc;
  if (scheme != "w8a8" && scheme != "w4a16") {
    return Fail("quantize", absl::InvalidArgumentError(absl::StrCat(
                                "--scheme must be w8a8 or w4a16, got '", scheme, "'")));
  }
  if (out.empty()) return Fail("quantize", absl::InvalidArgumentError("--out is required"));
  if (!mf.weights.empty()) {
    return Fail("quantize", absl::InvalidArgumentError("--weights makes no sense here"));
  }
  auto model = mf.Load(/*quiet=*/false, scheme);
  if (!model.ok()) return Fail("quantize", model.status());
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = model->model->SaveQuantized(out); !s.ok()) return Fail("quantize", s);
  std::fprintf(stderr, "pdq: wrote %s (%s, %.1f MB of weights per token) in %.2f s\n",
               out.c_str(), scheme.c_str(), model->model->weight_bytes_per_token() / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace pdq
