// XLA FFI handler `JaxspecMatmulKN`: y[R, N] = x[R, K] @ w[K, N] (float32, row-major) on the CPU,
// with the columns shared between the calling thread and one task on XLA's intra-op thread pool.
//
// Work is cut into column parts that whichever thread is free claims from an atomic counter; the
// caller waits only for parts another thread has already claimed, so a busy (or absent) pool
// never deadlocks or stalls it: the caller then simply does every part itself.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "small_matmul.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxspec {
namespace {

struct Job {
  const float* x;
  const float* w;
  float* y;
  int64_t rows, k, n, parts, strips;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      // Part p gets strips [p * strips / parts, (p + 1) * strips / parts); the last part also
      // takes the columns past the last full strip.
      const int64_t c0 = p * strips / parts * kStrip;
      const int64_t c1 = p + 1 == parts ? n : (p + 1) * strips / parts * kStrip;
      MatmulKN(x, w, y, rows, k, n, c0, c1);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// JAXSPEC_CPU_MATMUL_THREADS=1 keeps every call on its calling thread (for measurements).
bool SplitAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("JAXSPEC_CPU_MATMUL_THREADS");
    return v == nullptr || std::atoi(v) != 1;
  }();
  return allowed;
}

ffi::Error MatmulKNImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("jaxspec_matmul_kn: expected x[R, K] and w[K, N]");
  const auto yd = y->dimensions();
  if (yd.size() != 2 || yd[0] != xd[0] || yd[1] != wd[1])
    return ffi::Error::InvalidArgument("jaxspec_matmul_kn: expected y[R, N]");
  auto job = std::make_shared<Job>();
  job->x = x.typed_data();
  job->w = w.typed_data();
  job->y = y->typed_data();
  job->rows = xd[0];
  job->k = xd[1];
  job->n = wd[1];
  job->strips = job->n / kStrip;
  const bool split = SplitAllowed() && pool.num_threads() > 1 && job->strips >= 2;
  job->parts = split ? std::min<int64_t>(job->strips, 4) : 1;
  if (split) pool.Schedule([job] { job->Run(); });
  job->Run();
  while (job->done.load(std::memory_order_acquire) < job->parts) _mm_pause();
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxspec

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecMatmulKN, jaxspec::MatmulKNImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
