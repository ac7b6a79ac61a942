// Small pieces the C++ CPU kernels share (cpu_native.cc, cpu_matmul.cc,
// cpu_qmatmul.cc, cpu_sampler.cc): GCC vector types with unaligned
// loads/stores, an AVX2 horizontal sum, and the run-time check that an
// AVX-512 build may run here. Included by path: the builder
// (cpu_native.build) passes -I for this folder and hashes this header into
// each library's cache key.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace pagedjax_simd {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

#if defined(__AVX2__) && defined(__FMA__)
// Lane i of the result: the sum of a[i]'s 8 lanes.
inline __m256 hsum8x8(const __m256* a) {
  __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

// 0 when AVX-512 instructions run (or the build does not use them): a
// -march=native build on a CPU whose OS disables AVX-512 fails here, in the
// builder's guarded child process, not in the serving process.
inline int avx512_self_test() {
#if defined(__AVX512F__)
  volatile float in[16] = {1.0f};
  float out[16];
  __m512 v = _mm512_loadu_ps(const_cast<const float*>(in));
  _mm512_storeu_ps(out, _mm512_add_ps(v, v));
  return out[0] != 2.0f;
#else
  return 0;
#endif
}

}  // namespace pagedjax_simd
