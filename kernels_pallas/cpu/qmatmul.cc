// Few-row matmul with int8 weights for the CPU, called from XLA through the FFI.
//
//   y[M, N] = (x[M, K] @ q[K, N]) * scale[N]           (transposed = 0)
//   y[M, N] = (x[M, K] @ q[N, K]^T) * scale[N]         (transposed = 1: the tied LM head)
//   x f32, q s8, scale f32 (per output channel: models/quant.py's "int8"), y f32.
//
// Why: a decode step multiplies a handful of rows by every weight, so it is
// bound by reading the weights; int8 weights are a quarter of float32's
// bytes. XLA would widen a whole weight to f32 first (or chunk by chunk,
// models/quant.py) and then read the f32 copy. Here each weight element is
// read from memory once per call, as int8, and widened to f32 a small block at
// a time into an L1-resident panel (AVX-512: 16 values per instruction; AVX2:
// 8; portable: a plain loop), which every row of x then reuses; the sums are
// f32 FMA chains, the scale multiplies each output once at the end.
//
// Work split, as in matmul.cc's float32 few-row matmul: q [K, N] is split
// along K into one contiguous part per thread of XLA's intra-op pool (partial
// sums added at the end), each part read kKC rows at a time (kKC sequential
// streams), 6 x 16 register tiles (up to 6 rows of x: each 16-column strip
// widened in registers; more: widened once into the panel, which every 6-row
// group reuses); q [N, K] is split along N into tasks of kNB rows, 4 rows of q
// at a time (widened in registers for up to 2 rows of x, else into a buffer)
// dotted with 2 rows of x at a time. The split depends on K, N and the pool
// only (never on M), and every path sums in the same order: a row's result
// does not depend on the batch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "isa.h"
#include "matmul_ffi.h"
#include "parallel.h"
#include "simd.h"
#include "tile.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kKC = 16;  // q rows per pass (q [K, N]); the panel is kKC x 16 floats
constexpr int64_t kNB = 64;  // q rows per task (q [N, K])

// dst[0:n] = float(src[0:n]): exact (every int8 is a float).
inline void widen(const int8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
  }
#elif defined(PAGEDJAX_AVX2)
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
  }
#endif
  for (; i < n; ++i) dst[i] = float(src[i]);
}

struct QWork : pagedjax_parallel::Tasks {
  const float* x;
  const int8_t* q;
  const float* scale;
  float* y;
  int64_t M, K, N;
  bool transposed;
  int64_t parts = 1;           // q [K, N]: K split into this many contiguous parts
  std::vector<float> partial;  // parts 1.. write here; part 0 writes y
  void run();
};

#ifdef PAGEDJAX_AVX2
using pagedjax_tile::load8f;
#ifdef __AVX512F__
using pagedjax_tile::load16f;
#endif
using pagedjax_tile::tile_rows;
#endif

// out[:, n0:n1] = x[:, k0:k1] @ q[k0:k1, n0:n1], plain loops: the columns past the
// last 16-wide strip (and everything without AVX2).
void scalar_columns(const QWork& w, int64_t n0, int64_t n1, int64_t k0, int64_t k1, float* out) {
  const int64_t K = w.K, N = w.N;
  for (int64_t m = 0; m < w.M; ++m) {
    float* y = out + m * N;
    for (int64_t n = n0; n < n1; ++n) y[n] = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      const float a = w.x[m * K + k];
      const int8_t* q = w.q + k * N;
      for (int64_t n = n0; n < n1; ++n) y[n] += a * float(q[n]);
    }
  }
}

// Rows [k0, k1) of q [K, N] into out [M, N] = x[:, k0:k1] @ q[k0:k1] (unscaled).
void part_nn(const QWork& w, int64_t k0, int64_t k1, float* out) {
  int64_t n16 = 0;
#ifdef PAGEDJAX_AVX2
  const int64_t M = w.M, K = w.K, N = w.N;
  n16 = N & ~int64_t(15);
  alignas(64) float panel[kKC * 16];
  for (int64_t kb = k0; kb < k1; kb += kKC) {
    const int64_t kc = std::min(kKC, k1 - kb);
    const bool first = kb == k0;
    for (int64_t j = 0; j < n16; j += 16) {
      if (M <= 6) {  // one row group: widen in registers
        tile_rows(int(M), w.x + kb, K, w.q + kb * N + j, N, out + j, N, kc, first);
        continue;
      }
      for (int64_t k = 0; k < kc; ++k) widen(w.q + (kb + k) * N + j, 16, panel + k * 16);
      for (int64_t m0 = 0; m0 < M; m0 += 6)
        tile_rows(int(std::min<int64_t>(6, M - m0)), w.x + m0 * K + kb, K, panel, 16,
                  out + m0 * N + j, N, kc, first);
    }
  }
#endif
  if (n16 == w.N) return;
  scalar_columns(w, n16, w.N, k0, k1, out);
}

#ifdef PAGEDJAX_AVX2
// y[m0:M, n:n+4] = (x[m0:M] @ rows^T) * sc for 4 rows of q of K values each (K % 8 == 0),
// read as floats (widened in a buffer) or as int8 (widened here): the same sums.
template <typename T>
void rows4_nt(const QWork& w, const T* w0, const T* w1, const T* w2, const T* w3, int64_t n,
              int64_t m0) {
  const int64_t M = w.M, K = w.K, N = w.N;
  const __m128 sc = _mm_loadu_ps(w.scale + n);
  int64_t m = m0;
  for (; m + 2 <= M; m += 2) {
    const float* xa = w.x + m * K;
    const float* xb = xa + K;
    const __m256 s = pagedjax_tile::dot2x4(xa, xb, w0, w1, w2, w3, K);
    _mm_storeu_ps(w.y + m * N + n, _mm_mul_ps(_mm256_castps256_ps128(s), sc));
    _mm_storeu_ps(w.y + (m + 1) * N + n, _mm_mul_ps(_mm256_extractf128_ps(s, 1), sc));
  }
  if (m < M) {  // the last odd row: the same sums as its pair would give
    const __m128 s = pagedjax_tile::dot1x4(w.x + m * K, w0, w1, w2, w3, K);
    _mm_storeu_ps(w.y + m * N + n, _mm_mul_ps(s, sc));
  }
}
#endif

// Rows [n0, n1) of q [N, K]: y[:, n0:n1] = (x @ q[n0:n1]^T) * scale[n0:n1]; buf holds
// 4*K floats. Up to 2 rows of x widen q in registers (each value is used once or
// twice); more rows widen 4 rows of q into buf once and reuse them.
void block_nt(const QWork& w, int64_t n0, int64_t n1, float* buf) {
  const int64_t M = w.M, K = w.K, N = w.N;
  int64_t n4 = n0;
#ifdef PAGEDJAX_AVX2
  if (K % 8 == 0) {
    for (; n4 + 4 <= n1; n4 += 4) {
      const int8_t* q = w.q + n4 * K;
      if (M <= 2) {
        rows4_nt(w, q, q + K, q + 2 * K, q + 3 * K, n4, 0);
      } else {
        widen(q, 4 * K, buf);  // 4 contiguous rows of q
        rows4_nt(w, buf, buf + K, buf + 2 * K, buf + 3 * K, n4, 0);
      }
    }
  }
#endif
  for (int64_t n = n4; n < n1; ++n) {  // rows past the last group of 4 (or all: no AVX2)
    widen(w.q + n * K, K, buf);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += w.x[m * K + k] * buf[k];
      w.y[m * N + n] = acc * w.scale[n];
    }
  }
  (void)N;
}

void QWork::run() {
  std::vector<float> buf;
  for (int64_t t; (t = claim()) >= 0; finish()) {
    if (transposed) {
      if (buf.empty()) buf.resize(4 * K);
      block_nt(*this, t * kNB, std::min(N, (t + 1) * kNB), buf.data());
    } else {
      const int64_t per = (K + parts - 1) / parts;
      float* out = t == 0 ? y : partial.data() + (t - 1) * M * N;
      part_nn(*this, std::min(K, t * per), std::min(K, (t + 1) * per), out);
    }
  }
}

// Splits the work (see the top), runs it on `threads` workers (`schedule` hands a
// task to the pool; null: this thread only), adds the K parts and applies the scale.
template <typename Schedule>
void run_qmatmul(const std::shared_ptr<QWork>& work, int64_t threads, Schedule schedule) {
  QWork& w = *work;
  if (w.transposed) {
    w.n_tasks = (w.N + kNB - 1) / kNB;
  } else {
    w.parts = std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, w.K / 128));
    w.n_tasks = w.parts;
    w.partial.assign((w.parts - 1) * w.M * w.N, 0.0f);
  }
  pagedjax_parallel::run(work, threads, w.M * w.K * w.N >= (1 << 16), schedule);
  if (w.transposed) return;
  for (int64_t m = 0; m < w.M; ++m) {
    float* y = w.y + m * w.N;
    for (int64_t p = 1; p < w.parts; ++p) {
      const float* src = w.partial.data() + (p - 1) * w.M * w.N + m * w.N;
      for (int64_t n = 0; n < w.N; ++n) y[n] += src[n];
    }
    for (int64_t n = 0; n < w.N; ++n) y[n] *= w.scale[n];
  }
}

std::shared_ptr<QWork> make_work(const float* x, const int8_t* q, const float* scale, float* y,
                                 int64_t M, int64_t K, int64_t N, bool transposed) {
  auto work = std::make_shared<QWork>();
  work->x = x;
  work->q = q;
  work->scale = scale;
  work->y = y;
  work->M = M;
  work->K = K;
  work->N = N;
  work->transposed = transposed;
  return work;
}

ffi::Error QMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q,
                       ffi::Buffer<ffi::F32> scale, ffi::Result<ffi::Buffer<ffi::F32>> y,
                       int32_t transposed) {
  auto qd = q.dimensions(), sd = scale.dimensions();
  int64_t M, K;
  const int64_t N = qd.size() == 2 ? (transposed ? qd[0] : qd[1]) : -1;
  if (qd.size() != 2 || sd.size() != 1 || !pagedjax_matmul_ffi::xy_shapes(x, y, N, &M, &K) ||
      (transposed ? qd[1] : qd[0]) != K || sd[0] != N)
    return ffi::Error::InvalidArgument(
        "cpu_qmatmul: expected x [M, K], q [K, N] (or [N, K]), scale [N], y [M, N]");
  if (pagedjax_matmul_ffi::empty_product(M, K, N, y->typed_data())) return ffi::Error::Success();
  auto work = make_work(x.typed_data(), q.typed_data(), scale.typed_data(), y->typed_data(), M,
                        K, N, transposed != 0);
  run_qmatmul(work, pool.num_threads(), pagedjax_matmul_ffi::on_pool(pool));
  return ffi::Error::Success();
}

// One problem through every path this build has (K parts on `threads` parts, the
// 16-column tiles and their scalar tail, the 4-row and the scalar transposed
// blocks), against a plain loop in double: 0 = fine.
int self_test_case(int64_t M, int64_t K, int64_t N, bool transposed, int64_t threads) {
  std::vector<float> x(M * K), scale(N), y(M * N, -1.0f);
  std::vector<int8_t> q(K * N);
  for (int64_t i = 0; i < M * K; ++i) x[i] = float((i * 7) % 13) * 0.25f - 1.5f;
  for (int64_t i = 0; i < K * N; ++i) q[i] = int8_t((i * 37) % 255 - 127);
  for (int64_t n = 0; n < N; ++n) scale[n] = 0.01f * float(1 + n % 5);
  auto work = make_work(x.data(), q.data(), scale.data(), y.data(), M, K, N, transposed);
  run_qmatmul(work, threads, [](auto task) { task(); });
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0.0;
      for (int64_t k = 0; k < K; ++k)
        ref += double(x[m * K + k]) * double(transposed ? q[n * K + k] : q[k * N + n]);
      ref *= scale[n];
      if (std::fabs(y[m * N + n] - ref) > 1e-4 * (1.0 + std::fabs(ref)) * std::sqrt(double(K)))
        return 1;
    }
  return 0;
}

}  // namespace

// Run once in a child process right after a build (kernels_pallas/cpu/build.py's
// builder): executes the vectorized paths this build was compiled with, so an
// instruction the CPU or the OS does not support kills the child, not the
// serving process. 0 when every result matches a plain loop.
extern "C" int PagedjaxSelfTest() {
  int bad = 0;
  bad |= self_test_case(3, 40, 37, false, 1);     // one part: 16-column tiles + tail
  bad |= self_test_case(13, 300, 70, false, 2);   // two K parts, 6-row tiles + a 1-row tile
  bad |= self_test_case(5, 64, 9, true, 1);       // q [N, K]: 4-row blocks + scalar rows
  bad |= self_test_case(2, 20, 6, true, 1) << 1;  // K % 8 != 0: the scalar transposed path
  {  // widening: every int8 value, the vector blocks and the scalar tail
    int8_t codes[259];
    float wide[259];
    for (int b = 0; b < 259; ++b) codes[b] = int8_t(b % 256 - 128);
    widen(codes, 259, wide);
    for (int b = 0; b < 259; ++b) bad |= wide[b] != float(b % 256 - 128) ? 4 : 0;
  }
  bad |= pagedjax_isa::avx512_self_test() << 3;  // -march=native may have turned AVX-512 on
  return bad;
}

// 1 when the kernel has its vectorized paths (x86-64 with AVX2 + FMA).
PAGEDJAX_VECTORIZED_ENTRY(PagedjaxFastQMatmul)

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxQMatmul, QMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("transposed"));
