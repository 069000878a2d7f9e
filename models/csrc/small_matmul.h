// Small-row fp32 matmul kernels: y[R, N] = x[R, K] @ W[K, N] with R (rows) small.
//
// Every weight is read from memory once for all rows: the columns of W are cut into strips of
// 32 floats, and for each strip a register tile of up to 3 rows x 32 columns sweeps k = 0..K-1
// (further row groups re-read the strip from cache, not from memory). Each y[r, n] is one fused
// multiply-add chain over k in increasing order, so its value does not depend on R, on which rows
// are computed together, on the column split across threads, or on the AVX2 vs scalar path.
#pragma once

#include <cstdint>

namespace jaxspec {

// Columns [n_begin, n_end) of y = x @ w; x [rows, k] , w [k, n], y [rows, n], all row-major.
void MatmulKN(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end);

// Columns [n_begin, n_end) of y = x @ w.T; x [rows, k], w [n, k] (out, in layout, e.g. a tied
// embedding), y [rows, n]. Rows of w stream from memory in order, 4 at a time, each read once for
// all rows of x; each output is 8 lane-wise fma chains over k summed in a fixed order.
void MatmulNK(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end);

// The same with bfloat16 weights (uint16_t bit patterns), widened exactly to float32 on load:
// bit-identical to the float32 kernels on the widened weights, at half the bytes read.
void MatmulKN(const float* x, const uint16_t* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end);
void MatmulNK(const float* x, const uint16_t* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end);

// The streaming form, for a few rows: part[r, 0:n] = sum over k in [k0, k1) of x[r, k] * w[k, :],
// reading w's rows in memory order (8 or 4 at a time) with the partial sums in cache. Each output
// is one fma chain over k in increasing order on every path (AVX-512, AVX2, scalar). A product is
// the sum of such parts over a fixed split of k (the FFI handler's), added in part order: its bits
// depend on K and the split, not on R, threads or the instruction set, and differ from MatmulKN's
// single chain by float round-off.
void StreamKNPart(const float* x, const float* w, float* part, int64_t rows, int64_t k, int64_t n,
                  int64_t k0, int64_t k1);

// Columns [n_begin, n_end) of y = x @ w.T for a few rows (the tied head of a verify window):
// w [n, k] streams from memory in order, 4 rows at a time, each read once for every row of x
// (rows of x 4 at a time, from cache). Each output is 16 lane-wise fma chains over k (lane j takes
// k = j mod 16) reduced by a fixed tree (lane i + lane i+8, then + i+4, + i+2, + i+1), then the
// k mod 16 tail as one chain: the same bits on every instruction set and for any R or row group.
void StreamNK(const float* x, const float* w, float* y, int64_t rows, int64_t k, int64_t n,
              int64_t n_begin, int64_t n_end);

// Columns are handed to threads in multiples of this many (one register tile's width).
constexpr int64_t kStrip = 32;

}  // namespace jaxspec
