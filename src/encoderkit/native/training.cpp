// Kernels of a training step on the CPU: dropout, attention's probabilities (softmax and dropout in one pass, and
// their gradient), a post-norm layer's residual add with dropout and LayerNorm (and its gradient), the total norm
// of the gradients, and AdamW's step of an embedding table whose gradient is a few rows.
//
// Dropout: keep-masks from Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011), a counter-based generator: the mask of element i is a function of the
// call's 64-bit seed and i alone. So the mask is never stored: the backward pass computes it again from the seed, and
// any thread can draw any part of it.
//
// Elements are drawn in groups of 128 from 16 consecutive counters (group g: counters 16g .. 16g + 15, each
// counter (low, high, 0, 0) of its 64-bit number, the key (low, high) of the seed). Element 16k + j of a group takes
// 16 bits of counter j's output: word k / 2, its low half for even k, its high half for odd k. That order puts 16
// neighbouring elements in the 16 lanes of one vector. An element is kept when its 16 bits are at least
// ``dropped`` (round(p * 65536)), and scaled by ``scale``: y = x * scale or x * 0 (NaN and infinity stay NaN, as in
// torch's dropout). modeling/dropout.py's numpy code is the reference these masks are tested against, and
// Random123's known answers test that code.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "vector_math.h"

namespace {

typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));
typedef float f32x16 __attribute__((vector_size(64)));

constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
constexpr int64_t GROUP = 128;             // elements drawn together: 16 counters of 8 x 16 bits
constexpr int64_t PARALLEL_FROM = 1 << 16;  // smaller tensors run on the calling thread

// The 64-bit products of a's even 32-bit lanes with m (vpmuludq; the compiler's own product of 64-bit lanes
// would be vpmullq or three multiplications).
inline u64x8 mul_even(u32x16 a, uint32_t m) {
#if defined(__AVX512F__)
  return (u64x8)_mm512_mul_epu32((__m512i)a, _mm512_set1_epi32(static_cast<int>(m)));
#elif defined(__AVX2__)
  __m256i halves[2];
  std::memcpy(halves, &a, sizeof a);
  const __m256i factor = _mm256_set1_epi32(static_cast<int>(m));
  halves[0] = _mm256_mul_epu32(halves[0], factor);
  halves[1] = _mm256_mul_epu32(halves[1], factor);
  u64x8 out;
  std::memcpy(&out, halves, sizeof out);
  return out;
#else
  return ((u64x8)a & 0xFFFFFFFFull) * m;
#endif
}

// Low and high 32 bits of a * m, lane by lane.
inline void mulhilo(u32x16 a, uint32_t m, u32x16& lo, u32x16& hi) {
  const u64x8 even = mul_even(a, m), odd = mul_even((u32x16)((u64x8)a >> 32), m);
  const u64x8 low32 = (u64x8){} + 0xFFFFFFFFull;
  lo = (u32x16)((even & low32) | (odd << 32));
  hi = (u32x16)((even >> 32) | (odd & ~low32));
}

// Philox4x32-10 of counters first .. first + 15 under the key: four vectors of output words.
inline void draw(uint64_t first, uint32_t key0, uint32_t key1, u32x16 out[4]) {
  u32x16 c0, c1;
  for (int j = 0; j < 16; ++j) {
    c0[j] = static_cast<uint32_t>(first + j);
    c1[j] = static_cast<uint32_t>((first + j) >> 32);
  }
  u32x16 c2 = (u32x16){}, c3 = (u32x16){};
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += W0;
      k1 += W1;
    }
    u32x16 lo0, hi0, lo1, hi1;
    mulhilo(c0, M0, lo0, hi0);
    mulhilo(c2, M1, lo1, hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The 16 bits of elements 16k .. 16k + 15 of a group, one a lane.
inline u32x16 bits(const u32x16 words[4], int k) {
  return k % 2 ? words[k / 2] >> 16 : words[k / 2] & 0xFFFFu;
}

// Calls body(group, begin, end, words) for each group of GROUP elements (the last one shorter), on ``threads``.
template <typename Body>
void for_each_group(int64_t n, uint64_t seed, int threads, Body body) {
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  const int64_t groups = (n + GROUP - 1) / GROUP;
  threads = n >= PARALLEL_FROM ? std::max(1, threads) : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    u32x16 words[4];
    draw(static_cast<uint64_t>(g) * 16, key0, key1, words);
    const int64_t begin = g * GROUP;
    body(begin, std::min(n, begin + GROUP), words);
  }
}

// The keep factors (scale or 0) of elements first .. first + n - 1 of a mask, into out[0 .. n). Draws each group
// once while a thread walks forward through the elements (the cursor keeps the last one).
struct MaskCursor {
  uint32_t key0, key1, dropped;
  float scale;
  int64_t group = -1;
  u32x16 words[4];

  MaskCursor(uint64_t seed, uint32_t dropped_, float scale_)
      : key0(static_cast<uint32_t>(seed)), key1(static_cast<uint32_t>(seed >> 32)), dropped(dropped_), scale(scale_) {}

  void factors(int64_t first, int64_t n, float* out) {
    const f32x16 kept = (f32x16){} + scale;
    for (int64_t e = first; e < first + n;) {
      const int64_t g = e / GROUP;
      if (g != group) {
        draw(static_cast<uint64_t>(g) * 16, key0, key1, words);
        group = g;
      }
      if (e == g * GROUP && first + n - e >= GROUP) {  // a whole group: eight vectors
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const f32x16 f = bits(words, k) >= dropped ? kept : (f32x16){};
          std::memcpy(out + e - first + 16 * k, &f, sizeof f);
        }
        e += GROUP;
        continue;
      }
      const int64_t block = e / 16;
      const u32x16 b = bits(words, static_cast<int>(block % 8));
      const int64_t hi = std::min<int64_t>(16, first + n - block * 16);
      for (int64_t l = e - block * 16; l < hi; ++l) out[block * 16 + l - first] = b[l] >= dropped ? scale : 0.0f;
      e = block * 16 + hi;
    }
  }
};

// The keep factors of rows of ``length`` elements (row r: elements r * length ..), drawn for ``chunk`` rows at once:
// short rows (attention over few keys) would otherwise draw each group of 128 elements once per row.
struct RowMask {
  MaskCursor cursor;
  int64_t length, rows, chunk, first = -1;
  std::vector<float> keep;

  RowMask(uint64_t seed, uint32_t dropped, float keep_scale, int64_t length_, int64_t rows_)
      : cursor(seed, dropped, keep_scale), length(length_), rows(rows_),
        chunk(std::max<int64_t>(1, 2048 / length_)), keep(dropped ? chunk * length_ : 0) {}

  const float* row(int64_t r) {
    if (first < 0 || r < first || r >= first + chunk) {
      first = r;
      cursor.factors(r * length, std::min(chunk, rows - r) * length, keep.data());
    }
    return keep.data() + (r - first) * length;
  }
};

// Rows of attention scores run on ``threads`` threads when the scores are at least this many elements.
constexpr int64_t ROWS_PARALLEL_FROM = 1 << 15;

}  // namespace

extern "C" {

// y = x * scale where element i is kept, x * 0 where it is dropped; fp32, n elements (y may be x).
void ek_dropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t dropped, float scale, int threads) {
  const u32x16 scale_bits = (u32x16){} + [&] { uint32_t b; std::memcpy(&b, &scale, 4); return b; }();
  for_each_group(n, seed, threads, [=](int64_t begin, int64_t end, const u32x16* words) {
    for (int k = 0; k < 8; ++k) {
      const int64_t first = begin + 16 * k;
      if (first >= end) break;
      const f32x16 factor = (f32x16)((u32x16)(bits(words, k) >= dropped) & scale_bits);  // scale or +0
      if (end - first >= 16) {
        f32x16 v;
        std::memcpy(&v, x + first, sizeof v);
        v *= factor;
        std::memcpy(y + first, &v, sizeof v);
      } else {
        for (int64_t e = first; e < end; ++e) y[e] = x[e] * factor[e - first];
      }
    }
  });
}

// The keep-mask alone (1 kept, 0 dropped), for tensors of other dtypes.
void ek_dropout_mask(uint8_t* keep, int64_t n, uint64_t seed, uint32_t dropped, int threads) {
  for_each_group(n, seed, threads, [=](int64_t begin, int64_t end, const u32x16* words) {
    for (int k = 0; k < 8; ++k) {
      const u32x16 kept = bits(words, k) >= dropped;
      for (int64_t e = begin + 16 * k; e < std::min(end, begin + 16 * k + 16); ++e) keep[e] = kept[e - begin - 16 * k] & 1;
    }
  });
}

// Attention's probabilities from raw scores s = q k^T, rows of ``length`` keys: row r's first valid[r / per_valid]
// keys (every key when valid is null) take p = softmax(scale * s), the others 0, written over s; and, where
// ``dropped_out`` is not null, p times the keep factors of the mask of ``seed`` (element r * length + j, as
// ek_dropout draws it) into dropped_out. rows * length fp32 elements each.
void ek_attention_probs(float* s, float* dropped_out, int64_t rows, int64_t length, const int64_t* valid,
                        int64_t per_valid, float scale, uint64_t seed, uint32_t dropped, float keep_scale,
                        int threads) {
  threads = rows * length >= ROWS_PARALLEL_FROM ? std::max(1, threads) : 1;
  const int64_t padded = (length + VW - 1) / VW * VW;
#pragma omp parallel num_threads(threads)
  {
    RowMask mask(seed, dropped_out ? dropped : 0, keep_scale, length, rows);
    std::vector<float> buffer(padded);
    float* x = buffer.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * length;
      const int64_t n = valid ? std::min<int64_t>(length, valid[r / per_valid]) : length;
      for (int64_t j = 0; j < n; ++j) x[j] = row[j] * scale;
      for (int64_t j = n; j < padded; ++j) x[j] = -std::numeric_limits<float>::infinity();
      vf top = loadu(x);
      for (int64_t j = VW; j < padded; j += VW) top = loadu(x + j) > top ? loadu(x + j) : top;
      const float m = horizontal_max(top);
      vf lanes = splat(0.0f);
      for (int64_t j = 0; j < padded; j += VW) {
        const vf v = loadu(x + j);
        const vf e = v == -std::numeric_limits<float>::infinity() ? splat(0.0f) : vexp(v - m);
        storeu(x + j, e);
        lanes += e;
      }
      const float inverse = 1.0f / horizontal_sum(lanes);
      for (int64_t j = 0; j < padded; j += VW) storeu(x + j, loadu(x + j) * inverse);
      std::memcpy(row, x, length * sizeof(float));
      if (dropped_out) {
        const float* f = mask.row(r);
        float* out = dropped_out + r * length;
        for (int64_t j = 0; j < length; ++j) out[j] = x[j] * f[j];
      }
    }
  }
}

// The gradient of ek_attention_probs: g holds the gradient of its output (of dropped_out where there was a mask, of
// p otherwise) and is overwritten with the gradient of s: scale * p * (g' - sum_j g'_j p_j), g' = g times the keep
// factors of the mask of ``seed`` (dropped = 0: no mask).
void ek_attention_probs_backward(const float* p, float* g, int64_t rows, int64_t length, float scale, uint64_t seed,
                                 uint32_t dropped, float keep_scale, int threads) {
  threads = rows * length >= ROWS_PARALLEL_FROM ? std::max(1, threads) : 1;
  const int64_t padded = (length + VW - 1) / VW * VW;
#pragma omp parallel num_threads(threads)
  {
    RowMask mask(seed, dropped, keep_scale, length, rows);
    std::vector<float> buffer(2 * padded, 0.0f);
    float *gx = buffer.data(), *px = buffer.data() + padded;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* prob = p + r * length;
      float* grad = g + r * length;
      if (dropped) {
        const float* f = mask.row(r);
        for (int64_t j = 0; j < length; ++j) gx[j] = grad[j] * f[j];
      } else {
        std::memcpy(gx, grad, length * sizeof(float));
      }
      std::memcpy(px, prob, length * sizeof(float));  // the padding lanes stay 0
      vf lanes = splat(0.0f);
      for (int64_t j = 0; j < padded; j += VW) lanes += loadu(gx + j) * loadu(px + j);
      const float dot = horizontal_sum(lanes);
      for (int64_t j = 0; j < padded; j += VW) storeu(gx + j, scale * loadu(px + j) * (loadu(gx + j) - dot));
      std::memcpy(grad, gx, length * sizeof(float));
    }
  }
}

// A post-norm layer's out = LayerNorm(residual + dropout(y)): rows x width (width a multiple of 16), the dropout mask
// of ``seed`` on y's elements (dropped = 0: none), LayerNorm's gamma and beta (beta may be null), eps. Also writes what
// the backward pass reads: each row normalised (xhat, rows x width) and its 1 / standard deviation (rstd, rows).
void ek_add_dropout_norm(const float* residual, const float* y, const float* gamma, const float* beta, float* out,
                         float* xhat, float* rstd, int64_t rows, int64_t width, float eps, uint64_t seed,
                         uint32_t dropped, float keep_scale, int threads) {
  threads = rows * width >= ROWS_PARALLEL_FROM ? std::max(1, threads) : 1;
#pragma omp parallel num_threads(threads)
  {
    MaskCursor mask(seed, dropped, keep_scale);
    std::vector<float> keep(width, 1.0f);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *res = residual + r * width, *in = y + r * width;
      float *normed = xhat + r * width, *o = out + r * width;
      if (dropped) mask.factors(r * width, width, keep.data());
      vf lanes = splat(0.0f);
      for (int64_t j = 0; j < width; j += VW) {
        const vf z = loadu(res + j) + loadu(in + j) * loadu(keep.data() + j);
        storeu(normed + j, z);
        lanes += z;
      }
      const float mean = horizontal_sum(lanes) / width;
      lanes = splat(0.0f);
      for (int64_t j = 0; j < width; j += VW) {
        const vf centred = loadu(normed + j) - mean;
        lanes += centred * centred;
      }
      const float inverse = 1.0f / std::sqrt(horizontal_sum(lanes) / width + eps);
      rstd[r] = inverse;
      for (int64_t j = 0; j < width; j += VW) {
        const vf x = (loadu(normed + j) - mean) * inverse;
        storeu(normed + j, x);
        storeu(o + j, x * loadu(gamma + j) + (beta ? loadu(beta + j) : splat(0.0f)));
      }
    }
  }
}

// The gradient of ek_add_dropout_norm from grad (rows x width): into grad_residual that of residual + dropout(y), into
// grad_y that of y (the same times the mask's keep factors), and gamma's and beta's (width each; beta's may be null)
// summed over the rows.
void ek_add_dropout_norm_backward(const float* grad, const float* xhat, const float* rstd, const float* gamma,
                                  float* grad_residual, float* grad_y, float* grad_gamma, float* grad_beta,
                                  int64_t rows, int64_t width, uint64_t seed, uint32_t dropped, float keep_scale,
                                  int threads) {
  threads = rows * width >= ROWS_PARALLEL_FROM ? std::max(1, threads) : 1;
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * width, 0.0f);  // each thread's gamma, beta sums
#pragma omp parallel num_threads(threads)
  {
    MaskCursor mask(seed, dropped, keep_scale);
    std::vector<float> keep(width, 1.0f);
    float* sums = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * width;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *g = grad + r * width, *normed = xhat + r * width;
      vf lanes_g = splat(0.0f), lanes_gx = splat(0.0f);
      for (int64_t j = 0; j < width; j += VW) {
        const vf gj = loadu(g + j), x = loadu(normed + j), scaled = gj * loadu(gamma + j);
        lanes_g += scaled;
        lanes_gx += scaled * x;
        storeu(sums + j, loadu(sums + j) + gj * x);
        storeu(sums + width + j, loadu(sums + width + j) + gj);
      }
      const float a = horizontal_sum(lanes_g) / width, b = horizontal_sum(lanes_gx) / width;
      const float inverse = rstd[r];
      float *gr = grad_residual + r * width, *gy = grad_y + r * width;
      if (dropped) mask.factors(r * width, width, keep.data());
      for (int64_t j = 0; j < width; j += VW) {
        const vf d = inverse * (loadu(g + j) * loadu(gamma + j) - a - loadu(normed + j) * b);
        storeu(gr + j, d);
        storeu(gy + j, d * loadu(keep.data() + j));
      }
    }
  }
  for (int64_t j = 0; j < width; ++j) {
    float gamma_sum = 0.0f, beta_sum = 0.0f;
    for (int t = 0; t < threads; ++t) {
      gamma_sum += partial[static_cast<size_t>(t) * 2 * width + j];
      beta_sum += partial[static_cast<size_t>(t) * 2 * width + width + j];
    }
    grad_gamma[j] = gamma_sum;
    if (grad_beta) grad_beta[j] = beta_sum;
  }
}

// The sum of the squares of ``count`` fp32 buffers (pointers and lengths), in double: the square of the gradients'
// total 2-norm. The buffers are cut into pieces of at most PIECE elements shared by ``threads`` threads; each piece
// sums in 16 float lanes, added into the thread's double.
double ek_sum_squares(const float* const* buffers, const int64_t* sizes, int count, int threads) {
  constexpr int64_t PIECE = 1 << 14;
  int64_t pieces = 0;
  for (int b = 0; b < count; ++b) pieces += (sizes[b] + PIECE - 1) / PIECE;
  std::vector<std::pair<int, int64_t>> where;  // (buffer, first element) of each piece
  where.reserve(pieces);
  for (int b = 0; b < count; ++b)
    for (int64_t first = 0; first < sizes[b]; first += PIECE) where.emplace_back(b, first);
  double total = 0.0;
  threads = pieces > 1 ? std::max(1, threads) : 1;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
  for (int64_t p = 0; p < pieces; ++p) {
    const float* x = buffers[where[p].first] + where[p].second;
    const int64_t n = std::min(PIECE, sizes[where[p].first] - where[p].second);
    f32x16 lanes = (f32x16){};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      f32x16 v;
      std::memcpy(&v, x + i, sizeof v);
      lanes += v * v;
    }
    double sum = 0.0;
    for (int l = 0; l < 16; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
    total += sum;
  }
  return total;
}

// One AdamW step (decoupled weight decay: Loshchilov and Hutter, "Decoupled weight decay regularization", ICLR 2019;
// the arithmetic of torch's AdamW) of a table of ``rows`` rows of ``width`` fp32 elements whose gradient is zero
// outside the rows marked in ``touched``. With g = grad * inv_scale:
//   p = p * decay (1 - lr * weight decay);  m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g;
//   p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)   (step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t))
// A touched row takes it in full. An ``active`` row (one touched at some earlier step) takes it with g = 0, its
// gradient not read. Any other row has m = v = 0, so that m / (sqrt(v) / bc2_sqrt + eps) is 0 and m and v stay 0:
// its step is p = p * decay alone, with no read of m, v or the gradient (the same numbers as the full step).
void ek_adamw_rows(float* p, const float* g, float* m, float* v, int64_t rows, int64_t width, const uint8_t* active,
                   const uint8_t* touched, float decay, float beta1, float beta2, float step_size, float bc2_sqrt,
                   float eps, float inv_scale, int threads) {
  threads = rows * width >= PARALLEL_FROM ? std::max(1, threads) : 1;
  const float keep1 = 1.0f - beta1, keep2 = 1.0f - beta2;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = p + r * width;
    if (!touched[r] && !active[r]) {
      if (decay != 1.0f) {
        int64_t j = 0;
        for (; j + VW <= width; j += VW) storeu(pr + j, loadu(pr + j) * decay);
        for (; j < width; ++j) pr[j] *= decay;
      }
      continue;
    }
    float* mr = m + r * width;
    float* vr = v + r * width;
    const float* gr = touched[r] ? g + r * width : nullptr;
    int64_t j = 0;
    for (; j + VW <= width; j += VW) {
      const vf grad = gr ? loadu(gr + j) * inv_scale : splat(0.0f);
      const vf mean = loadu(mr + j) * beta1 + grad * keep1;
      const vf square = loadu(vr + j) * beta2 + grad * grad * keep2;
      const vf root = vsqrt(square);
      storeu(mr + j, mean);
      storeu(vr + j, square);
      storeu(pr + j, loadu(pr + j) * decay - step_size * mean / (root / bc2_sqrt + eps));
    }
    for (; j < width; ++j) {
      const float grad = gr ? gr[j] * inv_scale : 0.0f;
      mr[j] = mr[j] * beta1 + grad * keep1;
      vr[j] = vr[j] * beta2 + grad * grad * keep2;
      pr[j] = pr[j] * decay - step_size * mr[j] / (std::sqrt(vr[j]) / bc2_sqrt + eps);
    }
  }
}

}  // extern "C"
