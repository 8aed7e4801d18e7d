// Calibrated W4 quantizers: they choose the 4-bit codes and fp16 group
// parameters of a weight matrix from statistics of its inputs, and hand them
// to kernels' PackW4Rows. GPTQ (Frantar et al. 2022) rounds one input column
// at a time and spreads each rounding error over the columns not yet rounded,
// through the inverse of the inputs' Gram matrix; AWQ (Lin et al. 2023)
// scales input channels by a power of their mean |activation| before
// rounding, choosing the power that minimizes the layer's output error.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/half.h"
#include "kernels/cpu/thread_pool.h"

namespace pdq {

// A rows x k matrix in groups of `group` inputs (the last may be shorter).
struct W4Shape {
  int64_t rows = 0;
  int64_t k = 0;
  int group = 128;
  bool symmetric = false;  // min = -8 * scale
  int64_t groups() const { return (k + group - 1) / group; }
};

// Codes before packing: w ~= scale * code + min.
struct W4Codes {
  std::vector<uint8_t> codes;        // rows x k, each 0..15
  std::vector<fp16_t> scales, mins;  // rows x groups
};

// Round to nearest with each group's [min, max] (or absmax when symmetric),
// exactly as kernels' QuantizeW4Rows. With `importance` (k weights, e.g. the
// Gram diagonal), each group's range is shrunk by the factor (down to 0.6)
// that minimizes the importance-weighted squared error instead.
W4Codes QuantizeW4Rtn(const float* w, const W4Shape& shape, const float* importance = nullptr);

// The fp32 matrix the codes stand for.
std::vector<float> DequantizeW4(const W4Codes& q, const W4Shape& shape);

struct GptqOptions {
  double damp = 0.01;  // added to the Gram diagonal, relative to its mean
  // Group ranges by QuantizeW4Rtn's importance-weighted clipping search (the
  // Gram diagonal as importance) instead of min-max: the error-updated
  // weights of a group spread wider than the originals, and min-max then
  // wastes the grid on them.
  bool clip = true;
};
// GPTQ with static groups in natural column order (no act-order): a group's
// scale and min come from its columns' error-updated weights when the first
// is reached.
// `gram` is the k x k Gram matrix of the inputs (mean of x x^T); channels that
// were never active get zero weight. Internal if the damped Gram matrix is
// not positive definite.
absl::StatusOr<W4Codes> QuantizeW4Gptq(const float* w, const W4Shape& shape, const float* gram,
                                      const GptqOptions& options = {});

struct AwqOptions {
  int grid = 20;          // exponents 0, 1/grid, ..., (grid - 1)/grid
  int64_t max_rows = 256; // rows (evenly spaced) that score each exponent
};
struct AwqScales {
  std::vector<float> scales;  // per input channel; the weights' columns are multiplied
  double alpha = 0.0;         // chosen exponent (0: all ones, i.e. plain RTN)
  double error = 0.0;         // its output error on the scoring rows
  double rtn_error = 0.0;     // plain RTN's, same rows
};
// AWQ's search: s_j = mean_abs_j^alpha, normalized so sqrt(max s * min s) = 1,
// over the exponent grid, scoring RTN of W diag(s) (divided back by s)
// by the output error tr(E G E^T) with E the weight error. alpha = 0 is RTN,
// so the result is never worse than RTN on this objective.
AwqScales SearchAwqScales(const float* w, const W4Shape& shape, const float* mean_abs,
                          const float* gram, const AwqOptions& options = {});

// sum over rows r of e_r^T G e_r: the summed squared output error over the
// calibration inputs (per input, when G is a mean) of a weight error E.
double GramQuadraticError(const float* e, int64_t rows, int64_t k, const float* gram);

// Accumulates the Gram matrix sum_t x_t x_t^T of a layer's inputs over calls,
// for calibration.
class GramAccumulator {
 public:
  explicit GramAccumulator(int64_t k);
  // Adds m rows of width k (ldx floats apart). Uses every thread of `pool`
  // (may be null); the pool must be idle.
  void Add(const float* x, int64_t m, int64_t ldx, ThreadPool* pool);
  int64_t rows() const { return rows_; }
  // The mean of x x^T over every row added (k x k, symmetric, row-major).
  std::vector<float> MeanGram() const;

 private:
  int64_t k_, kp_;  // kp_: k rounded up to the tile width
  int64_t rows_ = 0;
  std::vector<float> upper_;   // kp_ x kp_ sums; tiles on and above the diagonal valid
  std::vector<float> staged_;  // a chunk of rows in panels of 16 columns
};

}  // namespace pdq
