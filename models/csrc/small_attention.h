// The two products of grouped-query attention over a KV cache, for few new tokens per row:
//   scores[b, m, g, t, s] = sum_h q[b, t, m, g, h] * k[b, s, m, h]
//   mixed[b, t, m, g, h] = sum_s p[b, m, g, t, s] * v[b, s, m, h]
// (B batch, T new tokens, M kv heads, G query heads per kv head, S cache length, H head dim; all
// float32, row-major). XLA:CPU runs these as B*M separate small GEMMs, about 1 ms per layer at
// B=16; here each (b, m) pair is a unit of work on one thread. Every output is computed the same
// way whatever T, B or the thread split is: scores take eight keys at a time (their lane sums
// done together, in the same order as one key's), the mix keeps a row's 64 output columns in
// registers over s; both are then bound by reading the cache (at B=16, S=201: 2.5 MB a layer).
#pragma once

#include <cstdint>

namespace jaxspec {

struct AttentionDims {
  int64_t b, t, m, g, s, h;
};

// Units [u0, u1) of the b * m pairs.
void AttentionScores(const float* q, const float* k, float* scores, const AttentionDims& d,
                     int64_t u0, int64_t u1);
void AttentionMix(const float* p, const float* v, float* mixed, const AttentionDims& d,
                  int64_t u0, int64_t u1);

}  // namespace jaxspec
