#include "quant/smoothquant.h"

#include <algorithm>
#include <cmath>

namespace pdq {

std::vector<float> SmoothQuantScales(const float* w, int64_t out, int64_t in,
                                     const float* act_absmax, float alpha) {
  std::vector<float> w_absmax(in, 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    for (int64_t j = 0; j < in; ++j) w_absmax[j] = std::max(w_absmax[j], std::abs(w[i * in + j]));
  }
  std::vector<float> s(in);
  for (int64_t j = 0; j < in; ++j) {
    const float a = std::max(act_absmax[j], 1e-5f), wj = std::max(w_absmax[j], 1e-5f);
    s[j] = std::clamp(std::pow(a, alpha) / std::pow(wj, 1.0f - alpha), 1e-3f, 1e3f);
  }
  return s;
}

}  // namespace pdq
