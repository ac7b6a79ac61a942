// Small vector pieces the C++ CPU kernels share: GCC vector types with
// unaligned loads/stores and an AVX2 horizontal sum. Included by path: the
// builder (kernels_pallas/cpu/build.py) passes -I for this folder and hashes
// every header here into each library's cache key.
#pragma once

#include <cstdint>
#include <cstring>

#include "isa.h"

namespace pagedjax_simd {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

#ifdef PAGEDJAX_AVX2
// Lane i of the result: the sum of a[i]'s 8 lanes.
inline __m256 hsum8x8(const __m256* a) {
  __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

}  // namespace pagedjax_simd
