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
// (blocks.h), a 32-row x 16-column block at a time into a panel that every row
// of x then reuses through a float32 register tile (block_tiles.h: up to 12
// rows x 32 columns, or 6 rows x 16 or 32, f32 FMA chains). So a weight is read once per call
// at its quantized size, widened once per call, and multiplied in float32: the
// result is the dequantized weight's product up to summation order.
//
// A few rows of x through W [K, N] (up to kChunkRows: the decode steps of a few
// streams) read the blocks in place instead and factor the scales out of their
// sums: with a
// weight value a * q + c (blocks.h; a per 16 or 32 values of k, c per 32),
// each 32-block of k contributes
//
//   a * S + c * X,   S = x[0:32] . q[0:32] (q6_k: a * S_lo + a2 * S_hi, 16 each),
//                    X = block_sum(x[0:32])
//
// -- the dequantized weight's product in real arithmetic, with one FMA a value
// and row instead of two (widen a * q + c, then multiply): the arithmetic, not
// DRAM, bounds a few rows. Its float32 rounding differs from the panels'
// (within the same tolerance of the float64 product; not bit for bit).
//
// Work split: many rows of x (more than kChunkRows for W [K, N], more than
// kDotRows for the table W [N, K]) run on panels: x is packed once by groups of 6
// rows ([groups][K][6], so that the tile's broadcasts sit at fixed offsets), W is
// split along N into tasks of kNC columns (table rows) claimed from XLA's
// intra-op pool (many small tasks: on a busy machine a late thread takes fewer).
// AVX-512 with K <= kFullK: a task widens its strips over all of K (the table's
// rows widened whole, then transposed into columns) and runs them through every
// row of x two strips and 12 rows at a time (tile_tall), so each output is written
// once; else K kKB blocks at a time. A few
// rows of x through W [K, N] (chunk_rows, AVX2) split W along K instead, into
// an even number of chunks of up to kChunkKB blocks (chunk_blocks; each one run of
// memory, read once for all the rows, in order with the next rows prefetched),
// whose sums are added in order at the end. A few rows through the table: up to
// kRowsFewMax rows of x (4 with AVX-512,
// 16 with AVX2), rows_few reads 4 table rows at a time in place and factors the
// scales out of its sums as chunk_rows does; AVX-512 from 5 rows up to kDotRows
// (block_nt) widens 4 table rows at a time and dots them with up to 6 rows of x at
// a time (16-lane chains, dots_nt). Tasks of kNBFew table rows (longer runs of
// memory) for the fewest rows, else kNB. Without AVX2, block_nt's plain loops.
//
// Every output is the same sum whatever the pool, and whatever the batch within
// each path: panels, with AVX-512 and K <= kFullK one FMA chain from zero over all
// of K for the columns of whole strip pairs, else one FMA chain from zero over each
// chunk of kPanelK values of k, the chunks added in order; chunk_rows, each row's factored sums from
// zero over each chunk, the chunks added in order; rows_few, each row's factored
// sums in kLanes lanes over all of K, reduced in one fixed order; the table's dots,
// each one 16-lane chain reduced in one fixed order. So a row's result does not
// depend on the rest of the batch, except on which path its row count takes.

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
constexpr int64_t kChunkKB = 9;  // W [K, N], a few rows: at most this many 32-blocks a task
constexpr int64_t kNB = 64;  // W rows per task (W [N, K])
constexpr int64_t kNBFew = 256;  // W [N, K], at most kFewRows rows of x: longer runs of memory
constexpr int64_t kFewRows = 4;
constexpr int64_t kNC = 32;  // W columns per task: a strip pair (the 576 of a layer: 18 tasks)
constexpr int kChunkRows = 8;  // W [K, N]: rows of x up to which chunk_rows reads W in place
constexpr int kDotRows = 16;  // W [N, K]: rows of x up to which block_nt dots widened rows
constexpr int64_t kFullK = 2048;  // panels: K up to which a strip is widened whole (L2)

enum Path { kOnPanels, kOnRowsFew, kOnBlockNt, kOnChunks };  // a call's path (path_of)

struct BlockWork : pagedjax_parallel::Tasks {
  const float* x;
  Comps w;
  float* y;
  int64_t M, K, N;
  bool transposed;
  Path path = kOnPanels;
  std::unique_ptr<float[]> partials;  // a few rows of x, W [K, N]: each chunk's sums [tasks][M][N]
  int64_t rows_per_task = kNB;  // W [N, K]
  int64_t chunk = kChunkKB;  // W [K, N], a few rows: 32-blocks a task (chunk_blocks)
  std::unique_ptr<float[]> xp;  // panels: x packed [(M + 5) / 6][K][6] (rows past M: zero)
  std::vector<float> xs;  // the factored few-row paths, kinds with an offset: x's 32-blocks' sums [M][K / 32]
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
        tile_packed<R>(w.xp.get() + m0 * K + k0 * 6, panel, out + m0 * N + n0, N, kc, first);
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

// X of a 32-block of x (chunk_rows' c * X), in one fixed order of pairwise sums
// (it vectorizes): lane i of 16 = x[i] + x[i + 16], then halves added, 16 -> 1.
inline float block_sum(const float* x) {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = x[i] + x[i + 16];
  for (int h = 8; h > 0; h /= 2)
    for (int i = 0; i < h; ++i) t[i] += t[i + h];
  return t[0];
}

// xp[g][k][r] = x[6g + r, k] (rows past M: zero).
void pack_x(BlockWork& w) {
#ifdef PAGEDJAX_AVX2
  const int64_t groups = (w.M + 5) / 6, K = w.K;
  w.xp.reset(new float[groups * K * 6]);  // every value written below
  for (int64_t g = 0; g < groups; ++g) {  // written in order, 6 rows read side by side
    const int64_t rows = std::min<int64_t>(6, w.M - 6 * g);
    const float* src[6];
    for (int r = 0; r < 6; ++r) src[r] = w.x + (6 * g + std::min<int64_t>(r, rows - 1)) * K;
    float* dst = w.xp.get() + g * K * 6;
    for (int64_t k = 0; k < K; ++k, dst += 6)
      for (int r = 0; r < 6; ++r) dst[r] = r < rows ? src[r][k] : 0.0f;
  }
#else
  (void)w;
#endif
}

#ifdef PAGEDJAX_AVX512
// dst[i * ld + j] = src[j * ls + i] for a 16 x 16 block of floats.
inline void transpose16(const float* src, int64_t ls, float* dst, int64_t ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ls);
  for (int i = 0; i < 8; ++i) {  // lane L: rows 2i, 2i + 1 at columns 4L..4L+3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[g][c], lane L: rows 4g..4g+3 at column 4L + c
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
    r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of u[0..3][c]
    const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 b = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 a2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 b2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_ps(dst + c * ld, _mm512_shuffle_f32x4(a, a2, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * ld, _mm512_shuffle_f32x4(b, b2, 0x88));
    _mm512_storeu_ps(dst + (8 + c) * ld, _mm512_shuffle_f32x4(a, a2, 0xDD));
    _mm512_storeu_ps(dst + (12 + c) * ld, _mm512_shuffle_f32x4(b, b2, 0xDD));
  }
}
#endif

// Block b (32 values of k) of the 16 columns n..n+15 of W seen as [K, N] ->
// out[32][16]: Cols layout (T = 0) as it lies in memory; the table W [N, K]
// (T = 1): its rows n..n+15 widened, then transposed.
template <bool T>
inline void decode_panel(const BlockWork& w, int64_t b, int64_t n, float* out) {
  if constexpr (!T) {
    pagedjax_blocks::decode_cols(w.w, w.N, b, n, out);
  } else {
    alignas(64) float rows[16 * 32];
    pagedjax_blocks::with_kind(w.w.kind, [&](auto kind) {
      for (int j = 0; j < 16; ++j)
        pagedjax_blocks::decode_row_block_kind<decltype(kind)::value>(w.w, w.K, n + j, b,
                                                                      rows + 32 * j);
    });
#ifdef PAGEDJAX_AVX512
    transpose16(rows, 32, out, 16);
    transpose16(rows + 16, 32, out + 16 * 16, 16);
#else
    for (int e = 0; e < 32; ++e)
      for (int j = 0; j < 16; ++j) out[e * 16 + j] = rows[j * 32 + e];
#endif
  }
}

// decode_panel for the last cols < 16 columns, one value at a time (lanes past
// cols zero).
template <bool T>
inline void decode_panel_tail(const BlockWork& w, int64_t b, int64_t n, int64_t cols,
                              float* out) {
  if constexpr (!T) {
    pagedjax_blocks::decode_cols_tail(w.w, w.N, b, n, cols, out);
  } else {
    for (int e = 0; e < 32; ++e)
      for (int i = 0; i < 16; ++i)
        out[e * 16 + i] =
            i < cols ? pagedjax_blocks::value_rows(w.w, w.K, n + i, 32 * b + e) : 0.0f;
  }
}

// Columns [n0, n1) of y = x @ W [K, N] (T: of y = x @ W [N, K]^T, W's rows n0..n1).
// AVX-512 and K <= kFullK: kStrips strips at a time widened over all of K into
// `full` (kStrips * K * 16 floats, in L2; T: 16 * K more for the table rows before
// their transpose), then run through every row of x, so y is written once, each
// output one FMA chain over K. Else, and for the last strips: K kKB blocks at a
// time (the packed x's slice stays in cache for every strip), 16 columns at a time,
// each chunk of kPanelK values of k from zero, the chunks added in order. Which
// way a column goes depends on K, N and its place only, never on the rows.
template <bool T>
void columns_nn(const BlockWork& w, int64_t n0, int64_t n1, float* full) {
  const int64_t K = w.K;
  int64_t n_rest = n0;  // columns left to the chunked loop
#ifdef PAGEDJAX_AVX512
  const int64_t N = w.N;
  if (K <= kFullK) {
    for (; n_rest + 16 * kStrips <= n1; n_rest += 16 * kStrips) {
      for (int s = 0; s < kStrips; ++s) {
        float* strip = full + s * K * 16;
        if constexpr (T) {  // 16 table rows widened whole (past the strips), transposed
          float* rows = full + kStrips * K * 16;
          for (int j = 0; j < 16; ++j)
            pagedjax_blocks::decode_row(w.w, K, n_rest + 16 * s + j, rows + j * K);
          for (int64_t k = 0; k < K; k += 16) transpose16(rows + k, K, strip + k * 16, 16);
        } else {
          for (int64_t b = 0; b < K / 32; ++b)
            decode_panel<T>(w, b, n_rest + 16 * s, strip + b * 32 * 16);
        }
      }
      for (int64_t m0 = 0; m0 < w.M; m0 += 12)
        with_rows_upto<12>(int(std::min<int64_t>(12, w.M - m0)), [&](auto R) {
          const float* xa = w.xp.get() + m0 * K;
          tile_tall<R>(xa, R > 6 ? xa + 6 * K : xa, full, K * 16, w.y + m0 * N + n_rest, N, K);
        });
    }
  }
#else
  (void)full;
#endif
  alignas(64) float panel[kPanel];
  for (int64_t kb = 0; kb < K; kb += kKB * 32) {
    const int64_t kc = std::min(kKB * 32, K - kb);
    int64_t n = n_rest;
#ifdef PAGEDJAX_AVX512
    for (; n + 16 * kStrips <= n1; n += 16 * kStrips) {  // kStrips strips a tile
      alignas(64) float panels[kStrips][kPanel];
      for (int s = 0; s < kStrips; ++s)
        for (int64_t b = 0; b < kc / 32; ++b)
          decode_panel<T>(w, kb / 32 + b, n + 16 * s, panels[s] + b * 32 * 16);
      for (int64_t m0 = 0; m0 < w.M; m0 += 6)
        with_rows(int(std::min<int64_t>(6, w.M - m0)), [&](auto R) {
          tile_wide<R>(w.xp.get() + m0 * K + kb * 6, panels[0], kPanel, w.y + m0 * N + n, N,
                       kc, kb == 0);
        });
    }
#endif
    for (; n < n1; n += 16) {
      const int64_t cols = std::min<int64_t>(16, n1 - n);
      for (int64_t b = 0; b < kc / 32; ++b) {
        if (cols == 16)
          decode_panel<T>(w, kb / 32 + b, n, panel + b * 32 * 16);
        else  // the last columns (N % 16), one value at a time
          decode_panel_tail<T>(w, kb / 32 + b, n, cols, panel + b * 32 * 16);
      }
      panel_product(w, panel, kb, kc, n, cols, w.y, kb == 0);
    }
  }
}

#ifdef PAGEDJAX_AVX2
// A few rows of x (R <= kChunkRows): the product over blocks [b0, b1) of W [K, N]
// (one chunk, chunk_blocks), every column, into acc[R][N]. The chunk's rows are
// one run of memory, read once for every row of x, in order in 4 passes a block
// (pass p: the pairs of elements j, j + 16 for j = 4p..4p+3, one byte row each
// of a 4-bit kind), kLanes columns at a time (blocks.h: one register), each
// row's sums S (q6_k: S_lo and S_hi) kept in `sums` between passes, folded into
// acc with the block's factors (widened once into `f`, 48 floats a 16-column
// strip) after the last: acc = fma(a, S, acc) (q6_k: fma(a, S_lo, acc), then
// fma(a2, S_hi, acc)), then acc = fma(c, X, acc), X = block_sum (see the top).
// Tasks of columns would each read a little of every row instead, N values
// apart, which costs DRAM most of its bandwidth. Each row's sums are its own, so
// its bits are the same at every R.
template <int Kind, int R>
void chunk_rows_kind(const BlockWork& w, int64_t b0, int64_t b1, float* acc, float* f) {
  constexpr int L = pagedjax_blocks::kLanes;
  using V = pagedjax_blocks::Lanes<L>;
  using vf = typename V::f;
  using vi = typename V::i;
  constexpr bool kOne = pagedjax_blocks::one_scale(Kind);
  const int64_t N = w.N, K = w.K, strips = N / 16, cols = 16 * strips;
  float* s_lo = f + 48 * strips;  // [R][N]
  float* s_hi = s_lo + R * N;     // [R][N] (q6_k)
  std::memset(acc, 0, sizeof(float) * R * N);
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t s = 0; s < strips; ++s)
      pagedjax_blocks::cols_factors(w.w, N, b, 16 * s, f + 48 * s);
    const float* xb = w.x + 32 * b;  // row r: xb + r * K
    for (int p = 0; p < 4; ++p) {
      const pagedjax_blocks::Ahead ahead = pagedjax_blocks::rows_ahead(w.w, N, b, p, K / 32);
      for (int64_t n = 0; n < cols; n += L) {
        if (n % 64 == 0) pagedjax_blocks::prefetch(ahead, n, 64);
        vf lo_sum[R], hi_sum[R];
        for (int r = 0; r < R; ++r) {
          lo_sum[r] = p > 0 ? V::load(s_lo + r * N + n) : vf{};
          hi_sum[r] = !kOne && p > 0 ? V::load(s_hi + r * N + n) : vf{};
        }
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * p + i;
          vi lo_q, hi_q;
          pagedjax_blocks::cols_code_pair<Kind, L>(w.w, N, b, j, n, &lo_q, &hi_q);
          const vf lo = __builtin_convertvector(lo_q, vf), hi = __builtin_convertvector(hi_q, vf);
          for (int r = 0; r < R; ++r) {
            lo_sum[r] = V::splat(xb[r * K + j]) * lo + lo_sum[r];
            if (kOne)
              lo_sum[r] = V::splat(xb[r * K + 16 + j]) * hi + lo_sum[r];
            else
              hi_sum[r] = V::splat(xb[r * K + 16 + j]) * hi + hi_sum[r];
          }
        }
        if (p < 3) {
          for (int r = 0; r < R; ++r) {
            V::store(s_lo + r * N + n, lo_sum[r]);
            if (!kOne) V::store(s_hi + r * N + n, hi_sum[r]);
          }
          continue;
        }
        const float* fs = f + 48 * (n / 16) + n % 16;  // the fold
        const vf a = V::load(fs), a2 = V::load(fs + 16), cc = V::load(fs + 32);
        for (int r = 0; r < R; ++r) {
          vf c = V::load(acc + r * N + n);
          c = a * lo_sum[r] + c;
          if (!kOne) c = a2 * hi_sum[r] + c;
          if (pagedjax_blocks::has_offset(Kind)) c = cc * V::splat(w.xs[r * (K / 32) + b]) + c;
          V::store(acc + r * N + n, c);
        }
      }
    }
    if (cols < N) {  // the last columns (N % 16), one value at a time
      alignas(64) float panel[32 * 16];
      pagedjax_blocks::decode_cols_tail(w.w, N, b, cols, N - cols, panel);
      for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < N - cols; ++j) {
          float sum = acc[r * N + cols + j];
          for (int e = 0; e < 32; ++e) sum = std::fma(xb[r * K + e], panel[e * 16 + j], sum);
          acc[r * N + cols + j] = sum;
        }
    }
  }
}

void chunk_rows(const BlockWork& w, int64_t b0, int64_t b1, float* acc, float* f) {
  pagedjax_blocks::with_kind(w.w.kind, [&](auto kind) {
    with_rows_upto<kChunkRows>(int(w.M), [&](auto R) {
      chunk_rows_kind<decltype(kind)::value, R>(w, b0, b1, acc, f);
    });
  });
}
#endif

// v's lanes summed in one fixed order (pairwise halves, L -> 1).
template <int L, typename VF>
inline float lanes_sum(VF v) {
  float t[L];
  std::memcpy(t, &v, sizeof(t));
  for (int h = L / 2; h > 0; h /= 2)
    for (int i = 0; i < h; ++i) t[i] += t[i + h];
  return t[0];
}

// Rows of x a pass of rows_few carries in registers (J table rows x R rows of x
// accumulators, L lanes each; AVX2 has 16 registers, AVX-512 32).
constexpr int kFewPass = pagedjax_blocks::kLanes == 16 ? 4 : 2;

// y[r, n..n+J-1] = x[r] . W[n + j] for R rows of x (x, xs: the pass's first row),
// table rows read in place with the scales factored out of the sums, as
// chunk_rows does (see the top): per 32-block, S = the block's products as one
// FMA chain over its L-value pieces (q6_k: S_lo and S_hi, 16 values each), then
// acc = fma(a, S, acc) (q6_k: and fma(a2, S_hi, acc)) in L lanes, and c * X
// apart; the lanes summed at the end. fac: each table row's a | a2 | c (row_factors),
// ldf floats apart.
template <int Kind, int R, int J>
void rows_few_pass(const BlockWork& w, const float* x, const float* xs, int64_t n,
                   const float* fac, int64_t ldf, float* y) {
  constexpr int L = pagedjax_blocks::kLanes, P = 16 / L;
  using V = pagedjax_blocks::Lanes<L>;
  using vf = typename V::f;
  using vi = typename V::i;
  constexpr bool kOne = pagedjax_blocks::one_scale(Kind);
  constexpr bool kOffset = pagedjax_blocks::has_offset(Kind);
  const int64_t K = w.K, nb = K / 32;
  vf acc[R][J];
  float offs[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = vf{}, offs[r][j] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; j < J; ++j) {
      vf lo[P], hi[P];
      for (int h = 0; h < P; ++h) {
        vi l, u;
        pagedjax_blocks::row_code_pair<Kind, L>(w.w, K, n + j, b, h * L, &l, &u);
        lo[h] = __builtin_convertvector(l, vf), hi[h] = __builtin_convertvector(u, vf);
      }
      const float* f = fac + j * ldf;
      const vf a = V::splat(f[b]);
      for (int r = 0; r < R; ++r) {
        const float* xb = x + r * K + 32 * b;
        vf s = V::load(xb) * lo[0];
        for (int h = 1; h < P; ++h) s = V::load(xb + h * L) * lo[h] + s;
        if (kOne) {
          for (int h = 0; h < P; ++h) s = V::load(xb + 16 + h * L) * hi[h] + s;
          acc[r][j] = a * s + acc[r][j];
        } else {
          acc[r][j] = a * s + acc[r][j];
          vf s2 = V::load(xb + 16) * hi[0];
          for (int h = 1; h < P; ++h) s2 = V::load(xb + 16 + h * L) * hi[h] + s2;
          acc[r][j] = V::splat(f[nb + b]) * s2 + acc[r][j];
        }
        if (kOffset) offs[r][j] = std::fma(f[2 * nb + b], xs[r * nb + b], offs[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) y[r * w.N + n + j] = lanes_sum<L>(acc[r][j]) + offs[r][j];
}

// y[:, n0:n1] = x @ W[n0:n1]^T for at most kRowsFewMax rows of x (rows_few_pass: kTableRows
// table rows at a time, kFewPass rows of x a pass); fac holds kTableRows * 3 * K / 32
// floats.
constexpr int kTableRows = 4;

void rows_few(const BlockWork& w, int64_t n0, int64_t n1, float* fac) {
  const int64_t K = w.K, nb = K / 32, ldf = 3 * nb;
  pagedjax_blocks::with_kind(w.w.kind, [&](auto kind) {
    constexpr int Kind = decltype(kind)::value;
    auto passes = [&](int64_t n, auto table_rows) {
      constexpr int J = decltype(table_rows)::value;
      for (int64_t m = 0; m < w.M; m += kFewPass) {
        const float* x = w.x + m * K;
        const float* xs = w.xs.empty() ? nullptr : w.xs.data() + m * nb;  // (has_offset)
        float* y = w.y + m * w.N;
        with_rows_upto<kFewPass>(int(std::min<int64_t>(kFewPass, w.M - m)), [&](auto R) {
          rows_few_pass<Kind, R, J>(w, x, xs, n, fac, ldf, y);
        });
      }
    };
    int64_t n = n0;
    for (; n + kTableRows <= n1; n += kTableRows) {
      for (int j = 0; j < kTableRows; ++j) pagedjax_blocks::row_factors(w.w, K, n + j, fac + j * ldf);
      passes(n, std::integral_constant<int, kTableRows>{});
    }
    for (; n < n1; ++n) {
      pagedjax_blocks::row_factors(w.w, K, n, fac);
      passes(n, std::integral_constant<int, 1>{});
    }
  });
}

// y[:, n0:n1] = x @ W[n0:n1]^T for rows of W [N, K] (AVX-512: 5 to kDotRows rows of x;
// without AVX2: up to kDotRows); buf holds (n1 - n0) * K floats.
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
#endif
  for (; n < n1; ++n) {  // rows past the last group of 4 (or all: no AVX-512)
    pagedjax_blocks::decode_row(w.w, K, n, buf);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(w.x[m * K + k], buf[k], acc);
      w.y[m * N + n] = acc;
    }
  }
}

#ifdef PAGEDJAX_AVX2
constexpr bool kChunks = true;
// Rows of x up to which the table W [N, K] runs on rows_few rather than block_nt's
// dots: rows_few spends 3 FMAs a value and row, the dots 2 after a widening all rows
// share, so from 5 rows the AVX-512 dots win; AVX2 dots (8 lanes, 2 rows at a time)
// measured slower than rows_few up to kDotRows, so AVX2 builds have none.
constexpr int kRowsFewMax = pagedjax_blocks::kLanes == 16 ? int(kFewRows) : kDotRows;
#else
constexpr bool kChunks = false;  // chunk_rows and rows_few need the vector widening
constexpr int kRowsFewMax = 0;
#endif

// A few rows through W [K, N] of nb 32-blocks: blocks a task, at most kChunkKB and
// as even as an even number of tasks allows (K = 576: 2 tasks of 9; 1,536: 6 of 8),
// so that two threads get equal shares and the chunks' sums stay few. It depends
// on K alone (every row count and pool adds the same chunks' sums).
inline int64_t chunk_blocks(int64_t nb) {
  const int64_t tasks = 2 * ((nb + 2 * kChunkKB - 1) / (2 * kChunkKB));
  return std::max<int64_t>(1, (nb + tasks - 1) / tasks);
}

// Which path a call takes (see the top): panels (tasks of kNC columns, columns_nn)
// for many rows of x with either layout (W [K, N]: more than kChunkRows; W [N, K]:
// more than kDotRows) and for W [K, N] without chunk_rows; else the table's
// rows_few (up to kRowsFewMax rows) or block_nt, or W [K, N]'s chunk_rows.
inline Path path_of(const BlockWork& w) {
  if (w.M > (w.transposed ? kDotRows : kChunkRows) || (!w.transposed && !kChunks))
    return kOnPanels;
  if (!w.transposed) return kOnChunks;
  return w.M <= kRowsFewMax ? kOnRowsFew : kOnBlockNt;
}

// Floats of scratch a thread needs on the call's path (0: none).
int64_t scratch_floats(const BlockWork& w) {
  switch (w.path) {
    case kOnPanels:
#ifdef PAGEDJAX_AVX512
      if (w.K <= kFullK) return (kStrips + w.transposed) * w.K * 16 + 16;
#endif
      return 0;
    case kOnRowsFew: return kTableRows * 3 * (w.K / 32);
    case kOnBlockNt: return w.rows_per_task * w.K;
    default: return (3 + 2 * w.M) * (w.N + 16);
  }
}

// This thread's scratch of at least n floats, kept from call to call (a decode step
// makes ~120 calls): grown when too small, never cleared, since every path writes
// the scratch it reads.
float* thread_scratch(int64_t n) {
  static thread_local std::unique_ptr<float[]> buf;
  static thread_local int64_t size = 0;
  if (size < n) buf.reset(new float[n]), size = n;
  return buf.get();
}

void BlockWork::run() {
  const int64_t need = scratch_floats(*this);
  float* buf = nullptr;
  for (int64_t t; (t = claim()) >= 0; finish()) {
    if (buf == nullptr && need > 0) buf = thread_scratch(need);
    switch (path) {
      case kOnPanels: {
        float* full = need > 0 ? pagedjax_blocks::align64(buf) : nullptr;
        if (transposed)
          columns_nn<true>(*this, t * kNC, std::min(N, (t + 1) * kNC), full);
        else
          columns_nn<false>(*this, t * kNC, std::min(N, (t + 1) * kNC), full);
        break;
      }
      case kOnRowsFew:
        rows_few(*this, t * rows_per_task, std::min(N, (t + 1) * rows_per_task), buf);
        break;
      case kOnBlockNt:
        block_nt(*this, t * rows_per_task, std::min(N, (t + 1) * rows_per_task), buf);
        break;
      case kOnChunks:  // chunk t (chunk_blocks)
#ifdef PAGEDJAX_AVX2
        chunk_rows(*this, t * chunk, std::min(K / 32, (t + 1) * chunk),
                   partials.get() + t * M * N, buf);
#endif
        break;
    }
  }
}

// Packs x (W [K, N]), splits the work (see the top) and runs it on `threads`
// workers (`schedule` hands a task to the pool).
template <typename Schedule>
void run_blockmatmul(const std::shared_ptr<BlockWork>& work, int64_t threads,
                     Schedule schedule) {
  BlockWork& w = *work;
  w.path = path_of(w);
  if (w.path == kOnPanels) {
    pack_x(w);
    w.n_tasks = (w.N + kNC - 1) / kNC;
  } else if (w.transposed) {
    w.rows_per_task = w.M <= std::max<int64_t>(kFewRows, kRowsFewMax) ? kNBFew : kNB;
    w.n_tasks = (w.N + w.rows_per_task - 1) / w.rows_per_task;
  } else {
    w.chunk = chunk_blocks(w.K / 32);
    w.n_tasks = (w.K / 32 + w.chunk - 1) / w.chunk;
    w.partials.reset(new float[w.n_tasks * w.M * w.N]);  // each chunk writes all of its own
  }
  const bool factored = w.path == kOnRowsFew || w.path == kOnChunks;
  if (factored && pagedjax_blocks::has_offset(w.w.kind)) {  // their c * X
    w.xs.resize(w.M * (w.K / 32));
    for (int64_t i = 0; i < w.M * (w.K / 32); ++i) w.xs[i] = block_sum(w.x + 32 * i);
  }
  pagedjax_parallel::run(work, threads, pagedjax_matmul_ffi::worth_helpers(w.M, w.K, w.N),
                         schedule);
  if (w.partials) {  // the chunks' sums, in order
    const int64_t size = w.M * w.N;
    std::memcpy(w.y, w.partials.get(), sizeof(float) * size);
    for (int64_t t = 1; t < w.n_tasks; ++t)
      for (int64_t i = 0; i < size; ++i) w.y[i] += w.partials[t * size + i];
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
                           ffi::AnyBuffer c4, ffi::Buffer<ffi::S32> live,
                           ffi::Result<ffi::Buffer<ffi::F32>> y, int32_t kind,
                           int32_t transposed, int64_t n_out, int64_t group,
                           ffi::Span<const int64_t> offsets) {
  if (kind < 0 || kind >= pagedjax_blocks::kNumKinds)
    return ffi::Error::InvalidArgument("cpu_blockmatmul: unknown block kind");
  int64_t M, K;
  const int64_t N = n_out;
  if (!pagedjax_matmul_ffi::xy_shapes(x, y, N, &M, &K) || K % pagedjax_blocks::block_of(kind))
    return ffi::Error::InvalidArgument("cpu_blockmatmul: expected x [M, K], y [M, N] and K "
                                       "a multiple of the block");
  if (kind == pagedjax_blocks::kI4 && (group <= 0 || group % 32 || K % group))
    return ffi::Error::InvalidArgument("cpu_blockmatmul: int4 groups must be 32k rows dividing K");
  // Every component holds exactly its share of the K x N values (blocks.h), or, at a
  // byte offset >= 0, lies within a buffer of packed weights (kernels_pallas/packed.py).
  const ffi::AnyBuffer* cs[5] = {&c0, &c1, &c2, &c3, &c4};
  if (offsets.size() != 5)
    return ffi::Error::InvalidArgument("cpu_blockmatmul: expected 5 component offsets");
  Comps comps{kind, {}, group};
  for (int i = 0; i < pagedjax_blocks::kNumComps[kind]; ++i) {
    const int64_t want = K / pagedjax_blocks::div_of(comps, i) * N * pagedjax_blocks::kSize[kind][i];
    const int64_t size = int64_t(cs[i]->size_bytes()), off = offsets[i];
    if (off < 0 ? size != want : off > size - want)
      return ffi::Error::InvalidArgument("cpu_blockmatmul: a component's size does not match");
    comps.c[i] = static_cast<const uint8_t*>(cs[i]->untyped_data()) + (off < 0 ? 0 : off);
  }
  if (live.element_count() != 1)
    return ffi::Error::InvalidArgument("cpu_blockmatmul: expected one live row count");
  // Rows of x past the live count are a padded step's padding: their outputs are
  // zero, not computed (a count outside [0, M] means every row).
  const int64_t n_live = live.typed_data()[0];
  if (n_live >= 0 && n_live < M) {
    std::memset(y->typed_data() + n_live * N, 0, sizeof(float) * (M - n_live) * N);
    M = n_live;
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
// register tiles of 1-12 rows, tasks of columns and the transposed
// path, so an instruction the CPU or the OS does not support kills the child, not
// the serving process. 0 when every result matches the plain formulas.
extern "C" int PagedjaxSelfTest() {
  int bad = 0;
  for (int kind = 0; kind < pagedjax_blocks::kNumKinds; ++kind) {
    const int64_t K = pagedjax_blocks::block_of(kind) * 2;
    bad |= self_test_case(kind, 9, K, 70, false, 2) << 1;   // panels: two tasks, strips + tail
    bad |= self_test_case(kind, 14, K, 16, false, 1) << 2;  // 6-row tiles and a 2-row tile
    bad |= self_test_case(kind, 5, K, 9, true, 1) << 3;    // W [N, K]: groups of 4 + rows
    const int64_t chunks = pagedjax_blocks::block_of(kind) == 32 ? 320 : 512;  // 3-4 chunks
    bad |= self_test_case(kind, 1, chunks, 150, false, 2) << 5;  // one row: chunks + the tail
    bad |= self_test_case(kind, 3, chunks, 40, false, 2) << 6;   // a few rows: chunks
    bad |= self_test_case(kind, 13, chunks, 40, false, 2) << 8;  // panels: wide tiles
    bad |= self_test_case(kind, 7, chunks, 50, true, 2) << 7;    // W [N, K]: groups of 4
    bad |= self_test_case(kind, 3, chunks, 50, true, 2) << 10;   // W [N, K]: rows_few + rows
    bad |= self_test_case(kind, 1, K, 9, true, 1) << 11;         // W [N, K]: rows_few, one row
    bad |= self_test_case(kind, 17, chunks, 50, true, 2) << 9;   // W [N, K]: panels + tail
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
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("transposed")
                                  .Attr<int64_t>("n_out")
                                  .Attr<int64_t>("group")
                                  .Attr<ffi::Span<const int64_t>>("offsets"));
