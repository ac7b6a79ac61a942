// The register tiles of the C++ attention kernel's AVX2 + FMA path
// (attention.cc's fold_chunk_avx2): scores Q.K^T and the update acc += P.V
// for a group of up to kQB query vectors, reading key and value rows straight
// from the page pool (f32, or bf16 / f16 widened in registers) or from a
// widened chunk (int8 / fp8 pages). Each key or value row is loaded once per group,
// not once per query vector: a decode step's work item (one sequence, one KV
// head) has only G query vectors (3 for SmolLM2), so the group is the whole
// item and each key is read from memory exactly once.
//
// Software prefetch: while a chunk is folded, the rows of the next one (the
// next chunk of this item, or the first chunk of the next item this thread
// runs) are prefetched into L2, a few rows per key block, so that the loads
// of memory overlap the arithmetic instead of stalling it chunk by chunk.
// Included by attention.cc (its cache key covers this header).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace pagedjax_attn {

#if defined(__AVX512VL__)
constexpr int kQB = 4;  // 32 vector registers: 4 x 4 accumulators fit
#else
constexpr int kQB = 3;  // 16 registers: 3 x 4 accumulators + 4 key vectors
#endif

#ifndef PAGEDJAX_PF_HINT
#define PAGEDJAX_PF_HINT _MM_HINT_T1
#endif

// Rows [from, to) of `rows` (byte pointers, `bytes` long each) towards L2.
inline void prefetch_rows(const char* const* rows, int64_t from, int64_t to, int64_t bytes) {
#ifndef PAGEDJAX_NO_PREFETCH
  for (int64_t i = from; i < to; ++i)
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(rows[i] + b, PAGEDJAX_PF_HINT);
#else
  (void)rows, (void)from, (void)to, (void)bytes;
#endif
}

// What to prefetch while a chunk is folded: n rows of keys and of values.
struct Prefetch {
  const char* k[64];
  const char* v[64];
  int64_t n = 0, bytes = 0;
};

// An IEEE float16 element of the pool (its bits), told apart from bf16's uint16_t.
struct Half {
  uint16_t bits;
};

inline __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 ld8(const uint16_t* p) {  // bf16 -> f32: the bits move up 16
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if defined(__F16C__)
inline __m256 ld8(const Half* p) {  // f16 -> f32: one exact conversion instruction
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

// sc[r * ldsc + j] = q_r . k_j for r < MB and keys j in [j0, j1), 4 at a time
// (j0, j1 multiples of 4; kp past the chunk's keys points at a zero row).
// Each key vector is loaded once and multiplied into MB x 4 accumulators;
// one transpose-add per query vector turns 4 of them into 4 scores.
template <typename T, int MB>
void scores(const float* q, int64_t D, const void* const* kp, int64_t j0, int64_t j1, float* sc,
            int64_t ldsc, const Prefetch* pf) {
  for (int64_t j = j0; j < j1; j += 4) {
    if (pf != nullptr && j - j0 < pf->n)  // rows from 0, 4 per key block
      prefetch_rows(pf->k, j - j0, std::min(j - j0 + 4, pf->n), pf->bytes);
    const T* k0 = static_cast<const T*>(kp[j]);
    const T* k1 = static_cast<const T*>(kp[j + 1]);
    const T* k2 = static_cast<const T*>(kp[j + 2]);
    const T* k3 = static_cast<const T*>(kp[j + 3]);
    __m256 a[MB][4];
    for (int r = 0; r < MB; ++r)
      for (int k = 0; k < 4; ++k) a[r][k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 x0 = ld8(k0 + d), x1 = ld8(k1 + d), x2 = ld8(k2 + d), x3 = ld8(k3 + d);
      for (int r = 0; r < MB; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * D + d);
        a[r][0] = _mm256_fmadd_ps(qv, x0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(qv, x1, a[r][1]);
        a[r][2] = _mm256_fmadd_ps(qv, x2, a[r][2]);
        a[r][3] = _mm256_fmadd_ps(qv, x3, a[r][3]);
      }
    }
    for (int r = 0; r < MB; ++r) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]),
                                      _mm256_hadd_ps(a[r][2], a[r][3]));
      _mm_storeu_ps(sc + r * ldsc + j,
                    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
}

// acc_r[d0, d0 + 8 NV) = acc_r * alpha_r + sum over j in [j0, j1) of p[r * ldp + j] v_j:
// each value vector loaded once for all MB query vectors.
template <typename T, int MB, int NV>
void pv_block(const float* p, int64_t ldp, const void* const* vp, int64_t j0, int64_t j1,
              int64_t d0, float* acc, int64_t D, const float* alpha, const Prefetch* pf) {
  __m256 a[MB][NV];
  for (int r = 0; r < MB; ++r) {
    const __m256 al = _mm256_set1_ps(alpha[r]);
    for (int i = 0; i < NV; ++i) a[r][i] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + d0 + 8 * i), al);
  }
  for (int64_t j = j0; j < j1; ++j) {
    if (pf != nullptr && j - j0 < pf->n) prefetch_rows(pf->v, j - j0, j - j0 + 1, pf->bytes);
    const T* v = static_cast<const T*>(vp[j]) + d0;
    __m256 x[NV];
    for (int i = 0; i < NV; ++i) x[i] = ld8(v + 8 * i);
    for (int r = 0; r < MB; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * ldp + j);
      for (int i = 0; i < NV; ++i) a[r][i] = _mm256_fmadd_ps(pr, x[i], a[r][i]);
    }
  }
  for (int r = 0; r < MB; ++r)
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + r * D + d0 + 8 * i, a[r][i]);
}

// pv_block over all of D (a multiple of 8), 32 dims per register block; the
// prefetch of the next chunk's values rides on the first block.
template <typename T, int MB>
void pv(const float* p, int64_t ldp, const void* const* vp, int64_t j0, int64_t j1, float* acc,
        int64_t D, const float* alpha, const Prefetch* pf) {
  int64_t d0 = 0;
  for (; d0 + 32 <= D; d0 += 32, pf = nullptr)
    pv_block<T, MB, 4>(p, ldp, vp, j0, j1, d0, acc, D, alpha, pf);
  switch ((D - d0) / 8) {
    case 3: pv_block<T, MB, 3>(p, ldp, vp, j0, j1, d0, acc, D, alpha, pf); break;
    case 2: pv_block<T, MB, 2>(p, ldp, vp, j0, j1, d0, acc, D, alpha, pf); break;
    case 1: pv_block<T, MB, 1>(p, ldp, vp, j0, j1, d0, acc, D, alpha, pf); break;
    default: break;
  }
}

// scores / pv for a group of mb (1..kQB) query vectors.
template <typename T>
void scores_group(int mb, const float* q, int64_t D, const void* const* kp, int64_t j0,
                  int64_t j1, float* sc, int64_t ldsc, const Prefetch* pf) {
  switch (mb) {
#if defined(__AVX512VL__)
    case 4: scores<T, 4>(q, D, kp, j0, j1, sc, ldsc, pf); break;
#endif
    case 3: scores<T, 3>(q, D, kp, j0, j1, sc, ldsc, pf); break;
    case 2: scores<T, 2>(q, D, kp, j0, j1, sc, ldsc, pf); break;
    default: scores<T, 1>(q, D, kp, j0, j1, sc, ldsc, pf); break;
  }
}

template <typename T>
void pv_group(int mb, const float* p, int64_t ldp, const void* const* vp, int64_t j0, int64_t j1,
              float* acc, int64_t D, const float* alpha, const Prefetch* pf) {
  switch (mb) {
#if defined(__AVX512VL__)
    case 4: pv<T, 4>(p, ldp, vp, j0, j1, acc, D, alpha, pf); break;
#endif
    case 3: pv<T, 3>(p, ldp, vp, j0, j1, acc, D, alpha, pf); break;
    case 2: pv<T, 2>(p, ldp, vp, j0, j1, acc, D, alpha, pf); break;
    default: pv<T, 1>(p, ldp, vp, j0, j1, acc, D, alpha, pf); break;
  }
}

}  // namespace pagedjax_attn

#endif  // __AVX2__ && __FMA__
