// Scalar-type converters the C++ CPU kernels share: bfloat16 <-> float32,
// float8_e4m3fn -> float32 (one value, and a row widened and scaled, 8 at a
// time with AVX2), and IEEE float16 -> float32 (the GGUF block scales).
// Each is exact (a widening) or rounds to nearest even (f32 -> bf16).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "isa.h"

namespace pagedjax_convert {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE binary16 -> float32, exactly (subnormals, infinities and NaN included).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  uint32_t bits;
  if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float32
    float f = float(m) * 0x1p-24f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Fp8Table {  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) {
      int s = i >> 7, e = (i >> 3) & 15, m = i & 7;
      float x;
      if (e == 15 && m == 7) x = NAN;
      else if (e == 0) x = std::ldexp(float(m) / 8.0f, -6);
      else x = std::ldexp(1.0f + float(m) / 8.0f, e - 7);
      v[i] = s ? -x : x;
    }
  }
};
inline const Fp8Table kFp8;

// The same values as kFp8.v[b] (bit for bit: the attention kernel's self-test
// checks all 256) without a table lookup, so that a loop of it vectorizes: a
// normal number's exponent and mantissa move into float32's fields (bias 7 ->
// 127), a subnormal is m * 2^-9, 0x7f is NaN; the sign bit is copied.
inline float fp8_to_f32(uint8_t b) {
  const uint32_t mag = b & 0x7fu;
  const float sub = float(int32_t(mag)) * 0x1p-9f;  // exact for m < 8
  const uint32_t normal = (mag << 20) + (120u << 23);
  uint32_t bits;
  std::memcpy(&bits, &sub, 4);
  bits = mag < 8 ? bits : normal;
  bits = mag == 0x7fu ? 0x7fc00000u : bits;
  bits |= uint32_t(b & 0x80u) << 24;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// out[d] = fp8_to_f32(src[d]) * scale, 8 at a time with AVX2 (the same steps).
inline void widen_fp8_row(const uint8_t* src, float scale, int64_t n, float* out) {
  int64_t d = 0;
#ifdef PAGEDJAX_AVX2
  const __m256 vscale = _mm256_set1_ps(scale), tiny = _mm256_set1_ps(0x1p-9f);
  const __m256i m7f = _mm256_set1_epi32(0x7f), bias = _mm256_set1_epi32(120 << 23);
  const __m256i eight = _mm256_set1_epi32(8), qnan = _mm256_set1_epi32(0x7fc00000);
  const __m256i m80 = _mm256_set1_epi32(0x80);
  for (; d + 8 <= n; d += 8) {
    const __m256i b =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + d)));
    const __m256i mag = _mm256_and_si256(b, m7f);
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), tiny);
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), bias);
    __m256i bits = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub),
                                      _mm256_cmpgt_epi32(eight, mag));
    bits = _mm256_blendv_epi8(bits, qnan, _mm256_cmpeq_epi32(mag, m7f));
    bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(b, m80), 24));
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_castsi256_ps(bits), vscale));
  }
#endif
  for (; d < n; ++d) out[d] = fp8_to_f32(src[d]) * scale;
}

}  // namespace pagedjax_convert
