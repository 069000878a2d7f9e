// XLA FFI handlers of the CPU kernels, float32, row-major:
//   JaxspecMatmulKN:  y[R, N] = x[R, K] @ w[K, N]                      (small_matmul.h)
//   JaxspecMatmulNK:  y[R, N] = x[R, K] @ w[N, K].T
//   JaxspecStreamKN:  y[R, N] = x[R, K] @ w[K, N], the streaming form for a few rows
//   JaxspecStreamNK:  y[R, N] = x[R, K] @ w[N, K].T, the streaming form for a few rows
//   JaxspecMatmulKNBf16, JaxspecMatmulNKBf16: the same with bfloat16 w (x and y float32)
//   JaxspecAttnScores: scores[B,M,G,T,S] from q[B,T,M,G,H], k[B,S,M,H] (small_attention.h)
//   JaxspecAttnMix:    mixed[B,T,M,G,H] from p[B,M,G,T,S], v[B,S,M,H]
//
// Work is cut into parts that whichever thread is free claims from an atomic counter: the caller
// and one task on XLA's intra-op thread pool. The caller waits only for parts another thread has
// already claimed, so a busy (or absent) pool never deadlocks or stalls it: the caller then does
// every part itself. Which thread computes a part never changes its result.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "small_attention.h"
#include "small_matmul.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxspec {
namespace {

// JAXSPEC_CPU_MATMUL_THREADS=1 keeps every call on its calling thread (for measurements).
bool SplitAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("JAXSPEC_CPU_MATMUL_THREADS");
    return v == nullptr || std::atoi(v) != 1;
  }();
  return allowed;
}

struct Job {
  std::function<void(int64_t)> run_part;
  int64_t parts;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      run_part(p);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Runs run_part(0 .. parts-1), shared with at most one pool thread when `split`.
void ParallelFor(ffi::ThreadPool& pool, int64_t parts, bool split,
                 std::function<void(int64_t)> run_part) {
  if (!split || parts < 2 || !SplitAllowed() || pool.num_threads() < 2) {
    for (int64_t p = 0; p < parts; ++p) run_part(p);
    return;
  }
  auto job = std::make_shared<Job>();
  job->run_part = std::move(run_part);
  job->parts = parts;
  pool.Schedule([job] { job->Run(); });
  job->Run();
  while (job->done.load(std::memory_order_acquire) < job->parts) _mm_pause();
}

template <ffi::DataType WT>
ffi::Error MatmulKNImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<WT> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("jaxspec_matmul_kn: expected x[R, K] and w[K, N]");
  const auto yd = y->dimensions();
  if (yd.size() != 2 || yd[0] != xd[0] || yd[1] != wd[1])
    return ffi::Error::InvalidArgument("jaxspec_matmul_kn: expected y[R, N]");
  const float* xp = x.typed_data();
  const auto* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t rows = xd[0], k = xd[1], n = wd[1], strips = n / kStrip;
  // Part p: strips [p * strips / parts, (p + 1) * strips / parts); the last part also takes the
  // columns past the last full strip.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(strips, 4));
  ParallelFor(pool, parts, strips >= 2, [=](int64_t p) {
    const int64_t c0 = p * strips / parts * kStrip;
    const int64_t c1 = p + 1 == parts ? n : (p + 1) * strips / parts * kStrip;
    MatmulKN(xp, wp, yp, rows, k, n, c0, c1);
  });
  return ffi::Error::Success();
}

// Parts of k in the streaming form: more than the two threads, so that the one that starts late
// (the pool's) still takes a share (4 measured faster than 2, 8 or 16 on SmolLM2's one-row
// forward, docs/cpu_verify.md). Below ~64k multiply-adds the product is one part on the caller.
constexpr int64_t kStreamParts = 4;

ffi::Error StreamKNImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0] || yd.size() != 2 || yd[0] != xd[0] ||
      yd[1] != wd[1])
    return ffi::Error::InvalidArgument("jaxspec_matmul_kn_stream: expected x[R, K], w[K, N], "
                                       "y[R, N]");
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t rows = xd[0], k = wd[0], n = wd[1], size = rows * n;
  if (size == 0) return ffi::Error::Success();
  const int64_t parts = k * n >= (1 << 16) && k >= 8 * kStreamParts ? kStreamParts : 1;
  // The caller's buffer, kept between calls (the caller waits for every part before reusing it).
  static thread_local std::vector<float> buffer;
  buffer.resize(parts * size);
  float* bp = buffer.data();
  // Part p: weight rows [p * k / parts, (p + 1) * k / parts) rounded down to multiples of 8.
  ParallelFor(pool, parts, parts > 1, [=](int64_t p) {
    const int64_t k0 = p * k / parts / 8 * 8;
    const int64_t k1 = p + 1 == parts ? k : (p + 1) * k / parts / 8 * 8;
    StreamKNPart(xp, wp, bp + p * size, rows, k, n, k0, k1);
  });
  for (int64_t i = 0; i < size; ++i) {
    float sum = bp[i];
    for (int64_t p = 1; p < parts; ++p) sum += bp[p * size + i];
    yp[i] = sum;
  }
  return ffi::Error::Success();
}

// STREAM_NK: StreamNK (a few rows) in place of MatmulNK; the same split of w's rows.
template <ffi::DataType WT, bool STREAM_NK = false>
ffi::Error MatmulNKImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<WT> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || yd.size() != 2 || yd[0] != xd[0] ||
      yd[1] != wd[0])
    return ffi::Error::InvalidArgument("jaxspec_matmul_nk: expected x[R, K], w[N, K], y[R, N]");
  const float* xp = x.typed_data();
  const auto* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t rows = xd[0], k = xd[1], n = wd[0], groups = n / 4;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(groups, 4));
  ParallelFor(pool, parts, groups >= 2, [=](int64_t p) {
    const int64_t c0 = p * groups / parts * 4;
    const int64_t c1 = p + 1 == parts ? n : (p + 1) * groups / parts * 4;
    if constexpr (STREAM_NK) {
      StreamNK(xp, wp, yp, rows, k, n, c0, c1);
    } else {
      MatmulNK(xp, wp, yp, rows, k, n, c0, c1);
    }
  });
  return ffi::Error::Success();
}

// Parses q-or-p [.., .., .., .., ..] and k-or-v [B, S, M, H] into dims; checks the output.
std::optional<AttentionDims> Dims(ffi::Span<const int64_t> a, ffi::Span<const int64_t> kv,
                                  ffi::Span<const int64_t> out, bool scores) {
  if (a.size() != 5 || kv.size() != 4 || out.size() != 5) return std::nullopt;
  AttentionDims d;
  d.b = kv[0], d.s = kv[1], d.m = kv[2], d.h = kv[3];
  if (scores) {  // q [B, T, M, G, H] -> [B, M, G, T, S]
    d.t = a[1], d.g = a[3];
    if (a[0] != d.b || a[2] != d.m || a[4] != d.h) return std::nullopt;
    if (out[0] != d.b || out[1] != d.m || out[2] != d.g || out[3] != d.t || out[4] != d.s)
      return std::nullopt;
  } else {  // p [B, M, G, T, S] -> [B, T, M, G, H]
    d.g = a[2], d.t = a[3];
    if (a[0] != d.b || a[1] != d.m || a[4] != d.s) return std::nullopt;
    if (out[0] != d.b || out[1] != d.t || out[2] != d.m || out[3] != d.g || out[4] != d.h)
      return std::nullopt;
  }
  return d;
}

template <bool SCORES>
ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> kv,
                         ffi::ResultBuffer<ffi::F32> out) {
  const auto d = Dims(a.dimensions(), kv.dimensions(), out->dimensions(), SCORES);
  if (!d) return ffi::Error::InvalidArgument("jaxspec attention: inconsistent shapes");
  const float* ap = a.typed_data();
  const float* kvp = kv.typed_data();
  float* op = out->typed_data();
  const AttentionDims dims = *d;
  const int64_t units = dims.b * dims.m;
  const int64_t parts = std::min<int64_t>(units, 4);
  // Below ~64k multiply-adds a second thread costs more than it saves.
  const bool split = dims.b * dims.m * dims.g * dims.t * dims.s * dims.h >= (1 << 16);
  ParallelFor(pool, std::max<int64_t>(parts, 1), split, [=](int64_t p) {
    const int64_t u0 = p * units / parts, u1 = (p + 1) * units / parts;
    if (SCORES) {
      AttentionScores(ap, kvp, op, dims, u0, u1);
    } else {
      AttentionMix(ap, kvp, op, dims, u0, u1);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxspec

#define JAXSPEC_BINDING                    \
  ffi::Ffi::Bind()                         \
      .Ctx<ffi::ThreadPool>()              \
      .Arg<ffi::Buffer<ffi::F32>>()        \
      .Arg<ffi::Buffer<ffi::F32>>()        \
      .Ret<ffi::Buffer<ffi::F32>>()

#define JAXSPEC_BF16_BINDING               \
  ffi::Ffi::Bind()                         \
      .Ctx<ffi::ThreadPool>()              \
      .Arg<ffi::Buffer<ffi::F32>>()        \
      .Arg<ffi::Buffer<ffi::BF16>>()       \
      .Ret<ffi::Buffer<ffi::F32>>()

#ifndef JAXSPEC_SOURCE_HASH
#define JAXSPEC_SOURCE_HASH "unknown"
#endif
// The fingerprint of the sources this library was built from (models/kernel_sources.py).
extern "C" const char* JaxspecSourceHash() { return JAXSPEC_SOURCE_HASH; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecMatmulKN, jaxspec::MatmulKNImpl<ffi::F32>, JAXSPEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecMatmulNK, jaxspec::MatmulNKImpl<ffi::F32>, JAXSPEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecStreamKN, jaxspec::StreamKNImpl, JAXSPEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecStreamNK, (jaxspec::MatmulNKImpl<ffi::F32, true>),
                              JAXSPEC_BINDING);
// x float32, w bfloat16 (exactly widened on load), y float32.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecMatmulKNBf16, jaxspec::MatmulKNImpl<ffi::BF16>,
                              JAXSPEC_BF16_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecMatmulNKBf16, jaxspec::MatmulNKImpl<ffi::BF16>,
                              JAXSPEC_BF16_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecAttnScores, jaxspec::AttentionImpl<true>, JAXSPEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecAttnMix, jaxspec::AttentionImpl<false>, JAXSPEC_BINDING);
