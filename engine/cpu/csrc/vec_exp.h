// exp(x) for the CPU kernels, a vector at a time (csrc/simd.h: 16 floats with AVX-512, 8 with AVX2; std::exp is one scalar call per value,
// and GCC does not vectorize a loop of it): x = n ln(2) + r with n = round(x log2(e)) and
// r = x - n ln(2), ln(2) in two parts (Cody and Waite) so that r stays exact for large |x| (one
// product x * log2(e) would lose |x| * 2^-24 in the exponent: 3e-6 relative at x = 60); e^r for
// |r| <= ln(2)/2 from its Taylor polynomial of degree 6 (error below 1.3e-7, about one float
// rounding); 2^n applied with _mm512_scalef_ps, or two products by powers of 2 (simd::scale2; ldexp in the scalar version). x is clamped to
// [kExpMin, kExpLimit] = [-86, 100]. Below -86 the result would be a denormal (under 2^-126 = 1.2e-38),
// and a denormal result costs Intel cores a microcode assist of some hundred cycles a vector: a softmax's
// masked lanes (-inf, e^-100 before) made the prefill attention kernel 1.5x slower on 16 prompts of 128
// tokens. e^-86 = 4.4e-38 is 0 to any sum of weights it joins. Above 100, ~2.7e43, which is only ever used
// inside 1 / (1 + e^x) (silu), where it gives 0.
// Used by csrc/activation.cpp (silu), csrc/paged_attention.cpp and csrc/prefill_attention.cpp (the softmax).
#pragma once

#include <cmath>

#include "simd.h"

namespace vec_exp {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln(2) = hi + lo, hi with few bits
constexpr float kExpLimit = 100.0f;
constexpr float kExpMin = -86.0f;  // e^-86 = 4.4e-38: the smallest result stays a normal float
constexpr float c2 = 1.0f / 2, c3 = 1.0f / 6, c4 = 1.0f / 24, c5 = 1.0f / 120, c6 = 1.0f / 720;  // e^r's Taylor terms

inline float exp1(float x) {
  x = std::fmin(std::fmax(x, kExpMin), kExpLimit);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float p = 1.0f + r * (1.0f + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * c6)))));
  return std::ldexp(p, static_cast<int>(n));
}

#if defined(PAGEDATTENTION_LAB_SIMD)
inline simd::vfloat expv(simd::vfloat x) {
  using simd::fmadd, simd::set1, simd::vfloat;
  x = simd::vmin(simd::vmax(x, set1(kExpMin)), set1(kExpLimit));
  const vfloat n = simd::round_nearest(x * set1(kLog2e));
  const vfloat r = fmadd(-n, set1(kLn2Lo), fmadd(-n, set1(kLn2Hi), x));
  const vfloat one = set1(1.0f);
  vfloat p = fmadd(r, set1(c6), set1(c5));
  p = fmadd(r, p, set1(c4));
  p = fmadd(r, p, set1(c3));
  p = fmadd(r, p, set1(c2));
  p = fmadd(r, p, one);
  p = fmadd(r, p, one);
  return simd::scale2(p, n);
}
#endif

// x[i] = exp(x[i]) for i < n, in place.
inline void exp_inplace(float* x, long n) {
  long i = 0;
#if defined(PAGEDATTENTION_LAB_SIMD)
  for (; i + simd::kWidth <= n; i += simd::kWidth) simd::store(x + i, expv(simd::load(x + i)));
  if (i < n) {
    simd::store_first(x + i, expv(simd::load_first(x + i, static_cast<int>(n - i))), static_cast<int>(n - i));
    return;
  }
#endif
  for (; i < n; ++i) x[i] = exp1(x[i]);
}

}  // namespace vec_exp
