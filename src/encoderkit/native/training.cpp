// Kernels of a training step on the CPU: dropout, and the total norm of the gradients.
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
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

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

}  // extern "C"
