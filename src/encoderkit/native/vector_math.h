// Vectors of VW fp32 lanes (16 with AVX-512, 8 with AVX2) and the elementwise functions on them, shared by
// small_batch.cpp and training.cpp. exp is Cephes' polynomial (about 2 ulp); erf comes from erfc's Chebyshev fit
// (Numerical Recipes' erfcc, relative error under 1.2e-7).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef int32_t viu __attribute__((vector_size(VW * 4), aligned(1)));

static inline vf splat(float a) { return vf{} + a; }
static inline vf loadu(const float* p) { return *(const vfu*)p; }
static inline void storeu(float* p, vf v) { *(vfu*)p = v; }

// a * b + c, each lane rounded once: a fused multiply-add that the compiler cannot leave as a multiply and an add
// (GCC contracts ``acc += a * b`` in most places, but not in all of them).
static inline vf fused(float a, vf b, vf c) {
#if VW == 16
  return (vf)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)b, (__m512)c);
#else
  return (vf)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)b, (__m256)c);
#endif
}

static inline float horizontal_sum(vf v) {  // lane 0 first, in order
  float s = 0.0f;
  for (int l = 0; l < VW; ++l) s += v[l];
  return s;
}

static inline float horizontal_max(vf v) {
  float m = v[0];
  for (int l = 1; l < VW; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

static inline vf vsqrt(vf x) {  // correctly rounded, as std::sqrt
#if VW == 16
  return (vf)_mm512_sqrt_ps((__m512)x);
#else
  return (vf)_mm256_sqrt_ps((__m256)x);
#endif
}

static inline vf vexp(vf x) {
  x = x > splat(88.3762626647949f) ? splat(88.3762626647949f) : x;
  x = x < splat(-87.3365447505531f) ? splat(-87.3365447505531f) : x;
  vf fx = x * 1.44269504088896341f + 0.5f;
  vf n = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);  // truncation
  n = n > fx ? n - 1.0f : n;                                            // floor
  x = x - n * 0.693359375f + n * 2.12194440e-4f;
  vf z = x * x;
  vf y = ((((1.9875691500E-4f * x + 1.3981999507E-3f) * x + 8.3334519073E-3f) * x + 4.1665795894E-2f) * x +
          1.6666665459E-1f) * x + 5.0000001201E-1f;
  y = y * z + x + 1.0f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  return y * scale;
}

static inline vf verf(vf x) {
  vf z = x < 0.0f ? -x : x;
  vf t = 1.0f / (1.0f + 0.5f * z);
  vf p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f +
         t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  vf erfc = t * vexp(-z * z + p);
  return x < 0.0f ? erfc - 1.0f : 1.0f - erfc;
}

static inline vf vtanh(vf x) {  // 1 - 2 / (exp(2x) + 1), exact enough away from 0; near 0 the odd series
  vf big = 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f);
  vf x2 = x * x;
  vf small = x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
  vf a = x < 0.0f ? -x : x;
  return a < 0.0625f ? small : big;
}
