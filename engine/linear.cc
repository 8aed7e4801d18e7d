// FP16, W4A16 and W8A8 linear layers over the kernels' packed formats.
#include "engine/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/huge_pages.h"
#include "quant/smoothquant.h"
#include "quant/w4_quantize.h"

namespace pdq {

bool MatchesLayerPattern(const std::string& pattern, const std::string& name) {
  // Iterative glob with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp16: return "fp16";
    case Precision::kW8A8: return "w8a8";
    case Precision::kW4A16: return "w4a16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp16") return Precision::kFp16;
  if (name == "w8a8") return Precision::kW8A8;
  if (name == "w4a16") return Precision::kW4A16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (expected fp16, w8a8 or w4a16)"));
}

const char* W4MethodName(W4Method m) {
  switch (m) {
    case W4Method::kRtn: return "rtn";
    case W4Method::kAwq: return "awq";
    case W4Method::kGptq: return "gptq";
    case W4Method::kAwqGptq: return "awq+gptq";
  }
  return "?";
}

absl::StatusOr<W4Method> ParseW4Method(const std::string& name) {
  for (W4Method m : {W4Method::kRtn, W4Method::kAwq, W4Method::kGptq, W4Method::kAwqGptq}) {
    if (name == W4MethodName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown W4 method '", name, "' (expected rtn, awq, gptq or awq+gptq)"));
}

void WritableLinear::SetBias(int64_t row0, const std::vector<float>& b) {
  if (bias_.empty()) bias_.assign(out_features(), 0.0f);
  PDQ_CHECK(row0 + (int64_t)b.size() <= out_features());
  std::copy(b.begin(), b.end(), bias_.begin() + row0);
}

void WritableLinear::AddBias(float* y, int64_t m, int64_t ldy) const {
  if (bias_.empty()) return;
  for (int64_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < bias_.size(); ++j) y[i * ldy + j] += bias_[j];
  }
}

namespace {

// Concatenates the raw bytes of several arrays.
template <typename... Vectors>
std::string Concat(const Vectors&... v) {
  std::string out;
  (out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])), ...);
  return out;
}

// Splits `bytes` back into the arrays, which must have their final sizes.
template <typename... Vectors>
absl::Status Split(std::string_view bytes, Vectors&... v) {
  const size_t want = ((v.size() * sizeof(v[0])) + ...);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("packed weights are ", bytes.size(),
                                                   " bytes, expected ", want));
  }
  size_t off = 0;
  ((std::memcpy(v.data(), bytes.data() + off, v.size() * sizeof(v[0])),
    off += v.size() * sizeof(v[0])),
   ...);
  return absl::OkStatus();
}

std::vector<float> RoundedToFp16(const float* src, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFp32(Fp32ToFp16(src[i]));
  return out;
}

class Fp16Linear final : public WritableLinear {
 public:
  Fp16Linear(int64_t out, int64_t in) : out_(out), in_(in), packed_(PackedF16Elements(out, in)) {}
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  int64_t weight_bytes() const override { return out_ * in_ * (int64_t)sizeof(fp16_t); }
  void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
               int64_t ldy) const override {
    GemmF16(ctx, PackedF16{packed_.data(), out_, in_}, x, m, ldx, y, ldy);
    AddBias(y, m, ldy);
  }
  void SetRows(int64_t row0, int64_t rows, const float* src) override {
    PDQ_CHECK(row0 >= 0 && row0 + rows <= out_);
    PackF16Rows(src, row0, rows, in_, packed_.data());
  }
  PackedLinear Packed() const override {
    PackedLinear p;
    p.f16 = PackedF16{packed_.data(), out_, in_};
    p.bias = &bias_;
    return p;
  }
  std::string SerializeWeights() const override { return Concat(packed_); }
  absl::Status DeserializeWeights(std::string_view bytes) override { return Split(bytes, packed_); }

 private:
  int64_t out_, in_;
  HugeVector<fp16_t> packed_;
};

// Calibrated methods (GPTQ, AWQ) stage the rows until Finalize, which has
// the statistics. AWQ multiplies weight column j by s_j, so inputs are
// multiplied by 1 / s_j before the GEMM (`inv_s_`, saved with the weights).
class W4A16Linear final : public WritableLinear {
 public:
  W4A16Linear(int64_t out, int64_t in, int group, bool symmetric, W4Method method,
              int a8_min_rows, int bf16_min_rows)
      : out_(out), in_(in), group_(group), symmetric_(symmetric), method_(method),
        a8_min_rows_(a8_min_rows),
        bf16_min_rows_(bf16_min_rows),
        q_(PackedW4QBytes(out, in)),
        scale_(PackedW4ScaleElements(out, in, group)),
        min_(scale_.size()) {
    PDQ_CHECK(in % 2 == 0);
    if (method == W4Method::kAwq || method == W4Method::kAwqGptq) inv_s_.assign(in, 1.0f);
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  int64_t weight_bytes() const override {
    return out_ * in_ / 2 + out_ * PackedW4Groups(in_, group_) * 2 * (int64_t)sizeof(fp16_t);
  }
  void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
               int64_t ldy) const override {
    // Per calling thread, grown once: the kernels themselves never allocate.
    thread_local std::vector<uint8_t> scratch;
    const size_t need = GemmW4A16ScratchBytes(m, in_, group_);
    if (scratch.size() < need) scratch.resize(need);
    const PackedW4 w = view();
    GemmW4A16(ctx, w, x, m, ldx, y, ldy, scratch.data(), inv_s_.empty() ? nullptr : inv_s_.data());
    AddBias(y, m, ldy);
  }
  bool prompt_path_differs() const override { return true; }
  void SetRows(int64_t row0, int64_t rows, const float* src) override {
    PDQ_CHECK(row0 >= 0 && row0 + rows <= out_);
    const std::vector<float> ref = RoundedToFp16(src, rows * in_);
    if (method_ != W4Method::kRtn) {
      if (staged_.empty()) staged_.assign(out_ * in_, 0.0f);
      std::copy(ref.begin(), ref.end(), staged_.begin() + row0 * in_);
      return;
    }
    QuantizeW4Rows(ref.data(), row0, rows, in_, group_, symmetric_, q_.data(), scale_.data(),
                   min_.data());
  }
  absl::Status Finalize(const LayerStats* stats) override {
    if (method_ == W4Method::kRtn) return absl::OkStatus();
    if (stats == nullptr || (int64_t)stats->gram.size() != in_ * in_ ||
        (int64_t)stats->mean_abs.size() != in_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "W4 method ", W4MethodName(method_),
          " needs calibration statistics with Gram matrices for every quantized layer"));
    }
    const W4Shape shape{out_, in_, group_, symmetric_};
    const float* gram = stats->gram.data();
    std::vector<float> scaled_gram;
    if (!inv_s_.empty()) {
      const AwqScales awq = SearchAwqScales(staged_.data(), shape, stats->mean_abs.data(), gram);
      for (int64_t j = 0; j < in_; ++j) inv_s_[j] = 1.0f / awq.scales[j];
      for (int64_t i = 0; i < out_; ++i) {
        for (int64_t j = 0; j < in_; ++j) staged_[i * in_ + j] *= awq.scales[j];
      }
      // The scaled weights see inputs x / s: G' = S^-1 G S^-1.
      scaled_gram.resize(in_ * in_);
      for (int64_t i = 0; i < in_; ++i) {
        for (int64_t j = 0; j < in_; ++j) {
          scaled_gram[i * in_ + j] = gram[i * in_ + j] * inv_s_[i] * inv_s_[j];
        }
      }
      gram = scaled_gram.data();
    }
    W4Codes codes;
    if (method_ == W4Method::kGptq || method_ == W4Method::kAwqGptq) {
      PDQ_ASSIGN_OR_RETURN(codes, QuantizeW4Gptq(staged_.data(), shape, gram));
    } else {
      // Group ranges clipped to minimize the error weighted by each input's
      // mean square (the Gram diagonal).
      std::vector<float> importance(in_);
      for (int64_t j = 0; j < in_; ++j) importance[j] = gram[j * in_ + j];
      codes = QuantizeW4Rtn(staged_.data(), shape, importance.data());
    }
    PackW4Rows(codes.codes.data(), codes.scales.data(), codes.mins.data(), 0, out_, in_, group_,
               q_.data(), scale_.data(), min_.data());
    std::vector<float>().swap(staged_);  // frees it (`= {}` keeps the capacity)
    return absl::OkStatus();
  }
  PackedLinear Packed() const override {
    PackedLinear p;
    p.w4 = view();
    p.in_scale = inv_s_.empty() ? nullptr : inv_s_.data();
    p.bias = &bias_;
    return p;
  }
  std::string SerializeWeights() const override { return Concat(q_, scale_, min_, inv_s_); }
  absl::Status DeserializeWeights(std::string_view bytes) override {
    return Split(bytes, q_, scale_, min_, inv_s_);
  }

 private:
  int64_t out_, in_;
  int group_;
  bool symmetric_;
  W4Method method_;
  PackedW4 view() const {
    return PackedW4{q_.data(), scale_.data(), min_.data(), out_, in_, group_, a8_min_rows_,
                    bf16_min_rows_};
  }
  int a8_min_rows_;
  int bf16_min_rows_;
  HugeVector<uint8_t> q_;
  HugeVector<fp16_t> scale_, min_;
  std::vector<float> inv_s_;   // per input channel with AWQ, else empty
  std::vector<float> staged_;  // rows waiting for Finalize (calibrated methods)
};

// Int8 weight groups with 16-bit activations: half of FP16's bytes at
// nearly FP16's accuracy, for the layers a precision's own format costs too
// much on (the output projection; W8A8's FFN down projections). Quantized
// from the source values themselves rather than their fp16 rounding, so a
// Q8_0 source comes back exactly.
class W8A16Linear final : public WritableLinear {
 public:
  W8A16Linear(int64_t out, int64_t in, int bf16_min_rows)
      : out_(out), in_(in), bf16_min_rows_(bf16_min_rows), q_(PackedW8QBytes(out, in)),
        scale_(PackedW8ScaleElements(out, in)) {
    PDQ_CHECK(in % 2 == 0);
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  int64_t weight_bytes() const override {
    return out_ * in_ + out_ * PackedW8Groups(in_) * (int64_t)sizeof(fp16_t);
  }
  void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
               int64_t ldy) const override {
    // Per calling thread, grown once: the kernels themselves never allocate.
    thread_local std::vector<uint8_t> scratch;
    const size_t need = GemmW8A16ScratchBytes(m, in_);
    if (scratch.size() < need) scratch.resize(need);
    GemmW8A16(ctx, view(), x, m, ldx, y, ldy, scratch.data());
    AddBias(y, m, ldy);
  }
  bool prompt_path_differs() const override { return true; }
  void SetRows(int64_t row0, int64_t rows, const float* src) override {
    PDQ_CHECK(row0 >= 0 && row0 + rows <= out_);
    QuantizeW8Rows(src, row0, rows, in_, q_.data(), scale_.data());
  }
  PackedLinear Packed() const override {
    PackedLinear p;
    p.w8 = view();
    p.bias = &bias_;
    return p;
  }
  std::string SerializeWeights() const override { return Concat(q_, scale_); }
  absl::Status DeserializeWeights(std::string_view bytes) override {
    return Split(bytes, q_, scale_);
  }

 private:
  PackedW8 view() const { return PackedW8{q_.data(), scale_.data(), out_, in_, bf16_min_rows_}; }
  int64_t out_, in_;
  int bf16_min_rows_;
  HugeVector<int8_t> q_;
  HugeVector<fp16_t> scale_;
};

// With SmoothQuant (quant/smoothquant.h), activation outliers migrate into
// the weights: input channel j is divided by s_j at run time and the weight
// column multiplied by s_j before quantization. Rows are staged until
// Finalize, since s needs every row.
class W8A8Linear final : public WritableLinear {
 public:
  W8A8Linear(int64_t out, int64_t in, float smooth_alpha)
      : out_(out), in_(in), alpha_(smooth_alpha), q_(PackedI8Bytes(out, in)), scale_(out) {
    if (alpha_ > 0.0f) inv_s_.assign(in, 1.0f);
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  int64_t weight_bytes() const override { return out_ * in_ + out_ * (int64_t)sizeof(float); }
  void Forward(const CpuContext& ctx, const float* x, int64_t m, int64_t ldx, float* y,
               int64_t ldy) const override {
    // Per calling thread, grown once: the kernels themselves never allocate.
    thread_local std::vector<uint8_t> scratch;
    const size_t need = GemmW8A8ScratchBytes(m, in_);
    if (scratch.size() < need) scratch.resize(need);
    GemmW8A8(ctx, PackedI8{q_.data(), scale_.data(), out_, in_}, x, m, ldx, y, ldy,
             scratch.data(), inv_s_.empty() ? nullptr : inv_s_.data());
    AddBias(y, m, ldy);
  }
  void SetRows(int64_t row0, int64_t rows, const float* src) override {
    PDQ_CHECK(row0 >= 0 && row0 + rows <= out_);
    const std::vector<float> ref = RoundedToFp16(src, rows * in_);
    if (alpha_ > 0.0f) {
      if (staged_.empty()) staged_.assign(out_ * in_, 0.0f);
      std::copy(ref.begin(), ref.end(), staged_.begin() + row0 * in_);
      return;
    }
    QuantizeI8Rows(ref.data(), row0, rows, in_, q_.data(), scale_.data());
  }
  absl::Status Finalize(const LayerStats* stats) override {
    if (alpha_ <= 0.0f) return absl::OkStatus();
    const std::vector<float>* act_absmax = stats ? &stats->absmax : nullptr;
    if (act_absmax == nullptr || (int64_t)act_absmax->size() != in_) {
      return absl::FailedPreconditionError(
          "SmoothQuant needs calibration statistics for every quantized layer");
    }
    const std::vector<float> s =
        SmoothQuantScales(staged_.data(), out_, in_, act_absmax->data(), alpha_);
    for (int64_t j = 0; j < in_; ++j) inv_s_[j] = 1.0f / s[j];
    for (int64_t i = 0; i < out_; ++i) {
      for (int64_t j = 0; j < in_; ++j) staged_[i * in_ + j] *= s[j];
    }
    QuantizeI8Rows(staged_.data(), 0, out_, in_, q_.data(), scale_.data());
    std::vector<float>().swap(staged_);  // frees it (`= {}` keeps the capacity)
    return absl::OkStatus();
  }
  PackedLinear Packed() const override {
    PackedLinear p;
    p.i8 = PackedI8{q_.data(), scale_.data(), out_, in_};
    p.in_scale = inv_s_.empty() ? nullptr : inv_s_.data();
    p.bias = &bias_;
    return p;
  }
  std::string SerializeWeights() const override { return Concat(q_, scale_, inv_s_); }
  absl::Status DeserializeWeights(std::string_view bytes) override {
    return Split(bytes, q_, scale_, inv_s_);
  }

 private:
  int64_t out_, in_;
  float alpha_;
  HugeVector<int8_t> q_;
  HugeVector<float> scale_;
  std::vector<float> inv_s_;   // per input channel when smoothing, else empty
  std::vector<float> staged_;  // rows waiting for Finalize
};

}  // namespace

std::unique_ptr<WritableLinear> MakeLinear(const LinearOptions& options, int64_t out, int64_t in) {
  if (options.w8a16) {
    if (in % 2 == 0) return std::make_unique<W8A16Linear>(out, in, options.bf16_min_rows);
    return std::make_unique<Fp16Linear>(out, in);  // odd widths cannot pair inputs
  }
  switch (options.precision) {
    case Precision::kW4A16:
      if (in % 2 == 0) {
        return std::make_unique<W4A16Linear>(out, in, options.w4_group, options.w4_symmetric,
                                             options.w4_method, options.w4_a8_min_rows,
                                             options.bf16_min_rows);
      }
      break;  // odd widths cannot pair nibbles; keep them FP16
    case Precision::kW8A8:
      return std::make_unique<W8A8Linear>(out, in, options.smooth_alpha);
    case Precision::kFp16:
      break;
  }
  return std::make_unique<Fp16Linear>(out, in);
}

}  // namespace pdq
