#include "small_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace jaxspec {
namespace {

constexpr int kRowTile = 3;
// Weight rows per block. The block after the current one is software-prefetched in plain
// row-major order (long contiguous runs, which memory serves fastest) while the current block is
// multiplied strip by strip.
constexpr int64_t kBlockRows = 16;
constexpr int64_t kPrefetchRowsNK = 8;

// Weights are float32, or bfloat16 (the upper half of a float32, stored as uint16_t) widened
// exactly to float32 on load: the arithmetic after the load is the same for both.
inline float ToF32(float v) { return v; }
inline float ToF32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

__attribute__((target("avx2,fma"))) inline __m256 Load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Walks a [rows, c0:c1) panel of w in row-major order, two cache lines per step.
template <typename W>
struct PrefetchCursor {
  const W* row;
  const W* end_row;
  int64_t c, c0, c1, n;

  __attribute__((target("avx2,fma"))) inline void Step() {
    if (row >= end_row) return;
    _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(row + c + 16), _MM_HINT_T0);
    c += kStrip;
    if (c >= c1) {
      c = c0;
      row += n;
    }
  }
};

// One row tile (MR rows) x one strip (32 columns starting at c), weight rows [k0, k1).
// acc starts at 0 for k0 == 0, else from y (exact float round trip: the fma chain continues).
template <int MR, bool PREFETCH, typename W>
__attribute__((target("avx2,fma"))) void TileAvx2(const float* x, const W* w, float* y,
                                                  int64_t k, int64_t n, int64_t c, int64_t k0,
                                                  int64_t k1, PrefetchCursor<W>* pf) {
  __m256 acc[MR][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      acc[i][j] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(y + i * n + c + 8 * j);
  const W* wp = w + k0 * n + c;
  for (int64_t kk = k0; kk < k1; ++kk, wp += n) {
    if (PREFETCH) pf->Step();
    __m256 xb[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) xb[i] = _mm256_broadcast_ss(x + i * k + kk);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256 wv = Load8(wp + 8 * j);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xb[i], wv, acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + i * n + c + 8 * j, acc[i][j]);
}

template <bool PREFETCH, typename W>
__attribute__((target("avx2,fma"))) void RowTiles(const float* x, const W* w, float* y,
                                                  int64_t rows, int64_t k, int64_t n, int64_t c,
                                                  int64_t k0, int64_t k1, PrefetchCursor<W>* pf) {
  // Only the first tile prefetches; the others re-read the strip from cache.
  int64_t r = 0;
  if (rows >= kRowTile) {
    TileAvx2<3, PREFETCH>(x, w, y, k, n, c, k0, k1, pf);
    for (r = kRowTile; r + kRowTile <= rows; r += kRowTile)
      TileAvx2<3, false>(x + r * k, w, y + r * n, k, n, c, k0, k1, pf);
    if (rows - r == 2) TileAvx2<2, false>(x + r * k, w, y + r * n, k, n, c, k0, k1, pf);
    if (rows - r == 1) TileAvx2<1, false>(x + r * k, w, y + r * n, k, n, c, k0, k1, pf);
  } else if (rows == 2) {
    TileAvx2<2, PREFETCH>(x, w, y, k, n, c, k0, k1, pf);
  } else if (rows == 1) {
    TileAvx2<1, PREFETCH>(x, w, y, k, n, c, k0, k1, pf);
  }
}

template <typename W>
__attribute__((target("avx2,fma"))) void StripsAvx2(const float* x, const W* w, float* y,
                                                    int64_t rows, int64_t k, int64_t n,
                                                    int64_t c0, int64_t c1) {
  for (int64_t k0 = 0; k0 < k; k0 += kBlockRows) {
    const int64_t k1 = std::min(k, k0 + kBlockRows);
    PrefetchCursor<W> pf{w + k1 * n, w + std::min(k, k1 + kBlockRows) * n, c0, c0, c1, n};
    for (int64_t c = c0; c < c1; c += kStrip)
      RowTiles<true>(x, w, y, rows, k, n, c, k0, k1, &pf);
  }
}

// Portable path, same arithmetic (one fma chain over k per output).
template <typename W>
void ColumnsScalar(const float* x, const W* w, float* y, int64_t rows, int64_t k, int64_t n,
                   int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(x[r * k + kk], ToF32(w[kk * n + c]), acc);
      y[r * n + c] = acc;
    }
}


// Lanes of v summed in a fixed order.
__attribute__((target("avx2,fma"))) inline float SumLanes(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// y[i, c..c+NR) for MR rows of x against NR consecutive rows of w (w rows c..c+NR).
template <int MR, int NR, typename W>
__attribute__((target("avx2,fma"))) void TileNKAvx2(const float* x, const W* w, float* y,
                                                    int64_t k, int64_t n, int64_t c) {
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t k8 = k / 8 * 8;
  for (int64_t kk = 0; kk < k8; kk += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = Load8(w + (c + j) * k + kk);
    // Software prefetch kPrefetchRowsNK rows ahead: measured 1.2-1.7x faster than the hardware
    // prefetcher alone on the tied head (docs/cpu_verify.md).
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(w + (c + j + kPrefetchRowsNK) * k + kk),
                   _MM_HINT_T0);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * k + kk);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      float sum = SumLanes(acc[i][j]);
      for (int64_t kk = k8; kk < k; ++kk) sum = std::fma(x[i * k + kk], ToF32(w[(c + j) * k + kk]), sum);
      y[i * n + c + j] = sum;
    }
}

template <int NR, typename W>
__attribute__((target("avx2,fma"))) void RowTilesNK(const float* x, const W* w, float* y,
                                                    int64_t rows, int64_t k, int64_t n,
                                                    int64_t c) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) TileNKAvx2<2, NR, W>(x + r * k, w, y + r * n, k, n, c);
  if (r < rows) TileNKAvx2<1, NR, W>(x + r * k, w, y + r * n, k, n, c);
}

// Scalar twin of TileNKAvx2's arithmetic for one output.
template <typename W>
float DotLanesScalar(const float* a, const W* b, int64_t k) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t k8 = k / 8 * 8;
  for (int64_t kk = 0; kk < k8; kk += 8)
    for (int j = 0; j < 8; ++j) l[j] = std::fma(a[kk + j], ToF32(b[kk + j]), l[j]);
  float sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  for (int64_t kk = k8; kk < k; ++kk) sum = std::fma(a[kk], ToF32(b[kk]), sum);
  return sum;
}

// The widest instruction set used: 2 AVX-512, 1 AVX2 + FMA, 0 scalar; what the CPU has, capped by
// JAXSPEC_CPU_MATMUL_ISA=avx2|scalar (tests: every path gives the same bits).
int Isa() {
  static const int isa = [] {
    const int has = __builtin_cpu_supports("avx512f")                                    ? 2
                    : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
                                                                                       : 0;
    const char* cap = std::getenv("JAXSPEC_CPU_MATMUL_ISA");
    if (cap == nullptr) return has;
    if (std::strcmp(cap, "scalar") == 0) return 0;
    if (std::strcmp(cap, "avx2") == 0) return std::min(has, 1);
    return has;
  }();
  return isa;
}

bool HasAvx2() { return Isa() >= 1; }

template <typename W>
void MatmulKNImpl(const float* x, const W* w, float* y, int64_t rows, int64_t k, int64_t n,
                  int64_t n_begin, int64_t n_end) {
  int64_t full_end = n_begin;
  if (HasAvx2() && k > 0) {
    full_end = n_begin + (n_end - n_begin) / kStrip * kStrip;
    StripsAvx2(x, w, y, rows, k, n, n_begin, full_end);
  }
  ColumnsScalar(x, w, y, rows, k, n, full_end, n_end);
}

template <typename W>
void MatmulNKImpl(const float* x, const W* w, float* y, int64_t rows, int64_t k, int64_t n,
                  int64_t n_begin, int64_t n_end) {
  int64_t c = n_begin;
  if (HasAvx2()) {
    for (; c + 4 <= n_end; c += 4) RowTilesNK<4>(x, w, y, rows, k, n, c);
    for (; c < n_end; ++c) RowTilesNK<1>(x, w, y, rows, k, n, c);
    return;
  }
  for (; c < n_end; ++c)
    for (int64_t r = 0; r < rows; ++r) y[r * n + c] = DotLanesScalar(x + r * k, w + c * k, k);
}

// ---- Streaming form (StreamKNPart): every output of a part is one fma chain over its k range in
// increasing order, whatever the instruction set, row grouping or column block, so all three
// paths below give the same bits.

// AVX-512: a strip of 32 columns x RB rows of x, its 2 RB accumulators in registers while the
// strip walks weight rows [kb0, kb1) in order (2 weight loads and RB broadcasts per weight row);
// meanwhile `pf` walks the next block of weight rows in memory order, two cache lines a step.
template <int RB>
__attribute__((target("avx512f"))) inline void Strip512(const float* x, int64_t k,
                                                      const float* w, int64_t n, float* part,
                                                      int64_t c, int64_t kb0, int64_t kb1,
                                                      const char*& pf, const char* pf_end) {
  __m512 u[RB], v[RB];
#pragma GCC unroll 16
  for (int i = 0; i < RB; ++i) {
    u[i] = _mm512_loadu_ps(part + i * n + c);
    v[i] = _mm512_loadu_ps(part + i * n + c + 16);
  }
  for (int64_t kk = kb0; kk < kb1; ++kk) {
    const float* wr = w + kk * n + c;
    const __m512 w0 = _mm512_loadu_ps(wr), w1 = _mm512_loadu_ps(wr + 16);
    if (pf < pf_end) {
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      pf += 128;
    }
#pragma GCC unroll 16
    for (int i = 0; i < RB; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * k + kk]);
      u[i] = _mm512_fmadd_ps(xb, w0, u[i]);
      v[i] = _mm512_fmadd_ps(xb, w1, v[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < RB; ++i) {
    _mm512_storeu_ps(part + i * n + c, u[i]);
    _mm512_storeu_ps(part + i * n + c + 16, v[i]);
  }
}

constexpr int kStripRowsMax = 12;     // 24 accumulators + 2 weights + a broadcast: 27 of 32 zmm
constexpr int64_t kStreamBlock = 32;  // weight rows a strip walks before the next strip

// Columns [0, n32) (a multiple of 32), weight rows [k0, k1): blocks of kStreamBlock weight rows;
// in a block every strip of 32 columns walks the block's rows for the rows of x in as few
// passes of at most kStripRowsMax as possible, of near-equal sizes.
__attribute__((target("avx512f"))) void StreamAvx512(const float* x, const float* w, float* part,
                                                     int64_t rows, int64_t k, int64_t n,
                                                     int64_t n32, int64_t k0, int64_t k1) {
  for (int64_t kb0 = k0; kb0 < k1; kb0 += kStreamBlock) {
    const int64_t kb1 = std::min(k1, kb0 + kStreamBlock);
    const int64_t nb1 = std::min(k1, kb1 + kStreamBlock);
    // The next block's rows, whole (contiguous in memory), two cache lines a weight row walked.
    const char* pf = reinterpret_cast<const char*>(w + kb1 * n);
    const char* const pf_end = reinterpret_cast<const char*>(w + nb1 * n);
    const int64_t passes = (rows + kStripRowsMax - 1) / kStripRowsMax;
    for (int64_t c = 0; c < n32; c += 32) {
      for (int64_t p = 0, r = 0; p < passes; ++p) {
        const int64_t take = (rows - r + (passes - p) - 1) / (passes - p);
        const float* xr = x + r * k;
        float* pr = part + r * n;
        switch (take) {
          case 12: Strip512<12>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 11: Strip512<11>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 10: Strip512<10>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 9: Strip512<9>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 8: Strip512<8>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 7: Strip512<7>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 6: Strip512<6>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 5: Strip512<5>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 4: Strip512<4>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 3: Strip512<3>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          case 2: Strip512<2>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
          default: Strip512<1>(xr, k, w, n, pr, c, kb0, kb1, pf, pf_end); break;
        }
        r += take;
      }
    }
  }
}

// AVX2: 4 weight rows x 16 columns, one row of x at a time.
__attribute__((target("avx2,fma"))) int64_t StreamAvx2(const float* x, const float* w,
                                                       float* part, int64_t rows, int64_t k,
                                                       int64_t n, int64_t c0, int64_t c1,
                                                       int64_t k0, int64_t k1) {
  int64_t kk = k0;
  for (; kk + 4 <= k1; kk += 4) {
    const float* w0 = w + kk * n;
    for (int64_t c = c0; c < c1; c += 16) {
      __m256 wv[8];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        wv[2 * j] = _mm256_loadu_ps(w0 + j * n + c);
        wv[2 * j + 1] = _mm256_loadu_ps(w0 + j * n + c + 8);
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = part + r * n + c;
        __m256 u = _mm256_loadu_ps(pr), v = _mm256_loadu_ps(pr + 8);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256 xb = _mm256_broadcast_ss(x + r * k + kk + j);
          u = _mm256_fmadd_ps(xb, wv[2 * j], u);
          v = _mm256_fmadd_ps(xb, wv[2 * j + 1], v);
        }
        _mm256_storeu_ps(pr, u);
        _mm256_storeu_ps(pr + 8, v);
      }
    }
  }
  return kk;
}

bool HasAvx512() { return Isa() >= 2; }

// The scalar tail: columns [c0, c1), weight rows [k0, k1), the same chain.
void StreamScalar(const float* x, const float* w, float* part, int64_t rows, int64_t k,
                  int64_t n, int64_t c0, int64_t c1, int64_t k0, int64_t k1) {
  for (int64_t kk = k0; kk < k1; ++kk)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c)
        part[r * n + c] = std::fma(x[r * k + kk], w[kk * n + c], part[r * n + c]);
}

// ---- StreamNK: 16 lane-wise chains per output, reduced by a fixed tree, then the tail.

constexpr int64_t kPrefetchRowsStreamNK = 8;

// The scalar twin of the tree: (l_i + l_{i+8}), then + the pair 4 apart, 2 apart, 1 apart.
inline float Tree16(const float* l) {
  float s[8], t[4];
  for (int i = 0; i < 8; ++i) s[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) t[i] = s[i] + s[i + 4];
  const float u0 = t[0] + t[2], u1 = t[1] + t[3];
  return u0 + u1;
}

float DotTree16Scalar(const float* a, const float* b, int64_t k) {
  float l[16] = {};
  const int64_t k16 = k / 16 * 16;
  for (int64_t kk = 0; kk < k16; kk += 16)
    for (int j = 0; j < 16; ++j) l[j] = std::fma(a[kk + j], b[kk + j], l[j]);
  float sum = Tree16(l);
  for (int64_t kk = k16; kk < k; ++kk) sum = std::fma(a[kk], b[kk], sum);
  return sum;
}

// The tree on 8 + 8 lanes held as (lo, hi) = lanes 0..7, 8..15.
__attribute__((target("avx2,fma"))) inline float Tree16Avx2(__m256 lo, __m256 hi) {
  const __m256 s = _mm256_add_ps(lo, hi);
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

__attribute__((target("avx512f"))) inline float Tree16Avx512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s = _mm256_add_ps(lo, hi);
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// MR rows of x against w rows c..c+NR; the first row group prefetches the rows 8 ahead.
template <int MR, int NR, bool PREFETCH>
__attribute__((target("avx512f"))) void TileNK512(const float* x, const float* w, float* y,
                                                  int64_t k, int64_t n, int64_t c) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t k16 = k / 16 * 16;
  const float* w0 = w + c * k;
  for (int64_t kk = 0; kk < k16; kk += 16) {
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w0 + j * k + kk);
    if (PREFETCH) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w0 + (j + kPrefetchRowsStreamNK) * k + kk),
                     _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * k + kk);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      float sum = Tree16Avx512(acc[i][j]);
      for (int64_t kk = k16; kk < k; ++kk) sum = std::fma(x[i * k + kk], w0[j * k + kk], sum);
      y[i * n + c + j] = sum;
    }
}

template <int NR>
__attribute__((target("avx512f"))) void RowsNK512(const float* x, const float* w, float* y,
                                                  int64_t rows, int64_t k, int64_t n, int64_t c) {
  int64_t r = 0;
  if (rows >= 4) {
    TileNK512<4, NR, true>(x, w, y, k, n, c);
    for (r = 4; r + 4 <= rows; r += 4) TileNK512<4, NR, false>(x + r * k, w, y + r * n, k, n, c);
  } else if (rows == 3) {
    TileNK512<3, NR, true>(x, w, y, k, n, c);
    return;
  } else if (rows == 2) {
    TileNK512<2, NR, true>(x, w, y, k, n, c);
    return;
  } else if (rows == 1) {
    TileNK512<1, NR, true>(x, w, y, k, n, c);
    return;
  }
  const int64_t left = rows - r;
  if (left == 3) TileNK512<3, NR, false>(x + r * k, w, y + r * n, k, n, c);
  if (left == 2) TileNK512<2, NR, false>(x + r * k, w, y + r * n, k, n, c);
  if (left == 1) TileNK512<1, NR, false>(x + r * k, w, y + r * n, k, n, c);
}

// AVX2: one row of x against w rows c..c+NR, each chain's 16 lanes as two registers.
template <int NR>
__attribute__((target("avx2,fma"))) void RowNKAvx2(const float* x, const float* w, float* y,
                                                   int64_t k, int64_t c) {
  __m256 lo[NR], hi[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
  const int64_t k16 = k / 16 * 16;
  const float* w0 = w + c * k;
  for (int64_t kk = 0; kk < k16; kk += 16) {
    const __m256 xl = _mm256_loadu_ps(x + kk), xh = _mm256_loadu_ps(x + kk + 8);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      lo[j] = _mm256_fmadd_ps(xl, _mm256_loadu_ps(w0 + j * k + kk), lo[j]);
      hi[j] = _mm256_fmadd_ps(xh, _mm256_loadu_ps(w0 + j * k + kk + 8), hi[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) {
    float sum = Tree16Avx2(lo[j], hi[j]);
    for (int64_t kk = k16; kk < k; ++kk) sum = std::fma(x[kk], w0[j * k + kk], sum);
    y[c + j] = sum;
  }
}

}  // namespace

void StreamNK(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end) {
  int64_t c = n_begin;
  if (HasAvx512()) {
    for (; c + 4 <= n_end; c += 4) RowsNK512<4>(x, w, y, rows, k, n, c);
    for (; c < n_end; ++c) RowsNK512<1>(x, w, y, rows, k, n, c);
  } else if (HasAvx2()) {
    for (; c + 4 <= n_end; c += 4)
      for (int64_t r = 0; r < rows; ++r) RowNKAvx2<4>(x + r * k, w, y + r * n, k, c);
    for (; c < n_end; ++c)
      for (int64_t r = 0; r < rows; ++r) RowNKAvx2<1>(x + r * k, w, y + r * n, k, c);
  }
  for (; c < n_end; ++c)
    for (int64_t r = 0; r < rows; ++r) y[r * n + c] = DotTree16Scalar(x + r * k, w + c * k, k);
}

void StreamKNPart(const float* x, const float* w, float* part, int64_t rows, int64_t k,
                  int64_t n, int64_t k0, int64_t k1) {
  std::memset(part, 0, rows * n * sizeof(float));
  if (HasAvx512()) {
    const int64_t n32 = n / 32 * 32;
    StreamAvx512(x, w, part, rows, k, n, n32, k0, k1);
    StreamScalar(x, w, part, rows, k, n, n32, n, k0, k1);
  } else if (HasAvx2()) {
    const int64_t n16 = n / 16 * 16;
    const int64_t rest = StreamAvx2(x, w, part, rows, k, n, 0, n16, k0, k1);
    StreamScalar(x, w, part, rows, k, n, 0, n16, rest, k1);
    StreamScalar(x, w, part, rows, k, n, n16, n, k0, k1);
  } else {
    StreamScalar(x, w, part, rows, k, n, 0, n, k0, k1);
  }
}

void MatmulKN(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end) {
  MatmulKNImpl(x, w, y, rows, k, n, n_begin, n_end);
}
void MatmulKN(const float* x, const uint16_t* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end) {
  MatmulKNImpl(x, w, y, rows, k, n, n_begin, n_end);
}
void MatmulNK(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end) {
  MatmulNKImpl(x, w, y, rows, k, n, n_begin, n_end);
}
void MatmulNK(const float* x, const uint16_t* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end) {
  MatmulNKImpl(x, w, y, rows, k, n, n_begin, n_end);
}

}  // namespace jaxspec
