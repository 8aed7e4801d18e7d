// Loading synthetic models for tests, each with its own thread pool and
// context, and small helpers over their logits.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/model.h"
#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"

namespace pdq::testing {

struct TestModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
  Model* operator->() const { return model.get(); }
  explicit operator bool() const { return model != nullptr; }
};

// `spec` may end in "@w4a16" (group 32) or "@w8a8" to load that precision
// (plain round to nearest). Null model (and a test failure) on error.
inline TestModel LoadOrDie(std::string spec, int threads = 2, LoadOptions o = {}) {
  if (size_t at = spec.find('@'); at != std::string::npos) {
    o.precision = *ParsePrecision(spec.substr(at + 1));
    o.w4_group = 32;
    spec = spec.substr(0, at);
  }
  TestModel t;
  t.pool = std::make_unique<ThreadPool>(threads);
  auto m = Model::Load(spec, o, CpuContext{t.pool.get()});
  if (!m.ok()) {
    ADD_FAILURE() << "loading " << spec << ": " << m.status();
    return t;
  }
  t.model = std::move(*m);
  t.ctx = std::make_unique<Context>(*t.model, CpuContext{t.pool.get()});
  return t;
}

inline std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 5) % vocab;
  return t;
}

// Logits of the last position after running `tokens` through a fresh
// cache; empty (and a test failure) on error.
inline Logits LastLogits(Context& ctx, const std::vector<int32_t>& tokens) {
  Logits out;
  auto kv = ctx.NewKvCache((int64_t)tokens.size());
  if (!kv.ok()) {
    ADD_FAILURE() << kv.status();
    return out;
  }
  BatchEntry e{(*kv)->AddSequence(), tokens, 1};
  if (absl::Status s = ctx.ForwardAll(**kv, {&e, 1}, &out); !s.ok()) {
    ADD_FAILURE() << s;
    out.data.clear();
  }
  return out;
}

// Every |a[i] - b[i]| under `tol`; a NaN anywhere fails too.
inline void ExpectRowsNear(const float* a, const float* b, int n, float tol,
                           const std::string& what) {
  float worst = 0;
  int at = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = std::abs(a[i] - b[i]);
    if (!(diff <= worst)) {  // NaN lands here too
      worst = std::isnan(diff) ? INFINITY : diff;
      at = i;
    }
  }
  EXPECT_LT(worst, tol) << what << ": element " << at << " is " << a[at] << ", expected " << b[at];
}

// Relative RMS difference of two logit sets of the same size.
inline double RelativeError(const Logits& got, const Logits& ref) {
  EXPECT_EQ(got.data.size(), ref.data.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.data.size() && i < got.data.size(); ++i) {
    err += (got.data[i] - ref.data[i]) * (got.data[i] - ref.data[i]);
    norm += ref.data[i] * ref.data[i];
  }
  return std::sqrt(err / norm);
}

inline std::string RepeatedText(int copies) {
  std::string text;
  for (int i = 0; i < copies; ++i) text += "Pack my box with five dozen liquor jugs. ";
  return text;
}

}  // namespace pdq::testing
