// Per-ISA single-threaded kernel bodies behind kernels.h. kernels.cc splits
// work across threads and picks the table for the running CPU; the scalar
// table is the reference every other one is tested against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"

namespace pdq::cpu {

struct KernelTable {
  const char* name;
  // Output panels [p_begin, p_end) of y = x W^T for all m rows.
  void (*gemm_f16_panels)(const PackedF16& w, int64_t p_begin, int64_t p_end, const float* x,
                          int64_t m, int64_t ldx, float* y, int64_t ldy);
  // W4A16 with int16 activations: xq holds m rows of k values quantized per
  // weight group, xs and xsum each group's scale and scale * sum(xq).
  void (*gemm_w4_panels)(const PackedW4& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                         const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy);
  // W4A16 with fp32 activations (the many-row path).
  void (*gemm_w4_panels_f32)(const PackedW4& w, int64_t p_begin, int64_t p_end, const float* x,
                             int64_t m, int64_t ldx, float* y, int64_t ldy);
  // Integer GEMM on panels [p_begin, p_end); xq holds m rows of k4 * 4
  // int8 activations, xs their scales.
  void (*gemm_i8_panels)(const PackedI8& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                         const float* xs, int64_t m, float* y, int64_t ldy);
  // Quantizes one activation row: returns its scale, writes k4 * 4 bytes.
  float (*quantize_row_i8)(const float* x, int64_t k, int8_t* q);
  // W4A8: the same with int8 activations (rows W4A8RowBytes(k) bytes apart,
  // quantized by quantize_row_i8_groups). Null where the path has no W4A8
  // kernel (the AVX2 tables so far); GemmW4A16 then keeps int16 activations.
  void (*gemm_w4a8_panels)(const PackedW4& w, int64_t p_begin, int64_t p_end, const int8_t* xq,
                           const float* xs, const float* xsum, int64_t m, float* y, int64_t ldy);
  // Quantizes one activation row to int8 per group of `group` inputs (absmax
  // / 127): writes W4A8RowBytes(k) bytes (zero past k), and per group its
  // scale and scale * sum of the quantized values.
  void (*quantize_row_i8_groups)(const float* x, int64_t k, int group, int8_t* q, float* scale,
                                 float* sum);
  // Quantizes one activation row to int16 per group of `group` inputs:
  // writes k values, and per group its scale (absmax / 32767) and
  // scale * sum of the quantized values.
  void (*quantize_row_i16)(const float* x, int64_t k, int group, int16_t* q, float* scale,
                           float* sum);
  void (*rms_norm_row)(const float* x, const float* weight, int64_t d, float eps, float* out);
  void (*silu_mul_row)(const float* gate, const float* up, int64_t f, float* out);
  void (*gelu_mul_row)(const float* gate, const float* up, int64_t f, float* out);
  // Query rows [0, rows) of one sequence, row r at position n_pos - 1 + r
  // (it sees positions [0, n_pos + r)), times the `group` query heads that
  // share kv head `kv_head` (contiguous in each q and out row; rows q_stride
  // and out_stride floats apart). scratch: AttendScratch(n_pos + rows - 1,
  // rows * group, head_dim) floats.
  void (*attend)(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                 int kv_head, int group, const float* q, int64_t q_stride, float scale,
                 float* out, int64_t out_stride, float* scratch);
  // Converts n floats to fp16 (round to nearest even).
  void (*to_f16)(const float* src, int64_t n, fp16_t* dst);
  // W8A16 on panels [p_begin, p_end): xq holds m rows of k int16 values
  // quantized per kW8Group inputs by quantize_row_i16, xs their scales.
  void (*gemm_w8_panels)(const PackedW8& w, int64_t p_begin, int64_t p_end, const int16_t* xq,
                         const float* xs, int64_t m, float* y, int64_t ldy);
  // W4A16 on bf16 tiles (AMX): xb holds Bf16Rows(m) rows of Bf16RowElements(k)
  // bf16 values from quantize_row_bf16 (the rows past m zero), and the
  // weights are dequantized to bf16 (scale * q + min, fused, rounded to
  // nearest even). Null where the path has no bf16 tiles; so is
  // quantize_row_bf16.
  void (*gemm_w4_panels_bf16)(const PackedW4& w, int64_t p_begin, int64_t p_end,
                              const uint16_t* xb, int64_t m, float* y, int64_t ldy);
  // One row to bf16 (round to nearest even, denormals to zero), zero from
  // k to Bf16RowElements(k).
  void (*quantize_row_bf16)(const float* x, int64_t k, uint16_t* dst);
  // W8A16 on bf16 tiles, as gemm_w4_panels_bf16 (weights scale * q).
  void (*gemm_w8_panels_bf16)(const PackedW8& w, int64_t p_begin, int64_t p_end,
                              const uint16_t* xb, int64_t m, float* y, int64_t ldy);
  // attend's contract for head_dim 64, 16-token blocks and at most 64
  // queries on AMX tiles, fp32 sums: Q * scale and K as two bf16 parts each
  // (scores to about 16 bits; a bf16 cache's K is one part, exact), the
  // softmax weights and V as bf16 (CpuContext::bf16_prompt_attention takes
  // it for prompt rows). Null where the path has no bf16 tiles.
  void (*attend_bf16)(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                      int kv_head, int group, const float* q, int64_t q_stride, float scale,
                      float* out, int64_t out_stride, float* scratch);
  // attend without its one-row (decode) and few-query shortcuts, for prompt
  // rows: a row's numbers then do not depend on how many rows share the
  // call, up to 64 queries (rows * group). Null where attend has no
  // shortcuts.
  void (*attend_prompt)(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                        int rows, int kv_head, int group, const float* q, int64_t q_stride,
                        float scale, float* out, int64_t out_stride, float* scratch) = nullptr;
  // One decode row (n_pos positions) of a sequence for every kv head of the
  // layer: attend(layer, block_table, n_pos, 1, h, group, q + h * group *
  // head_dim, ...) for each kv head h, the same numbers, with q and out the
  // row's kv_heads * group query vectors in order; reads a block's kv heads
  // together where it can (one run in the cache). scratch: kv_heads * group
  // * (n_pos + 16) + AttendWorkFloats(n_pos, 0, head_dim, false) floats (the
  // scores of every query, then the fp32 kernels' work area). Null where the
  // path has none (attend per kv head then). lse: null, or where
  // attend_decode_heads_lse(layer, group) holds, kv_heads * group floats
  // that take each query's log-sum-exp (its largest score plus the log of
  // the sum of exp(score - largest)): what joins the outputs of a row's
  // positions taken in parts (Attention's split of a long context).
  void (*attend_decode_heads)(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos,
                              int group, const float* q, float scale, float* out, float* scratch,
                              float* lse) = nullptr;
  // Whether attend_decode_heads computes this shape on its own kernels and
  // so can write lse (else it hands each kv head to attend, which has none).
  bool (*attend_decode_heads_lse)(const KvLayerView& layer, int group) = nullptr;
  // ArgmaxRow and ExpRow (kernels.h), one row each.
  int64_t (*argmax_row)(const float* x, int64_t n) = nullptr;
  float (*exp_row)(const float* x, int64_t n, float max, float scale, float* out) = nullptr;
};

// bf16 activation rows: k padded to whole 32-input tiles, rows to whole
// 16-row tiles.
inline int64_t Bf16RowElements(int64_t k) { return (k + 31) / 32 * 32; }
inline int64_t Bf16Rows(int64_t m) { return (m + 15) / 16 * 16; }

// The bf16 W4 path's reference, for tests (no table holds it: the scalar
// path keeps fp32 and int16 activations).
void GemmW4PanelsBf16Ref(const PackedW4& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy);
void GemmW8PanelsBf16Ref(const PackedW8& w, int64_t p_begin, int64_t p_end, const uint16_t* xb,
                         int64_t m, float* y, int64_t ldy);
void QuantizeRowBf16Ref(const float* x, int64_t k, uint16_t* dst);
// Inline: KvWrite rounds every element of a bf16 cache through it.
inline uint16_t Fp32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);         // denormals to zero
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (uint16_t)(u >> 16);
}
inline float Bf16ToFp32(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bytes between W4A8 activation rows: k rounded up to whole 8-input steps.
inline int64_t W4A8RowBytes(int64_t k) { return (k + 7) / 8 * 8; }

// p rounded up to a 64-byte boundary (scratch carved into vector- and
// tile-aligned parts), as a T*.
template <typename T = float>
inline T* Align64(void* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// Floats an attend call needs besides its scores: the fp32 kernels' K^T or
// V block (16 x head_dim), and the bf16 prompt kernel's (AMX) queries (hi
// and lo), K tiles (hi and lo), output rows and every V tile of the call
// (n_pos + 32 keys), each 64-byte aligned.
// (`bf16` false: the fp32 kernels' part alone.)
inline int64_t AttendWorkFloats(int64_t n_pos, int queries, int head_dim, bool bf16 = true) {
  const int64_t fp32 = 2 * 16 * (int64_t)head_dim + 8;  // + 8: alignment slack
  if (!bf16) return fp32;
  const int64_t tiles = (2 * queries * (int64_t)head_dim + 2048 + (n_pos + 32) * head_dim) / 2 +
                        16 * (int64_t)head_dim + 4 * 16;
  return std::max(fp32, tiles);
}
inline int64_t AttendScratch(int64_t n_pos, int queries, int head_dim) {
  return queries * (n_pos + 16) + AttendWorkFloats(n_pos, queries, head_dim);
}

// Query rows one attend call takes during a prefill, so each K/V block is
// converted once for all of them: up to kAttendRows, while their scores
// (rows * group * (n_pos + 16) floats) stay within kAttendScoreFloats (L2).
constexpr int kAttendRows = 8;
constexpr int64_t kAttendScoreFloats = 1 << 16;
inline int AttendRowsFor(int64_t n_pos, int group) {
  const int64_t rows = kAttendScoreFloats / ((int64_t)group * (n_pos + 16));
  return (int)std::clamp<int64_t>(rows, 1, kAttendRows);
}

// Where the attention kernels' chunks of 16 positions lie in a paged layer:
// a block holds block_tokens positions (a multiple of 16 for the vector
// kernels: Fit; other sizes take the scalar reference), its kv heads' rows
// one run after another. Offset(j0), j0 a multiple of 16: elements from the
// layer's K or V base to kv head 0's row of position j0; kv head h's row is
// h * head_stride further, and the chunk's rows follow it head_dim apart.
// (Positions below 2^32; a power-of-two block size shifts and masks, any
// other divides in 32 bits.)
inline int BlockShift(int block_tokens) {
  return block_tokens > 0 && (block_tokens & (block_tokens - 1)) == 0
             ? __builtin_ctz((unsigned)block_tokens)
             : -1;
}
struct KvChunks {
  KvChunks(const KvLayerView& layer, const int32_t* block_table)
      : table(block_table),
        block_tokens((uint32_t)layer.block_tokens),
        shift(BlockShift(layer.block_tokens)),
        head_dim(layer.head_dim),
        head_stride((int64_t)layer.block_tokens * layer.head_dim),
        block_stride(head_stride * layer.kv_heads) {}
  static bool Fit(const KvLayerView& layer) {
    return layer.block_tokens > 0 && layer.block_tokens % 16 == 0;
  }
  // Position j's block (its index in the table) and its row in the block.
  uint32_t BlockOf(uint32_t j) const { return shift >= 0 ? j >> shift : j / block_tokens; }
  uint32_t RowOf(uint32_t j) const {
    return shift >= 0 ? j & (block_tokens - 1) : j % block_tokens;
  }
  int64_t Offset(int64_t j0) const {
    const uint32_t j = (uint32_t)j0;
    return table[BlockOf(j)] * block_stride + (int64_t)RowOf(j) * head_dim;
  }
  // The block position j0 starts, or -1 inside one.
  int64_t BlockStarting(int64_t j0) const {
    const uint32_t j = (uint32_t)j0;
    return RowOf(j) == 0 ? (int64_t)BlockOf(j) : -1;
  }
  const int32_t* table;
  uint32_t block_tokens;
  int shift;  // log2(block_tokens), or -1
  int64_t head_dim, head_stride, block_stride;
};

// K/V blocks are block_tokens rows (16 by default) of one kv head, far
// apart in the cache (other heads' and sequences' blocks between them), so
// the hardware prefetchers lose the stream at every block: decode attention
// fetches the block this many ahead while it computes one (a decode row
// reads the whole cache once, from memory rather than cache at long
// context).
constexpr int64_t kPrefetchBlocks = 2;
inline void PrefetchKv(const fp16_t* p, int64_t elements) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < elements * (int64_t)sizeof(fp16_t); i += 64) __builtin_prefetch(c + i);
}
// That schedule for one decode row of one kv head, which reads every K
// block, then every V block, once: FirstKeys before the scores, KeysAhead(b)
// while block b's keys are scored (the keys' last blocks bring in the
// values' first), ValuesAhead(b) while block b's values are weighed.
// (heads: kv heads from kv_head on read together, their rows one run.)
// KeysAt / ValuesAt(j0) are the same at a kernel's chunk of 16 positions
// from j0: the schedule's step on a block's first chunk, nothing on others.
struct KvRowPrefetch {
  KvRowPrefetch(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int kv_head,
                int heads = 1)
      : chunks(layer, block_table),
        run(chunks.head_stride * heads),
        blocks((n_pos + layer.block_tokens - 1) / layer.block_tokens),
        k(layer.k + kv_head * chunks.head_stride),
        v(layer.v + kv_head * chunks.head_stride) {}
  void FirstKeys() const {
    for (int64_t b = 0; b < std::min(blocks, kPrefetchBlocks); ++b) PrefetchKv(k + Start(b), run);
  }
  void KeysAhead(int64_t b) const {
    const int64_t ahead = b + kPrefetchBlocks;
    if (ahead < blocks) {
      PrefetchKv(k + Start(ahead), run);
    } else if (ahead - blocks < blocks) {
      PrefetchKv(v + Start(ahead - blocks), run);
    }
  }
  void ValuesAhead(int64_t b) const {
    if (b + kPrefetchBlocks < blocks) PrefetchKv(v + Start(b + kPrefetchBlocks), run);
  }
  void KeysAt(int64_t j0) const {
    if (const int64_t b = chunks.BlockStarting(j0); b >= 0) KeysAhead(b);
  }
  void ValuesAt(int64_t j0) const {
    if (const int64_t b = chunks.BlockStarting(j0); b >= 0) ValuesAhead(b);
  }
  // Elements from block 0 to the sequence's b-th block.
  int64_t Start(int64_t b) const { return chunks.table[b] * chunks.block_stride; }
  KvChunks chunks;  // the layer's blocks (the table, their sizes)
  int64_t run;      // elements of the kv heads' rows in a block
  int64_t blocks;
  const fp16_t* k;  // this kv head's rows in block 0
  const fp16_t* v;
};

extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;  // only valid where the CPU has AVX2+FMA+F16C
// Only valid where CpuFeatures::avx512_kernels() holds (and AVX2); the AMX
// table differs in its W8A8 GEMM and its bf16 GEMMs, which need
// CpuFeatures::amx_kernels().
extern const KernelTable kAvx512Kernels;
extern const KernelTable kAvx512AmxKernels;

// AVX2 with AVX-VNNI (CpuFeatures::avxvnni): the AVX2 table with its W8A8
// GEMM on 256-bit vpdpbusd from 4 rows up and its int16 W4A16 and W8A16
// kernels on vpdpwssd (the W8A16 one from 2 rows up).
const KernelTable& AvxVnniKernels();

// The AVX2 attention body, shared by the AVX-512 tables (see avx512.cc):
// attend (kShortcuts: a decode row on register tiles) and attend_prompt
// (without). Defined and instantiated for both in avx2.cc only.
template <bool kShortcuts>
void AttendAvx2(const KvLayerView& layer, const int32_t* block_table, int64_t n_pos, int rows,
                int kv_head, int group, const float* q, int64_t q_stride, float scale, float* out,
                int64_t out_stride, float* scratch);

// The table for this CPU (see GetCpuFeatures and PDQ_ISA).
const KernelTable& ActiveKernels();

}  // namespace pdq::cpu
