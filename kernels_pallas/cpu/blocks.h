// GGUF block formats widened in registers, 16 lanes at a time, for
// blockmatmul.cc. The components are models/quant.py's (read its table
// first): a weight [K, N] quantized along K in blocks of 32 (256 for the
// K-quants) is q8_0 {q i8, d f16}, q4_0 {qs u8, d}, q4_1 {qs, d, m f16},
// q4_k {qs, sc u8, mn u8, d, dmin f16}, q6_k {ql u8, qh u8, sc i8, d} or
// int4 {qs, s f32, z u8} with one (s, z) per group of G rows (AWQ / GPTQ).
// Element e of a 32-block (e < 16: the low nibble of byte e, else the high
// nibble of byte e - 16; q6_k's two high bits: bits 2*(e/8) of qh byte e % 8)
// has the integer code q and the value a * q + c, where
//
//   q8_0  a = d                 c = 0             q in -128..127
//   q4_0  a = d                 c = 0             q = nibble - 8
//   q4_1  a = d                 c = m             q = nibble
//   q4_k  a = d * sc            c = -(dmin * mn)  q = nibble     (sc, mn per 32)
//   q6_k  a = d * sc            c = 0             q = 6 bits - 32 (sc per 16)
//   int4  a = s                 c = -(s * z)      q = nibble     (s, z per group)
//
// -- the same products gguf.quants.dequantize forms, so a block widened here
// is the dequantized float weight (up to the fused multiply-add's rounding).
// blockmatmul.cc's few-row paths take the codes (cols_code_pair / row_code_pair:
// elements j and j + 16 together) and the factors a, a2, c (cols_scales /
// row_factors) apart instead, to factor the scales out of their sums.
// Two layouts: Cols (the quantized axis first, [K_c, N]: 16 lanes are 16
// columns of one row) and Rows (the quantized axis last, [N, K_c]: the tied
// embedding; 16 lanes are 16 consecutive elements of one row). Written with
// GCC vector types, so one source gives AVX-512, AVX2 or portable code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "convert.h"
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>  // the float16 scales' conversion instructions
#endif

namespace pagedjax_blocks {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

enum Kind { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2, kQ4_K = 3, kQ6_K = 4, kI4 = 5 };
constexpr int kNumKinds = 6;

inline int64_t block_of(int kind) { return kind == kQ4_K || kind == kQ6_K ? 256 : 32; }

// The components of one weight, in models/quant.py's order for its kind.
struct Comps {
  int kind;
  const uint8_t* c[5];
  int64_t group = 0;  // int4: rows per (s, z) group, a multiple of 32
};

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

// 8 bytes at p widened to 8 int32 lanes (zero- or sign-extended): one instruction
// with AVX2 (GCC would widen lane by lane).
template <bool Signed>
inline v8i widen8(const uint8_t* p) {
  v8i out;
#if defined(PAGEDJAX_AVX2)
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i v = Signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  std::memcpy(&out, &v, 32);
#else
  for (int i = 0; i < 8; ++i) out[i] = Signed ? int32_t(int8_t(p[i])) : int32_t(p[i]);
#endif
  return out;
}

// 16 bytes at p widened to 16 int32 lanes: one instruction with AVX-512, else two
// halves.
template <bool Signed>
inline v16i widen16(const uint8_t* p) {
  v16i out;
#if defined(PAGEDJAX_AVX512)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m512i v = Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  std::memcpy(&out, &v, 64);
#else
  const v8i half[2] = {widen8<Signed>(p), widen8<Signed>(p + 8)};
  std::memcpy(&out, half, 64);
#endif
  return out;
}
inline v16i widen_u8(const uint8_t* p) { return widen16<false>(p); }
inline v16i widen_s8(const uint8_t* p) { return widen16<true>(p); }

// L-lane vectors (L = 16: AVX-512's registers, or two AVX2 ones; L = 8: one AVX2
// register): L floats loaded / stored unaligned as one vector (std::memcpy of a
// vector wider than a register goes 8 bytes at a time with AVX2), L bytes
// widened, and one float in every lane (one broadcast).
template <int L>
struct Lanes;
template <>
struct Lanes<16> {
  typedef v16f f;
  typedef v16i i;
  typedef float f_u __attribute__((vector_size(64), aligned(4), may_alias));
  template <bool Signed>
  static i widen(const uint8_t* p) { return widen16<Signed>(p); }
  static f load(const float* p) { return *reinterpret_cast<const f_u*>(p); }
  static void store(float* p, f v) { *reinterpret_cast<f_u*>(p) = v; }
  static f splat(float x) { return f{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
};
template <>
struct Lanes<8> {
  typedef v8f f;
  typedef v8i i;
  typedef float f_u __attribute__((vector_size(32), aligned(4), may_alias));
  template <bool Signed>
  static i widen(const uint8_t* p) { return widen8<Signed>(p); }
  static f load(const float* p) { return *reinterpret_cast<const f_u*>(p); }
  static void store(float* p, f v) { *reinterpret_cast<f_u*>(p) = v; }
  static f splat(float x) { return f{x, x, x, x, x, x, x, x}; }
};
inline v16f to_f(v16i v) { return __builtin_convertvector(v, v16f); }
// f in every lane (one broadcast: `v16f{} + f` would also add zero, which GCC must
// keep, as it turns -0.0 into +0.0).
inline v16f splat(float f) { return Lanes<16>::splat(f); }
// p rounded up to 64 bytes (an aligned view into a buffer 16 floats longer).
inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

inline float f16(const uint8_t* base, int64_t i) {
  uint16_t h;
  std::memcpy(&h, base + 2 * i, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);  // f16x16's conversion, one value
#else
  return pagedjax_convert::f16_to_f32(h);
#endif
}

typedef uint16_t v16u16 __attribute__((vector_size(32)));

// 16 IEEE float16 values -> float32, exactly (as f16_to_f32; no float32
// subnormal is formed, so a flush-to-zero mode cannot change a value). With F16C
// (every AVX2 CPU) one or two conversion instructions, exact for every float16
// but a signalling NaN's payload (it comes out quiet), which no scale is; else
// the bits assembled here.
inline v16f f16x16(const uint8_t* p) {
#if defined(__AVX512F__)
  const __m512 h = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  v16f f;
  std::memcpy(&f, &h, 64);
  return f;
#elif defined(__F16C__)
  const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  v16f f;
  std::memcpy(&f, &lo, 32);
  std::memcpy(reinterpret_cast<char*>(&f) + 32, &hi, 32);
  return f;
#else
  v16u16 raw;
  std::memcpy(&raw, p, 32);
  const v16i h = __builtin_convertvector(raw, v16i);
  const v16i e = (h >> 10) & 31, m = h & 1023;
  const v16f sub = to_f(m) * 0x1p-24f;
  v16i sub_bits;
  std::memcpy(&sub_bits, &sub, 64);
  v16i bits = ((e + 112) << 23) | (m << 13);
  bits = e == 0 ? sub_bits : bits;
  bits = e == 31 ? (0x7f800000 | (m << 13)) : bits;
  bits |= (h & 0x8000) << 16;
  v16f f;
  std::memcpy(&f, &bits, 64);
  return f;
#endif
}
inline v16f u8x16(const uint8_t* p) { return to_f(widen_u8(p)); }
inline v16f f32x16(const uint8_t* p) {
  v16f f;
  std::memcpy(&f, p, 64);
  return f;
}
inline float f32(const uint8_t* base, int64_t i) {
  float f;
  std::memcpy(&f, base + 4 * i, 4);
  return f;
}
inline v16f s8x16(const uint8_t* p) { return to_f(widen_s8(p)); }

// Cols layout: the factors of block b (rows 32b..32b+31) of columns n..n+15 of a
// weight [K, N] (the table at the top): a for elements 0..15, a2 for 16..31, c.
inline void cols_scales(const Comps& w, int64_t N, int64_t b, int64_t n, v16f* a_out,
                        v16f* a2_out, v16f* c_out) {
  const uint8_t* const c[5] = {w.c[0], w.c[1], w.c[2], w.c[3], w.c[4]};
  const int64_t sb = b / 8;  // the super-block (K-quants)
  v16f a, a2, cc = v16f{};
  switch (w.kind) {
    case kQ8_0: case kQ4_0:
      a = a2 = f16x16(c[1] + 2 * (b * N + n));
      break;
    case kQ4_1:
      a = a2 = f16x16(c[1] + 2 * (b * N + n));
      cc = f16x16(c[2] + 2 * (b * N + n));
      break;
    case kQ4_K:
      a = a2 = f16x16(c[3] + 2 * (sb * N + n)) * u8x16(c[1] + b * N + n);
      cc = -(f16x16(c[4] + 2 * (sb * N + n)) * u8x16(c[2] + b * N + n));
      break;
    case kI4: {
      const int64_t g = 32 * b / w.group;
      a = a2 = f32x16(c[1] + 4 * (g * N + n));
      cc = -(a * u8x16(c[2] + g * N + n));
      break;
    }
    default: {  // kQ6_K: sc per 16 rows
      const v16f d = f16x16(c[3] + 2 * (sb * N + n));
      a = d * s8x16(c[2] + (2 * b) * N + n);
      a2 = d * s8x16(c[2] + (2 * b + 1) * N + n);
    }
  }
  *a_out = a, *a2_out = a2, *c_out = cc;
}

// cols_scales into out[0:48] = a | a2 | c (one vector store each).
inline void cols_factors(const Comps& w, int64_t N, int64_t b, int64_t n, float* out) {
  v16f a, a2, cc;
  cols_scales(w, N, b, n, &a, &a2, &cc);
  Lanes<16>::store(out, a), Lanes<16>::store(out + 16, a2), Lanes<16>::store(out + 32, cc);
}

// A 4-bit kind's code bytes (byte e holds elements e and e + 16 of a block, as its
// low and high nibbles) -> the codes of both elements (q4_0: nibble - 8; q6_k: with
// the two high bits of `qh` at bit shift s (element e) and s + 4 (element e + 16),
// then - 32). V: Lanes<L>; S: a shift for every lane or one for all.
template <int Kind, typename V, typename S>
inline void nibble_codes(typename V::i bytes, typename V::i qh, S s, typename V::i* lo,
                         typename V::i* hi) {
  typename V::i l = bytes & 15, h = bytes >> 4;
  if (Kind == kQ4_0) {
    l -= 8;
    h -= 8;
  }
  if (Kind == kQ6_K) {
    l = (l | (((qh >> s) & 3) << 4)) - 32;
    h = (h | (((qh >> (s + 4)) & 3) << 4)) - 32;
  }
  *lo = l, *hi = h;
}

// Cols layout: the integer codes q of elements j and j + 16 (j < 16) of block b,
// columns n..n+L-1 (the table at the top; a 4-bit kind's byte row j holds both),
// for a block kind known at compile time.
template <int Kind, int L = 16>
inline void cols_code_pair(const Comps& w, int64_t N, int64_t b, int j, int64_t n,
                           typename Lanes<L>::i* lo, typename Lanes<L>::i* hi) {
  using V = Lanes<L>;
  if (Kind == kQ8_0) {
    *lo = V::template widen<true>(w.c[0] + (32 * b + j) * N + n);
    *hi = V::template widen<true>(w.c[0] + (32 * b + 16 + j) * N + n);
    return;
  }
  const typename V::i bytes = V::template widen<false>(w.c[0] + (16 * b + j) * N + n);
  const typename V::i qh = Kind == kQ6_K
      ? V::template widen<false>(w.c[1] + (8 * b + j % 8) * N + n) : typename V::i{};
  nibble_codes<Kind, V>(bytes, qh, 2 * (j / 8), lo, hi);  // element j: bits 2 * (j / 8)
}

// f(std::integral_constant<int, Kind>{}) for the kind known at run time.
template <typename F>
inline void with_kind(int kind, F f) {
  switch (kind) {
    case kQ8_0: f(std::integral_constant<int, kQ8_0>{}); break;
    case kQ4_0: f(std::integral_constant<int, kQ4_0>{}); break;
    case kQ4_1: f(std::integral_constant<int, kQ4_1>{}); break;
    case kQ4_K: f(std::integral_constant<int, kQ4_K>{}); break;
    case kQ6_K: f(std::integral_constant<int, kQ6_K>{}); break;
    default: f(std::integral_constant<int, kI4>{}); break;
  }
}

// Whether a kind's factor a is the same for all 32 values of a block (a2 = a):
// every kind but q6_k (a scale per 16). The one-row path then sums the block's
// 32 products in one chain.
constexpr bool one_scale(int kind) { return kind != kQ6_K; }

// Whether a kind's values have an offset c (a * q + c, c not always zero): q4_1,
// q4_k and int4. The others' sums skip c * X.
constexpr bool has_offset(int kind) { return kind == kQ4_1 || kind == kQ4_K || kind == kI4; }

// Columns a vector of the Cols layout's kernels holds: one register (16 with
// AVX-512, 8 with AVX2: GCC keeps wider vectors of its own on the stack there).
#ifdef PAGEDJAX_AVX512
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

// Cols layout: rows 32b..32b+31 of columns n..n+15 of a weight [K, N] -> out[32][16]
// floats (row-major, 16 per row), kLanes columns at a time.
template <int Kind>
inline void decode_cols_kind(const Comps& w, int64_t N, int64_t b, int64_t n, float* out) {
  using V = Lanes<kLanes>;
  using vf = typename V::f;
  alignas(64) float fac[48];  // a | a2 | c of the 16 columns
  cols_factors(w, N, b, n, fac);
  for (int h = 0; h < 16; h += kLanes) {
    const vf a = V::load(fac + h), a2 = V::load(fac + 16 + h), cc = V::load(fac + 32 + h);
    for (int j = 0; j < 16; ++j) {
      typename V::i lo, hi;
      cols_code_pair<Kind, kLanes>(w, N, b, j, n + h, &lo, &hi);
      const vf flo = __builtin_convertvector(lo, vf), fhi = __builtin_convertvector(hi, vf);
      V::store(out + j * 16 + h, has_offset(Kind) ? a * flo + cc : a * flo);
      V::store(out + (j + 16) * 16 + h, has_offset(Kind) ? a2 * fhi + cc : a2 * fhi);
    }
  }
}

inline void decode_cols(const Comps& w, int64_t N, int64_t b, int64_t n, float* out) {
  with_kind(w.kind, [&](auto kind) { decode_cols_kind<decltype(kind)::value>(w, N, b, n, out); });
}

// Rows layout: the factors a (elements 0..15), a2 (16..31) and c of block b of
// row n of a weight [N, K] (the quantized axis last; K values a row; the table at
// the top).
inline void row_block_factors(const Comps& w, int64_t K, int64_t n, int64_t b, float* a_out,
                              float* a2_out, float* c_out) {
  const uint8_t* const* c = w.c;
  const int64_t nb = K / 32, sb = b / 8, nsb = K / 256;
  float a, a2, cc = 0.0f;
  switch (w.kind) {
    case kQ8_0: case kQ4_0:
      a = a2 = f16(c[1], n * nb + b);
      break;
    case kQ4_1:
      a = a2 = f16(c[1], n * nb + b), cc = f16(c[2], n * nb + b);
      break;
    case kQ4_K:
      a = a2 = f16(c[3], n * nsb + sb) * float(c[1][n * nb + b]);
      cc = -(f16(c[4], n * nsb + sb) * float(c[2][n * nb + b]));
      break;
    case kI4: {
      const int64_t g = n * (K / w.group) + 32 * b / w.group;
      a = a2 = f32(c[1], g), cc = -(a * float(c[2][g]));
      break;
    }
    default: {
      const float d = f16(c[3], n * nsb + sb);
      a = d * float(int8_t(c[2][n * 2 * nb + 2 * b]));
      a2 = d * float(int8_t(c[2][n * 2 * nb + 2 * b + 1]));
    }
  }
  *a_out = a, *a2_out = a2, *c_out = cc;
}

// Rows layout: the factors of blocks b0..b0+count-1 of row n -> a[count], a2[count],
// c[count] (a kind with one float16 scale and offset a block: 16 blocks at a time).
inline void row_run_factors(const Comps& w, int64_t K, int64_t n, int64_t b0, int64_t count,
                            float* a, float* a2, float* c) {
  const int64_t nb = K / 32;
  int64_t i = 0;
  if (w.kind == kQ8_0 || w.kind == kQ4_0 || w.kind == kQ4_1) {
    for (; i + 16 <= count; i += 16) {
      const v16f d = f16x16(w.c[1] + 2 * (n * nb + b0 + i));
      Lanes<16>::store(a + i, d);
      Lanes<16>::store(a2 + i, d);
      Lanes<16>::store(c + i, w.kind == kQ4_1 ? f16x16(w.c[2] + 2 * (n * nb + b0 + i)) : v16f{});
    }
  }
  for (; i < count; ++i) row_block_factors(w, K, n, b0 + i, a + i, a2 + i, c + i);
}

// Rows layout: the factors of every block of row n -> fac = a[K/32] | a2[K/32] | c[K/32].
inline void row_factors(const Comps& w, int64_t K, int64_t n, float* fac) {
  const int64_t nb = K / 32;
  row_run_factors(w, K, n, 0, nb, fac, fac + nb, fac + 2 * nb);
}

// Rows layout: the integer codes q of elements h..h+L-1 and 16+h..16+h+L-1
// (h + L <= 16) of block b of row n, for a block kind known at compile time (a
// 4-bit kind's byte e holds elements e and e + 16, as its low and high nibbles).
template <int Kind, int L>
inline void row_code_pair(const Comps& w, int64_t K, int64_t n, int64_t b, int h,
                          typename Lanes<L>::i* lo, typename Lanes<L>::i* hi) {
  using V = Lanes<L>;
  using vi = typename V::i;
  if (Kind == kQ8_0) {
    const uint8_t* q = w.c[0] + n * K + 32 * b + h;
    *lo = V::template widen<true>(q);
    *hi = V::template widen<true>(q + 16);
    return;
  }
  vi qh{}, s{};
  if (Kind == kQ6_K) {  // element e: bits 2 * (e / 8) of qh byte e % 8
    uint8_t h8[16];
    std::memcpy(h8, w.c[1] + n * (K / 4) + 8 * b, 8);
    std::memcpy(h8 + 8, h8, 8);
    qh = V::template widen<false>(h8 + h);
    for (int i = 0; i < L; ++i) s[i] = 2 * ((h + i) / 8);
  }
  nibble_codes<Kind, V>(V::template widen<false>(w.c[0] + n * (K / 2) + 16 * b + h), qh, s,
                        lo, hi);
}

// Rows layout: elements 32b..32b+31 of row n of a weight [N, K] -> out[0:32].
template <int Kind>
inline void decode_row_block_kind(const Comps& w, int64_t K, int64_t n, int64_t b,
                                  float* out) {
  float a, a2, cc;
  row_block_factors(w, K, n, b, &a, &a2, &cc);
  v16i lo, hi;
  row_code_pair<Kind, 16>(w, K, n, b, 0, &lo, &hi);
  const v16f lo_f = has_offset(Kind) ? splat(a) * to_f(lo) + cc : splat(a) * to_f(lo);
  const v16f hi_f = has_offset(Kind) ? splat(a2) * to_f(hi) + cc : splat(a2) * to_f(hi);
  Lanes<16>::store(out, lo_f), Lanes<16>::store(out + 16, hi_f);
}

inline void decode_row_block(const Comps& w, int64_t K, int64_t n, int64_t b, float* out) {
  with_kind(w.kind, [&](auto kind) { decode_row_block_kind<decltype(kind)::value>(w, K, n, b, out); });
}

// Row n of a weight [N, K] (Rows layout) -> out[0:K], a run of kRowRun blocks at a
// time: their factors first (row_run_factors' vectors), then their codes, the kind
// known at compile time (the values of decode_row_block).
constexpr int64_t kRowRun = 64;
template <int Kind>
inline void decode_row_kind(const Comps& w, int64_t K, int64_t n, float* out) {
  alignas(64) float fac[3 * kRowRun];
  const int64_t nb = K / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += kRowRun) {
    const int64_t count = std::min(kRowRun, nb - b0);
    row_run_factors(w, K, n, b0, count, fac, fac + kRowRun, fac + 2 * kRowRun);
    for (int64_t i = 0; i < count; ++i) {
      const float a = fac[i], a2 = fac[kRowRun + i], cc = fac[2 * kRowRun + i];
      v16i lo, hi;
      row_code_pair<Kind, 16>(w, K, n, b0 + i, 0, &lo, &hi);
      const v16f lo_f = has_offset(Kind) ? splat(a) * to_f(lo) + cc : splat(a) * to_f(lo);
      const v16f hi_f = has_offset(Kind) ? splat(a2) * to_f(hi) + cc : splat(a2) * to_f(hi);
      float* o = out + 32 * (b0 + i);
      Lanes<16>::store(o, lo_f), Lanes<16>::store(o + 16, hi_f);
    }
  }
}

inline void decode_row(const Comps& w, int64_t K, int64_t n, float* out) {
  with_kind(w.kind, [&](auto kind) { decode_row_kind<decltype(kind)::value>(w, K, n, out); });
}

// Each component's divisor of the quantized axis and bytes per element, by kind
// (models/quant.py's FORMATS).
// (int4's s and z: the group, div_of)
constexpr int kDiv[kNumKinds][5] = {
    {1, 32}, {2, 32}, {2, 32, 32}, {2, 32, 32, 256, 256}, {2, 4, 16, 256}, {2, 0, 0}};
constexpr int kSize[kNumKinds][5] = {{1, 2}, {1, 2}, {1, 2, 2}, {1, 1, 1, 2, 2}, {1, 1, 1, 2},
                                     {1, 4, 1}};
constexpr int kNumComps[kNumKinds] = {2, 2, 3, 5, 4, 3};

// Component i's divisor of the quantized axis.
inline int64_t div_of(const Comps& w, int i) {
  return w.kind == kI4 && i > 0 ? w.group : kDiv[w.kind][i];
}

// Cols layout, a kernel reading block b's codes in 4 passes over a run of blocks
// (pass p: elements 4p..4p+3 and 16+4p..16+4p+3 across the columns,
// cols_code_pair's pairs): the rows the coming pass reads, for prefetch().
// Codes: the rows of the next pass (the next block's first after the last);
// factors: the next block's, at pass 2. The hardware prefetchers alone leave
// this stream of short row runs well short of DRAM's bandwidth.
struct Ahead {
  const uint8_t* row[24];
  int64_t size[24];  // bytes a column
  int n = 0;
};

inline Ahead rows_ahead(const Comps& w, int64_t N, int64_t b, int p, int64_t blocks) {
  Ahead a;
  const int64_t nb = p < 3 ? b : b + 1;  // the coming pass's block and pass
  const int np = (p + 1) % 4;
  for (int i = 0; i < kNumComps[w.kind]; ++i) {
    const int64_t div = div_of(w, i), size = kSize[w.kind][i];
    const int64_t per = div <= 32 ? 32 / div : 0;  // rows a block
    int64_t starts[2], rows = 0;
    int n_starts = 0;
    if (per >= 8) {  // codes: 4 rows (q8_0: and the 4 rows 16 further; q6_k's qh: mod 8)
      if (nb >= blocks) continue;
      starts[n_starts++] = per * nb + (4 * np) % per, rows = 4;
      if (per == 32) starts[n_starts++] = per * nb + 16 + 4 * np;
    } else if (p == 2 && b + 1 < blocks) {  // factors of the next block
      if (per == 0 && (32 * (b + 1)) % div) continue;
      starts[n_starts++] = per ? per * (b + 1) : 32 * (b + 1) / div, rows = per ? per : 1;
    }
    const int64_t end = blocks * 32 / div;  // the weight's rows
    for (int t = 0; t < n_starts; ++t)
      for (int64_t r = starts[t]; r < starts[t] + rows && r < end && a.n < 24; ++r)
        a.row[a.n] = w.c[i] + r * N * size, a.size[a.n++] = size;
  }
  return a;
}

// Asks the cache for columns [n, n + cols) of the rows in `a`.
inline void prefetch(const Ahead& a, int64_t n, int64_t cols) {
  for (int i = 0; i < a.n; ++i)
    for (int64_t o = n * a.size[i]; o < (n + cols) * a.size[i]; o += 64)
      __builtin_prefetch(a.row[i] + o);
}

// Element k (along the quantized axis) of one row or column, one value at a time:
// at(i, r) points at element r of component i's slice. The plain formulas of the
// table at the top (the vector decoders' reference and the columns they leave).
template <typename At>
inline float value(int kind, At at, int64_t k, int64_t group) {
  const int64_t b = k / 32, e = k % 32, sb = k / 256;
  auto h = [&](int i, int64_t r) {
    uint16_t v;
    std::memcpy(&v, at(i, r), 2);
    return pagedjax_convert::f16_to_f32(v);
  };
  if (kind == kQ8_0) return h(1, b) * float(int8_t(*at(0, k)));
  const uint8_t byte = *at(0, 16 * b + e % 16);
  const int nib = e < 16 ? byte & 15 : byte >> 4;
  switch (kind) {
    case kQ4_0: return h(1, b) * float(nib - 8);
    case kQ4_1: return h(1, b) * float(nib) + h(2, b);
    case kI4: {
      float s;
      std::memcpy(&s, at(1, k / group), 4);
      return s * float(nib - int(*at(2, k / group)));
    }
    case kQ4_K: return (h(3, sb) * float(*at(1, b))) * float(nib) - h(4, sb) * float(*at(2, b));
    default: {
      const int hi = (*at(1, 8 * b + e % 8) >> (2 * (e / 8))) & 3;
      return (h(3, sb) * float(int8_t(*at(2, k / 16)))) * float((nib | (hi << 4)) - 32);
    }
  }
}

// Element (k, n) of a weight [K, N] in the Cols layout.
inline float value_cols(const Comps& w, int64_t N, int64_t k, int64_t n) {
  return value(w.kind, [&](int i, int64_t r) {
    return w.c[i] + (r * N + n) * kSize[w.kind][i];
  }, k, w.group);
}

// Element k of row n of a weight [N, K] in the Rows layout.
inline float value_rows(const Comps& w, int64_t K, int64_t n, int64_t k) {
  return value(w.kind, [&](int i, int64_t r) {
    return w.c[i] + (n * (K / div_of(w, i)) + r) * kSize[w.kind][i];
  }, k, w.group);
}

// decode_cols for the last `cols` < 16 columns: out[32][16], lanes past cols zero.
inline void decode_cols_tail(const Comps& w, int64_t N, int64_t b, int64_t n, int64_t cols,
                             float* out) {
  for (int e = 0; e < 32; ++e)
    for (int i = 0; i < 16; ++i)
      out[e * 16 + i] = i < cols ? value_cols(w, N, 32 * b + e, n + i) : 0.0f;
}

}  // namespace pagedjax_blocks
