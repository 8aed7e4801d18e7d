// Public kernel entry points: split work across the context's threads and
// call the per-ISA bodies chosen once at start-up.
#include "kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"

namespace pdq {

int CpuContext::num_threads() const { return pool ? pool->size() : 1; }
namespace cpu {

const KernelTable& ActiveKernels() {
  static const KernelTable* table = [] {
    const std::string isa = KernelIsaName();
    if (isa == "avx512+amx") return &kAvx512AmxKernels;
    if (isa == "avx512") return &kAvx512Kernels;
    if (isa == "avx2+vnni") return &AvxVnniKernels();
    if (isa == "avx2") return &kAvx2Kernels;
    return &kScalarKernels;
  }();
  return *table;
}

}  // namespace cpu

int64_t ArgmaxRow(const float* x, int64_t n) { return cpu::ActiveKernels().argmax_row(x, n); }

float ExpRow(const float* x, int64_t n, float max, float scale, float* out) {
  return cpu::ActiveKernels().exp_row(x, n, max, scale, out);
}

bool W4A8Supported() { return cpu::ActiveKernels().gemm_w4a8_panels != nullptr; }
// The tables set the bf16 GEMMs and their row conversion together.
bool Bf16TilesSupported() { return cpu::ActiveKernels().gemm_w4_panels_bf16 != nullptr; }

bool Bf16AttentionSupported() { return cpu::ActiveKernels().attend_bf16 != nullptr; }

namespace {
void ForRows(const CpuContext& ctx, int64_t m, const std::function<void(int64_t, int64_t)>& fn) {
  if (ctx.pool == nullptr || m < 2) {
    fn(0, m);
    return;
  }
  ctx.pool->ParallelFor(m, 1, [&](int64_t b, int64_t e, int) { fn(b, e); });
}
}  // namespace

void PackF16Rows(const float* src, int64_t row0, int64_t rows, int64_t k, fp16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row0 + r;
    fp16_t* panel = dst + n / kPanelRows * k * kPanelRows;
    const int64_t j = n % kPanelRows;
    for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanelRows + j] = Fp32ToFp16(src[r * k + kk]);
  }
}

// Splits the output panels of an n-row weight matrix across the threads.
static void ForPanels(const CpuContext& ctx, int64_t n,
               const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t panels = (n + kPanelRows - 1) / kPanelRows;
  if (ctx.pool == nullptr) {
    fn(0, panels);
    return;
  }
  ctx.pool->ParallelFor(panels, 1, [&](int64_t b, int64_t e, int) { fn(b, e); });
}

// The row count the bf16 tiles' threshold sees: prompt rows take them
// whatever their number (where the weight set and the CPU do).
static int64_t TileRows(const CpuContext& ctx, int64_t m) {
  return ctx.prompt_rows ? std::numeric_limits<int64_t>::max() : m;
}

void GemmF16(const CpuContext& ctx, const PackedF16& w, const float* x, int64_t m, int64_t ldx,
             float* y, int64_t ldy) {
  if (m <= 0) return;
  const auto& kt = cpu::ActiveKernels();
  if (m == 1 && ctx.prompt_rows) {
    // One row alone runs on several partial sums (kernels/cpu: PanelDirect),
    // two or more on one sum per output, as every other prompt row does: a
    // one-row prompt pass runs as two copies of its row (ldx 0), both
    // written to its one output row (ldy 0).
    ForPanels(ctx, w.n, [&](int64_t b, int64_t e) { kt.gemm_f16_panels(w, b, e, x, 2, 0, y, 0); });
    return;
  }
  ForPanels(ctx, w.n, [&](int64_t b, int64_t e) { kt.gemm_f16_panels(w, b, e, x, m, ldx, y, ldy); });
}

// The bf16 tile GEMMs' activations: rows row_of(i) as bf16 at `at` (tile
// loads need no alignment), Bf16RowElements(k) apart, the rows past m up to
// Bf16Rows(m) zero.
template <typename RowOf>
static uint16_t* ToBf16Rows(const CpuContext& ctx, int64_t m, int64_t k, const RowOf& row_of,
                            void* at) {
  const auto& kt = cpu::ActiveKernels();
  uint16_t* xb = static_cast<uint16_t*>(at);
  const int64_t row = cpu::Bf16RowElements(k);
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) kt.quantize_row_bf16(row_of(i), k, xb + i * row);
  });
  std::fill(xb + m * row, xb + cpu::Bf16Rows(m) * row, uint16_t{0});
  return xb;
}

void GemmW4A16(const CpuContext& ctx, const PackedW4& w, const float* x, int64_t m, int64_t ldx,
               float* y, int64_t ldy, void* scratch, const float* in_scale) {
  if (m <= 0) return;
  PDQ_CHECK(w.group > 0 && 256 % w.group == 0 && w.k % 2 == 0);
  const auto& kt = cpu::ActiveKernels();
  // The rescaled rows (if any), then scales, scaled sums and the int16 rows.
  float* scaled = cpu::Align64(scratch);
  auto row_of = [&](int64_t i) {
    const float* row = x + i * ldx;
    if (in_scale == nullptr) return row;
    float* dst = scaled + i * w.k;
    for (int64_t j = 0; j < w.k; ++j) dst[j] = row[j] * in_scale[j];
    return static_cast<const float*>(dst);
  };
  if (Bf16TilesTake(w.bf16_min_rows, TileRows(ctx, m), w.k)) {
    uint16_t* xb = ToBf16Rows(ctx, m, w.k, row_of, scaled + (in_scale ? m * w.k : 0));
    ForPanels(ctx, w.n, [&](int64_t b, int64_t e) {
      kt.gemm_w4_panels_bf16(w, b, e, xb, m, y, ldy);
    });
    return;
  }
  // Without the tiles, prompt rows take the int16 kernels at any count (as
  // fast as the fp32 tiles at 512 rows, faster below 64: bench/RESULTS.md,
  // "Prompt rows"); so do decode steps of up to kW4IntMaxRows rows.
  if (!ctx.prompt_rows && m > kW4IntMaxRows) {
    if (in_scale != nullptr) {
      ForRows(ctx, m, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) row_of(i);
      });
      x = scaled;
      ldx = w.k;
    }
    ForPanels(ctx, w.n, [&](int64_t b, int64_t e) {
      kt.gemm_w4_panels_f32(w, b, e, x, m, ldx, y, ldy);
    });
    return;
  }
  const int64_t groups = PackedW4Groups(w.k, w.group);
  float* xs = scaled + (in_scale ? m * w.k : 0);
  float* xsum = xs + m * groups;
  // Quantizes every row into xq (rows `stride` apart), then runs the GEMM:
  // int8 rows for W4A8, else int16 (GemmW4A16ScratchBytes sizes the rows for
  // the larger of the two).
  auto run = [&](auto* xq, int64_t stride, auto quantize_row, auto gemm_panels) {
    auto quantize = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        quantize_row(row_of(i), w.k, w.group, xq + i * stride, xs + i * groups, xsum + i * groups);
      }
    };
    if (m < 8) {
      quantize(0, m);  // cheaper than waking the threads
    } else {
      ForRows(ctx, m, quantize);
    }
    ForPanels(ctx, w.n, [&](int64_t b, int64_t e) { gemm_panels(w, b, e, xq, xs, xsum, m, y, ldy); });
  };
  if (!ctx.prompt_rows && w.a8_min_rows > 0 && m >= w.a8_min_rows &&
      kt.gemm_w4a8_panels != nullptr) {
    run(reinterpret_cast<int8_t*>(xsum + m * groups), cpu::W4A8RowBytes(w.k),
        kt.quantize_row_i8_groups, kt.gemm_w4a8_panels);
  } else {
    run(reinterpret_cast<int16_t*>(xsum + m * groups), w.k, kt.quantize_row_i16,
        kt.gemm_w4_panels);
  }
}

void GemmW8A16(const CpuContext& ctx, const PackedW8& w, const float* x, int64_t m, int64_t ldx,
               float* y, int64_t ldy, void* scratch) {
  if (m <= 0) return;
  PDQ_CHECK(w.k % 2 == 0);
  const auto& kt = cpu::ActiveKernels();
  const int64_t groups = PackedW8Groups(w.k);
  // Scales, scaled sums (unused: the weights have no min) and the int16 rows.
  float* xs = cpu::Align64(scratch);
  if (Bf16TilesTake(w.bf16_min_rows, TileRows(ctx, m), w.k)) {
    uint16_t* xb = ToBf16Rows(ctx, m, w.k, [&](int64_t i) { return x + i * ldx; }, xs);
    ForPanels(ctx, w.n, [&](int64_t b, int64_t e) {
      kt.gemm_w8_panels_bf16(w, b, e, xb, m, y, ldy);
    });
    return;
  }
  float* xsum = xs + m * groups;
  int16_t* xq = reinterpret_cast<int16_t*>(xsum + m * groups);
  auto quantize = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      kt.quantize_row_i16(x + i * ldx, w.k, kW8Group, xq + i * w.k, xs + i * groups,
                          xsum + i * groups);
    }
  };
  if (m < 8) {
    quantize(0, m);  // cheaper than waking the threads
  } else {
    ForRows(ctx, m, quantize);
  }
  ForPanels(ctx, w.n, [&](int64_t b, int64_t e) { kt.gemm_w8_panels(w, b, e, xq, xs, m, y, ldy); });
}

void GemmW8A8(const CpuContext& ctx, const PackedI8& w, const float* x, int64_t m, int64_t ldx,
              float* y, int64_t ldy, void* scratch, const float* in_scale) {
  if (m <= 0) return;
  const auto& kt = cpu::ActiveKernels();
  const int64_t row_bytes = PackedI8K4(w.k) * 4;
  // Scales, then the rescaled rows (if any), then the int8 rows.
  float* xs = cpu::Align64(scratch);
  float* scaled = xs + m;
  int8_t* xq = reinterpret_cast<int8_t*>(scaled + (in_scale ? m * w.k : 0));
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* row = x + i * ldx;
      if (in_scale != nullptr) {
        float* dst = scaled + i * w.k;
        for (int64_t j = 0; j < w.k; ++j) dst[j] = row[j] * in_scale[j];
        row = dst;
      }
      xs[i] = kt.quantize_row_i8(row, w.k, xq + i * row_bytes);
    }
  });
  ForPanels(ctx, w.n, [&](int64_t b, int64_t e) { kt.gemm_i8_panels(w, b, e, xq, xs, m, y, ldy); });
}

void RmsNorm(const CpuContext& ctx, const float* x, const float* weight, int64_t m, int64_t d,
             float eps, float* out) {
  const auto& kt = cpu::ActiveKernels();
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) kt.rms_norm_row(x + i * d, weight, d, eps, out + i * d);
  });
}

void SiluMul(const CpuContext& ctx, const float* gate_up, int64_t m, int64_t f, float* out) {
  const auto& kt = cpu::ActiveKernels();
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      kt.silu_mul_row(gate_up + i * 2 * f, gate_up + i * 2 * f + f, f, out + i * f);
    }
  });
}

void GeluMul(const CpuContext& ctx, const float* gate_up, int64_t m, int64_t f, float* out) {
  const auto& kt = cpu::ActiveKernels();
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      kt.gelu_mul_row(gate_up + i * 2 * f, gate_up + i * 2 * f + f, f, out + i * f);
    }
  });
}

namespace {

// One row's head_dim/2 (cos, sin) pairs.
void RowAngles(int32_t position, const float* inv_freq, int half, float* cos_sin) {
  for (int t = 0; t < half; ++t) {
    const double angle = (double)position * (double)inv_freq[t];
    cos_sin[2 * t] = (float)std::cos(angle);
    cos_sin[2 * t + 1] = (float)std::sin(angle);
  }
}

// One row's heads rotated by its (cos, sin) pairs: interleaved rotates
// (2t, 2t+1), half-split (t, t+half).
void RotateRow(float* row, int heads, int head_dim, const float* cos_sin, RopeStyle style) {
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    float* v = row + (int64_t)h * head_dim;
    for (int t = 0; t < half; ++t) {
      const int a = style == RopeStyle::kInterleaved ? 2 * t : t;
      const int c = style == RopeStyle::kInterleaved ? 2 * t + 1 : t + half;
      const float x0 = v[a], x1 = v[c], cs = cos_sin[2 * t], sn = cos_sin[2 * t + 1];
      v[a] = x0 * cs - x1 * sn;
      v[c] = x0 * sn + x1 * cs;
    }
  }
}

}  // namespace

void Rope(const CpuContext& ctx, float* x, int64_t m, int64_t stride, int heads, int head_dim,
          const int32_t* positions, const float* inv_freq, RopeStyle style) {
  const int half = head_dim / 2;
  PDQ_CHECK(half <= 512);
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    float cos_sin[1024];
    for (int64_t i = b; i < e; ++i) {
      RowAngles(positions[i], inv_freq, half, cos_sin);
      RotateRow(x + i * stride, heads, head_dim, cos_sin, style);
    }
  });
}

void RopeAngles(const CpuContext& ctx, const int32_t* positions, int64_t m, const float* inv_freq,
                int head_dim, float* cos_sin) {
  const int half = head_dim / 2;
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) RowAngles(positions[i], inv_freq, half, cos_sin + i * 2 * half);
  });
}

void Rope(const CpuContext& ctx, float* x, int64_t m, int64_t stride, int heads, int head_dim,
          const float* cos_sin, RopeStyle style) {
  ForRows(ctx, m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      RotateRow(x + i * stride, heads, head_dim, cos_sin + i * head_dim, style);
    }
  });
}

void KvWrite(const KvLayerView& layer, const int32_t* block_table, const int32_t* positions,
             int64_t m, const float* k, int64_t k_stride, const float* v, int64_t v_stride) {
  const auto& kt = cpu::ActiveKernels();
  const int64_t d = layer.head_dim;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t block = block_table[positions[i] / layer.block_tokens];
    const int64_t slot = positions[i] % layer.block_tokens;
    for (int h = 0; h < layer.kv_heads; ++h) {
      const int64_t off = ((block * layer.kv_heads + h) * layer.block_tokens + slot) * d;
      if (layer.bf16) {
        for (int64_t e = 0; e < d; ++e) {
          layer.k[off + e] = cpu::Fp32ToBf16(k[i * k_stride + h * d + e]);
          layer.v[off + e] = cpu::Fp32ToBf16(v[i * v_stride + h * d + e]);
        }
      } else {
        kt.to_f16(k + i * k_stride + h * d, d, layer.k + off);
        kt.to_f16(v + i * v_stride + h * d, d, layer.v + off);
      }
    }
  }
}

// AttendRowsFor keeps rows * group * (n + 16) score floats within
// kAttendScoreFloats unless one row is already larger.
// With room for the bf16 prompt kernel's tiles only where the context can
// take it.
static int64_t AttentionScratchPerThread(const CpuContext& ctx, int64_t max_positions, int heads,
                                         int head_dim) {
  const int64_t scores = std::max<int64_t>(heads * (max_positions + 16), cpu::kAttendScoreFloats);
  const bool bf16 = ctx.bf16_prompt_attention && Bf16AttentionSupported();
  return scores + cpu::AttendWorkFloats(max_positions, 64, head_dim, bf16);
}

int64_t AttentionScratchFloats(const CpuContext& ctx, int64_t max_positions, int heads,
                               int head_dim) {
  return (int64_t)ctx.num_threads() *
         AttentionScratchPerThread(ctx, max_positions, heads, head_dim);
}

void Attention(const CpuContext& ctx, const KvLayerView& layer, const int32_t* block_table,
               int64_t first_pos, int64_t m, const float* q, int64_t q_stride, int heads,
               float scale, float* out, int64_t out_stride, float* scratch) {
  const AttentionSeq seq{block_table, first_pos, m, q, out};
  Attention(ctx, layer, &seq, 1, q_stride, heads, scale, out_stride, scratch);
}

// A decode row over 2 * kDecodeSplitPositions positions or more is attended
// in parts of kDecodeSplitPositions to twice that, at block boundaries,
// which threads take apart, joined by each part's log-sum-exp
// (flash-decoding): a row's attention otherwise runs on one thread while the
// others wait whenever a step has fewer decode rows than threads (one
// stream over a long prompt). On a 2-thread Zen 4, one row at 2,048
// positions: 1.6-1.8 ms for 30 layers against 2.9 (kernels_bench
// BM_AttentionDecodeStep). Each part restarts the cache's streams, which
// rows enough to busy every thread pay for nothing; parts of 512 positions
// or more keep that within the host's noise at 2-16 rows (bench/RESULTS.md).
// The parts depend on the row's length alone, never on the threads or the
// step's other rows, so a row's numbers are the same alone or batched, on
// any number of threads; shorter rows keep the one-part numbers.
constexpr int64_t kDecodeSplitPositions = 512;

void Attention(const CpuContext& ctx, const KvLayerView& layer, const AttentionSeq* seqs,
               int64_t num_seqs, int64_t q_stride, int heads, float scale, int64_t out_stride,
               float* scratch) {
  const auto& kt = cpu::ActiveKernels();
  const int group = heads / layer.kv_heads;
  const int64_t d = layer.head_dim;
  int64_t max_pos = 0;
  for (int64_t si = 0; si < num_seqs; ++si)
    max_pos = std::max(max_pos, seqs[si].first_pos + seqs[si].m);
  const int64_t per_thread = AttentionScratchPerThread(ctx, max_pos, heads, layer.head_dim);
  // An item: a block of query rows of one sequence times one kv head, a
  // decode row with every kv head, or a part of one split. Causal
  // rows grow in cost, so threads take one item at a time, the costliest
  // (rows times the positions they see) first.
  struct Item {
    int64_t cost;
    int32_t seq;
    int32_t rows;
    int64_t row;
    int32_t kv_head;
    // A part of a split decode row (slot >= 0): its first position, its
    // length, its place in the part buffers and its row's in `splits`.
    int64_t part_begin = 0;
    int64_t part_len = 0;
    int32_t slot = -1;
    int32_t split = -1;
  };
  std::vector<Item> items;
  // Split decode rows: the sequence, its first slot, its number of parts.
  struct Split {
    int64_t seq, first_slot, parts;
  };
  std::vector<Split> splits;
  const bool can_split = kt.attend_decode_heads != nullptr &&
                         kt.attend_decode_heads_lse != nullptr &&
                         kt.attend_decode_heads_lse(layer, group);
  // Prompt rows on attend_prompt, or on the bf16 tiles when the context
  // asks for them and the path has them; decode rows on attend.
  // (16-token blocks only: the tiles' chunk addressing takes any multiple of
  // 16 as the vector kernels' does, but no AMX host has run it on another
  // size. Either cache dtype: fp16 K is split into two bf16 parts, bf16 K
  // and V go in as they lie.)
  const bool bf16 = ctx.bf16_prompt_attention && kt.attend_bf16 != nullptr &&
                    layer.head_dim == 64 && layer.block_tokens == 16 && group <= 32;
  // Decode rows read every kv head's blocks together where the path can
  // (attend_decode_heads: the cache's runs stream, where one kv head's rows
  // are short runs far apart), one item a sequence, unless items per kv head
  // would keep more than twice as many threads busy: from memory a sequence
  // read that way goes about 2.5x as fast (kernels_bench
  // BM_AttendDecodeFromMemory). On 2 threads that is every step: bench-engine
  // W4A16, one sequence at 1,000 tokens of context, 143-146 -> 171-192
  // tokens/s on a Zen 4 (no change measured at 0 or 256 tokens).
  int64_t decode_rows = 0;
  for (int64_t si = 0; si < num_seqs; ++si) decode_rows += !seqs[si].prompt && seqs[si].m == 1;
  const int64_t threads = std::max(1, ctx.num_threads());
  const bool heads_together =
      kt.attend_decode_heads != nullptr && layer.kv_heads > 1 &&
      2 * std::min(threads, decode_rows) >= std::min(threads, decode_rows * layer.kv_heads);
  int64_t slots = 0;
  for (int64_t si = 0; si < num_seqs; ++si) {
    const AttentionSeq& s = seqs[si];
    const int64_t n = s.first_pos + 1;
    if (can_split && !s.prompt && s.m == 1 && n >= 2 * kDecodeSplitPositions) {
      const int64_t bt = layer.block_tokens, blocks = (n + bt - 1) / bt;
      const int64_t parts = std::min(blocks, n / kDecodeSplitPositions);
      const int32_t split = (int32_t)splits.size();
      splits.push_back({si, slots, parts});
      for (int64_t i = 0; i < parts; ++i) {
        const int64_t begin = blocks * i / parts * bt;
        const int64_t end = std::min(n, blocks * (i + 1) / parts * bt);
        items.push_back({(end - begin) * layer.kv_heads, (int32_t)si, 1, 0, -1, begin, end - begin,
                         (int32_t)(slots++), split});
      }
      continue;
    }
    if (heads_together && !s.prompt && s.m == 1) {
      items.push_back({(s.first_pos + 1) * layer.kv_heads, (int32_t)si, 1, 0, -1});
      continue;
    }
    int rows_per_item = cpu::AttendRowsFor(s.first_pos + s.m, group);
    // Prompt kernels take up to 64 queries (rows times the group) a call.
    if (s.prompt) rows_per_item = std::max(1, std::min(rows_per_item, 64 / group));
    for (int64_t i = 0; i < s.m; i += rows_per_item) {
      const int rows = (int)std::min<int64_t>(rows_per_item, s.m - i);
      const int64_t cost = rows * (s.first_pos + i + rows);
      for (int g = 0; g < layer.kv_heads; ++g) items.push_back({cost, (int32_t)si, rows, i, g});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  // Each part's outputs (heads x head_dim) and log-sum-exps (heads), in
  // the calling thread's buffers; the last part of a row to finish joins
  // them (in part order whoever does: the same numbers).
  thread_local std::vector<float> part_buffer;
  if ((int64_t)part_buffer.size() < slots * heads * (d + 1)) {
    part_buffer.resize(slots * heads * (d + 1));
  }
  float* const part_out = part_buffer.data();
  float* const part_lse = part_out + slots * heads * d;
  std::unique_ptr<std::atomic<int64_t>[]> parts_left(new std::atomic<int64_t>[splits.size()]);
  for (size_t i = 0; i < splits.size(); ++i) {
    parts_left[i].store(splits[i].parts, std::memory_order_relaxed);
  }
  auto join = [&](const Split& sp) {
    float* out = seqs[sp.seq].out;
    for (int r = 0; r < heads; ++r) {
      // Part i's log-sum-exp at lse[i * heads], replaced by exp(it - top).
      float* lse = part_lse + sp.first_slot * heads + r;
      float top = -INFINITY;
      for (int64_t i = 0; i < sp.parts; ++i) top = std::max(top, lse[i * heads]);
      float sum = 0.0f;
      for (int64_t i = 0; i < sp.parts; ++i)
        sum += (lse[i * heads] = std::exp(lse[i * heads] - top));
      float* o = out + r * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t i = 0; i < sp.parts; ++i) {
        const float w = lse[i * heads] / sum;
        const float* p = part_out + ((sp.first_slot + i) * heads + r) * d;
        for (int64_t e = 0; e < d; ++e) o[e] += w * p[e];
      }
    }
  };
  auto item_fn = [&](int64_t index, int t) {
    const Item& it = items[index];
    const AttentionSeq& s = seqs[it.seq];
    if (it.slot >= 0) {
      kt.attend_decode_heads(layer, s.block_table + it.part_begin / layer.block_tokens, it.part_len,
                             group, s.q, scale, part_out + it.slot * heads * d,
                             scratch + t * per_thread, part_lse + it.slot * heads);
      if (parts_left[it.split].fetch_sub(1, std::memory_order_acq_rel) == 1) join(splits[it.split]);
      return;
    }
    if (it.kv_head < 0) {
      kt.attend_decode_heads(layer, s.block_table, s.first_pos + 1, group, s.q, scale, s.out,
                             scratch + t * per_thread, nullptr);
      return;
    }
    const int64_t head_off = (int64_t)it.kv_head * group * layer.head_dim;
    const auto attend = !s.prompt                     ? kt.attend
                        : bf16                        ? kt.attend_bf16
                        : kt.attend_prompt != nullptr ? kt.attend_prompt
                                                      : kt.attend;
    attend(layer, s.block_table, s.first_pos + it.row + 1, it.rows, it.kv_head, group,
           s.q + it.row * q_stride + head_off, q_stride, scale,
           s.out + it.row * out_stride + head_off, out_stride, scratch + t * per_thread);
  };
  if (ctx.pool == nullptr) {
    for (int64_t i = 0; i < (int64_t)items.size(); ++i) item_fn(i, 0);
  } else {
    ctx.pool->ParallelForEach((int64_t)items.size(), item_fn);
  }
}

}  // namespace pdq
