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

// out[i] = fma(c, x[i], out[i]) (the per-element chain of MixRowAvx2).
void AxpyScalar(float c, const float* x, float* out, int64_t h) {
  for (int64_t i = 0; i < h; ++i) out[i] = std::fma(c, x[i], out[i]);
}

// Eight dot products of one query row with keys k0..k7 (rows `stride` floats apart), written to
// out[0..7]. Each is DotAvx2's arithmetic exactly: 8 lane-wise fma chains over h, the lanes summed
// ((0+1)+(2+3))+((4+5)+(6+7)), then the h % 8 tail as a scalar fma chain; here the eight lane sums
// are done together with horizontal adds, which add the same pairs in the same order.
__attribute__((target("avx2,fma"))) void Dot8Avx2(const float* q, const float* k0,
                                                  int64_t stride, int64_t h, float* out) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= h; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j * stride + i), acc[j]);
  }
  // hadd(hadd(a0, a1), hadd(a2, a3)) holds, per 128-bit half, (l0+l1)+(l2+l3) of a0..a3 (low
  // half) and (l4+l5)+(l6+l7) (high half); the final add joins the halves.
  const __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 y = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20),
                                   _mm256_permute2f128_ps(x, y, 0x31));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  for (int j = 0; j < 8; ++j) {
    float v = lanes[j];
    for (int64_t r = i; r < h; ++r) v = std::fma(q[r], k0[j * stride + r], v);
    out[j] = v;
  }
}

// out[0..h) = sum over s in order of p[s] * v[s * stride ..] (one fma chain per element starting
// from 0, as AxpyScalar applied for s = 0, 1, ..), accumulated in registers 64 columns at a
// time.
__attribute__((target("avx2,fma"))) void MixRowAvx2(const float* p, const float* v,
                                                    int64_t stride, int64_t s_len, int64_t h,
                                                    float* out) {
  int64_t c = 0;
  for (; c + 64 <= h; c += 64) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < s_len; ++s) {
      const __m256 cv = _mm256_set1_ps(p[s]);
      const float* vrow = v + s * stride + c;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        acc[j] = _mm256_fmadd_ps(cv, _mm256_loadu_ps(vrow + 8 * j), acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + c + 8 * j, acc[j]);
  }
  for (; c + 8 <= h; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t s = 0; s < s_len; ++s)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[s]), _mm256_loadu_ps(v + s * stride + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
  for (; c < h; ++c) {
    float acc = 0.0f;
    for (int64_t s = 0; s < s_len; ++s) acc = std::fma(p[s], v[s * stride + c], acc);
    out[c] = acc;
  }
}

}  // namespace

void AttentionScores(const float* q, const float* k, float* scores, const AttentionDims& d,
                     int64_t u0, int64_t u1) {
  const bool avx2 = HasAvx2();
  const int64_t stride = d.m * d.h;  // between the keys of one (b, m) at consecutive s
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / d.m, m = u % d.m;
    const float* kbase = k + (b * d.s * d.m + m) * d.h;
    for (int64_t g = 0; g < d.g; ++g)
      for (int64_t t = 0; t < d.t; ++t) {
        const float* qrow = q + (((b * d.t + t) * d.m + m) * d.g + g) * d.h;
        float* out = scores + (((b * d.m + m) * d.g + g) * d.t + t) * d.s;
        int64_t s = 0;
        if (avx2)
          for (; s + 8 <= d.s; s += 8) Dot8Avx2(qrow, kbase + s * stride, stride, d.h, out + s);
        for (; s < d.s; ++s)
          out[s] = avx2 ? DotAvx2(qrow, kbase + s * stride, d.h)
                        : DotScalar(qrow, kbase + s * stride, d.h);
      }
  }
}

void AttentionMix(const float* p, const float* v, float* mixed, const AttentionDims& d,
                  int64_t u0, int64_t u1) {
  const bool avx2 = HasAvx2();
  const int64_t stride = d.m * d.h;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / d.m, m = u % d.m;
    const float* vbase = v + (b * d.s * d.m + m) * d.h;
    for (int64_t g = 0; g < d.g; ++g)
      for (int64_t t = 0; t < d.t; ++t) {
        const float* prow = p + (((b * d.m + m) * d.g + g) * d.t + t) * d.s;
        float* out = mixed + (((b * d.t + t) * d.m + m) * d.g + g) * d.h;
        if (avx2) {
          MixRowAvx2(prow, vbase, stride, d.s, d.h, out);
        } else {
          for (int64_t i = 0; i < d.h; ++i) out[i] = 0.0f;
          for (int64_t s = 0; s < d.s; ++s) AxpyScalar(prow[s], vbase + s * stride, out, d.h);
        }
      }
  }
}

}  // namespace jaxspec
