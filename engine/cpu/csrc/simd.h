// One vector of floats at this build's width, for every CPU kernel: the kernels are written once against
// simd::vfloat and compiled per instruction set (engine/cpu/ops.py builds one ISA per machine), as ATen's
// kernels are written against at::vec::Vectorized and compiled for AVX2, AVX-512 and NEON:
//   avx512   (-march=x86-64-v4)  16 floats, __m512, 32 registers
//   avx2     (-march=x86-64-v3)   8 floats, __m256, 16 registers, FMA
//   generic  (SSE2, NEON, ...)    4 floats, GCC's vector extension: correct, slow
// kIsa names it (the library reports it, and engine/cpu/ops.py refuses a build of another ISA).
// Arithmetic is GCC's vector operators (+, -, *, / on all three); what they do not have is here.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace simd {

#if defined(__AVX512F__)
constexpr int kWidth = 16;
constexpr const char* kIsa = "avx512";
using vfloat = __m512;
#elif defined(__AVX2__) && defined(__FMA__)
#define PAGEDATTENTION_LAB_AVX2 1
constexpr int kWidth = 8;
constexpr const char* kIsa = "avx2";
using vfloat = __m256;
#else
constexpr int kWidth = 4;
constexpr const char* kIsa = "generic";
typedef float vfloat __attribute__((vector_size(16)));
#endif

// The kernels written with whole vectors of registers (the span attention, the fast exp) are compiled
// for AVX-512 and AVX2; the generic build takes their portable loops.
#if defined(__AVX512F__) || defined(PAGEDATTENTION_LAB_AVX2)
#define PAGEDATTENTION_LAB_SIMD 1
#endif

inline vfloat set1(float a) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(a);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return _mm256_set1_ps(a);
#else
  return vfloat{a, a, a, a};
#endif
}
inline vfloat zero() { return set1(0.0f); }
inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);  // an unaligned load (vmovups)
  return v;
}
inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof v); }

// a * b + c, one rounding where the ISA has FMA.
inline vfloat fmadd(vfloat a, vfloat b, vfloat c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline vfloat vmin(vfloat a, vfloat b) { return a < b ? a : b; }
inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }

// Lane i: v[i] for i < n, else `fill` (n in 0 .. kWidth).
inline vfloat first_lanes(vfloat v, int n, float fill) {
#if defined(__AVX512F__)
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1), _mm512_set1_ps(fill), v);
#else
  float lanes[kWidth];
  store(lanes, v);
  for (int i = n; i < kWidth; ++i) lanes[i] = fill;
  return load(lanes);
#endif
}
// The first n floats at p (n < kWidth), the other lanes 0; and their store.
inline vfloat load_first(const float* p, int n) {
  float lanes[kWidth] = {};
  std::memcpy(lanes, p, n * sizeof(float));
  return load(lanes);
}
inline void store_first(float* p, vfloat v, int n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
#else
  float lanes[kWidth];
  store(lanes, v);
  std::memcpy(p, lanes, n * sizeof(float));
#endif
}

// Lane 0 op lane 1 op ... (the portable horizontal reductions).
template <typename Op>
inline float fold_lanes(vfloat v, Op op) {
  float lanes[kWidth];
  store(lanes, v);
  float r = lanes[0];
  for (int i = 1; i < kWidth; ++i) r = op(r, lanes[i]);
  return r;
}
inline float reduce_add(vfloat v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  return fold_lanes(v, [](float a, float b) { return a + b; });
#endif
}
inline float reduce_max(vfloat v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(v);
#else
  return fold_lanes(v, [](float a, float b) { return b > a ? b : a; });
#endif
}

// Bit i set where lane i of a and b compare as asked (NaN lanes: only `unordered` is set for them).
inline uint32_t equal_lanes(vfloat a, vfloat b) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)));
#else
  uint32_t bits = 0;
  for (int i = 0; i < kWidth; ++i) bits |= static_cast<uint32_t>(a[i] == b[i]) << i;
  return bits;
#endif
}
inline uint32_t nan_lanes(vfloat v) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
#else
  uint32_t bits = 0;
  for (int i = 0; i < kWidth; ++i) bits |= static_cast<uint32_t>(v[i] != v[i]) << i;
  return bits;
#endif
}

// Round to the nearest integer, ties to even (std::nearbyint in the default rounding mode), |x| < 2^22.
inline vfloat round_nearest(vfloat x) {
#if defined(__AVX512F__)
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const vfloat magic = set1(12582912.0f);  // 1.5 * 2^23: the sum's last bit is the integer's
  return (x + magic) - magic;
#endif
}

// p * 2^n for integer-valued n in [-252, 252] (std::ldexp, for the exponents exp() needs).
inline vfloat scale2(vfloat p, vfloat n) {
#if defined(__AVX512F__)
  return _mm512_scalef_ps(p, n);
#else
  // 2^n as two normal floats 2^a 2^b (a = n / 2 rounded, b = n - a, each within [-126, 127]): p 2^a is
  // exact and the second product rounds once, as ldexp does, also where the result is subnormal.
  const vfloat a = round_nearest(n * set1(0.5f)), b = n - a;
  auto power = [](vfloat e) {
#if defined(PAGEDATTENTION_LAB_AVX2)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(e), _mm256_set1_epi32(127)), 23));
#else
    typedef int32_t vint __attribute__((vector_size(16)));
    const vint bits = (__builtin_convertvector(e, vint) + 127) << 23;
    vfloat out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
#endif
  };
  return p * power(a) * power(b);
#endif
}

// kWidth consecutive elements as floats: a bf16 is the top half of a float.
inline vfloat load(const c10::BFloat16* p) {
#if defined(__AVX512F__)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  float lanes[kWidth];
  for (int i = 0; i < kWidth; ++i) lanes[i] = static_cast<float>(p[i]);
  return load(lanes);
#endif
}
// kWidth bytes, each an index into `table` (256 floats): the fp8 caches' widening.
inline vfloat gather_bytes(const uint8_t* p, const float* table) {
#if defined(__AVX512F__)
  return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), table, 4);
#elif defined(PAGEDATTENTION_LAB_AVX2)
  return _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 4);
#else
  float lanes[kWidth];
  for (int i = 0; i < kWidth; ++i) lanes[i] = table[p[i]];
  return load(lanes);
#endif
}

}  // namespace simd
