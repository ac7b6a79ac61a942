// Matmul with GGUF block-quantized weights for the CPU, called from XLA through
// the FFI (kernels_pallas/cpu/blockmatmul.py).
//
//   y[M, N] = x[M, K] @ W[K, N]          (transposed = 0: a Linear kernel, W quantized along K)
//   y[M, N] = x[M, K] @ W[N, K]^T        (transposed = 1: the tied LM head, W's rows quantized)
//   x f32, W = models/quant.py's components of kind q8_0 | q4_0 | q4_1 | q4_k | q6_k
//   or int4 groups of `group` rows (AWQ / GPTQ, int4_g<group>), y f32.
//
// Why: the weights of a GGUF file are 4.5-8.5 bits a value; dequantized to
// float32 at load, every decode step reads 4-7x the bytes. Here the blocks
// stay as they are in memory and are widened to float32 in registers
// (blocks.h), a 32-row x 16-column block at a time into an L1-resident panel
// that every row of x then reuses through a float32 register tile
// (block_tiles.h: up to 6 rows x 16 or 32 columns, f32 FMA chains; one row of
// x reads the blocks in place instead, see below). So a weight is read
// once per call at its quantized size, widened once per call, and multiplied
// in float32: the result is the dequantized weight's product up to summation
// order.
//
// Work split: x is packed once by groups of 6 rows ([groups][K][6], so that
// the tile's broadcasts sit at fixed offsets). W [K, N] is split along N into
// tasks of kNC columns claimed from XLA's intra-op pool (many small tasks: on
// a busy machine a late thread takes fewer), each walking K kKB blocks at a
// time (AVX-512: two 16-column strips a tile). For one row of x, W [K, N] is
// split along K instead, into chunks of kKB blocks (each one run of memory,
// read in order with the next rows prefetched), whose sums are added in order
// at the end. Every output of W [K, N] is the same sum whatever the batch and
// the pool: one FMA chain from zero over each chunk of kKB * 32 values of k,
// in order, the chunks added in order. W [N, K] is split along N into tasks of
// kNB rows (kNBFew for a few rows of x: longer runs of memory), 4 rows
// widened at a time and dotted with up to 6 rows of x at a
// time (AVX-512: 16-lane chains, dots_nt; AVX2: 8-lane, dot2x4 / dot1x4), the
// same sums at every row count. So a row's result does not depend on the rest
// of the batch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "block_tiles.h"
#include "blocks.h"
#include "isa.h"
#include "matmul_ffi.h"
#include "parallel.h"
#include "simd.h"
#include "tile.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using pagedjax_blocks::Comps;
using namespace pagedjax_block_tiles;

namespace {

constexpr int64_t kKB = kPanelK / 32;  // 32-blocks per panel (W [K, N]): a 128 x 16 float panel (8 KiB)
constexpr int64_t kNB = 64;  // W rows per task (W [N, K])
constexpr int64_t kNBFew = 256;  // W [N, K], at most kFewRows rows of x: longer runs of memory
constexpr int64_t kFewRows = 4;
constexpr int64_t kNC = 64;  // W columns per task (W [K, N])

struct BlockWork : pagedjax_parallel::Tasks {
  const float* x;
  Comps w;
  float* y;
  int64_t M, K, N;
  bool transposed;
  std::vector<float> partials;  // one row of x, W [K, N]: each chunk's sums [tasks][N]
  int64_t rows_per_task = kNB;  // W [N, K]
  std::vector<float> xp;  // W [K, N]: x packed [(M + 5) / 6][K][6] (rows past M: zero)
  void run();
};

// out[m, n0:n0+cols] (+)= x[m, k0:k0+kc] @ panel[0:kc, 0:cols] for every row m,
// panel rows 16 floats apart: the register tile on the packed x (AVX2 / AVX-512),
// or plain loops.
void panel_product(const BlockWork& w, const float* panel, int64_t k0, int64_t kc, int64_t n0,
                   int64_t cols, float* out, bool first) {
  const int64_t M = w.M, K = w.K, N = w.N;
#ifdef PAGEDJAX_AVX2
  if (cols == 16) {
    for (int64_t m0 = 0; m0 < M; m0 += 6)
      with_rows(int(std::min<int64_t>(6, M - m0)), [&](auto R) {
        tile_packed<R>(w.xp.data() + m0 * K + k0 * 6, panel, out + m0 * N + n0, N, kc, first);
      });
    return;
  }
#endif
  for (int64_t m = 0; m < M; ++m) {
    float* y = out + m * N + n0;
    const float* xr = w.x + m * K + k0;
    for (int64_t j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < kc; ++k) acc = std::fma(xr[k], panel[k * 16 + j], acc);
      y[j] = first ? acc : y[j] + acc;
    }
  }
}

// xp[g][k][r] = x[6g + r, k] (rows past M: zero).
void pack_x(BlockWork& w) {
#ifdef PAGEDJAX_AVX2
  const int64_t groups = (w.M + 5) / 6, K = w.K;
  w.xp.assign(groups * K * 6, 0.0f);
  for (int64_t m = 0; m < w.M; ++m) {
    float* dst = w.xp.data() + (m / 6) * K * 6 + m % 6;
    const float* src = w.x + m * K;
    for (int64_t k = 0; k < K; ++k) dst[k * 6] = src[k];
  }
#else
  (void)w;
#endif
}

// Columns [n0, n1) of y = x @ W [K, N]: K kKB blocks at a time (the packed x's
// slice stays in cache for every strip), 16 columns at a time.
void columns_nn(const BlockWork& w, int64_t n0, int64_t n1) {
  const int64_t N = w.N, K = w.K;
  alignas(64) float panel[kPanel];
  for (int64_t kb = 0; kb < K; kb += kKB * 32) {
    const int64_t kc = std::min(kKB * 32, K - kb);
    int64_t n = n0;
#ifdef PAGEDJAX_AVX512
    for (; n + 16 * kStrips <= n1; n += 16 * kStrips) {  // kStrips strips a tile
      alignas(64) float panels[kStrips][kPanel];
      for (int s = 0; s < kStrips; ++s)
        for (int64_t b = 0; b < kc / 32; ++b)
          pagedjax_blocks::decode_cols(w.w, N, kb / 32 + b, n + 16 * s, panels[s] + b * 32 * 16);
      for (int64_t m0 = 0; m0 < w.M; m0 += 6)
        with_rows(int(std::min<int64_t>(6, w.M - m0)), [&](auto R) {
          tile_wide<R>(w.xp.data() + m0 * K + kb * 6, panels[0], w.y + m0 * N + n, N, kc, kb == 0);
        });
    }
#endif
    for (; n < n1; n += 16) {
      const int64_t cols = std::min<int64_t>(16, n1 - n);
      for (int64_t b = 0; b < kc / 32; ++b) {
        if (cols == 16)
          pagedjax_blocks::decode_cols(w.w, N, kb / 32 + b, n, panel + b * 32 * 16);
        else  // the last columns (N % 16), one value at a time
          pagedjax_blocks::decode_cols_tail(w.w, N, kb / 32 + b, n, cols, panel + b * 32 * 16);
      }
      panel_product(w, panel, kb, kc, n, cols, w.y, kb == 0);
    }
  }
}

#ifdef PAGEDJAX_AVX2
// One row of x: the product over blocks [b0, b1) of W [K, N] (one chunk of kKB
// blocks), every column, into acc[0:N]. The chunk's rows are one run of memory,
// read in order four elements of k at a time, the blocks' factors widened once
// into `f` (48 floats a strip). Tasks of columns would each read a little of
// every row instead, N values apart, which costs DRAM most of its bandwidth.
// Each output is the FMA chain over the chunk's k in order from zero that
// columns_nn forms from the same widened values, so the bits are the same as
// at any other row count.
template <int Kind>
void chunk_row_kind(const BlockWork& w, int64_t b0, int64_t b1, float* acc, float* f) {
  using pagedjax_blocks::v16f;
  const int64_t N = w.N, K = w.K, strips = N / 16;
  std::memset(acc, 0, sizeof(float) * N);
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t s = 0; s < strips; ++s) {
      v16f a, a2, cc;
      pagedjax_blocks::cols_scales(w.w, N, b, 16 * s, &a, &a2, &cc);
      std::memcpy(f + 48 * s, &a, 64);
      std::memcpy(f + 48 * s + 16, &a2, 64);
      std::memcpy(f + 48 * s + 32, &cc, 64);
    }
    const float* xb = w.x + 32 * b;
    for (int e0 = 0; e0 < 32; e0 += 4) {
      const int half = e0 < 16 ? 0 : 16;
      const pagedjax_blocks::Ahead ahead = pagedjax_blocks::rows_ahead(w.w, N, b, e0 / 4, K / 32);
      const v16f xe[4] = {pagedjax_blocks::splat(xb[e0]), pagedjax_blocks::splat(xb[e0 + 1]),
                          pagedjax_blocks::splat(xb[e0 + 2]), pagedjax_blocks::splat(xb[e0 + 3])};
      for (int64_t s = 0; s < strips; ++s) {
        if (s % 4 == 0) pagedjax_blocks::prefetch(ahead, 16 * s, 64);
        v16f sum, a, cc;
        std::memcpy(&sum, acc + 16 * s, 64);
        std::memcpy(&a, f + 48 * s + half, 64);
        std::memcpy(&cc, f + 48 * s + 32, 64);
        for (int e = e0; e < e0 + 4; ++e) {
          const v16f q =
              pagedjax_blocks::to_f(pagedjax_blocks::cols_codes<Kind>(w.w, N, b, e, 16 * s));
          const v16f v = Kind == pagedjax_blocks::kQ8_0 ? a * q : a * q + cc;
          sum = xe[e - e0] * v + sum;
        }
        std::memcpy(acc + 16 * s, &sum, 64);
      }
    }
    if (16 * strips < N) {  // the last columns (N % 16), one value at a time
      alignas(64) float panel[32 * 16];
      pagedjax_blocks::decode_cols_tail(w.w, N, b, 16 * strips, N - 16 * strips, panel);
      for (int64_t j = 0; j < N - 16 * strips; ++j) {
        float sum = acc[16 * strips + j];
        for (int e = 0; e < 32; ++e) sum = std::fma(xb[e], panel[e * 16 + j], sum);
        acc[16 * strips + j] = sum;
      }
    }
  }
}

void chunk_row(const BlockWork& w, int64_t b0, int64_t b1, float* acc, float* f) {
  using namespace pagedjax_blocks;
  switch (w.w.kind) {
    case kQ8_0: chunk_row_kind<kQ8_0>(w, b0, b1, acc, f); break;
    case kQ4_0: chunk_row_kind<kQ4_0>(w, b0, b1, acc, f); break;
    case kQ4_1: chunk_row_kind<kQ4_1>(w, b0, b1, acc, f); break;
    case kQ4_K: chunk_row_kind<kQ4_K>(w, b0, b1, acc, f); break;
    case kQ6_K: chunk_row_kind<kQ6_K>(w, b0, b1, acc, f); break;
    default: chunk_row_kind<kI4>(w, b0, b1, acc, f);
  }
}
#endif

// y[:, n0:n1] = x @ W[n0:n1]^T for rows of W [N, K]; buf holds (n1 - n0) * K floats.
void block_nt(const BlockWork& w, int64_t n0, int64_t n1, float* buf) {
  const int64_t M = w.M, K = w.K, N = w.N;
  int64_t n = n0;
#ifdef PAGEDJAX_AVX512
  // Many rows of x: every group of 4 rows of the task widened first, then each group
  // of 6 rows of x through all of them (x's group stays in L1; read once per group of
  // 4 table rows, x streamed from L2 again and again). A few rows: 4 table rows at a
  // time (the widened rows stay in L1).
  const int64_t span = M > kFewRows ? (n1 - n0) / 4 * 4 : 4;
  for (; span > 0 && n + span <= n1; n += span) {
    for (int64_t r = 0; r < span; ++r) pagedjax_blocks::decode_row(w.w, K, n + r, buf + r * K);
    for (int64_t m = 0; m < M; m += 6)
      for (int64_t g = 0; g < span / 4; ++g)
        with_rows(int(std::min<int64_t>(6, M - m)), [&](auto R) {
          dots_nt<R>(w.x + m * K, K, buf + 4 * g * K, w.y + m * N + n + 4 * g, N);
        });
  }
#elif defined(PAGEDJAX_AVX2)
  for (; n + 4 <= n1; n += 4) {
    for (int r = 0; r < 4; ++r) pagedjax_blocks::decode_row(w.w, K, n + r, buf + r * K);
    const float *w0 = buf, *w1 = buf + K, *w2 = buf + 2 * K, *w3 = buf + 3 * K;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) {
      const float* xa = w.x + m * K;
      const __m256 s = pagedjax_tile::dot2x4(xa, xa + K, w0, w1, w2, w3, K);
      _mm_storeu_ps(w.y + m * N + n, _mm256_castps256_ps128(s));
      _mm_storeu_ps(w.y + (m + 1) * N + n, _mm256_extractf128_ps(s, 1));
    }
    if (m < M)  // the last odd row: its pair's sums
      _mm_storeu_ps(w.y + m * N + n, pagedjax_tile::dot1x4(w.x + m * K, w0, w1, w2, w3, K));
  }
#endif
  for (; n < n1; ++n) {  // rows past the last group of 4 (or all: no AVX2)
    pagedjax_blocks::decode_row(w.w, K, n, buf);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(w.x[m * K + k], buf[k], acc);
      w.y[m * N + n] = acc;
    }
  }
}

void BlockWork::run() {
  std::vector<float> buf;
  for (int64_t t; (t = claim()) >= 0; finish()) {
    if (transposed) {
      if (buf.empty()) buf.resize(rows_per_task * K);
      block_nt(*this, t * rows_per_task, std::min(N, (t + 1) * rows_per_task), buf.data());
#ifdef PAGEDJAX_AVX2
    } else if (!partials.empty()) {  // one row: chunk t of kKB blocks
      if (buf.empty()) buf.resize(3 * (N + 15));
      chunk_row(*this, t * kKB, std::min(K / 32, (t + 1) * kKB), partials.data() + t * N,
                buf.data());
#endif
    } else {
      columns_nn(*this, t * kNC, std::min(N, (t + 1) * kNC));
    }
  }
}

// Packs x (W [K, N]), splits the work (see the top) and runs it on `threads`
// workers (`schedule` hands a task to the pool).
template <typename Schedule>
void run_blockmatmul(const std::shared_ptr<BlockWork>& work, int64_t threads,
                     Schedule schedule) {
  BlockWork& w = *work;
  if (w.transposed) {
    w.rows_per_task = w.M <= kFewRows ? kNBFew : kNB;
    w.n_tasks = (w.N + w.rows_per_task - 1) / w.rows_per_task;
#ifdef PAGEDJAX_AVX2
  } else if (w.M == 1) {
    w.n_tasks = (w.K / 32 + kKB - 1) / kKB;
    w.partials.resize(w.n_tasks * w.N);
#endif
  } else {
    pack_x(w);
    w.n_tasks = (w.N + kNC - 1) / kNC;
  }
  pagedjax_parallel::run(work, threads, pagedjax_matmul_ffi::worth_helpers(w.M, w.K, w.N),
                         schedule);
  if (!w.partials.empty()) {  // the chunks' sums, in order (as columns_nn adds them)
    std::memcpy(w.y, w.partials.data(), sizeof(float) * w.N);
    for (int64_t t = 1; t < w.n_tasks; ++t)
      for (int64_t n = 0; n < w.N; ++n) w.y[n] += w.partials[t * w.N + n];
  }
}

std::shared_ptr<BlockWork> make_work(const float* x, Comps comps, float* y, int64_t M,
                                     int64_t K, int64_t N, bool transposed) {
  auto work = std::make_shared<BlockWork>();
  work->x = x;
  work->w = comps;
  work->y = y;
  work->M = M;
  work->K = K;
  work->N = N;
  work->transposed = transposed;
  return work;
}

ffi::Error BlockMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer c0,
                           ffi::AnyBuffer c1, ffi::AnyBuffer c2, ffi::AnyBuffer c3,
                           ffi::AnyBuffer c4, ffi::Result<ffi::Buffer<ffi::F32>> y,
                           int32_t kind, int32_t transposed, int64_t n_out, int64_t group) {
  if (kind < 0 || kind >= pagedjax_blocks::kNumKinds)
    return ffi::Error::InvalidArgument("cpu_blockmatmul: unknown block kind");
  int64_t M, K;
  const int64_t N = n_out;
  if (!pagedjax_matmul_ffi::xy_shapes(x, y, N, &M, &K) || K % pagedjax_blocks::block_of(kind))
    return ffi::Error::InvalidArgument("cpu_blockmatmul: expected x [M, K], y [M, N] and K "
                                       "a multiple of the block");
  if (kind == pagedjax_blocks::kI4 && (group <= 0 || group % 32 || K % group))
    return ffi::Error::InvalidArgument("cpu_blockmatmul: int4 groups must be 32k rows dividing K");
  // Every component must hold exactly its share of the K x N values (blocks.h).
  const ffi::AnyBuffer* cs[5] = {&c0, &c1, &c2, &c3, &c4};
  Comps comps{kind, {}, group};
  for (int i = 0; i < pagedjax_blocks::kNumComps[kind]; ++i) {
    const int64_t want = K / pagedjax_blocks::div_of(comps, i) * N * pagedjax_blocks::kSize[kind][i];
    if (int64_t(cs[i]->size_bytes()) != want)
      return ffi::Error::InvalidArgument("cpu_blockmatmul: a component's size does not match");
    comps.c[i] = static_cast<const uint8_t*>(cs[i]->untyped_data());
  }
  if (pagedjax_matmul_ffi::empty_product(M, K, N, y->typed_data())) return ffi::Error::Success();
  auto work = make_work(x.typed_data(), comps, y->typed_data(), M, K, N, transposed != 0);
  run_blockmatmul(work, pool.num_threads(), pagedjax_matmul_ffi::on_pool(pool));
  return ffi::Error::Success();
}

// Deterministic bytes for a component (f16 scales: small positive normal numbers).
void fill(std::vector<uint8_t>& v, int64_t n, int size, uint32_t seed) {
  v.resize(n * size);
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    if (size == 2) {
      uint16_t h = uint16_t(0x2000 + ((seed >> 16) & 0x7ff));  // ~2^-7 .. 2^-6
      if (i % 7 == 3) h = uint16_t((seed >> 16) & 0x83ff);  // a subnormal (either sign)
      std::memcpy(v.data() + 2 * i, &h, 2);
    } else if (size == 4) {  // f32 scales: ~2^-8 .. 2^-7, either sign
      const float f = float(int32_t(seed >> 8) - (1 << 23)) * 0x1p-31f;
      std::memcpy(v.data() + 4 * i, &f, 4);
    } else {
      v[i] = uint8_t(seed >> 24);
    }
  }
}

// One problem of `kind` through the paths this build has, against value_cols /
// value_rows summed in double: 0 = fine.
int self_test_case(int kind, int64_t M, int64_t K, int64_t N, bool transposed, int64_t threads) {
  std::vector<uint8_t> store[5];
  Comps comps{kind, {}, 32 * (1 + kind % 2)};  // int4: groups of 64 rows
  for (int i = 0; i < pagedjax_blocks::kNumComps[kind]; ++i) {
    fill(store[i], K / pagedjax_blocks::div_of(comps, i) * N, pagedjax_blocks::kSize[kind][i],
         uint32_t(7 + 31 * i + kind));
    comps.c[i] = store[i].data();
  }
  std::vector<float> x(M * K), y(M * N, -1.0f);
  for (int64_t i = 0; i < M * K; ++i) x[i] = float((i * 7) % 13) * 0.25f - 1.5f;
  run_blockmatmul(make_work(x.data(), comps, y.data(), M, K, N, transposed), threads,
                  [](auto task) { task(); });
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = transposed ? pagedjax_blocks::value_rows(comps, K, n, k)
                                    : pagedjax_blocks::value_cols(comps, N, k, n);
        ref += double(x[m * K + k]) * v;
        mag += std::fabs(double(x[m * K + k]) * v);
      }
      if (!(std::fabs(y[m * N + n] - ref) <= 1e-5 * (1.0 + mag))) return 1;
    }
  return 0;
}

}  // namespace

// Run once in a child process right after a build (kernels_pallas/cpu/build.py):
// every kind through the widening (vector blocks and the scalar column tail), the
// register tiles of 1-6 rows, tasks of columns and the transposed
// path, so an instruction the CPU or the OS does not support kills the child, not
// the serving process. 0 when every result matches the plain formulas.
extern "C" int PagedjaxSelfTest() {
  int bad = 0;
  for (int kind = 0; kind < pagedjax_blocks::kNumKinds; ++kind) {
    const int64_t K = pagedjax_blocks::block_of(kind) * 2;
    bad |= self_test_case(kind, 3, K, 70, false, 2) << 1;  // two tasks, 16-col strips + tail
    bad |= self_test_case(kind, 8, K, 16, false, 1) << 2;  // a 6-row and a 2-row tile
    bad |= self_test_case(kind, 5, K, 9, true, 1) << 3;    // W [N, K]: groups of 4 + rows
    const int64_t chunks = pagedjax_blocks::block_of(kind) == 32 ? 320 : 512;  // 3-4 chunks
    bad |= self_test_case(kind, 1, chunks, 150, false, 2) << 5;  // one row: chunks + the tail
    bad |= self_test_case(kind, 3, chunks, 40, false, 2) << 6;   // rows: chunks, wide tiles
    bad |= self_test_case(kind, 7, chunks, 50, true, 2) << 7;    // W [N, K]: groups of 4
  }
  bad |= pagedjax_isa::avx512_self_test() << 4;  // -march=native may have turned AVX-512 on
  return bad;
}

// 1 when the kernel has its vectorized (AVX2 + FMA) register tiles.
PAGEDJAX_VECTORIZED_ENTRY(PagedjaxFastBlockMatmul)

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxBlockMatmul, BlockMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("transposed")
                                  .Attr<int64_t>("n_out")
                                  .Attr<int64_t>("group"));
