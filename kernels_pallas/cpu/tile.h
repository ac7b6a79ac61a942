// The register kernels both CPU matmuls run (matmul.cc: float32 weights,
// qmatmul.cc: int8 weights widened in registers): the tile y[0:MR, 0:16]
// (+)= x @ b for up to 6 rows of x, and dot2x4, 2 rows of x against 4 rows of
// w [N, K] (the tied-embedding logits). Included by path, like simd.h (the builder hashes
// every header beside the sources into each library's cache key).
#pragma once

#include <cstdint>

#include "isa.h"
#include "simd.h"

#ifdef PAGEDJAX_AVX2

namespace pagedjax_tile {

inline __m256 load8f(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8f(const int8_t* p) {  // 8 int8 widened in registers (exact)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#ifdef __AVX512F__
inline __m512 load16f(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16f(const int8_t* p) {  // 16 int8 widened in registers (exact)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#endif

// y[0:MR, 0:16] (+)= x[0:MR, 0:kc] @ b[0:kc, 0:16], b's rows ldb apart: the widened
// panel (float, ldb 16) or q itself (int8, ldb N, widened in registers: for up to 6
// rows of x, where a panel would be used once). Each output is one FMA chain over k
// in order, of the same values either way: the same bits from the panel and from q,
// and from the AVX-512 version (one register per row) and the AVX2 one (two per row).
template <int MR, typename T>
inline void tile(const float* x, int64_t K, const T* b, int64_t ldb, float* y, int64_t ldy,
                 int64_t kc, bool first) {
#ifdef __AVX512F__
  __m512 c[MR];
  for (int r = 0; r < MR; ++r) c[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * ldy);
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 bk = load16f(b + k * ldb);
    for (int r = 0; r < MR; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * K + k]), bk, c[r]);
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(y + r * ldy, c[r]);
#else
  __m256 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    c0[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy);
    c1[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy + 8);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = load8f(b + k * ldb), b1 = load8f(b + k * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * K + k);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(y + r * ldy, c0[r]);
    _mm256_storeu_ps(y + r * ldy + 8, c1[r]);
  }
#endif
}

template <typename T>
inline void tile_rows(int rows, const float* x, int64_t K, const T* b, int64_t ldb, float* y,
                      int64_t ldy, int64_t kc, bool first) {
  switch (rows) {
    case 6: tile<6>(x, K, b, ldb, y, ldy, kc, first); break;
    case 5: tile<5>(x, K, b, ldb, y, ldy, kc, first); break;
    case 4: tile<4>(x, K, b, ldb, y, ldy, kc, first); break;
    case 3: tile<3>(x, K, b, ldb, y, ldy, kc, first); break;
    case 2: tile<2>(x, K, b, ldb, y, ldy, kc, first); break;
    default: tile<1>(x, K, b, ldb, y, ldy, kc, first); break;
  }
}

// Two rows of x (xa, xb) dotted with four rows of w (w0..w3, float or int8 widened
// in registers) over K, a multiple of 8: lanes 0-3 are xa . w0..w3, lanes 4-7
// xb . w0..w3 (the tied-embedding logits' kernel in both matmuls).
template <typename T>
inline __m256 dot2x4(const float* xa, const float* xb, const T* w0, const T* w1, const T* w2,
                     const T* w3, int64_t K) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 u = _mm256_loadu_ps(xa + k), v = _mm256_loadu_ps(xb + k);
    const __m256 b0 = load8f(w0 + k), b1 = load8f(w1 + k);
    const __m256 b2 = load8f(w2 + k), b3 = load8f(w3 + k);
    a[0] = _mm256_fmadd_ps(u, b0, a[0]);
    a[1] = _mm256_fmadd_ps(u, b1, a[1]);
    a[2] = _mm256_fmadd_ps(u, b2, a[2]);
    a[3] = _mm256_fmadd_ps(u, b3, a[3]);
    a[4] = _mm256_fmadd_ps(v, b0, a[4]);
    a[5] = _mm256_fmadd_ps(v, b1, a[5]);
    a[6] = _mm256_fmadd_ps(v, b2, a[6]);
    a[7] = _mm256_fmadd_ps(v, b3, a[7]);
  }
  return pagedjax_simd::hsum8x8(a);
}

// dot2x4(xa, xa, ...)'s lanes 0-3 (the same FMA chains, summed the same way) at half
// the multiply-adds: the last odd row of x, or the only one.
template <typename T>
inline __m128 dot1x4(const float* xa, const T* w0, const T* w1, const T* w2, const T* w3,
                     int64_t K) {
  __m256 a[8];
  for (int i = 0; i < 4; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 u = _mm256_loadu_ps(xa + k);
    a[0] = _mm256_fmadd_ps(u, load8f(w0 + k), a[0]);
    a[1] = _mm256_fmadd_ps(u, load8f(w1 + k), a[1]);
    a[2] = _mm256_fmadd_ps(u, load8f(w2 + k), a[2]);
    a[3] = _mm256_fmadd_ps(u, load8f(w3 + k), a[3]);
  }
  for (int i = 0; i < 4; ++i) a[4 + i] = a[i];
  return _mm256_castps256_ps128(pagedjax_simd::hsum8x8(a));
}

}  // namespace pagedjax_tile
#endif
