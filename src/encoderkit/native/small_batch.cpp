// encoderkit's native kernel for the layers of a post-norm encoder (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA):
// one short text, a few (the serving case), batches of short texts; and its attention alone (ek_attention), the
// PyTorch layers' inference attention on the batches it does not take. See encoderkit/native/__init__.py for why
// they exist, when they run, and how the library is built (g++ at first use, for the CPU it runs on).
//
// No torch headers and no BLAS: the whole layer stack runs in one call, so no Python, no dispatcher and no
// allocation sits between two ops. With few rows a matrix product is bound by reading its weights, so each
// weight is packed once into panels of VW output columns, k-major, read front to back once per call; the rows
// are held in registers (R rows x VW columns of accumulators), and the bias, the activation or the residual
// add are applied to the accumulators before they are stored. Panels are split between the threads; many rows are
// taken in chunks, and a short text's few blocks of rows take each pair of panels slice by slice of k (product_part).
//
// Numbers: fp32 throughout, products summed in k order with fused multiply-adds. exp is Cephes' polynomial
// (about 2 ulp), erf comes from erfc's Chebyshev fit (Numerical Recipes' erfcc, relative error under 1.2e-7).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>
#include <immintrin.h>
#include <omp.h>

#include "vector_math.h"

// int8 products: uint8 activations times int8 weights, four products summed into each 32-bit lane. EK_INT8 says how
// (ek_int8() tells Python):
//   1: exactly, by vpdpbusd (AVX512-VNNI, or AVX-VNNI on 256-bit vectors), for any weight codes;
//   2: by vpmaddubsw, which adds pairs of products into 16 bits with saturation, then vpmaddwd by ones, which adds
//      the pairs into 32 bits (AVX2, AVX512BW without VNNI). The same sums as vpdpbusd wherever a pair cannot
//      saturate: weight codes within -63..63 (2 x 255 x 63 = 32130 < 32767), which encoderkit.modeling.inference
//      gives int8 weights on exactly these CPUs (PyTorch's int8 kernels add pairs in 16 bits there too); Python
//      runs no layer with larger codes here.
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define EK_INT8 1
static inline vi dpbusd(vi acc, vi a, vi b) { return (vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)a, (__m512i)b); }
#elif !defined(__AVX512F__) && defined(__AVXVNNI__)
#define EK_INT8 1
static inline vi dpbusd(vi acc, vi a, vi b) {
  return (vi)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)a, (__m256i)b);
}
#elif defined(__AVX512F__) && defined(__AVX512BW__)
#define EK_INT8 2
static inline vi dpbusd(vi acc, vi a, vi b) {
  const __m512i pairs = _mm512_maddubs_epi16((__m512i)a, (__m512i)b);
  return acc + (vi)_mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}
#elif !defined(__AVX512F__) && defined(__AVX2__)
#define EK_INT8 2
static inline vi dpbusd(vi acc, vi a, vi b) {
  const __m256i pairs = _mm256_maddubs_epi16((__m256i)a, (__m256i)b);
  return acc + (vi)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
#else
#define EK_INT8 0
#endif

enum Activation { GELU = 0, RELU = 1, GELU_TANH = 2 };

static inline vf activate(vf v, int activation) {
  switch (activation) {
    case GELU: return 0.5f * v * (1.0f + verf(v * 0.70710678118654752f));
    case RELU: return v < 0.0f ? splat(0.0f) : v;
    default: return 0.5f * v * (1.0f + vtanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  }
}

namespace {
// [begin, end) of part ``part`` of ``parts`` equal shares of n.
inline void split(int n, int part, int parts, int* begin, int* end) {
  *begin = (int)((int64_t)n * part / parts);
  *end = (int)((int64_t)n * (part + 1) / parts);
}

// ---------------------------------------------------------------------------------------------------------------
// Matrix products
// ---------------------------------------------------------------------------------------------------------------
enum Epilogue { BIAS = 0, BIAS_ACTIVATION = 1, BIAS_RESIDUAL = 2 };

// One linear layer as the caller lays it out: fp32 panels, or int8 ones where ``scale`` is set.
struct Linear {
  const void* weight;     // fp32: panels of (K, VW) floats; int8: panels of (K4, VW, 4) codes (K4: K rounded up to 4)
  const float* bias;      // (panels * VW,), zero past N
  const float* scale;     // int8: each output channel's weight scale (panels * VW,); null for fp32
  const int32_t* sums;    // int8: each output channel's sum of weight codes (panels * VW,)
  const float* inverse;   // int8: 1 / the SmoothQuant factor of each input channel (K,), or null
};

struct Product {
  const float* x;         // (M, K) rows
  const float* packed;    // fp32 panels, or null
  const int8_t* qpacked;  // int8 panels, or null
  const float* bias;
  const float* residual;  // (M, N) or null
  float* y;               // (M, N)
  int M, N, K, epilogue, activation;
  // int8: the rows quantised (``quantize``) with each row's scale and zero point, and the weights' scales and code
  // sums
  const uint8_t* codes;   // (M, K4)
  const float* wscale;
  const int32_t* sums;
  const float* xscale;    // (M,)
  const int32_t* zero;    // (M,)
  int K4;
};

// The activation or the residual applied to a row's VW columns from ``col``, and the store.
inline void finish(const Product& g, int row, int col, vf v) {
  const int width = std::min(VW, g.N - col);
  float* out = g.y + (size_t)row * g.N + col;
  if (g.epilogue == BIAS_ACTIVATION) v = activate(v, g.activation);
  if (width == VW) {
    if (g.epilogue == BIAS_RESIDUAL) v += loadu(g.residual + (size_t)row * g.N + col);
    storeu(out, v);
  } else {
    float lanes[VW];
    std::memcpy(lanes, &v, sizeof lanes);
    for (int j = 0; j < width; j++)
      out[j] = lanes[j] + (g.epilogue == BIAS_RESIDUAL ? g.residual[(size_t)row * g.N + col + j] : 0.0f);
  }
}

// R rows times P panels (adjacent), all in registers. Two panels at once keep two weight streams in flight (faster
// than one, and than three or four panels of fewer rows, on the Cascade Lake Xeon). Each weight stream is prefetched
// AHEAD bytes per lane ahead (2 KB with 16 lanes); a non-temporal prefetch was slower, since the weights that stay in
// the last-level cache between calls are worth keeping there. bench/native_phases.py measures the products.
constexpr int AHEAD = 128;

// The sums of R rows times P panels over k0..k1, in k order, added to ``acc``.
template <int R, int P>
__attribute__((always_inline)) inline void sum_k(const float* w, const float* x, int K, int k0, int k1,
                                                 vf (&acc)[P][R]) {
  for (int k = k0; k < k1; k++) {
    vf wk[P];
    for (int q = 0; q < P; q++) {
      wk[q] = loadu(w + ((size_t)q * K + k) * VW);
      __builtin_prefetch(w + ((size_t)q * K + k + AHEAD / 4) * VW);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; r++) {
      const float xr = x[(size_t)r * K + k];
      for (int q = 0; q < P; q++) acc[q][r] = fused(xr, wk[q], acc[q][r]);
    }
  }
}

// A block's accumulators: the bias where k0 is 0, else the sums ``carried`` from the slices before.
template <int R, int P>
__attribute__((always_inline)) inline void start_sums(const float* bias, int k0, const vf* carried,
                                                      vf (&acc)[P][R]) {
  for (int q = 0; q < P; q++) {
    const vf b = loadu(bias + (size_t)q * VW);
    for (int r = 0; r < R; r++) acc[q][r] = k0 == 0 ? b : carried[q * R + r];
  }
}

// The sums of a block over k0..k1 (all of k: k0 = 0, k1 = K), stored in ``out`` (P x R vectors), which holds the
// sums of the slices before where k0 > 0. With 16 vector registers (AVX2) the k loop is a function of its own:
// inlined beside the epilogue after it (bias, activation, residual), GCC keeps an accumulator in memory, a store and
// a load on every k, even where the registers would hold them all (the 256-bit build's assembly).
#if VW == 8
#define EK_K_LOOP __attribute__((noinline))
#else
#define EK_K_LOOP inline
#endif
template <int R, int P>
EK_K_LOOP void accumulate(const Product& g, int m0, int panel, int k0, int k1, vf* out) {
  vf acc[P][R];
  start_sums<R, P>(g.bias + (size_t)panel * VW, k0, out, acc);
  sum_k<R, P>(g.packed + (size_t)panel * g.K * VW, g.x + (size_t)m0 * g.K, g.K, k0, k1, acc);
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) out[q * R + r] = acc[q][r];
}

// A block's epilogue, once all of k is summed into ``acc`` (P x R vectors).
template <int R, int P>
inline void block_finish(const Product& g, int m0, int panel, const vf* acc) {
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) finish(g, m0 + r, (panel + q) * VW, acc[q * R + r]);
}

#if VW == 8
template <int R, int P>
inline void block(const Product& g, int m0, int panel) {
  vf acc[P * R];
  accumulate<R, P>(g, m0, panel, 0, g.K, acc);
  block_finish<R, P>(g, m0, panel, acc);
}
#else  // 32 registers (AVX-512): one function, no accumulator in memory below its largest blocks
template <int R, int P>
inline void block(const Product& g, int m0, int panel) {
  vf acc[P][R];
  start_sums<R, P>(g.bias + (size_t)panel * VW, 0, nullptr, acc);
  sum_k<R, P>(g.packed + (size_t)panel * g.K * VW, g.x + (size_t)m0 * g.K, g.K, 0, g.K, acc);
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) finish(g, m0 + r, (panel + q) * VW, acc[q][r]);
}
#endif  // VW

#if EK_INT8
// The int8 block: four k at a time, the row's four codes broadcast against each column's four weight codes, summed
// exactly in 32 bits; then y = (sum - row zero point * column code sum) * row scale * column scale + bias, in fp32.
template <int R>
inline void qfinish(const Product& g, int m0, int col, const vi* acc) {
  const vf scale = loadu(g.wscale + col), bias = loadu(g.bias + col);
  const vi sums = *(const viu*)(g.sums + col);
  for (int r = 0; r < R; r++)
    finish(g, m0 + r, col, __builtin_convertvector(acc[r] - sums * g.zero[m0 + r], vf) * (scale * g.xscale[m0 + r]) +
                               bias);
}

#if VW == 8
template <int R, int P>
__attribute__((noinline)) void qaccumulate(const int8_t* w, const uint8_t* x, int K4, vi (*out)[R]) {
  vi acc[P][R];
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) acc[q][r] = vi{};
  for (int k = 0; k < K4; k += 4) {
    vi wk[P];
    for (int q = 0; q < P; q++) {
      wk[q] = *(const viu*)(w + ((size_t)q * K4 + k) * VW);
      __builtin_prefetch(w + ((size_t)q * K4 + k + AHEAD) * VW);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; r++) {
      int32_t four;
      std::memcpy(&four, x + (size_t)r * K4 + k, 4);
      const vi xr = vi{} + four;
      for (int q = 0; q < P; q++) acc[q][r] = dpbusd(acc[q][r], xr, wk[q]);
    }
  }
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) out[q][r] = acc[q][r];
}

template <int R, int P>
inline void qblock(const Product& g, int m0, int panel) {
  vi acc[P][R];
  qaccumulate<R, P>(g.qpacked + (size_t)panel * g.K4 * VW, g.codes + (size_t)m0 * g.K4, g.K4, acc);
  for (int q = 0; q < P; q++) qfinish<R>(g, m0, (panel + q) * VW, acc[q]);
}
#else
template <int R, int P>
inline void qblock(const Product& g, int m0, int panel) {
  const int8_t* w = g.qpacked + (size_t)panel * g.K4 * VW;
  const uint8_t* x = g.codes + (size_t)m0 * g.K4;
  const int K4 = g.K4;
  vi acc[P][R];
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++) acc[q][r] = vi{};
  for (int k = 0; k < K4; k += 4) {
    vi wk[P];
    for (int q = 0; q < P; q++) {
      wk[q] = *(const viu*)(w + ((size_t)q * K4 + k) * VW);
      __builtin_prefetch(w + ((size_t)q * K4 + k + AHEAD) * VW);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; r++) {
      int32_t four;
      std::memcpy(&four, x + (size_t)r * K4 + k, 4);
      const vi xr = vi{} + four;
      for (int q = 0; q < P; q++) acc[q][r] = dpbusd(acc[q][r], xr, wk[q]);
    }
  }
  for (int q = 0; q < P; q++) qfinish<R>(g, m0, (panel + q) * VW, acc[q]);
}
#endif  // VW
#endif

typedef void (*BlockFn)(const Product&, int, int);
template <int P, int... I>
constexpr std::array<BlockFn, sizeof...(I)> blocks_of(std::integer_sequence<int, I...>) {
  return {block<I + 1, P>...};
}
#if EK_INT8
template <int P, int... I>
constexpr std::array<BlockFn, sizeof...(I)> qblocks_of(std::integer_sequence<int, I...>) {
  return {qblock<I + 1, P>...};
}
#endif
// Rows per block: what the registers hold (32 vector registers with AVX-512, 16 with AVX2), a few kept for the
// weights and the broadcast row value; with AVX2 the most that hold with no accumulator in memory, for the fp32
// products and the int8 pair sums (which take two registers more). EK_ROWS1 and EK_ROWS2 (compiler flags, through
// ENCODERKIT_NATIVE_FLAGS) set others, for measuring.
#ifndef EK_ROWS1
#ifdef __AVX512F__
#define EK_ROWS1 24
#define EK_ROWS2 14
#else
#define EK_ROWS1 11
#define EK_ROWS2 6
#endif
#endif
constexpr int ROWS1 = EK_ROWS1, ROWS2 = EK_ROWS2;
const std::array<BlockFn, ROWS1> ONE_PANEL = blocks_of<1>(std::make_integer_sequence<int, ROWS1>{});
const std::array<BlockFn, ROWS2> TWO_PANELS = blocks_of<2>(std::make_integer_sequence<int, ROWS2>{});
// int8 blocks: two panels of ROWS2 rows as well (as fast as more panels of fewer rows with VNNI on the Cascade Lake
// Xeon).
#if EK_INT8
const std::array<BlockFn, ROWS1> ONE_PANEL_INT8 = qblocks_of<1>(std::make_integer_sequence<int, ROWS1>{});
const std::array<BlockFn, ROWS2> TWO_PANELS_INT8 = qblocks_of<2>(std::make_integer_sequence<int, ROWS2>{});
#else  // never called: without int8 instructions the caller runs no int8 layer here (ek_int8)
const std::array<BlockFn, ROWS1> ONE_PANEL_INT8 = ONE_PANEL;
const std::array<BlockFn, ROWS2> TWO_PANELS_INT8 = TWO_PANELS;
#endif

// Rows are taken in chunks whose inputs take about EK_CHUNK_BYTES (0: all rows in one chunk), each chunk passing
// over every panel: the chunk's rows stay in the core's own cache while the weights stream past them once a chunk.
// Without chunks each pair of panels streams all the rows, which fall out of that cache once a batch has a few
// hundred tokens.
#ifndef EK_CHUNK_BYTES
#define EK_CHUNK_BYTES (192 * 1024)
#endif

// Blocks of rows summed slice by slice of k (EK_KSLICE k a slice, 0: off): see ``sliced_pair``. On 256-bit builds
// only: a 512-bit build's blocks hold 14 rows, so a short text has at most a block or two to overlap, and each
// slice stores and reloads up to 28 accumulators; measured there (Zen 5), slices were slower.
#ifndef EK_KSLICE
#if VW == 8
#define EK_KSLICE 32
#else
#define EK_KSLICE 0
#endif
#endif
typedef void (*SliceFn)(const Product&, int, int, int, int, vf*);
typedef void (*FinishFn)(const Product&, int, int, const vf*);
template <int... I>
constexpr std::array<SliceFn, sizeof...(I)> slices_of(std::integer_sequence<int, I...>) {
  return {accumulate<I + 1, 2>...};
}
template <int... I>
constexpr std::array<FinishFn, sizeof...(I)> finishes_of(std::integer_sequence<int, I...>) {
  return {block_finish<I + 1, 2>...};
}
const std::array<SliceFn, ROWS2> TWO_PANEL_SLICES = slices_of(std::make_integer_sequence<int, ROWS2>{});
const std::array<FinishFn, ROWS2> TWO_PANEL_FINISHES = finishes_of(std::make_integer_sequence<int, ROWS2>{});
// Products of at most this many blocks of rows are sliced: a batch of many rows keeps each panel in the core's cache
// for its many blocks anyway (and a chunk of rows of a wide product, a few blocks, is no short text).
constexpr int SLICED_BLOCKS = 8;

// A pair of panels times a few blocks of rows (a short text's), slice by slice of k. Block by block, the first
// block reads the panels from memory and the others from the core's cache after it, so their sums wait for the
// whole panels to stream in. Slice by slice, the first block reads a slice from memory and the others run while the
// next slice streams in. Each output is the same sum in the same order.
void sliced_pair(const Product& g, int c0, int c1, int p) {
  vf acc[SLICED_BLOCKS][2 * ROWS2];
  for (int k0 = 0; k0 < g.K; k0 += EK_KSLICE) {
    const int k1 = std::min(g.K, k0 + EK_KSLICE);
    for (int m0 = c0, b = 0; m0 < c1; m0 += ROWS2, b++)
      TWO_PANEL_SLICES[std::min(ROWS2, c1 - m0) - 1](g, m0, p, k0, k1, acc[b]);
  }
  for (int m0 = c0, b = 0; m0 < c1; m0 += ROWS2, b++)
    TWO_PANEL_FINISHES[std::min(ROWS2, c1 - m0) - 1](g, m0, p, acc[b]);
}

void product_part(const Product& g, int part, int parts) {
  const auto& two = g.qpacked ? TWO_PANELS_INT8 : TWO_PANELS;
  const auto& one = g.qpacked ? ONE_PANEL_INT8 : ONE_PANEL;
  int panels = (g.N + VW - 1) / VW, pairs = panels / 2, begin, end;
  split(pairs, part, parts, &begin, &end);  // pairs of panels; the odd one last goes to the last part
  const size_t row_bytes = g.qpacked ? (size_t)g.K4 : (size_t)g.K * sizeof(float);
  const int chunk = EK_CHUNK_BYTES > 0 ? std::max(ROWS2, (int)(EK_CHUNK_BYTES / row_bytes) / ROWS2 * ROWS2) : g.M;
  for (int c0 = 0; c0 < g.M; c0 += chunk) {
    const int c1 = std::min(g.M, c0 + chunk);
    if (EK_KSLICE > 0 && !g.qpacked && c1 - c0 > ROWS2 && g.M <= SLICED_BLOCKS * ROWS2) {
      for (int p = 2 * begin; p < 2 * end; p += 2) sliced_pair(g, c0, c1, p);
    } else {
      for (int p = 2 * begin; p < 2 * end; p += 2)
        for (int m0 = c0; m0 < c1; m0 += ROWS2) two[std::min(ROWS2, c1 - m0) - 1](g, m0, p);
    }
    if (panels % 2 && part == parts - 1)
      for (int m0 = c0; m0 < c1; m0 += ROWS1) one[std::min(ROWS1, c1 - m0) - 1](g, m0, panels - 1);
  }
}

static inline vi round_to_int(vf v) {  // to nearest, ties to even (the rounding mode's default), as torch.round
#ifdef __AVX512F__
  return (vi)_mm512_cvtps_epi32((__m512)v);
#else
  return (vi)_mm256_cvtps_epi32((__m256)v);
#endif
}

// A vector of codes, clamped to 0..255, stored as VW bytes.
static inline void store_codes(uint8_t* out, vi c) {
#ifdef __AVX512F__
  _mm_storeu_si128((__m128i*)out, _mm512_cvtusepi32_epi8(_mm512_max_epi32((__m512i)c, _mm512_setzero_si512())));
#else
  const __m256i words = _mm256_packus_epi32((__m256i)c, (__m256i)c);  // per 128-bit lane: c0..c3 twice, 16 bits
  const __m256i bytes = _mm256_packus_epi16(words, words);            // per lane: c0..c3 four times, 8 bits
  _mm_storel_epi64((__m128i*)out, _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(
      0, 4, 0, 0, 0, 0, 0, 0))));
#endif
}

// Rows (M, K), times ``inverse`` per channel where given, -> uint8 codes (M, K4) (zero past K), each row with its
// own scale and zero point from its minimum and maximum (each widened to include 0): the scheme of
// encoderkit.modeling.inference's int8 products (``_uint8_rows``), whose arithmetic this repeats step for step. Per
// row, not per matrix: a text's codes then do not depend on the other texts of its batch, and one token's outlier
// activations coarsen only its own row.
void quantize(const float* x, int M, int K, const float* inverse, uint8_t* codes, int K4, float* xscale,
              int32_t* zero) {
  for (int r = 0; r < M; r++) {
    const float* row = x + (size_t)r * K;
    vf low = splat(0.0f), high = splat(0.0f);
    float lo = 0.0f, hi = 0.0f;
    int k = 0;
    for (; k + VW <= K; k += VW) {
      vf v = loadu(row + k);
      if (inverse) v *= loadu(inverse + k);
      low = v < low ? v : low;
      high = v > high ? v : high;
    }
    for (; k < K; k++) {
      const float v = inverse ? row[k] * inverse[k] : row[k];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    for (int j = 0; j < VW; j++) lo = std::min(lo, low[j]), hi = std::max(hi, high[j]);
    const double scale = std::max((double)hi - (double)lo, 1e-12) / 255;
    const int zp = (int)std::min(std::max(std::nearbyint(-(double)lo / scale), 0.0), 255.0);
    const float step = (float)(1.0 / scale);
    uint8_t* out = codes + (size_t)r * K4;
    k = 0;
    for (; k + VW <= K; k += VW) {
      vf v = loadu(row + k);
      if (inverse) v *= loadu(inverse + k);
      store_codes(out + k, round_to_int(v * step) + zp);
    }
    for (; k < K; k++) {
      const float v = (inverse ? row[k] * inverse[k] : row[k]) * step;
      out[k] = (uint8_t)std::min(std::max((int)std::nearbyint(v) + zp, 0), 255);
    }
    for (; k < K4; k++) out[k] = 0;
    xscale[r] = (float)scale;
    zero[r] = zp;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Attention: each (sequence, head) on its own, softmax(q k^T * scale) v
// ---------------------------------------------------------------------------------------------------------------
struct Attention {
  const float* qkv;  // (T, 3H): q | k | v, heads side by side in each
  float* out;        // (T, H)
  const int64_t* starts;  // (sequences + 1,)
  int sequences, heads, dim, hidden, longest;
  float scale;
  // An additive bias by relative position (MPNet's), or null: query i and key j of head h get
  // bias[h * bias_stride + bias_center + i - j]; bias_center >= longest - 1, and each head's row holds at least
  // bias_center + longest + VW - 1 values (the lanes past the last query read, unused, up to VW - 1 more).
  const float* bias;
  int bias_stride, bias_center;
};

// Per (sequence, head), with the queries across the vector lanes: the scores are held transposed, a row per key and
// a lane per query (ST[j][i]), so the softmax over each query's keys runs down the rows, VW queries at once, with no
// sum or maximum across lanes. The queries are transposed first (dim, queries), scaled. Both products run in blocks
// held in registers, as the linear layers' do: KR keys x QC vectors of queries for the scores, PR queries x DC
// vectors of dimensions for the output, enough independent multiply-adds in flight to hide their latency and one
// load serving several of them. A block past the last key or query repeats it (its results are not stored).
// EK_ATT_* (compiler flags) set other block sizes, for measuring. The blocks' ``acc += a * b`` compile to fused
// multiply-adds (GCC contracts them; the output's edge, where it did not, calls std::fma, and tests/native checks that
// each output dimension is the same sum in a block or at the edge). Written with ``fused()`` they changed which
// functions GCC inlined across the file (vexp into every caller), for no gain.
#if VW == 16
constexpr int ATT_DEFAULTS[4] = {6, 3, 8, 2};
#else
constexpr int ATT_DEFAULTS[4] = {6, 2, 6, 2};
#endif
#ifndef EK_ATT_KR
#define EK_ATT_KR ATT_DEFAULTS[0]
#endif
#ifndef EK_ATT_QC
#define EK_ATT_QC ATT_DEFAULTS[1]
#endif
#ifndef EK_ATT_PR
#define EK_ATT_PR ATT_DEFAULTS[2]
#endif
#ifndef EK_ATT_DC
#define EK_ATT_DC ATT_DEFAULTS[3]
#endif
constexpr int KR = EK_ATT_KR, QC = EK_ATT_QC, PR = EK_ATT_PR, DC = EK_ATT_DC;

// ST[r][i + c VW ...] = sum_d k_r[d] qt[d][i + c VW ...], for keys r < count (rows[r] for r < R)
template <int R, int C>
static inline void scores_block(const float* const* rows, const float* qt, int columns, int i, int dim, float* ST,
                                int count) {
  vf acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = splat(0.0f);
  for (int d = 0; d < dim; d++) {
    const float* q = qt + (size_t)d * columns + i;
    vf qv[C];
    for (int c = 0; c < C; c++) qv[c] = loadu(q + c * VW);
    for (int r = 0; r < R; r++) {
      const float kr = rows[r][d];  // a scalar times a vector: a broadcast load (splat adds 0, a step more)
      for (int c = 0; c < C; c++) acc[r][c] += kr * qv[c];
    }
  }
  for (int r = 0; r < R; r++)  // a whole block's stores unrolled: the sums stay in registers
    if (r < count)
      for (int c = 0; c < C; c++) storeu(ST + (size_t)r * columns + i + c * VW, acc[r][c]);
}

// out_r[d + c VW ...] = inverse[r] sum_j PT[j][r] v_j[d + c VW ...], for queries r < count
template <int R, int C>
static inline void values_block(const float* PT, int columns, const float* inverse, const float* v, int stride, int n,
                                int d, float* out, int hidden, int count) {
  vf acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = splat(0.0f);
  for (int j = 0; j < n; j++) {
    const float* vj = v + (size_t)j * stride + d;
    vf vv[C];
    for (int c = 0; c < C; c++) vv[c] = loadu(vj + c * VW);
    for (int r = 0; r < R; r++) {
      const float p = PT[(size_t)j * columns + r];
      for (int c = 0; c < C; c++) acc[r][c] += p * vv[c];
    }
  }
  for (int r = 0; r < R; r++)
    if (r < count)
      for (int c = 0; c < C; c++) storeu(out + (size_t)r * hidden + d + c * VW, acc[r][c] * inverse[r]);
}

// dst[t][0..8] = scale * src[0..8][t] for t < 8: eight rows of eight (rows ``stride`` apart) transposed in registers
static inline void transpose8(const float* src, size_t stride, float* dst, size_t columns, float scale) {
  const __m256 f = _mm256_set1_ps(scale);
  __m256 r[8], t[8];
  for (int k = 0; k < 8; k++) r[k] = _mm256_mul_ps(_mm256_loadu_ps(src + k * stride), f);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; k++) {
    _mm256_storeu_ps(dst + k * columns, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * columns, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

void attention_part(const Attention& a, int part, int parts) {
  int begin, end;
  split(a.sequences * a.heads, part, parts, &begin, &end);
  // queries rounded up to whole vectors, plus a block's repeats past the last one (read by values_block, not used)
  const int width = (a.longest + VW - 1) / VW * VW + PR;
  thread_local std::vector<float> queries, scores, inverses;
  if (queries.size() < (size_t)a.dim * width) queries.resize((size_t)a.dim * width);
  if (scores.size() < (size_t)a.longest * width) scores.resize((size_t)a.longest * width);
  if (inverses.size() < (size_t)width) inverses.resize(width);
  const int stride = 3 * a.hidden, dim = a.dim;
  for (int task = begin; task < end; task++) {
    int s = task / a.heads, h = task % a.heads;
    const int64_t first = a.starts[s];
    const int n = (int)(a.starts[s + 1] - first), columns = (n + VW - 1) / VW * VW;
    const float* q = a.qkv + first * stride + h * dim;
    const float* k = q + a.hidden;
    const float* v = q + 2 * a.hidden;
    float* ST = scores.data();
    float* qt = queries.data();
    float* inverse = inverses.data();
    const int whole = n / 8 * 8, dims = dim / 8 * 8;  // 8 x 8 tiles in registers, the edges one by one
    for (int i = 0; i < whole; i += 8)
      for (int d = 0; d < dims; d += 8)
        transpose8(q + (size_t)i * stride + d, stride, qt + (size_t)d * columns + i, columns, a.scale);
    for (int i = 0; i < n; i++) {
      const float* qi = q + (size_t)i * stride;
      for (int d = i < whole ? dims : 0; d < dim; d++) qt[(size_t)d * columns + i] = qi[d] * a.scale;
    }
    for (int d = 0; d < dim; d++)
      for (int i = n; i < columns; i++) qt[(size_t)d * columns + i] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += KR) {
      const float* rows[KR];
      for (int r = 0; r < KR; r++) rows[r] = k + (size_t)std::min(j0 + r, n - 1) * stride;
      const int count = std::min(KR, n - j0);
      float* row = ST + (size_t)j0 * columns;
      int i = 0;
      for (; i + QC * VW <= columns; i += QC * VW) scores_block<KR, QC>(rows, qt, columns, i, dim, row, count);
      if constexpr (QC > 2) {  // two vectors left: one block of two, not two of one
        if (i + 2 * VW <= columns) {
          scores_block<KR, 2>(rows, qt, columns, i, dim, row, count);
          i += 2 * VW;
        }
      }
      for (; i < columns; i += VW) scores_block<KR, 1>(rows, qt, columns, i, dim, row, count);
    }
    if (a.bias != nullptr) {  // key j's row, query i's lane: + bias by i - j, contiguous in i
      const float* table = a.bias + (size_t)h * a.bias_stride + a.bias_center;
      for (int j = 0; j < n; j++) {
        float* row = ST + (size_t)j * columns;
        for (int i = 0; i < columns; i += VW) storeu(row + i, loadu(row + i) + loadu(table - j + i));
      }
    }
    // each query's softmax over its keys, down the rows, VW queries at a time: the maximum, then exp and the sum
    // (in key order, a chain a lane); the division waits for the output's store (values_block)
    for (int i = 0; i < columns; i += VW) {
      vf top = loadu(ST + i);
      for (int j = 1; j < n; j++) {
        const vf x = loadu(ST + (size_t)j * columns + i);
        top = x > top ? x : top;
      }
      vf sum = splat(0.0f);
      for (int j = 0; j < n; j++) {
        float* x = ST + (size_t)j * columns + i;
        const vf e = vexp(loadu(x) - top);
        storeu(x, e);
        sum += e;
      }
      storeu(inverse + i, splat(1.0f) / sum);
    }
    for (int i0 = 0; i0 < n; i0 += PR) {
      const int count = std::min(PR, n - i0);
      float* out = a.out + (first + i0) * a.hidden + h * dim;
      const float* PT = ST + i0;
      int d = 0;
      for (; d + DC * VW <= dim; d += DC * VW)
        values_block<PR, DC>(PT, columns, inverse + i0, v, stride, n, d, out, a.hidden, count);
      for (; d + VW <= dim; d += VW)
        values_block<PR, 1>(PT, columns, inverse + i0, v, stride, n, d, out, a.hidden, count);
      for (; d < dim; d++)
        for (int b = 0; b < count; b++) {
          float sum = 0.0f;
          for (int j = 0; j < n; j++) sum = std::fma(PT[(size_t)j * columns + b], v[(size_t)j * stride + d], sum);
          out[(size_t)b * a.hidden + d] = sum * inverse[i0 + b];
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// LayerNorm of rows, in place
// ---------------------------------------------------------------------------------------------------------------
void layer_norm(float* x, int rows, int n, const float* weight, const float* bias, float eps) {
  for (int r = 0; r < rows; r++) {
    float* row = x + (size_t)r * n;
    int i = 0;
    vf sum = splat(0.0f);
    for (; i + VW <= n; i += VW) sum += loadu(row + i);
    float total = horizontal_sum(sum);
    for (; i < n; i++) total += row[i];
    const float mean = total / n;
    vf squares = splat(0.0f);
    for (i = 0; i + VW <= n; i += VW) {
      vf d = loadu(row + i) - mean;
      squares += d * d;
    }
    float variance = horizontal_sum(squares);
    for (; i < n; i++) variance += (row[i] - mean) * (row[i] - mean);
    const float inverse = 1.0f / std::sqrt(variance / n + eps);
    for (i = 0; i < n; i++) row[i] = (row[i] - mean) * inverse * weight[i] + bias[i];
  }
}
// The embeddings: word + absolute position + segment rows, summed and normalised (none of them projected).
struct Embedding {
  const int64_t *ids, *positions, *types;  // (T,) each; positions or types may be null (then row 0 of types)
  const float *word, *position, *segment, *norm_weight, *norm_bias;  // tables (rows, H); position/segment or null
  int64_t words, places, segments;  // the tables' row counts
  float eps;
};

// -1 where an id, position or segment is outside its table (the caller then runs the PyTorch path, whose error
// says which), else 0.
int check_embedding(const Embedding& e, int T) {
  for (int t = 0; t < T; t++) {
    if (e.ids[t] < 0 || e.ids[t] >= e.words) return -1;
    if (e.position && (e.positions[t] < 0 || e.positions[t] >= e.places)) return -1;
    if (e.segment && e.types && (e.types[t] < 0 || e.types[t] >= e.segments)) return -1;
  }
  return 0;
}

void embed_rows(const Embedding& e, float* x, int H, int first, int last) {
  for (int t = first; t < last; t++) {
    float* row = x + (size_t)t * H;
    const float* w = e.word + (size_t)e.ids[t] * H;
    for (int i = 0; i < H; i++) row[i] = w[i];
    if (e.position) {
      const float* p = e.position + (size_t)e.positions[t] * H;
      for (int i = 0; i < H; i++) row[i] += p[i];
    }
    if (e.segment) {
      const float* s = e.segment + (size_t)(e.types ? e.types[t] : 0) * H;
      for (int i = 0; i < H; i++) row[i] += s[i];
    }
  }
  layer_norm(x + (size_t)first * H, last - first, H, e.norm_weight, e.norm_bias, e.eps);
}

// Scratch reused by the calls of one thread (grown, never shrunk): no allocation, no fresh pages per call.
std::vector<float>& scratch(int which, size_t size) {
  thread_local std::vector<float> buffers[4];
  if (buffers[which].size() < size) buffers[which].resize(size);
  return buffers[which];
}

// Built with -DEK_PROFILE (ENCODERKIT_NATIVE_FLAGS; bench/native_phases.py): the seconds the first thread spends in
// each step of ek_encode (its waits at the barriers included), and in quantising the int8 products' rows.
enum Phase { EMBED, QKV, ATTEND, OUTPUT, NORM1, FFN_IN, FFN_OUT, NORM2, QUANTIZE, PHASES };
#ifdef EK_PROFILE
double phase_seconds[PHASES];
#endif

// One layer's products and norms, as the caller lays them out.
struct Layer {
  Linear qkv, output, ffn_in, ffn_out;
  const float *attention_norm_weight, *attention_norm_bias, *ffn_norm_weight, *ffn_norm_bias;
};

// The product of ``linear`` on this thread's panels, rows x (M, K) -> y (M, N); an int8 one first quantises x
// into this thread's own codes (every thread all of x: a few thousand values, cheaper than a barrier).
void product_part(const Linear& linear, const float* x, float* y, const float* residual, int M, int N, int K,
                  int epilogue, int activation, int part, int parts) {
  Product g{x, nullptr, nullptr, linear.bias, residual, y, M, N, K, epilogue, activation,
            nullptr, nullptr, nullptr, nullptr, nullptr, (K + 3) / 4 * 4};
  if (linear.scale == nullptr) {
    g.packed = (const float*)linear.weight;
  } else {
    thread_local std::vector<uint8_t> codes;
    thread_local std::vector<float> scales;
    thread_local std::vector<int32_t> zeros;
    if (codes.size() < (size_t)M * g.K4) codes.resize((size_t)M * g.K4);
    if (scales.size() < (size_t)M) scales.resize(M), zeros.resize(M);
#ifdef EK_PROFILE
    const double started = omp_get_wtime();
#endif
    quantize(x, M, K, linear.inverse, codes.data(), g.K4, scales.data(), zeros.data());
    g.xscale = scales.data();
    g.zero = zeros.data();
#ifdef EK_PROFILE
    if (part == 0) phase_seconds[QUANTIZE] += omp_get_wtime() - started;
#endif
    g.qpacked = (const int8_t*)linear.weight;
    g.codes = codes.data();
    g.wscale = linear.scale;
    g.sums = linear.sums;
  }
  product_part(g, part, parts);
}
}  // namespace

extern "C" {

// The interface's version (loader.py's ABI_VERSION) and the sizes of the structs that Python mirrors: a library
// built from other sources than the Python beside it is refused at load, not read with the wrong layout.
int ek_abi_version() { return 3; }

void ek_struct_sizes(int64_t* out) {
  out[0] = sizeof(Embedding);
  out[1] = sizeof(Linear);
  out[2] = sizeof(Layer);
}

int ek_vector_width() { return VW; }

int ek_int8() { return EK_INT8; }

// The phase seconds summed since the last call (see Phase), then zeroed; 0 (nothing written) without -DEK_PROFILE.
int ek_phases(double* out) {
#ifdef EK_PROFILE
  for (int i = 0; i < PHASES; i++) out[i] = phase_seconds[i], phase_seconds[i] = 0.0;
  return PHASES;
#else
  (void)out;
  return 0;
#endif
}

// (N, K) row-major weight -> panels of VW columns, k-major, the last one zero-filled past N.
void ek_pack(const float* weight, float* packed, int N, int K) {
  int panels = (N + VW - 1) / VW;
  for (int p = 0; p < panels; p++)
    for (int k = 0; k < K; k++)
      for (int j = 0; j < VW; j++) {
        int n = p * VW + j;
        packed[((size_t)p * K + k) * VW + j] = n < N ? weight[(size_t)n * K + k] : 0.0f;
      }
}

// (N, K) row-major int8 codes -> panels of VW columns, four k at a time ((K4, VW, 4) per panel, zero past N and K),
// and each column's sum of codes (panels * VW,).
void ek_pack_int8(const int8_t* weight, int8_t* packed, int32_t* sums, int N, int K) {
  const int panels = (N + VW - 1) / VW, K4 = (K + 3) / 4 * 4;
  for (int p = 0; p < panels; p++)
    for (int j = 0; j < VW; j++) {
      const int n = p * VW + j;
      int32_t sum = 0;
      for (int k = 0; k < K4; k++) {
        const int8_t code = n < N && k < K ? weight[(size_t)n * K + k] : 0;
        packed[(size_t)p * K4 * VW + (size_t)(k / 4) * VW * 4 + j * 4 + k % 4] = code;
        sum += code;
      }
      sums[n] = sum;
    }
}

// The PyTorch layers' int8 products (encoderkit.modeling.inference.Int8Prepacked), which multiply the codes in
// oneDNN: rows (M, K) times ``inverse`` where given -> uint8 codes (M, K) with each row's scale and zero point, as
// ``quantize`` (K a multiple of 4), on ``threads`` threads.
void ek_quantize_rows(const float* x, int M, int K, const float* inverse, uint8_t* codes, float* scales,
                      int32_t* zeros, int threads) {
  threads = std::max(1, std::min(threads, M / 8));
#pragma omp parallel num_threads(threads)
  {
    int first, last;
    split(M, omp_get_thread_num(), omp_get_num_threads(), &first, &last);
    quantize(x + (size_t)first * K, last - first, K, inverse, codes + (size_t)first * K, K, scales + first,
             zeros + first);
  }
}

// Then, in place, oneDNN's (M, N) products of the codes with the weights (each column times its weight scale) ->
// (product - row zero point * column's weight sum) * row scale + bias: ``wsums`` is each column's sum of codes times
// its scale.
void ek_rescale_rows(float* y, int M, int N, const float* scales, const int32_t* zeros, const float* wsums,
                     const float* bias, int threads) {
  threads = std::max(1, std::min(threads, M / 8));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int r = 0; r < M; r++) {
    float* row = y + (size_t)r * N;
    const float scale = scales[r], offset = -(float)zeros[r] * scales[r];
    for (int c = 0; c < N; c++) row[c] = row[c] * scale + (offset * wsums[c] + bias[c]);
  }
}

// One product, y = x W^T + b (M, N), on the calling thread: the kernel's own product, for tests.
void ek_product(const void* linear, const float* x, float* y, int M, int N, int K) {
  product_part(*(const Linear*)linear, x, y, nullptr, M, N, K, BIAS, 0, 0, 1);
}

// Attention alone, for the PyTorch layers' inference: packed (T, 3H) q | k | v -> (T, H), each sequence (rows
// starts[s] to starts[s + 1]) attending within itself, with the bias by relative position where ``bias`` is given
// (see Attention), on ``threads`` threads. Returns 0, or -2 (nothing computed) where the bias table is too short for
// the longest sequence.
int ek_attention(const float* qkv, float* out, const int64_t* starts, int sequences, int heads, int dim, float scale,
                 const float* bias, int bias_stride, int bias_center, int threads) {
  int longest = 0;
  for (int s = 0; s < sequences; s++) longest = std::max(longest, (int)(starts[s + 1] - starts[s]));
  if (bias != nullptr && bias_center < longest - 1) return -2;
  const Attention attention{qkv, out, starts, sequences, heads, dim, heads * dim, longest, scale, bias, bias_stride,
                            bias_center};
  threads = std::max(1, std::min(threads, sequences * heads));
#pragma omp parallel num_threads(threads)
  attention_part(attention, omp_get_thread_num(), omp_get_num_threads());
  return 0;
}

// One call: the embeddings (where ``embedding`` is given) and every layer. x: (T, H) out (and in, the embeddings'
// output, where ``embedding`` is null). layers: one ``Layer`` per layer run, in order. starts: (sequences + 1,)
// first row of each sequence. bias: every layer's attention bias by relative position, or null (see Attention).
// Returns 0, -1 (nothing computed) where an id is outside its embedding table, or -2 (nothing computed) where the
// bias table is too short for the longest sequence.
int ek_encode(float* x, const void* embedding, int T, int H, int heads, int inter, int count, const void* layers,
              const int64_t* starts, int sequences, int activation, float eps, float scale, const float* bias,
              int bias_stride, int bias_center, int threads) {
  const Embedding* e = (const Embedding*)embedding;
  if (e != nullptr && check_embedding(*e, T) != 0) return -1;
  const int dim = H / heads;
  float* qkv = scratch(0, (size_t)T * 3 * H).data();
  float* context = scratch(1, (size_t)T * H).data();
  float* hidden = scratch(2, (size_t)T * H).data();
  float* inner = scratch(3, (size_t)T * inter).data();
  int longest = 0;
  for (int s = 0; s < sequences; s++) longest = std::max(longest, (int)(starts[s + 1] - starts[s]));
  threads = std::max(1, std::min(threads, (H + VW - 1) / VW / 2));  // at least a pair of panels each
  if (bias != nullptr && bias_center < longest - 1) return -2;  // a table too short for this batch
  const Attention attention{qkv, context, starts, sequences, heads, dim, H, longest, scale, bias, bias_stride,
                            bias_center};
  // OpenMP, in the libgomp torch has loaded (the same SONAME): the caller's thread drives the same team as its torch
  // ops, so no second set of threads competes with torch's for the cores.
#pragma omp parallel num_threads(threads)
  {
    const int part = omp_get_thread_num(), parts = omp_get_num_threads();
    int first, last;
    split(T, part, parts, &first, &last);  // this thread's rows, for the embeddings and the norms
    // this thread's panels of a product, then wait for the others'
    auto multiply = [&](const Linear& linear, const float* in, float* out, const float* residual, int N, int K,
                        int epilogue) {
      product_part(linear, in, out, residual, T, N, K, epilogue, activation, part, parts);
#pragma omp barrier
    };
    auto normalize = [&](float* rows, const float* weight, const float* bias) {  // this thread's rows, then wait
      layer_norm(rows + (size_t)first * H, last - first, H, weight, bias, eps);
#pragma omp barrier
    };
#ifdef EK_PROFILE
    double clock = omp_get_wtime();
    auto mark = [&](Phase phase) {  // the time since the last mark goes to ``phase``
      const double now = omp_get_wtime();
      if (part == 0) phase_seconds[phase] += now - clock;
      clock = now;
    };
#else
    auto mark = [](Phase) {};
#endif
    if (e != nullptr) {
      embed_rows(*e, x, H, first, last);
#pragma omp barrier
      mark(EMBED);
    }
    for (int l = 0; l < count; l++) {
      const Layer& w = ((const Layer*)layers)[l];
      multiply(w.qkv, x, qkv, nullptr, 3 * H, H, BIAS);
      mark(QKV);
      attention_part(attention, part, parts);
#pragma omp barrier
      mark(ATTEND);
      multiply(w.output, context, hidden, x, H, H, BIAS_RESIDUAL);
      mark(OUTPUT);
      normalize(hidden, w.attention_norm_weight, w.attention_norm_bias);
      mark(NORM1);
      multiply(w.ffn_in, hidden, inner, nullptr, inter, H, BIAS_ACTIVATION);
      mark(FFN_IN);
      multiply(w.ffn_out, inner, x, hidden, H, inter, BIAS_RESIDUAL);
      mark(FFN_OUT);
      normalize(x, w.ffn_norm_weight, w.ffn_norm_bias);
      mark(NORM2);
    }
  }
  return 0;
}
}
