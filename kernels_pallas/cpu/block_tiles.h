// The register tiles of the block matmul (blockmatmul.cc), on float32 panels of
// widened weights. Each output is one FMA chain from zero over the panel's k in
// order (then added to y, or stored), whatever the number of rows: the tiles of
// 1-6 rows, and of one or two panels, give the same bits. The tied LM head's dots
// reduce each 16-lane chain in one fixed order. Included by path, like tile.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "isa.h"
#include "simd.h"

namespace pagedjax_block_tiles {

constexpr int64_t kPanelK = 128;              // values of k a panel holds (4 32-blocks)
constexpr int64_t kPanel = kPanelK * 16;      // floats a panel holds ([kPanelK][16])

// f(std::integral_constant<int, R>{}) for R = rows, 1..Max (a kernel's row counts as
// template arguments: only those up to Max are instantiated).
template <int Max, typename F>
inline void with_rows_upto(int rows, F f) {
  if constexpr (Max > 1) {
    if (rows < Max) return with_rows_upto<Max - 1>(rows, f);
  }
  f(std::integral_constant<int, Max>{});
}

// with_rows_upto for the register tiles' 1-6 rows.
template <typename F>
inline void with_rows(int rows, F f) {
  with_rows_upto<6>(rows, f);
}

#ifdef PAGEDJAX_AVX2
// y[0:MR, 0:16] = (first) or += (else) xp @ panel over kc values of k: xp holds x's
// rows packed [kc][6] (so every broadcast is at a fixed offset from one pointer),
// the panel [kc][16]. The product is one FMA chain over k in order from zero,
// whatever MR is, and the AVX-512 version (one register per row) gives the AVX2
// one's bits.
template <int MR>
void tile_packed(const float* xp, const float* panel, float* y, int64_t ldy, int64_t kc,
                 bool first) {
#ifdef PAGEDJAX_AVX512
  __m512 c[MR];
  for (int r = 0; r < MR; ++r) c[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, xp += 6, panel += 16) {
    const __m512 bk = _mm512_loadu_ps(panel);
    for (int r = 0; r < MR; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(xp[r]), bk, c[r]);
  }
  for (int r = 0; r < MR; ++r)
    _mm512_storeu_ps(y + r * ldy, first ? c[r] : _mm512_add_ps(_mm512_loadu_ps(y + r * ldy), c[r]));
#else
  __m256 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm256_setzero_ps();
    c1[r] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k, xp += 6, panel += 16) {
    const __m256 b0 = _mm256_loadu_ps(panel), b1 = _mm256_loadu_ps(panel + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(xp + r);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (!first) {
      c0[r] = _mm256_add_ps(_mm256_loadu_ps(y + r * ldy), c0[r]);
      c1[r] = _mm256_add_ps(_mm256_loadu_ps(y + r * ldy + 8), c1[r]);
    }
    _mm256_storeu_ps(y + r * ldy, c0[r]);
    _mm256_storeu_ps(y + r * ldy + 8, c1[r]);
  }
#endif
}

#endif

#ifdef PAGEDJAX_AVX512
constexpr int kStrips = 2;  // AVX-512: 16-column strips a tile spans (2 and 4 measure alike)

// tile_packed over kStrips panels side by side (y[0:MR, 16s:16s+16] from panel s,
// panels `apart` floats apart): each broadcast of x feeds kStrips FMAs. Over kc
// values of k a chunk of kPanelK at a time, each chunk's sum one FMA chain from
// zero, the chunks' sums added in order in registers (then added to y, or
// stored): so y is written once for any kc, and the bits are those of one
// tile_packed call per strip and chunk.
template <int MR>
void tile_wide(const float* xp, const float* panels, int64_t apart, float* y, int64_t ldy,
               int64_t kc, bool first) {
  __m512 tot[MR][kStrips], c[MR][kStrips];
  for (int64_t k0 = 0; k0 < kc; k0 += kPanelK) {
    for (int r = 0; r < MR; ++r)
      for (int s = 0; s < kStrips; ++s) c[r][s] = _mm512_setzero_ps();
    for (int64_t k = k0; k < std::min(kc, k0 + kPanelK); ++k, xp += 6, panels += 16) {
      __m512 p[kStrips];
      for (int s = 0; s < kStrips; ++s) p[s] = _mm512_load_ps(panels + s * apart);
      for (int r = 0; r < MR; ++r) {
        const __m512 x = _mm512_set1_ps(xp[r]);
        for (int s = 0; s < kStrips; ++s) c[r][s] = _mm512_fmadd_ps(x, p[s], c[r][s]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int s = 0; s < kStrips; ++s)
        tot[r][s] = k0 == 0 ? c[r][s] : _mm512_add_ps(tot[r][s], c[r][s]);
  }
  for (int r = 0; r < MR; ++r)
    for (int s = 0; s < kStrips; ++s) {
      float* out = y + r * ldy + 16 * s;
      _mm512_storeu_ps(out, first ? tot[r][s] : _mm512_add_ps(_mm512_loadu_ps(out), tot[r][s]));
    }
}

// y[0:MR, 0:32] = x @ kStrips (2) panels side by side over all kc values of k (panel
// s `apart` floats after panel 0), for up to 12 rows of x from two packed groups
// (rows 0-5 at xa, rows 6-11 at xb; [kc][6] each), stored. Each output is one FMA
// chain over k in order from zero, whatever MR is. 24 accumulators: each k's two
// panel loads and MR broadcasts feed 2 * MR FMAs, so the FMAs bound it, not the
// instructions that feed them (tile_wide's 6 rows issue 25 a k for 12 FMAs).
template <int MR>
void tile_tall(const float* xa, const float* xb, const float* panels, int64_t apart, float* y,
               int64_t ldy, int64_t kc) {
  static_assert(kStrips == 2 && MR <= 12, "tile_tall: 2 strips, at most 12 rows");
  __m512 c[MR][2];
  for (int r = 0; r < MR; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, xa += 6, xb += 6, panels += 16) {
    const __m512 p0 = _mm512_load_ps(panels), p1 = _mm512_load_ps(panels + apart);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(r < 6 ? xa[r] : xb[r - 6]);
      c[r][0] = _mm512_fmadd_ps(x, p0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(x, p1, c[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(y + r * ldy, c[r][0]);
    _mm512_storeu_ps(y + r * ldy + 16, c[r][1]);
  }
}

#endif

#ifdef PAGEDJAX_AVX512
// y[r, 0:4] = x[r] . w[0:4] for R rows of x (K apart) and 4 widened rows of W [N, K]
// (buf, K apart), y's rows ldy apart: each dot one 16-lane FMA chain over k, then
// its lanes added in _mm512_reduce_add_ps's fixed order, whatever R is (so one
// row's sums do not depend on the batch). Each widened vector feeds R FMAs.
template <int R>
void dots_nt(const float* x, int64_t K, const float* w, float* y, int64_t ldy) {
  __m512 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 b[4];
    for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_ps(w + j * K + k);
    for (int r = 0; r < R; ++r) {
      const __m512 u = _mm512_loadu_ps(x + r * K + k);
      for (int j = 0; j < 4; ++j) a[r][j] = _mm512_fmadd_ps(u, b[j], a[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) y[r * ldy + j] = _mm512_reduce_add_ps(a[r][j]);
}

#endif

}  // namespace pagedjax_block_tiles
