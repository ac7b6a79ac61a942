// Ragged paged attention for the CPU, called from XLA through the FFI.
//
// Same contract as kernels_pallas/reference.py (read it first):
//   q [T, Hq, D] (f32 | bf16), kv_pages [N, 2, Hkv, page_size, D]
//   (f32 | bf16 | f16 | s8 | f8e4m3fn, the last two with kv_scales [N, 2, Hkv, page_size]),
//   kv_lens i32[S], page_table i32[S, P], cu_q_lens i32[S+1], num_seqs i32[1]
//   -> out [T, Hq, D] (q's dtype); rows past cu_q_lens[num_seqs] are zero.
//
// Why a hand-written kernel: XLA:CPU runs the jnp reference's gathers and
// small batched dots at a few GB/s and GFLOP/s, and its loop costs ~0.7 ms
// per layer even for one decode row. Here one work item is (sequence, KV
// head, tile of query rows): the tile's G*rows query vectors stay in L1
// while the keys of its causal range stream past once, in chunks of up to
// kChunk keys, each chunk folded into a running (max, sum, acc) softmax
// (flash-attention style). Keys are read straight from the pool (a head's
// keys of one page are one contiguous [page_size, D] block); quantized, bf16
// and f16 pages are widened to f32 a chunk at a time (with AVX2, bf16 rows,
// and f16 rows where the build has F16C, are widened in registers instead:
// cpu_attention_avx2.h, whose register tiles
// load each key and value row once per group of query vectors and prefetch
// the next chunk's rows while a chunk is folded). Items run on XLA's
// intra-op thread pool, largest first, claimed from an atomic counter one
// ahead (so the next item's first keys can be prefetched).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attention_avx2.h"
#include "convert.h"
#include "isa.h"
#include "parallel.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kChunk = 64;     // keys per softmax fold
constexpr int kMaxTile = 64;   // query vectors (rows x G) per work item
constexpr float kNegInf = -1e30f;

using pagedjax_simd::load8;
using pagedjax_simd::store8;
using pagedjax_simd::v8f;
inline float hsum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

using pagedjax_convert::bf16_to_f32;
using pagedjax_convert::f16_to_f32;
using pagedjax_convert::f32_to_bf16;
using pagedjax_convert::kFp8;
using pagedjax_convert::widen_fp8_row;

// exp(x) for x <= 0 (a softmax argument); 0 below -87. Polynomial for 2^f on
// [0, 1), relative error ~2e-7. Written so the compiler vectorizes a loop of it.
inline float exp_nonpos(float x) {
  float t = std::max(x, -87.0f) * 1.44269504088896341f;
  float fi = std::floor(t);
  float f = t - fi;
  float p = 1.8775767e-3f;
  p = p * f + 8.9893397e-3f;
  p = p * f + 5.5826318e-2f;
  p = p * f + 2.4015361e-1f;
  p = p * f + 6.9315308e-1f;
  p = p * f + 9.9999994e-1f;
  int32_t bits = (int32_t(fi) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.0f : p * scale;
}

enum QType { kQF32 = 0, kQBF16 = 1 };
enum KVType { kKVF32 = 0, kKVBF16 = 1, kKVS8 = 2, kKVF8 = 3, kKVF16 = 4 };

// Whether the AVX2 tiles read rows of this pool type in place (else chunk_rows
// widens them into a buffer first).
inline bool in_place(int kv_type) {
#ifdef PAGEDJAX_AVX2
#ifdef __F16C__
  if (kv_type == kKVF16) return true;
#endif
  return kv_type == kKVF32 || kv_type == kKVBF16;
#else
  return kv_type == kKVF32;
#endif
}

struct Problem {
  const void* q;
  int q_type;
  const void* kv;
  int kv_type;
  const float* scales;  // null when not quantized
  const int32_t* kv_lens;
  const int32_t* page_table;
  const int32_t* cu;
  void* out;
  int64_t T, Hq, Hkv, G, D, N, ps, S, P;
  float sm_scale, soft_cap;
  int64_t window;  // 0: none
};

struct Item {
  int32_t seq, kh, row0, rows;
  int64_t cost;
};

struct Scratch {
  std::vector<float> qbuf, acc, scores, mrow, lrow, alpha, kbuf, vbuf, zero;
  std::vector<const void*> kp, vp;  // the chunk's key / value rows (f32, or bf16 / f16 in place)
  explicit Scratch(int64_t D)
      : qbuf(kMaxTile * D), acc(kMaxTile * D), scores(kMaxTile * kChunk),
        mrow(kMaxTile), lrow(kMaxTile), alpha(kMaxTile), kbuf(kChunk * D), vbuf(kChunk * D), zero(D),
        kp(kChunk), vp(kChunk) {}
#ifdef PAGEDJAX_AVX2
  pagedjax_attn::Prefetch pf;  // the rows to prefetch during the next fold
#endif
};

// Element offset of (page, kv, head, slot, 0) in the pool.
inline int64_t pool_offset(const Problem& pr, int64_t page, int kv, int64_t h, int64_t slot) {
  return (((page * 2 + kv) * pr.Hkv + h) * pr.ps + slot) * pr.D;
}

// Pointers to the f32 rows of keys [start, start + n) of one sequence/head
// (a page's keys of one head are consecutive rows); widened into buf unless
// the pool is f32 already.
void chunk_rows(const Problem& pr, const int32_t* table, int64_t kh, int kv, int64_t start,
                int64_t n, float* buf, const void** rows) {
  const int64_t D = pr.D;
  for (int64_t j = 0; j < n;) {
    const int64_t key = start + j;
    int64_t page = table[key / pr.ps];
    if (page < 0 || page >= pr.N) page = 0;
    const int64_t slot = key % pr.ps;
    const int64_t cnt = std::min(pr.ps - slot, n - j);
    const int64_t off = pool_offset(pr, page, kv, kh, slot);
    if (in_place(pr.kv_type)) {  // f32, or widened in registers (attention_avx2.h)
      const int64_t elt = pr.kv_type == kKVF32 ? 4 : 2;
      const char* src = static_cast<const char*>(pr.kv) + off * elt;
      for (int64_t c = 0; c < cnt; ++c) rows[j + c] = src + c * D * elt;
    } else {
      float* dst = buf + j * D;
      const int64_t e = cnt * D;
      if (pr.kv_type == kKVBF16) {
        const uint16_t* src = static_cast<const uint16_t*>(pr.kv) + off;
        for (int64_t i = 0; i < e; ++i) dst[i] = bf16_to_f32(src[i]);
      } else if (pr.kv_type == kKVF16) {
        const uint16_t* src = static_cast<const uint16_t*>(pr.kv) + off;
        for (int64_t i = 0; i < e; ++i) dst[i] = f16_to_f32(src[i]);
      } else if (pr.kv_type == kKVS8) {  // one scale per key row: a loop the compiler vectorizes
        const int8_t* src = static_cast<const int8_t*>(pr.kv) + off;
        const float* sc = pr.scales + off / D;
        for (int64_t c = 0; c < cnt; ++c) {
          const float scale = sc[c];
          const int8_t* s8 = src + c * D;
          float* d32 = dst + c * D;
          for (int64_t d = 0; d < D; ++d) d32[d] = float(s8[d]) * scale;
        }
      } else {
        const uint8_t* src = static_cast<const uint8_t*>(pr.kv) + off;
        const float* sc = pr.scales + off / D;
        for (int64_t c = 0; c < cnt; ++c) {
          const float scale = sc[c];
          const uint8_t* s8 = src + c * D;
          float* d32 = dst + c * D;
          widen_fp8_row(s8, scale, D, d32);
        }
      }
      for (int64_t c = 0; c < cnt; ++c) rows[j + c] = dst + c * D;
    }
    j += cnt;
  }
}

inline float dot(const float* a, const float* b, int64_t D) {
  v8f s0 = {0, 0, 0, 0, 0, 0, 0, 0}, s1 = s0;
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    s0 += load8(a + d) * load8(b + d);
    s1 += load8(a + d + 8) * load8(b + d + 8);
  }
  if (d < D) s0 += load8(a + d) * load8(b + d);  // D % 8 == 0
  return hsum8(s0 + s1);
}

// Scores of the tile's M query vectors against keys [start, start + n),
// folded into the running softmax (max mrow, sum lrow, output acc).
void fold_chunk(const Problem& pr, Scratch& w, int64_t M, int64_t pos0, int64_t start,
                int64_t n) {
  const int64_t D = pr.D, G = pr.G;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t pos = pos0 + m / G;
    // Keys this row sees in the chunk: [jlo, jhi).
    const int64_t jhi = std::min<int64_t>(n, pos - start + 1);
    const int64_t jlo = pr.window > 0 ? std::max<int64_t>(0, pos - pr.window + 1 - start) : 0;
    if (jhi <= jlo) continue;
    const float* qm = w.qbuf.data() + m * D;
    float* sc = w.scores.data() + m * kChunk;
    float mx = kNegInf;
    for (int64_t j = jlo; j < jhi; ++j) {
      float x = dot(qm, static_cast<const float*>(w.kp[j]), D);
      if (pr.soft_cap > 0) x = pr.soft_cap * std::tanh(x / pr.soft_cap);
      sc[j] = x;
      mx = std::max(mx, x);
    }
    const float m_new = std::max(w.mrow[m], mx);
    const float alpha = exp_nonpos(w.mrow[m] - m_new);
    float sum = 0.0f;
    for (int64_t j = jlo; j < jhi; ++j) {
      float p = exp_nonpos(sc[j] - m_new);
      sc[j] = p;
      sum += p;
    }
    w.mrow[m] = m_new;
    w.lrow[m] = w.lrow[m] * alpha + sum;
    float* am = w.acc.data() + m * D;
    for (int64_t d = 0; d < D; d += 8) {
      v8f a = load8(am + d) * alpha;
      for (int64_t j = jlo; j < jhi; ++j) a += sc[j] * load8(static_cast<const float*>(w.vp[j]) + d);
      store8(am + d, a);
    }
  }
}

#ifdef PAGEDJAX_AVX2
using pagedjax_simd::hsum8x8;

inline __m256 exp_nonpos8(__m256 x) {
  const __m256 lim = _mm256_set1_ps(-87.0f);
  __m256 t = _mm256_mul_ps(_mm256_max_ps(x, lim), _mm256_set1_ps(1.44269504088896341f));
  __m256 fi = _mm256_floor_ps(t);
  __m256 f = _mm256_sub_ps(t, fi);
  __m256 p = _mm256_set1_ps(1.8775767e-3f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.9893397e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5826318e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4015361e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9315308e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.9999994e-1f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fi), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_and_ps(r, _mm256_cmp_ps(x, lim, _CMP_GE_OQ));
}

// The running softmax of query vector m over the chunk's scores sc[0, n8):
// masked to [jlo, jhi), max, exp, sum; sc becomes P (0 outside the range).
void softmax_row(Scratch& w, int64_t m, float* sc, int64_t jlo, int64_t jhi, int64_t n8) {
  const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg = _mm256_set1_ps(kNegInf);
  const int64_t jb0 = jlo & ~int64_t(7);
  const __m256 lo = _mm256_set1_ps(float(jlo)), hi = _mm256_set1_ps(float(jhi));
  __m256 mx = neg;
  for (int64_t j = jb0; j < jhi; j += 8) {
    __m256 idx = _mm256_add_ps(iota, _mm256_set1_ps(float(j)));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(idx, lo, _CMP_GE_OQ), _mm256_cmp_ps(idx, hi, _CMP_LT_OQ));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg, _mm256_loadu_ps(sc + j), ok));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, mx);
  float mxs = t[0];
  for (int k = 1; k < 8; ++k) mxs = std::max(mxs, t[k]);
  const float m_new = std::max(w.mrow[m], mxs);
  const float alpha = exp_nonpos(w.mrow[m] - m_new);
  const __m256 mn = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 idx = _mm256_add_ps(iota, _mm256_set1_ps(float(j)));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(idx, lo, _CMP_GE_OQ), _mm256_cmp_ps(idx, hi, _CMP_LT_OQ));
    __m256 p = _mm256_setzero_ps();
    if (j + 8 > jb0 && j < jhi)
      p = _mm256_and_ps(exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mn)), ok);
    sum = _mm256_add_ps(sum, p);
    _mm256_storeu_ps(sc + j, p);
  }
  _mm256_store_ps(t, sum);
  w.mrow[m] = m_new;
  w.lrow[m] = w.lrow[m] * alpha + (((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7])));
  w.alpha[m] = alpha;
}

// fold_chunk with AVX2 (the register tiles in cpu_attention_avx2.h): the
// tile's query vectors in groups of kQB, each key and value row loaded once
// per group; scores 4 keys at a time, the softmax 8 keys at a time, P.V 32
// dims at a time. T: the rows' element type (float, or uint16_t for bf16
// pages read in place). pf: the rows to prefetch meanwhile (or null).
template <typename T>
void fold_chunk_avx2(const Problem& pr, Scratch& w, int64_t M, int64_t pos0, int64_t start,
                     int64_t n, const pagedjax_attn::Prefetch* pf) {
  using pagedjax_attn::kQB;
  const int64_t D = pr.D, G = pr.G;
  const int64_t n8 = (n + 7) & ~int64_t(7);
  for (int64_t j = n; j < n8; ++j) w.kp[j] = w.zero.data();  // padding keys: zero rows
  int64_t jlo[kMaxTile], jhi[kMaxTile];
  for (int64_t m = 0; m < M; ++m) {
    const int64_t pos = pos0 + m / G;
    jhi[m] = std::min<int64_t>(n, pos - start + 1);
    jlo[m] = pr.window > 0 ? std::max<int64_t>(0, pos - pr.window + 1 - start) : 0;
  }
  // Keys any row of group [m0, m0 + mb) sees: [j0, j1), empty when none.
  auto span = [&](int64_t m0, int64_t mb, int64_t& j0, int64_t& j1) {
    j0 = n;
    j1 = 0;
    for (int64_t r = m0; r < m0 + mb; ++r) {
      if (jhi[r] <= jlo[r]) continue;
      j0 = std::min(j0, jlo[r]);
      j1 = std::max(j1, jhi[r]);
    }
  };
  int64_t pf_k = 0, pf_v = 0;  // rows of pf prefetched so far
  for (int64_t m0 = 0; m0 < M; m0 += kQB) {
    const int64_t mb = std::min<int64_t>(kQB, M - m0);
    int64_t j0, j1;
    span(m0, mb, j0, j1);
    if (j1 <= j0) continue;
    j0 &= ~int64_t(3);
    j1 = (j1 + 3) & ~int64_t(3);
    const bool lead = pf != nullptr && pf_k == 0;
    pagedjax_attn::scores_group<T>(int(mb), w.qbuf.data() + m0 * D, D, w.kp.data(), j0, j1,
                                   w.scores.data() + m0 * kChunk, kChunk, lead ? pf : nullptr);
    if (lead) pf_k = std::min(j1 - j0, pf->n);
  }
  for (int64_t m = 0; m < M; ++m) {
    float* sc = w.scores.data() + m * kChunk;
    if (jhi[m] <= jlo[m]) {  // nothing visible: P row 0, state unchanged
      std::fill(sc, sc + n8, 0.0f);
      w.alpha[m] = 1.0f;
      continue;
    }
    if (pr.soft_cap > 0)  // rare (Gemma 2): scalar tanh
      for (int64_t j = jlo[m]; j < jhi[m]; ++j) sc[j] = pr.soft_cap * std::tanh(sc[j] / pr.soft_cap);
    softmax_row(w, m, sc, jlo[m], jhi[m], n8);
  }
  for (int64_t m0 = 0; m0 < M; m0 += kQB) {
    const int64_t mb = std::min<int64_t>(kQB, M - m0);
    int64_t j0, j1;
    span(m0, mb, j0, j1);
    if (j1 <= j0) continue;
    const bool lead = pf != nullptr && pf_v == 0;
    pagedjax_attn::pv_group<T>(int(mb), w.scores.data() + m0 * kChunk, kChunk, w.vp.data(), j0,
                               j1, w.acc.data() + m0 * D, D, w.alpha.data() + m0,
                               lead ? pf : nullptr);
    if (lead) pf_v = std::min(j1 - j0, pf->n);
  }
  if (pf != nullptr) {  // rows no key block above reached
    pagedjax_attn::prefetch_rows(pf->k, pf_k, pf->n, pf->bytes);
    pagedjax_attn::prefetch_rows(pf->v, pf_v, pf->n, pf->bytes);
  }
}
#endif

// An item's first row's position and the keys [lo, hi) its rows see.
struct Span {
  int64_t pos0, lo, hi;
};
Span item_span(const Problem& pr, const Item& it) {
  const int64_t s = it.seq, q_len = pr.cu[s + 1] - pr.cu[s];
  const int64_t pos0 = pr.kv_lens[s] - q_len + (it.row0 - pr.cu[s]);
  return {pos0, pr.window > 0 ? std::max<int64_t>(0, pos0 - pr.window + 1) : 0,
          std::min<int64_t>(pos0 + it.rows, pr.P * pr.ps)};
}

#ifdef PAGEDJAX_AVX2
// The pool rows (keys and values, as stored) of item it's keys [start, min(hi, start + kChunk)).
void plan_prefetch(const Problem& pr, const Item& it, int64_t start, int64_t hi,
                   pagedjax_attn::Prefetch& pf) {
  static_assert(kChunk <= int(sizeof(pf.k) / sizeof(pf.k[0])), "Prefetch holds a chunk");
  const int64_t elt = pr.kv_type == kKVF32 ? 4 : pr.kv_type == kKVBF16 || pr.kv_type == kKVF16 ? 2 : 1;
  const int32_t* table = pr.page_table + it.seq * pr.P;
  const char* kv = static_cast<const char*>(pr.kv);
  pf.n = std::min<int64_t>(kChunk, hi - start);
  pf.bytes = pr.D * elt;
  for (int64_t j = 0; j < pf.n; ++j) {
    int64_t page = table[(start + j) / pr.ps];
    if (page < 0 || page >= pr.N) page = 0;
    const int64_t slot = (start + j) % pr.ps;
    pf.k[j] = kv + pool_offset(pr, page, 0, it.kh, slot) * elt;
    pf.v[j] = kv + pool_offset(pr, page, 1, it.kh, slot) * elt;
  }
}
#endif

// One work item; `after` (or null): the item this thread runs next, whose
// first keys are prefetched during this one's last chunk.
void run_item(const Problem& pr, const Item& it, Scratch& w, const Item* after) {
  const int64_t D = pr.D, G = pr.G;
  const int64_t M = int64_t(it.rows) * G;
  const int32_t* table = pr.page_table + it.seq * pr.P;
  const Span sp = item_span(pr, it);
  const int64_t pos0 = sp.pos0, lo = sp.lo, hi = sp.hi;

  // The tile's query vectors, m = row * G + g (the q heads of KV head kh are
  // consecutive), scaled by sm_scale.
  for (int64_t i = 0; i < it.rows; ++i) {
    int64_t base = ((it.row0 + i) * pr.Hq + it.kh * G) * D;
    float* dst = w.qbuf.data() + i * G * D;
    if (pr.q_type == kQF32) {
      const float* src = static_cast<const float*>(pr.q) + base;
      for (int64_t e = 0; e < G * D; ++e) dst[e] = src[e] * pr.sm_scale;
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(pr.q) + base;
      for (int64_t e = 0; e < G * D; ++e) dst[e] = bf16_to_f32(src[e]) * pr.sm_scale;
    }
  }
  std::fill(w.acc.begin(), w.acc.begin() + M * D, 0.0f);
  std::fill(w.mrow.begin(), w.mrow.begin() + M, kNegInf);
  std::fill(w.lrow.begin(), w.lrow.begin() + M, 0.0f);

  for (int64_t start = lo; start < hi; start += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, hi - start);
    chunk_rows(pr, table, it.kh, 0, start, n, w.kbuf.data(), w.kp.data());
    chunk_rows(pr, table, it.kh, 1, start, n, w.vbuf.data(), w.vp.data());
#ifdef PAGEDJAX_AVX2
    const pagedjax_attn::Prefetch* pf = nullptr;
    if (start + kChunk < hi) {
      plan_prefetch(pr, it, start + kChunk, hi, w.pf);
      pf = &w.pf;
    } else if (after != nullptr) {
      const Span next = item_span(pr, *after);
      if (next.lo < next.hi) {
        plan_prefetch(pr, *after, next.lo, next.hi, w.pf);
        pf = &w.pf;
      }
    }
    if (pr.kv_type == kKVBF16)
      fold_chunk_avx2<uint16_t>(pr, w, M, pos0, start, n, pf);
#ifdef __F16C__
    else if (pr.kv_type == kKVF16)
      fold_chunk_avx2<pagedjax_attn::Half>(pr, w, M, pos0, start, n, pf);
#endif
    else  // f32, or rows chunk_rows widened
      fold_chunk_avx2<float>(pr, w, M, pos0, start, n, pf);
#else
    fold_chunk(pr, w, M, pos0, start, n);
#endif
  }

  for (int64_t i = 0; i < it.rows; ++i) {
    int64_t base = ((it.row0 + i) * pr.Hq + it.kh * G) * D;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t m = i * G + g;
      const float l = w.lrow[m];
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      const float* am = w.acc.data() + m * D;
      if (pr.q_type == kQF32) {
        float* dst = static_cast<float*>(pr.out) + base + g * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = am[d] * inv;
      } else {
        uint16_t* dst = static_cast<uint16_t*>(pr.out) + base + g * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = f32_to_bf16(am[d] * inv);
      }
    }
  }
}

struct Work : pagedjax_parallel::Tasks {  // one task per item
  Problem pr;
  std::vector<Item> items;

  // Items are claimed one ahead, so that the next one's keys can be
  // prefetched while this one finishes.
  void run() {
    int64_t i = claim();
    if (i < 0) return;
    auto w = std::make_unique<Scratch>(pr.D);
    while (i >= 0) {
      const int64_t after = claim();
      run_item(pr, items[i], *w, after >= 0 ? &items[after] : nullptr);
      finish();
      i = after;
    }
  }
};

int qtype_of(ffi::DataType t) {
  if (t == ffi::DataType::F32) return kQF32;
  if (t == ffi::DataType::BF16) return kQBF16;
  return -1;
}
int kvtype_of(ffi::DataType t) {
  if (t == ffi::DataType::F32) return kKVF32;
  if (t == ffi::DataType::BF16) return kKVBF16;
  if (t == ffi::DataType::F16) return kKVF16;
  if (t == ffi::DataType::S8) return kKVS8;
  if (t == ffi::DataType::F8E4M3FN) return kKVF8;
  return -1;
}

ffi::Error Impl(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer kv_pages,
                ffi::Buffer<ffi::F32> kv_scales, ffi::Buffer<ffi::S32> kv_lens,
                ffi::Buffer<ffi::S32> page_table, ffi::Buffer<ffi::S32> cu_q_lens,
                ffi::Buffer<ffi::S32> num_seqs, ffi::Result<ffi::AnyBuffer> out, float sm_scale,
                int32_t sliding_window, float soft_cap, int32_t has_scales) {
  auto qd = q.dimensions();
  auto kd = kv_pages.dimensions();
  if (qd.size() != 3 || kd.size() != 5 || kd[1] != 2 || kd[4] != qd[2] || qd[2] % 8 ||
      qd[1] % kd[2])
    return ffi::Error::InvalidArgument("cpu_native attention: unsupported shapes");
  Problem pr;
  pr.q_type = qtype_of(q.element_type());
  pr.kv_type = kvtype_of(kv_pages.element_type());
  if (pr.q_type < 0 || pr.kv_type < 0 || out->element_type() != q.element_type())
    return ffi::Error::InvalidArgument("cpu_native attention: unsupported dtypes");
  if ((pr.kv_type == kKVS8 || pr.kv_type == kKVF8) != (has_scales != 0))
    return ffi::Error::InvalidArgument("cpu_native attention: kv_scales must come with s8/f8 pages");
  pr.T = qd[0];
  pr.Hq = qd[1];
  pr.D = qd[2];
  pr.N = kd[0];
  pr.Hkv = kd[2];
  pr.ps = kd[3];
  pr.G = pr.Hq / pr.Hkv;
  pr.S = kv_lens.dimensions()[0];
  pr.P = page_table.dimensions()[1];
  pr.q = q.untyped_data();
  pr.kv = kv_pages.untyped_data();
  pr.scales = has_scales ? kv_scales.typed_data() : nullptr;
  pr.kv_lens = kv_lens.typed_data();
  pr.page_table = page_table.typed_data();
  pr.cu = cu_q_lens.typed_data();
  pr.out = out->untyped_data();
  pr.sm_scale = sm_scale;
  pr.soft_cap = soft_cap;
  pr.window = sliding_window;

  const int64_t ns = std::clamp<int64_t>(num_seqs.typed_data()[0], 0, pr.S);
  const int64_t elt = q.element_type() == ffi::DataType::F32 ? 4 : 2;
  // Rows no valid sequence owns are zero.
  const int64_t t_valid = std::clamp<int64_t>(ns > 0 ? pr.cu[ns] : 0, 0, pr.T);
  std::memset(static_cast<char*>(pr.out) + t_valid * pr.Hq * pr.D * elt, 0,
              (pr.T - t_valid) * pr.Hq * pr.D * elt);

  auto work = std::make_shared<Work>();
  work->pr = pr;
  const int64_t rows_per_tile = std::max<int64_t>(1, kMaxTile / pr.G);
  for (int64_t s = 0; s < ns; ++s) {
    const int64_t r0 = std::clamp<int64_t>(pr.cu[s], 0, t_valid);
    const int64_t r1 = std::clamp<int64_t>(pr.cu[s + 1], r0, t_valid);
    const int64_t q_len = r1 - r0;
    if (q_len <= 0) continue;
    const int64_t kv_len = pr.kv_lens[s];
    if (kv_len < q_len) {  // malformed: leave the rows zero
      std::memset(static_cast<char*>(pr.out) + r0 * pr.Hq * pr.D * elt, 0,
                  q_len * pr.Hq * pr.D * elt);
      continue;
    }
    for (int64_t r = r0; r < r1; r += rows_per_tile) {
      const int64_t rows = std::min(rows_per_tile, r1 - r);
      const int64_t last = kv_len - q_len + (r - r0) + rows;
      const int64_t first = pr.window > 0 ? std::max<int64_t>(0, last - rows - pr.window + 1) : 0;
      for (int64_t h = 0; h < pr.Hkv; ++h)
        work->items.push_back(Item{int32_t(s), int32_t(h), int32_t(r), int32_t(rows),
                                   (last - first) * rows});
    }
  }
  std::stable_sort(work->items.begin(), work->items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  work->n_tasks = int64_t(work->items.size());
  int64_t total_cost = 0;
  for (const Item& it : work->items) total_cost += it.cost;
  // Helpers only when there is enough work to pay for waking a thread.
  pagedjax_parallel::run_on_pool(work, pool, total_cost * pr.G * pr.D >= (1 << 16));
  return ffi::Error::Success();
}

}  // namespace

// Run once in a child process right after a build (kernels_pallas/cpu/build.py):
// executes the vectorized paths this build was compiled with, so an instruction
// the CPU or the OS does not support kills the child, not the user's process.
// 0 when every result matches a plain loop.
extern "C" int PagedjaxSelfTest() {
  int bad = 0;
  bad |= pagedjax_isa::avx512_self_test();  // -march=native may have turned AVX-512 on
  {  // fp8 widening (the vector path and the scalar tail): the table's bits exactly
    uint8_t codes[259];
    float wide[259];
    for (int b = 0; b < 259; ++b) codes[b] = uint8_t(b % 256);
    widen_fp8_row(codes, 1.0f, 259, wide);
    for (int b = 0; b < 259; ++b) bad |= std::memcmp(&wide[b], &kFp8.v[b % 256], 4) != 0 ? 8 : 0;
  }
  return bad;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxRaggedPagedAttention, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("sm_scale")
                                  .Attr<int32_t>("sliding_window")
                                  .Attr<float>("soft_cap")
                                  .Attr<int32_t>("has_scales"));
