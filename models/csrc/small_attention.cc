#include "small_attention.h"

#include <immintrin.h>

#include <cmath>

namespace jaxspec {
namespace {

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// sum_h a[h] * b[h]: 8 lane-wise fma chains, then the lanes summed in a fixed order.
__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t h) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= h; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < h; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

float DotScalar(const float* a, const float* b, int64_t h) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= h; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] = std::fma(a[i + j], b[i + j], lanes[j]);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < h; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// out[i] = fma(c, x[i], out[i]) (the same per-element chain on both paths).
__attribute__((target("avx2,fma"))) void AxpyAvx2(float c, const float* x, float* out,
                                                  int64_t h) {
  const __m256 cv = _mm256_set1_ps(c);
  int64_t i = 0;
  for (; i + 8 <= h; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_fmadd_ps(cv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(out + i)));
  for (; i < h; ++i) out[i] = std::fma(c, x[i], out[i]);
}

void AxpyScalar(float c, const float* x, float* out, int64_t h) {
  for (int64_t i = 0; i < h; ++i) out[i] = std::fma(c, x[i], out[i]);
}

}  // namespace

void AttentionScores(const float* q, const float* k, float* scores, const AttentionDims& d,
                     int64_t u0, int64_t u1) {
  const bool avx2 = HasAvx2();
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / d.m, m = u % d.m;
    for (int64_t s = 0; s < d.s; ++s) {
      const float* krow = k + ((b * d.s + s) * d.m + m) * d.h;
      for (int64_t g = 0; g < d.g; ++g)
        for (int64_t t = 0; t < d.t; ++t) {
          const float* qrow = q + (((b * d.t + t) * d.m + m) * d.g + g) * d.h;
          scores[(((b * d.m + m) * d.g + g) * d.t + t) * d.s + s] =
              avx2 ? DotAvx2(qrow, krow, d.h) : DotScalar(qrow, krow, d.h);
        }
    }
  }
}

void AttentionMix(const float* p, const float* v, float* mixed, const AttentionDims& d,
                  int64_t u0, int64_t u1) {
  const bool avx2 = HasAvx2();
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / d.m, m = u % d.m;
    for (int64_t g = 0; g < d.g; ++g)
      for (int64_t t = 0; t < d.t; ++t) {
        float* out = mixed + (((b * d.t + t) * d.m + m) * d.g + g) * d.h;
        for (int64_t i = 0; i < d.h; ++i) out[i] = 0.0f;
      }
    for (int64_t s = 0; s < d.s; ++s) {
      const float* vrow = v + ((b * d.s + s) * d.m + m) * d.h;
      for (int64_t g = 0; g < d.g; ++g)
        for (int64_t t = 0; t < d.t; ++t) {
          const float c = p[(((b * d.m + m) * d.g + g) * d.t + t) * d.s + s];
          float* out = mixed + (((b * d.t + t) * d.m + m) * d.g + g) * d.h;
          if (avx2) {
            AxpyAvx2(c, vrow, out, d.h);
          } else {
            AxpyScalar(c, vrow, out, d.h);
          }
        }
    }
  }
}

}  // namespace jaxspec
