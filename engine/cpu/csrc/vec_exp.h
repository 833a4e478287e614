// exp(x) for the CPU kernels, 16 floats at a time with AVX-512 (std::exp is one scalar call per value,
// and GCC does not vectorize a loop of it): x = n ln(2) + r with n = round(x log2(e)) and
// r = x - n ln(2), ln(2) in two parts (Cody and Waite) so that r stays exact for large |x| (one
// product x * log2(e) would lose |x| * 2^-24 in the exponent: 3e-6 relative at x = 60); e^r for
// |r| <= ln(2)/2 from its Taylor polynomial of degree 6 (error below 1.3e-7, about one float
// rounding); 2^n applied with _mm512_scalef_ps (ldexp in the scalar version). x is clamped to
// [-kExpLimit, kExpLimit] = [-100, 100]: below, the result is a denormal or 0 (e^-100 = 3.7e-44);
// above, ~2.7e43, which is only ever used inside 1 / (1 + e^x) (silu), where it gives 0.
// Used by csrc/activation.cpp (silu) and csrc/paged_attention.cpp (the softmax).
#pragma once

#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace vec_exp {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln(2) = hi + lo, hi with few bits
constexpr float kExpLimit = 100.0f;
constexpr float c2 = 1.0f / 2, c3 = 1.0f / 6, c4 = 1.0f / 24, c5 = 1.0f / 120, c6 = 1.0f / 720;  // e^r's Taylor terms

inline float exp1(float x) {
  x = std::fmin(std::fmax(x, -kExpLimit), kExpLimit);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float p = 1.0f + r * (1.0f + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * c6)))));
  return std::ldexp(p, static_cast<int>(n));
}

#if defined(__AVX512F__)
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-kExpLimit)), _mm512_set1_ps(kExpLimit));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(c6), _mm512_set1_ps(c5));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(c4));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(c3));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(c2));
  p = _mm512_fmadd_ps(r, p, one);
  p = _mm512_fmadd_ps(r, p, one);
  return _mm512_scalef_ps(p, n);
}
#endif

// x[i] = exp(x[i]) for i < n, in place.
inline void exp_inplace(float* x, long n) {
  long i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, tail, exp16(_mm512_maskz_loadu_ps(tail, x + i)));
    return;
  }
#endif
  for (; i < n; ++i) x[i] = exp1(x[i]);
}

}  // namespace vec_exp
