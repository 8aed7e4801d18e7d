// GPTQ, AWQ's scale search and the Gram accumulation they share. The hot
// loops are written with GCC vector types and compiled twice (x86-64-v3, i.e.
// AVX2+FMA, and baseline x86-64), picked at load time by the CPU's ISA level:
// quantization runs once per model, so it stays out of kernels/ and their
// hand-tuned dispatch.
#include "quant/w4_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/kernels.h"

// ifunc resolvers run before a sanitizer's runtime is up, so sanitized
// builds take the default clone only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PDQ_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PDQ_MULTIVERSION
#endif

namespace pdq {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));    // unaligned access
typedef double v4d __attribute__((vector_size(32)));
typedef double v4d_u __attribute__((vector_size(32), aligned(8)));

// Macros, not functions: a function returning a 32-byte vector changes ABI
// between the two compiled variants.
#define Load8(p) (*reinterpret_cast<const v8f_u*>(p))
#define Store8(p, v) (*reinterpret_cast<v8f_u*>(p) = (v))
#define Load4(p) (*reinterpret_cast<const v4d_u*>(p))

// y[i] += a * x[i].
PDQ_MULTIVERSION void Axpy(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// sum a[i] * b[i] in double, four vector accumulators.
PDQ_MULTIVERSION double DotD(const double* a, const double* b, int64_t n) {
  v4d s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += Load4(a + i) * Load4(b + i);
    s1 += Load4(a + i + 4) * Load4(b + i + 4);
    s2 += Load4(a + i + 8) * Load4(b + i + 8);
    s3 += Load4(a + i + 12) * Load4(b + i + 12);
  }
  for (; i + 4 <= n; i += 4) s0 += Load4(a + i) * Load4(b + i);
  const v4d s = (s0 + s1) + (s2 + s3);
  double out = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; ++i) out += a[i] * b[i];
  return out;
}

// Operands of the 4x16 tile kernel come in panels of 16 columns, t-major:
// panel[t * 16 + c] is column c of row t, so every stream is sequential.
// out[r][c] += sum_t a[t * 16 + r] * b[t * 16 + c] for r < 4, c < 16; out
// rows are ldo apart.
PDQ_MULTIVERSION void Tile4x16(const float* a, const float* b, int64_t n, float* out,
                               int64_t ldo) {
  v8f c00 = Load8(out), c01 = Load8(out + 8);
  v8f c10 = Load8(out + ldo), c11 = Load8(out + ldo + 8);
  v8f c20 = Load8(out + 2 * ldo), c21 = Load8(out + 2 * ldo + 8);
  v8f c30 = Load8(out + 3 * ldo), c31 = Load8(out + 3 * ldo + 8);
  for (int64_t t = 0; t < n; ++t) {
    const float* at = a + t * 16;
    const v8f b0 = Load8(b + t * 16), b1 = Load8(b + t * 16 + 8);
    const float a0 = at[0], a1 = at[1], a2 = at[2], a3 = at[3];
    c00 += a0 * b0;
    c01 += a0 * b1;
    c10 += a1 * b0;
    c11 += a1 * b1;
    c20 += a2 * b0;
    c21 += a2 * b1;
    c30 += a3 * b0;
    c31 += a3 * b1;
  }
  Store8(out, c00);
  Store8(out + 8, c01);
  Store8(out + ldo, c10);
  Store8(out + ldo + 8, c11);
  Store8(out + 2 * ldo, c20);
  Store8(out + 2 * ldo + 8, c21);
  Store8(out + 3 * ldo, c30);
  Store8(out + 3 * ldo + 8, c31);
}

// Packs `rows` rows of width `cols` (ld apart) into panels of 16 columns, t
// = row: dst[(p * rows + t) * 16 + c] = src[t][16 p + c], zero past cols.
void PackPanels(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  const int64_t panels = (cols + 15) / 16;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t c0 = 16 * p, nc = std::min<int64_t>(16, cols - c0);
    for (int64_t t = 0; t < rows; ++t) {
      float* d = dst + (p * rows + t) * 16;
      const float* s = src + t * ld + c0;
      for (int64_t c = 0; c < nc; ++c) d[c] = s[c];
      for (int64_t c = nc; c < 16; ++c) d[c] = 0.0f;
    }
  }
}

// Like W4GroupParams, but shrinks the range [lo, hi] by factors 1, 0.98, ...,
// 0.6 and keeps the one whose rounding minimizes sum_i importance_i (w_i -
// w^_i)^2: clipping a few outliers buys a finer grid for the rest.
void ClippedW4GroupParams(const float* w, const float* importance, int64_t n, bool symmetric,
                          fp16_t* scale, fp16_t* min) {
  W4GroupParams(w, n, symmetric, scale, min);
  auto error = [&](fp16_t sc, fp16_t mn) {
    const float sr = Fp16ToFp32(sc), mr = Fp16ToFp32(mn), inv = sr != 0.0f ? 1.0f / sr : 0.0f;
    double e = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float d = w[i] - (sr * W4Code(w[i], inv, mr) + mr);
      e += (double)importance[i] * d * d;
    }
    return e;
  };
  double best = error(*scale, *min);
  for (int step = 1; step <= 20; ++step) {
    fp16_t sc, mn;
    W4GroupParams(w, n, symmetric, &sc, &mn, 1.0f - 0.02f * step);
    const double e = error(sc, mn);
    if (e < best) {
      best = e;
      *scale = sc;
      *min = mn;
    }
  }
}

// U upper triangular with H^-1 = U^T U, from the damped Gram matrix `h`
// (k x k, overwritten). Factors the reversed matrix (J H J = L L^T, so
// H = U1 U1^T with U1 = J L J upper) and inverts U1: U = U1^-1.
bool UpperCholeskyOfInverse(std::vector<double>& h, int64_t k, std::vector<float>* u) {
  std::vector<double> l(k * k, 0.0);  // lower factor of the reversed matrix
  for (int64_t j = 0; j < k; ++j) {
    const double* lj = l.data() + j * k;
    double d = h[(k - 1 - j) * k + (k - 1 - j)] - DotD(lj, lj, j);
    if (!(d > 0.0)) return false;
    d = std::sqrt(d);
    l[j * k + j] = d;
    for (int64_t i = j + 1; i < k; ++i) {
      const double* li = l.data() + i * k;
      l[i * k + j] = (h[(k - 1 - i) * k + (k - 1 - j)] - DotD(li, lj, j)) / d;
    }
  }
  // U1[a][b] = L[k-1-a][k-1-b]. Solve U1 x = e_c for each column c of U,
  // kept transposed (ut[c][a] = U[a][c]) so the dot products run along rows.
  std::vector<double> u1(k * k, 0.0), ut(k * k, 0.0);
  for (int64_t a = 0; a < k; ++a) {
    for (int64_t b = a; b < k; ++b) u1[a * k + b] = l[(k - 1 - a) * k + (k - 1 - b)];
  }
  l = {};
  for (int64_t c = 0; c < k; ++c) {
    double* x = ut.data() + c * k;
    x[c] = 1.0 / u1[c * k + c];
    for (int64_t a = c - 1; a >= 0; --a) {
      x[a] = -DotD(u1.data() + a * k + a + 1, x + a + 1, c - a) / u1[a * k + a];
    }
  }
  u->assign(k * k, 0.0f);
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t a = 0; a <= c; ++a) (*u)[a * k + c] = (float)ut[c * k + a];
  }
  return true;
}

}  // namespace

W4Codes QuantizeW4Rtn(const float* w, const W4Shape& s, const float* importance) {
  const int64_t groups = s.groups();
  W4Codes q;
  q.codes.resize(s.rows * s.k);
  q.scales.resize(s.rows * groups);
  q.mins.resize(s.rows * groups);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * s.group, k1 = std::min<int64_t>(s.k, k0 + s.group);
      const float* row = w + r * s.k;
      fp16_t& sc = q.scales[r * groups + g];
      fp16_t& mn = q.mins[r * groups + g];
      if (importance != nullptr) {
        ClippedW4GroupParams(row + k0, importance + k0, k1 - k0, s.symmetric, &sc, &mn);
      } else {
        W4GroupParams(row + k0, k1 - k0, s.symmetric, &sc, &mn);
      }
      const float sr = Fp16ToFp32(sc), mr = Fp16ToFp32(mn);
      const float inv = sr != 0.0f ? 1.0f / sr : 0.0f;
      for (int64_t i = k0; i < k1; ++i) q.codes[r * s.k + i] = W4Code(row[i], inv, mr);
    }
  }
  return q;
}

std::vector<float> DequantizeW4(const W4Codes& q, const W4Shape& s) {
  const int64_t groups = s.groups();
  std::vector<float> w(s.rows * s.k);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t i = 0; i < s.k; ++i) {
      const int64_t g = r * groups + i / s.group;
      w[r * s.k + i] =
          Fp16ToFp32(q.scales[g]) * q.codes[r * s.k + i] + Fp16ToFp32(q.mins[g]);
    }
  }
  return w;
}

absl::StatusOr<W4Codes> QuantizeW4Gptq(const float* w, const W4Shape& s, const float* gram,
                                      const GptqOptions& options) {
  const int64_t k = s.k, groups = s.groups();
  std::vector<double> h(gram, gram + k * k);
  std::vector<float> importance(k);
  for (int64_t i = 0; i < k; ++i) importance[i] = std::max(gram[i * k + i], 0.0f);
  std::vector<bool> dead(k, false);
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) {
    if (h[i * k + i] <= 0.0) {
      dead[i] = true;
      h[i * k + i] = 1.0;
    }
    mean_diag += h[i * k + i] / k;
  }
  std::vector<float> u;
  bool factored = false;
  // Rounding can leave a near-singular Gram matrix indefinite: damp harder.
  for (double damp = options.damp; !factored && damp <= 100 * options.damp + 1e-12; damp *= 10) {
    std::vector<double> hd = h;
    for (int64_t i = 0; i < k; ++i) hd[i * k + i] += damp * mean_diag;
    factored = UpperCholeskyOfInverse(hd, k, &u);
  }
  if (!factored) {
    return absl::InternalError("GPTQ: the damped Gram matrix is not positive definite");
  }

  W4Codes q;
  q.codes.resize(s.rows * k);
  q.scales.resize(s.rows * groups);
  q.mins.resize(s.rows * groups);
  // Rows are independent: take a few at a time so each row of U is read
  // once per batch.
  constexpr int64_t kBatch = 16;
  std::vector<float> wb(kBatch * k), inv(kBatch), mn(kBatch), sc(kBatch);
  for (int64_t r0 = 0; r0 < s.rows; r0 += kBatch) {
    const int64_t nb = std::min(kBatch, s.rows - r0);
    for (int64_t r = 0; r < nb; ++r) {
      for (int64_t i = 0; i < k; ++i) wb[r * k + i] = dead[i] ? 0.0f : w[(r0 + r) * k + i];
    }
    for (int64_t j = 0; j < k; ++j) {
      if (j % s.group == 0) {
        const int64_t g = j / s.group, n = std::min<int64_t>(s.group, k - j);
        for (int64_t r = 0; r < nb; ++r) {
          fp16_t& scale = q.scales[(r0 + r) * groups + g];
          fp16_t& min = q.mins[(r0 + r) * groups + g];
          if (options.clip) {
            ClippedW4GroupParams(wb.data() + r * k + j, importance.data() + j, n, s.symmetric,
                               &scale, &min);
          } else {
            W4GroupParams(wb.data() + r * k + j, n, s.symmetric, &scale, &min);
          }
          sc[r] = Fp16ToFp32(scale);
          mn[r] = Fp16ToFp32(min);
          inv[r] = sc[r] != 0.0f ? 1.0f / sc[r] : 0.0f;
        }
      }
      const float* uj = u.data() + j * k;
      for (int64_t r = 0; r < nb; ++r) {
        float* row = wb.data() + r * k;
        const uint8_t c = W4Code(row[j], inv[r], mn[r]);
        q.codes[(r0 + r) * k + j] = c;
        const float err = (row[j] - (sc[r] * c + mn[r])) / uj[j];
        Axpy(row + j + 1, uj + j + 1, -err, k - j - 1);
      }
    }
  }
  return q;
}

double GramQuadraticError(const float* e, int64_t rows, int64_t k, const float* gram) {
  // F = E G by 4x16 tiles (E transposed into panels of 16 rows, G into
  // panels of 16 columns), then sum F o E.
  const int64_t kp = (k + 15) / 16 * 16, rp = (rows + 15) / 16 * 16;
  std::vector<float> gp(kp * k), et(k * rp, 0.0f), ep(rp * k);
  PackPanels(gram, k, k, k, gp.data());  // G symmetric: rows are columns
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) et[i * rp + r] = e[r * k + i];
  }
  PackPanels(et.data(), k, rp, rp, ep.data());
  double total = 0;
  float f[4 * 16];
  for (int64_t q = 0; q < kp / 16; ++q) {
    for (int64_t p = 0; p < rp / 16; ++p) {
      for (int64_t r0 = 0; r0 < 16; r0 += 4) {
        std::fill(f, f + 64, 0.0f);
        Tile4x16(ep.data() + p * k * 16 + r0, gp.data() + q * k * 16, k, f, 16);
        for (int64_t r = 0; r < 4; ++r) {
          const int64_t row = 16 * p + r0 + r;
          if (row >= rows) break;
          for (int64_t c = 0; c < 16 && 16 * q + c < k; ++c) {
            total += (double)f[r * 16 + c] * e[row * k + 16 * q + c];
          }
        }
      }
    }
  }
  return total;
}

AwqScales SearchAwqScales(const float* w, const W4Shape& s, const float* mean_abs,
                          const float* gram, const AwqOptions& options) {
  const int64_t k = s.k;
  // Scoring rows, evenly spaced.
  const int64_t n = std::min<int64_t>(s.rows, std::max<int64_t>(1, options.max_rows));
  std::vector<float> sub(n * k);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t src = r * s.rows / n;
    std::copy(w + src * k, w + (src + 1) * k, sub.begin() + r * k);
  }
  W4Shape ss = s;
  ss.rows = n;
  AwqScales best;
  best.scales.assign(k, 1.0f);
  std::vector<float> scaled(n * k), err(n * k), sc(k);
  for (int step = 0; step < std::max(1, options.grid); ++step) {
    const double alpha = (double)step / std::max(1, options.grid);
    double lo = INFINITY, hi = 0;
    for (int64_t j = 0; j < k; ++j) {
      sc[j] = std::max((float)std::pow(std::max(mean_abs[j], 0.0f), alpha), 1e-4f);
      lo = std::min<double>(lo, sc[j]);
      hi = std::max<double>(hi, sc[j]);
    }
    const float norm = (float)std::sqrt(lo * hi);
    for (int64_t j = 0; j < k; ++j) sc[j] /= norm;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < k; ++j) scaled[r * k + j] = sub[r * k + j] * sc[j];
    }
    const std::vector<float> deq = DequantizeW4(QuantizeW4Rtn(scaled.data(), ss), ss);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < k; ++j) err[r * k + j] = sub[r * k + j] - deq[r * k + j] / sc[j];
    }
    const double e = GramQuadraticError(err.data(), n, k, gram);
    if (step == 0) best.rtn_error = e;
    if (step == 0 || e < best.error) {
      best.error = e;
      best.alpha = alpha;
      best.scales = sc;
    }
  }
  return best;
}

GramAccumulator::GramAccumulator(int64_t k)
    : k_(k), kp_((k + 15) / 16 * 16), upper_(kp_ * kp_, 0.0f) {}

void GramAccumulator::Add(const float* x, int64_t m, int64_t ldx, ThreadPool* pool) {
  constexpr int64_t kChunk = 256;  // rows per pass over the triangle
  const int64_t panels = kp_ / 16;
  const int threads = pool ? pool->size() : 1;
  for (int64_t t0 = 0; t0 < m; t0 += kChunk) {
    const int64_t n = std::min(kChunk, m - t0);
    staged_.resize(panels * n * 16);
    PackPanels(x + t0 * ldx, n, k_, ldx, staged_.data());
    // Column panel q costs ~q + 1 tiles: deal them round-robin.
    auto work = [&](int tid) {
      for (int64_t q = tid; q < panels; q += threads) {
        for (int64_t p = 0; p <= q; ++p) {
          for (int64_t r0 = 0; r0 < 16; r0 += 4) {
            Tile4x16(staged_.data() + p * n * 16 + r0, staged_.data() + q * n * 16, n,
                     upper_.data() + (16 * p + r0) * kp_ + 16 * q, kp_);
          }
        }
      }
    };
    if (pool != nullptr && threads > 1) {
      pool->Run(work);
    } else {
      work(0);
    }
  }
  rows_ += m;
}

std::vector<float> GramAccumulator::MeanGram() const {
  std::vector<float> g(k_ * k_);
  const double inv = rows_ > 0 ? 1.0 / (double)rows_ : 0.0;
  for (int64_t i = 0; i < k_; ++i) {
    for (int64_t j = i; j < k_; ++j) {
      g[i * k_ + j] = g[j * k_ + i] = (float)(upper_[i * kp_ + j] * inv);
    }
  }
  return g;
}

}  // namespace pdq
