// Few-row float32 matmuls for the CPU, called from XLA through the FFI
// (kernels_pallas/cpu/native.py: ``matmul``; built and cached by build.py like the
// attention kernel, as its own library).
//
//   x f32[M, K], w f32[K, N] (or f32[N, K] with transposed=1) -> y f32[M, N]

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "isa.h"
#include "matmul_ffi.h"
#include "parallel.h"
#include "simd.h"
#include "tile.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// ------------------------------------------------------------------ matmul
// y[M, N] = x[M, K] @ w, f32, for the few-row matmuls of decode steps, where
// XLA:CPU's GEMM runs far below both the FLOP and the memory-bandwidth
// limits. Every weight element is read from memory once per call: w [K, N]
// is split along K into one contiguous part per thread (partial sums added
// at the end), each streamed kKC rows at a time, 6 rows x 16 columns per
// register tile; beyond kMG rows (compute-bound) w is packed block by block
// instead (block_packed);
// w [N, K] (the tied-embedding logits) is read 4 rows at a time into L1 and
// dotted with 2 rows of x at a time.

namespace {

constexpr int64_t kNB = 64;    // w rows per task (w [N, K])
constexpr int64_t kMG = 8;    // x rows per pass over w (w [K, N]); more: packed path
constexpr int64_t kPNC = 64;   // packed path: columns per task
constexpr int64_t kPKC = 256;  // packed path: K block
constexpr int64_t kKC = 8;     // w rows per pass (w [K, N])

struct MatmulWork : pagedjax_parallel::Tasks {
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N;
  bool transposed;
  int64_t parts = 1;              // w [K, N]: K split into this many contiguous parts
  std::vector<float> partial;     // parts 1.. write here; part 0 writes y
  bool packed = false;            // w [K, N] with more than kMG rows: block_packed
  void run();
};

#ifdef PAGEDJAX_AVX2
// The 6 x 16 register tile (tile.h, shared with the int8 matmul). Each output
// is one FMA chain over k in order, so the AVX-512 version (one 16-lane register
// per row, used where the build targets AVX-512, see build.py) gives the
// same bits as the AVX2 one (two 8-lane registers per row).
using pagedjax_tile::tile_rows;
#endif

// out[:, n0:n1] = x[:, k0:k1] @ w[k0:k1, n0:n1], plain loops: the columns the
// 16-wide tiles leave over (and everything without AVX2).
void scalar_columns(const MatmulWork& mw, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                    float* out) {
  const int64_t K = mw.K, N = mw.N;
  for (int64_t m = 0; m < mw.M; ++m) {
    float* y = out + m * N;
    for (int64_t n = n0; n < n1; ++n) y[n] = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      const float a = mw.x[m * K + k];
      const float* w = mw.w + k * N;
      for (int64_t n = n0; n < n1; ++n) y[n] += a * w[n];
    }
  }
}

// Rows [k0, k1) of w [K, N] into out [M, N] = x[:, k0:k1] @ w[k0:k1]. The rows
// are one contiguous stretch of memory, read kKC rows at a time left to
// right: kKC concurrent sequential streams, which the hardware prefetchers
// follow (a column block of w would jump a page per row).
void part_nn(const MatmulWork& mw, int64_t k0, int64_t k1, float* out) {
  const int64_t M = mw.M, K = mw.K, N = mw.N;
  int64_t n16 = 0;
#ifdef PAGEDJAX_AVX2
  n16 = N & ~int64_t(15);
  // Rows of x in groups of kMG, one pass over w each: the group's outputs
  // (kMG x N) stay in L2 across the pass.
  for (int64_t g0 = 0; g0 < M; g0 += kMG)
  for (int64_t kb = k0; kb < k1; kb += kKC) {
    const int64_t kc = std::min(kKC, k1 - kb);
    const bool first = kb == k0;
    const int64_t g1 = std::min(M, g0 + kMG);
    for (int64_t j = 0; j < n16; j += 16) {
      for (int64_t m0 = g0; m0 < g1; m0 += 6) {
        const float* x = mw.x + m0 * K + kb;
        const float* w = mw.w + kb * N + j;
        float* y = out + m0 * N + j;
        tile_rows(int(std::min<int64_t>(6, g1 - m0)), x, K, w, N, y, N, kc, first);
      }
    }
  }
#endif
  if (n16 == N) return;
  scalar_columns(mw, n16, N, k0, k1, out);  // past the last 16-wide strip
}

// Columns [n0, n1) of y = x @ w, w [K, N], for more than kMG rows: BLIS-style.
// Each kPKC x (n1 - n0) block of w is packed into 16-column panels (one
// contiguous [kPKC, 16] stretch each, L1-sized), and every 6-row group of x
// runs the 6 x 16 register tile over a whole panel, so a block read from
// memory once serves all rows and the outputs are touched once per block.
void block_packed(const MatmulWork& mw, int64_t n0, int64_t n1, float* pack) {
  const int64_t M = mw.M, K = mw.K, N = mw.N;
  int64_t n16 = 0;  // without AVX2 every column goes to scalar_columns
#ifdef PAGEDJAX_AVX2
  n16 = (n1 - n0) & ~int64_t(15);
  for (int64_t k0 = 0; k0 < K; k0 += kPKC) {
    const int64_t kc = std::min(kPKC, K - k0);
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = mw.w + (k0 + k) * N + n0;
      for (int64_t j = 0; j < n16; j += 16) {
        float* dst = pack + j * kc + k * 16;
        _mm256_storeu_ps(dst, _mm256_loadu_ps(src + j));
        _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(src + j + 8));
      }
    }
    const bool first = k0 == 0;
    for (int64_t j = 0; j < n16; j += 16) {
      const float* b = pack + j * kc;
      for (int64_t m0 = 0; m0 < M; m0 += 6) {
        const float* x = mw.x + m0 * K + k0;
        float* y = mw.y + m0 * N + n0 + j;
        tile_rows(int(std::min<int64_t>(6, M - m0)), x, K, b, 16, y, N, kc, first);
      }
    }
  }
#endif
  if (n0 + n16 == n1) return;
  scalar_columns(mw, n0 + n16, n1, 0, K, mw.y);  // past the last 16-wide panel
}

// Rows [n0, n1) of w [N, K]: y[:, n0:n1] = x @ w[n0:n1]^T.
void block_nt(const MatmulWork& mw, int64_t n0, int64_t n1) {
  const int64_t M = mw.M, K = mw.K, N = mw.N;
  int64_t n4 = n0;
#ifdef PAGEDJAX_AVX2
  if (K % 8 == 0) {
    for (; n4 + 4 <= n1; n4 += 4) {
      const float* w0 = mw.w + n4 * K;
      const float* w1 = w0 + K;
      const float* w2 = w1 + K;
      const float* w3 = w2 + K;
      int64_t m = 0;
      for (; m + 2 <= M; m += 2) {
        const float* xa = mw.x + m * K;
        const float* xb = xa + K;
        const __m256 s = pagedjax_tile::dot2x4(xa, xb, w0, w1, w2, w3, K);
        _mm_storeu_ps(mw.y + m * N + n4, _mm256_castps256_ps128(s));
        _mm_storeu_ps(mw.y + (m + 1) * N + n4, _mm256_extractf128_ps(s, 1));
      }
      if (m < M) {  // the last odd row: the same sums as its pair would give
        _mm_storeu_ps(mw.y + m * N + n4,
                      pagedjax_tile::dot1x4(mw.x + m * K, w0, w1, w2, w3, K));
      }
    }
  }
#endif
  for (int64_t n = n4; n < n1; ++n)  // rows past the last group of 4
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += mw.x[m * K + k] * mw.w[n * K + k];
      mw.y[m * N + n] = acc;
    }
}

void MatmulWork::run() {
  std::vector<float> pack;
  for (int64_t t; (t = claim()) >= 0; finish()) {
    if (packed) {
      if (pack.empty()) pack.resize(kPKC * kPNC);
      block_packed(*this, t * kPNC, std::min(N, (t + 1) * kPNC), pack.data());
    } else if (transposed) {
      block_nt(*this, t * kNB, std::min(N, (t + 1) * kNB));
    } else {
      const int64_t per = (K + parts - 1) / parts;
      float* out = t == 0 ? y : partial.data() + (t - 1) * M * N;
      part_nn(*this, t * per, std::min(K, (t + 1) * per), out);
    }
  }
}

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                      ffi::Result<ffi::Buffer<ffi::F32>> y, int32_t transposed) {
  auto wd = w.dimensions();
  int64_t M, K;
  const int64_t N = wd.size() == 2 ? (transposed ? wd[0] : wd[1]) : -1;
  if (wd.size() != 2 || !pagedjax_matmul_ffi::xy_shapes(x, y, N, &M, &K) ||
      (transposed ? wd[1] : wd[0]) != K)
    return ffi::Error::InvalidArgument(
        "cpu_native matmul: expected x [M, K], w [K, N] (or [N, K]), y [M, N]");
  auto work = std::make_shared<MatmulWork>();
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->y = y->typed_data();
  work->M = M;
  work->K = K;
  work->N = N;
  work->transposed = transposed != 0;
  if (pagedjax_matmul_ffi::empty_product(M, K, N, work->y)) return ffi::Error::Success();
  if (work->transposed) {
    work->n_tasks = (N + kNB - 1) / kNB;
  } else if (M > kMG) {
    work->packed = true;
    work->n_tasks = (N + kPNC - 1) / kPNC;
  } else {
    // The split depends on K and the pool only (never on M), so a row's sum
    // runs in the same order whatever else is in a batch of up to kMG rows
    // (block_packed's order is fixed too, but differs from this one).
    work->parts = std::clamp<int64_t>(pool.num_threads(), 1, std::max<int64_t>(1, K / 128));
    work->n_tasks = work->parts;
    work->partial.assign((work->parts - 1) * M * N, 0.0f);
  }
  pagedjax_parallel::run_on_pool(work, pool, pagedjax_matmul_ffi::worth_helpers(M, K, N));
  float* yp = work->y;
  for (int64_t p = 1; p < work->parts; ++p) {
    const float* src = work->partial.data() + (p - 1) * M * N;
    for (int64_t i = 0; i < M * N; ++i) yp[i] += src[i];
  }
  return ffi::Error::Success();
}

}  // namespace

namespace {

// Runs the matmul paths once on a small problem against a plain loop: 0 = fine.
int self_test_matmul(int64_t M, int64_t K, int64_t N, bool transposed) {
  std::vector<float> x(M * K), w(K * N), y(M * N), ref(M * N, 0.0f);
  for (int64_t i = 0; i < M * K; ++i) x[i] = float((i * 7) % 13) * 0.25f - 1.5f;
  for (int64_t i = 0; i < K * N; ++i) w[i] = float((i * 5) % 11) * 0.125f - 0.5f;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        ref[m * N + n] += x[m * K + k] * (transposed ? w[n * K + k] : w[k * N + n]);
  MatmulWork mw;
  mw.x = x.data();
  mw.w = w.data();
  mw.y = y.data();
  mw.M = M;
  mw.K = K;
  mw.N = N;
  mw.transposed = transposed;
  if (transposed) {
    mw.n_tasks = (N + kNB - 1) / kNB;
  } else if (M > kMG) {
    mw.packed = true;
    mw.n_tasks = (N + kPNC - 1) / kPNC;
  } else {
    mw.n_tasks = 1;
  }
  mw.run();
  for (int64_t i = 0; i < M * N; ++i)
    if (std::fabs(y[i] - ref[i]) > 1e-3f * (1.0f + std::fabs(ref[i]))) return 1;
  return 0;
}

}  // namespace

// Run once in a child process right after a build (kernels_pallas/cpu/build.py):
// executes the vectorized paths this build was compiled with, so an instruction
// the CPU or the OS does not support kills the child, not the user's process.
// 0 when every result matches a plain loop.
extern "C" int PagedjaxSelfTest() {
  int bad = 0;
  bad |= self_test_matmul(3, 40, 37, false);    // few rows: K parts, 16-column tiles
  bad |= self_test_matmul(12, 300, 70, false);  // packed blocks
  bad |= self_test_matmul(5, 64, 9, true);      // w [N, K]
  bad |= pagedjax_isa::avx512_self_test();  // -march=native may have turned AVX-512 on
  return bad;
}

// 1 when the matmul has its vectorized paths (x86-64 with AVX2 + FMA); the
// portable fallback is scalar, and the runner then keeps XLA's matmuls.
PAGEDJAX_VECTORIZED_ENTRY(PagedjaxFastMatmul)

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxMatmul, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("transposed"));
