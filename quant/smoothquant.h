// SmoothQuant (Xiao et al., 2023): activation outliers migrate into the
// weights before W8A8 quantization. Input channel j is divided by
//   s_j = a_j^alpha / w_j^(1 - alpha)
// at run time (a_j the calibration absmax of the channel's activations, w_j
// the absmax of weight column j) and weight column j is multiplied by s_j;
// the product is unchanged and both factors quantize with less error.
#pragma once

#include <cstdint>
#include <vector>

namespace pdq {

// The per-input-channel scales s of `w` ([out x in], row-major) for
// activation absmaxes `act_absmax` [in] at migration strength `alpha` in
// (0, 1]; each s_j is clamped to [1e-3, 1e3] and absmaxes below 1e-5 count
// as 1e-5.
std::vector<float> SmoothQuantScales(const float* w, int64_t out, int64_t in,
                                     const float* act_absmax, float alpha);

}  // namespace pdq
