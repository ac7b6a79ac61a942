// What the C++ matmul entries (matmul.cc, qmatmul.cc, blockmatmul.cc) share
// around their kernels: the operands' shapes, the empty products, the run on
// XLA's intra-op pool and the "vectorized" entry point.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "isa.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace pagedjax_matmul_ffi {

namespace ffi = xla::ffi;

// x [M, K] and y [M, N] (N: the weight's output count): true when both are 2-d
// with those sizes.
inline bool xy_shapes(const ffi::Buffer<ffi::F32>& x, ffi::Result<ffi::Buffer<ffi::F32>>& y,
                      int64_t n, int64_t* m, int64_t* k) {
  auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2 || yd[0] != xd[0] || yd[1] != n) return false;
  *m = xd[0];
  *k = xd[1];
  return true;
}

// The products with nothing to sum: true when y [M, N] is done (M or N is 0, or K
// is 0 and y is zeroed).
inline bool empty_product(int64_t M, int64_t K, int64_t N, float* y) {
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    std::memset(y, 0, sizeof(float) * M * N);
    return true;
  }
  return false;
}

// A schedule that hands a task to XLA's intra-op pool.
inline auto on_pool(ffi::ThreadPool& pool) {
  return [&pool](auto task) { pool.Schedule(std::move(task)); };
}

// Whether waking the pool's helpers pays for an M x K x N product.
inline bool worth_helpers(int64_t M, int64_t K, int64_t N) { return M * K * N >= (1 << 16); }

}  // namespace pagedjax_matmul_ffi

// `extern "C" int name()`: 1 when the build has its vectorized (AVX2 + FMA) paths.
#define PAGEDJAX_VECTORIZED_ENTRY(name) \
  extern "C" int name() { return pagedjax_isa::vectorized(); }
