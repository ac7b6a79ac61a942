// Instruction-set detection for the C++ CPU kernels, in one place: the
// compiler's target flags (chosen by kernels_pallas/cpu/build.py: the build
// machine's full set, then AVX2 + FMA, then portable) decide which paths a
// library has; PAGEDJAX_AVX2 marks the vectorized ones, PAGEDJAX_AVX512 the
// 16-lane ones. What the running CPU and OS allow is checked at run time,
// never assumed from the build machine: every build's PagedjaxSelfTest runs in
// a child process first (build.py), and avx512_self_test is that test's
// AVX-512 part.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PAGEDJAX_AVX2 1
#endif
#if defined(PAGEDJAX_AVX2) && defined(__AVX512F__)
#define PAGEDJAX_AVX512 1
#endif

namespace pagedjax_isa {

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

// 1 when the library has its vectorized paths (x86-64 with AVX2 + FMA).
inline int vectorized() {
#ifdef PAGEDJAX_AVX2
  return 1;
#else
  return 0;
#endif
}

}  // namespace pagedjax_isa
