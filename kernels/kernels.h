// pdq's CPU compute kernels. Each takes the device context first, never
// allocates, and dispatches at run time to the fastest path the CPU has
// (AVX-512 with AMX tiles, AVX-512 VNNI, AVX2 with AVX-VNNI, AVX2+FMA+F16C,
// else the scalar reference in kernels/cpu/ref.cc; see KernelIsaName in
// kernels/cpu/cpu_features.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/half.h"

namespace pdq {

class ThreadPool;  // kernels/cpu/thread_pool.h: whoever creates one includes it

// The CPU device: the threads every kernel call runs on. Non-owning view;
// a pool runs one caller's kernels at a time, so concurrent callers each
// need their own pool.
struct CpuContext {
  ThreadPool* pool = nullptr;
  // Attention's prompt rows (AttentionSeq::prompt, head_dim 64) on AMX-BF16
  // tiles where the CPU has them (Bf16AttentionSupported): Q and K as two
  // bf16 parts each (a bf16 cache's K as one, exact), softmax weights and V
  // as bf16, fp32 sums. Decode rows
  // stay fp32. Off here; the command-line flags turn it on
  // (ModelFlags::bf16_attention, bench/RESULTS.md).
  bool bf16_prompt_attention = false;
  // The rows of calls made with this context are prompt rows (the engine
  // passes them apart from decode rows): GemmW4A16, GemmW8A16 and GemmF16
  // take one path whatever their number, so a prompt token's numbers do not
  // depend on how its prompt was cut into passes (prefix cache hits,
  // chunked prefill) or what shared them. Decode rows (false) take the path
  // their count picks.
  bool prompt_rows = false;
  int num_threads() const;
};

// ---- FP16 weights in 16-row panels -------------------------------------
// A weight matrix W[n][k] (y = x W^T) is stored in panels of 16 rows, each
// panel k-major: data[(p * k + kk) * 16 + j] = W[16 p + j][kk]. Rows past n
// are zero. Both the decode GEMV and the prefill GEMM stream it in order.
constexpr int kPanelRows = 16;
struct PackedF16 {
  const fp16_t* data = nullptr;
  int64_t n = 0;  // output features
  int64_t k = 0;  // input features
};
inline int64_t PackedF16Elements(int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * k;
}
// Packs rows [row0, row0 + rows) of a row-major fp32 matrix (row length k)
// into `dst` (PackedF16Elements(n, k) elements, zero-filled by the caller for
// padding rows).
void PackF16Rows(const float* src, int64_t row0, int64_t rows, int64_t k, fp16_t* dst);

// y[m][n] = sum_k x[m][k] * W[n][k]. x rows are ldx floats apart, y rows ldy.
void GemmF16(const CpuContext& ctx, const PackedF16& w, const float* x, int64_t m,
             int64_t ldx, float* y, int64_t ldy);

// ---- W4A16: 4-bit weights, 16-bit activations ------------------------------
// Weights are quantized in groups of `group` consecutive inputs (32, 64 or
// 128: a divisor of 256; the last group of a row may be shorter):
// w = scale * q + min, q in [0, 15], with fp16 scale and min per (row, group).
// Storage follows the same 16-row panels as PackedF16, k-major in pairs of
// inputs: for panel p and input pair t, byte 2i + e (i < 8, e < 2) of the 16
// bytes at q + (p * k / 2 + t) * 16 holds q[16p + i][2t + e] in its low
// nibble and q[16p + 8 + i][2t + e] in its high nibble. Widened to 16 bits,
// masked and shifted, one load gives two vectors whose adjacent lanes are one
// row's two inputs: what an int16 pair dot product (vpmaddwd) consumes.
// scale/min: [panel][group][16].
struct PackedW4 {
  const uint8_t* q = nullptr;
  const fp16_t* scale = nullptr;
  const fp16_t* min = nullptr;
  int64_t n = 0;
  int64_t k = 0;  // even
  int group = 128;
  // W4A8: in calls of this many rows up to kW4IntMaxRows (batched decode,
  // and prefill chunks that short), the activations are quantized per weight
  // group to int8 (absmax / 127) instead of int16, on the paths that have a
  // W4A8 kernel (AVX-512 and the scalar reference; W4A8Supported()); the AVX2
  // paths keep int16. 0: never.
  int a8_min_rows = 0;
  // bf16 tiles: in calls of this many rows or more (any m), on paths with
  // AMX-BF16 (Bf16TilesSupported()), activations are rounded to bf16 and meet
  // the weights dequantized to bf16 in tdpbf16ps, fp32 sums; ahead of
  // a8_min_rows. Only for k up to kBf16MaxK. 0: never.
  int bf16_min_rows = 0;
};
// True when the kernel path dispatch chose has W4A8, so a8_min_rows takes
// effect.
bool W4A8Supported();
// True when the path has the bf16 prompt attention (AMX-BF16), so
// CpuContext::bf16_prompt_attention takes effect.
bool Bf16AttentionSupported();

// True when it has the bf16 tile GEMMs, so bf16_min_rows takes effect.
bool Bf16TilesSupported();
// The bf16 tile GEMMs take k up to this; larger k keeps the other paths.
constexpr int64_t kBf16MaxK = 4096;
// True when a W4A16 or W8A16 call of m rows over k inputs, with that
// weight set's bf16_min_rows, runs on the bf16 tiles.
inline bool Bf16TilesTake(int bf16_min_rows, int64_t m, int64_t k) {
  return bf16_min_rows > 0 && m >= bf16_min_rows && k <= kBf16MaxK && Bf16TilesSupported();
}
inline int64_t PackedW4Groups(int64_t k, int group) { return (k + group - 1) / group; }
inline int64_t PackedW4QBytes(int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * (k / 2);
}
inline int64_t PackedW4ScaleElements(int64_t n, int64_t k, int group) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * PackedW4Groups(k, group);
}
// The code of row j (within its panel) and input kk in a panel's q bytes.
inline int PackedW4Code(const uint8_t* panel_q, int64_t kk, int64_t j) {
  const uint8_t byte = panel_q[(kk / 2) * kPanelRows + 2 * (j % 8) + kk % 2];
  return j < 8 ? byte & 0xf : byte >> 4;
}
// One group's fp16 scale and min from its n weights: [min, max] mapped onto
// 0..15, or (symmetric) the extreme value onto 0 with min = -8 * scale.
// `shrink` < 1 maps that fraction of the range instead (clipping searches).
void W4GroupParams(const float* w, int64_t n, bool symmetric, fp16_t* scale, fp16_t* min,
                   float shrink = 1.0f);
// The code of weight w against a group's stored min and 1 / scale.
inline uint8_t W4Code(float w, float inv_scale, float min) {
  return (uint8_t)std::clamp(std::nearbyint((w - min) * inv_scale), 0.0f, 15.0f);
}
// Round-to-nearest quantization of rows [row0, row0 + rows) of a row-major
// fp32 matrix into the packed arrays. Asymmetric uses each group's [min, max];
// symmetric centres q on 8 (min = -8 * scale).
void QuantizeW4Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int group,
                    bool symmetric, uint8_t* q, fp16_t* scale, fp16_t* min);
// Packs given codes instead: `codes` is rows x k (values 0..15) and
// `scales`/`mins` rows x groups, all row-major, for quantizers that choose
// their own codes (GPTQ, AWQ).
void PackW4Rows(const uint8_t* codes, const fp16_t* scales, const fp16_t* mins, int64_t row0,
                int64_t rows, int64_t k, int group, uint8_t* q, fp16_t* scale, fp16_t* min);

// y[m][n] = sum_k x[m][k] * W[n][k].
// Up to kW4IntMaxRows rows (decode, batched decode), and prompt rows
// (CpuContext::prompt_rows) at any count, the activations are quantized per
// weight group to int16 (scale = group absmax / 32767: 16-bit activations,
// finer than fp16's 11-bit mantissa for the values that dominate a dot
// product), or, decode rows only, to int8 from PackedW4::a8_min_rows rows up
// (W4A8); each group's products are summed exactly in int32 and scaled once.
// More decode rows dequantize the weights into fp32 tiles instead. Where
// Bf16TilesTake holds (prompt rows: for any count), the bf16 tiles. `scratch`:
// GemmW4A16ScratchBytes(m, k, group) bytes. With
// `in_scale` (k entries), x[i][j] * in_scale[j] is multiplied instead:
// AWQ's input scaling, whose inverse the weights carry.
constexpr int64_t kW4IntMaxRows = 64;
inline int64_t GemmW4A16ScratchBytes(int64_t m, int64_t k, int group) {
  const int64_t scaled_rows = m * k * (int64_t)sizeof(float);
  // int16 rows, or W4A8's int8 rows of whole 8-input steps, whichever is larger.
  const int64_t row_bytes = std::max<int64_t>(k * 2, (k + 7) / 8 * 8);
  const int64_t int16_rows = m * (row_bytes + PackedW4Groups(k, group) * 8);
  // Or bf16 rows, k padded to whole 32s and m to whole 16s.
  const int64_t bf16_rows = (m + 15) / 16 * 16 * ((k + 31) / 32 * 32) * 2;
  return scaled_rows + std::max(int16_rows, bf16_rows) + 128;
}
void GemmW4A16(const CpuContext& ctx, const PackedW4& w, const float* x, int64_t m, int64_t ldx,
               float* y, int64_t ldy, void* scratch, const float* in_scale = nullptr);

// ---- W8A16: int8 weight groups, 16-bit activations ---------------------------
// Weights are symmetric int8 per group of kW8Group consecutive inputs (w =
// scale * q, q in [-127, 127], an fp16 scale per (row, group); a row's last
// group may be shorter): GGUF's Q8_0 grid, so a Q8_0 source (the tied
// embedding and output projection of many GGUF files) is re-found exactly.
// Half the bytes of FP16 for layers too sensitive for 4 bits (the output
// projection). Storage: 16-row panels, k-major in pairs of inputs: byte
// 2j + e of the 32 bytes at q + (p * k / 2 + t) * 32 holds q[16p + j][2t + e].
// Sign-extended to 16 bits, one such step is 16 lanes of one row's two
// inputs: what an int16 pair dot product (vpdpwssd, vpmaddwd) consumes
// against a broadcast pair of activations. scale: [panel][group][16].
constexpr int kW8Group = 32;
struct PackedW8 {
  const int8_t* q = nullptr;
  const fp16_t* scale = nullptr;
  int64_t n = 0;
  int64_t k = 0;  // even
  // As PackedW4::bf16_min_rows: from this many rows, bf16 AMX tiles; 0: never.
  int bf16_min_rows = 0;
};
inline int64_t PackedW8Groups(int64_t k) { return (k + kW8Group - 1) / kW8Group; }
inline int64_t PackedW8QBytes(int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * k;
}
inline int64_t PackedW8ScaleElements(int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * PackedW8Groups(k);
}
// The code of row j (within its panel) and input kk in a panel's q bytes.
inline int PackedW8Code(const int8_t* panel_q, int64_t kk, int64_t j) {
  return panel_q[(kk / 2) * 2 * kPanelRows + 2 * j + kk % 2];
}
// Round-to-nearest quantization of rows [row0, row0 + rows) of a row-major
// fp32 matrix (k even): per group, scale = absmax / 127 rounded to fp16, and
// the codes against that stored scale.
void QuantizeW8Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int8_t* q,
                    fp16_t* scale);
// Rows [row0, row0 + rows) back as row-major fp32 (scale * q), for backends
// that store them otherwise.
void DequantizeW8Rows(const PackedW8& w, int64_t row0, int64_t rows, float* dst);
// Scratch for GemmW8A16: m int16 rows and their group scales and sums, or
// the bf16 rows (k padded to whole 32s, m to whole 16s).
inline int64_t GemmW8A16ScratchBytes(int64_t m, int64_t k) {
  const int64_t int16_rows = m * (k * 2 + PackedW8Groups(k) * 2 * (int64_t)sizeof(float));
  const int64_t bf16_rows = (m + 15) / 16 * 16 * ((k + 31) / 32 * 32) * 2;
  return std::max(int16_rows, bf16_rows) + 128;
}
// y = x W^T: each row of x quantized per group of kW8Group inputs to int16
// (absmax / 32767, as GemmW4A16's decode path), each group's products summed
// exactly in int32 and scaled once. Any m; `scratch`: GemmW8A16ScratchBytes.
void GemmW8A16(const CpuContext& ctx, const PackedW8& w, const float* x, int64_t m, int64_t ldx,
               float* y, int64_t ldy, void* scratch);

// ---- W8A8: int8 weights per output channel, int8 activations per token ----
// Weights are symmetric int8 (w = scale[row] * q, q in [-127, 127]) in 16-row
// panels, k-major in quads: for panel p and input quad t, bytes
// [(p * k4 + t) * 64 + 4 j + i] hold q[16 p + j][4 t + i], with k4 = k / 4
// rounded up and the padding zero. Activations are quantized per row at run
// time (symmetric, absmax / 127) and the dot products run in int32.
struct PackedI8 {
  const int8_t* q = nullptr;
  const float* scale = nullptr;  // per output row (n entries)
  int64_t n = 0;
  int64_t k = 0;
};
inline int64_t PackedI8K4(int64_t k) { return (k + 3) / 4; }
inline int64_t PackedI8Bytes(int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * PackedI8K4(k) * 4;
}
// Quantizes rows [row0, row0 + rows) of a row-major fp32 matrix.
void QuantizeI8Rows(const float* src, int64_t row0, int64_t rows, int64_t k, int8_t* q,
                    float* scale);
// Scratch for GemmW8A8: m rows of quantized activations and their scales,
// plus room for the rescaled rows when an input scale is given.
inline int64_t GemmW8A8ScratchBytes(int64_t m, int64_t k) {
  return m * (PackedI8K4(k) * 4 + (int64_t)sizeof(float) * (1 + k)) + 128;
}
// y = x W^T: quantizes x per row into `scratch`, then integer dot products
// with fused dequantization of the int32 results. With `in_scale` (k
// entries), x[i][j] * in_scale[j] is quantized instead: SmoothQuant's
// migration, whose inverse the weights carry.
void GemmW8A8(const CpuContext& ctx, const PackedI8& w, const float* x, int64_t m, int64_t ldx,
              float* y, int64_t ldy, void* scratch, const float* in_scale = nullptr);

// ---- Elementwise and normalization -------------------------------------
// out[i] = x[i] / rms(x[i]) * weight, for m rows of length d.
void RmsNorm(const CpuContext& ctx, const float* x, const float* weight, int64_t m, int64_t d,
             float eps, float* out);

// gate_up rows hold [gate (f) | up (f)]; out[i][j] = silu(gate) * up.
void SiluMul(const CpuContext& ctx, const float* gate_up, int64_t m, int64_t f, float* out);
// The same with GELU's tanh approximation, gelu(g) = g/2 (1 + tanh(sqrt(2/pi)
// (g + 0.044715 g^3))): GeGLU (Gemma).
void GeluMul(const CpuContext& ctx, const float* gate_up, int64_t m, int64_t f, float* out);

// ---- One row, on the calling thread (sampling) --------------------------------
// The index of the largest of x[0, n) (n > 0), the lowest on ties; a NaN is
// never larger than anything.
int64_t ArgmaxRow(const float* x, int64_t n);
// out[i] = exp((x[i] - max) * scale) for i < n, to about 2 ulp (0 where
// the argument is below about -87); returns their sum. max is at least every
// x[i] and scale > 0, so each is at most 1.
float ExpRow(const float* x, int64_t n, float max, float scale, float* out);

// Rotary position embedding, in place, on `heads` heads of head_dim per row.
// Rows are `stride` floats apart. inv_freq has head_dim/2 entries.
enum class RopeStyle { kInterleaved, kHalfSplit };  // ggml's NORM and NEOX
void Rope(const CpuContext& ctx, float* x, int64_t m, int64_t stride, int heads, int head_dim,
          const int32_t* positions, const float* inv_freq, RopeStyle style);
// The same from the rows' rotations, which RopeAngles computes once for
// every layer of a forward pass: cos_sin holds head_dim/2 (cos, sin) pairs
// per row, the same numbers Rope above computes for each call.
void RopeAngles(const CpuContext& ctx, const int32_t* positions, int64_t m, const float* inv_freq,
                int head_dim, float* cos_sin);
void Rope(const CpuContext& ctx, float* x, int64_t m, int64_t stride, int heads, int head_dim,
          const float* cos_sin, RopeStyle style);

// ---- Paged attention -----------------------------------------------------
// One layer's KV storage: blocks of block_tokens tokens, each holding
// [kv_heads][block_tokens][head_dim] 16-bit elements for K and the same for
// V: fp16, or bf16 where `bf16` (rounded to nearest even; where the CPU has
// AVX512_BF16, a decode row's dot products take them as they lie).
struct KvLayerView {
  fp16_t* k = nullptr;
  fp16_t* v = nullptr;
  int kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;
  bool bf16 = false;
};

// Writes k/v rows (row i at position positions[i]) into the blocks of
// block_table. k rows are k_stride floats apart, v rows v_stride.
void KvWrite(const KvLayerView& layer, const int32_t* block_table, const int32_t* positions,
             int64_t m, const float* k, int64_t k_stride, const float* v, int64_t v_stride);

// Causal attention for m new query rows of one sequence at positions
// first_pos .. first_pos + m - 1, whose K/V are already in the cache.
// q rows are q_stride floats apart ([heads][head_dim]); out rows out_stride.
// scratch: AttentionScratchFloats(ctx, first_pos + m, heads, head_dim) floats.
int64_t AttentionScratchFloats(const CpuContext& ctx, int64_t max_positions, int heads,
                               int head_dim);
void Attention(const CpuContext& ctx, const KvLayerView& layer, const int32_t* block_table,
               int64_t first_pos, int64_t m, const float* q, int64_t q_stride, int heads,
               float scale, float* out, int64_t out_stride, float* scratch);

// The same for the sequences of one batch in one parallel pass: the work of
// all of them (a block of query rows times a kv head each) is handed out
// largest first, so a batched decode step's few items per sequence keep
// every thread busy instead of one parallel region per sequence; a decode
// row over 1,024 positions or more is itself cut into parts of its
// positions, joined by their log-sum-exp (kernels.cc: a row's numbers
// depend on its length alone, not on the batch or the threads). scratch:
// AttentionScratchFloats for the largest first_pos + m of the batch.
struct AttentionSeq {
  const int32_t* block_table = nullptr;
  int64_t first_pos = 0;
  int64_t m = 0;
  const float* q = nullptr;  // m rows, q_stride floats apart
  float* out = nullptr;      // m rows, out_stride floats apart
  // Prompt rows (as CpuContext::prompt_rows): on the bf16 tiles where the
  // context asks for them, else on attend_prompt, however many; decode rows
  // on attend.
  bool prompt = false;
};
void Attention(const CpuContext& ctx, const KvLayerView& layer, const AttentionSeq* seqs,
               int64_t num_seqs, int64_t q_stride, int heads, float scale, int64_t out_stride,
               float* scratch);

}  // namespace pdq
