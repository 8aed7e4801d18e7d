// oneDNN's int8 matmul against pdq's GemmW8A8 on the prefill shapes, in one
// run, to decide which W8A8 prefill should use (issue 3 asks for the
// comparison). Both produce fp32 from s8 weights; pdq's time includes its
// per-token activation quantization, oneDNN's takes pre-quantized s8 input.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "dnnl.hpp"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"

namespace pdq {
namespace {

void BM_OnednnMatmulS8(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  memory::desc a_md({m, k}, memory::data_type::s8, memory::format_tag::ab);
  memory::desc b_plain({k, n}, memory::data_type::s8, memory::format_tag::ab);
  memory::desc b_any({k, n}, memory::data_type::s8, memory::format_tag::any);
  memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  attr.set_output_scales(0, {0.001f});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), attr, eng);
  std::vector<int8_t> a(m * k), b(k * n);
  std::mt19937 rng(1);
  for (auto& v : a) v = (int8_t)(rng() % 255 - 127);
  for (auto& v : b) v = (int8_t)(rng() % 255 - 127);
  memory a_mem(a_md, eng, a.data()), b_src(b_plain, eng, b.data());
  memory b_mem(pd.weights_desc(), eng), c_mem(c_md, eng);
  dnnl::reorder(b_src, b_mem).execute(strm, b_src, b_mem);  // packing is load-time work
  dnnl::matmul prim(pd);
  for (auto _ : state) {
    prim.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  }
  state.counters["GOPs"] = benchmark::Counter((double)2 * m * n * k,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

void BM_PdqGemmW8A8(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  static ThreadPool pool(0);
  std::vector<float> w(n * k), x(m * k);
  std::mt19937 rng(1);
  for (auto& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<int8_t> q(PackedI8Bytes(n, k));
  std::vector<float> scale(n), y(m * n);
  QuantizeI8Rows(w.data(), 0, n, k, q.data(), scale.data());
  std::vector<uint8_t> scratch(GemmW8A8ScratchBytes(m, k));
  for (auto _ : state) {
    GemmW8A8(CpuContext{&pool}, PackedI8{q.data(), scale.data(), n, k}, x.data(), m, k, y.data(),
             n, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GOPs"] = benchmark::Counter((double)2 * m * n * k,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

#define PREFILL_SHAPES ->Args({512, 960, 576})->Args({512, 3072, 576})->Args({512, 576, 1536})->UseRealTime()
BENCHMARK(BM_OnednnMatmulS8) PREFILL_SHAPES;
BENCHMARK(BM_PdqGemmW8A8) PREFILL_SHAPES;

}  // namespace
}  // namespace pdq

BENCHMARK_MAIN();
