/* exp.h - the exponentials of every softmax of the core, on 16 floats at
 * once: e^x for the fp32 paths (the row kernels of softmax.c and the fp32
 * block), and 2^t for the bf16 paths (whose scores are in log2 units).
 * Header-only, no state; always inlined into callers compiled for their
 * own target.
 *
 * e^x, x <= 0: range reduction x = n ln2 + r, |r| <= ln2/2, and a degree-6
 * polynomial (Cephes expf coefficients): relative error about 2e-7; 0 below
 * the float range and at -inf. It takes the arithmetic of its caller's
 * target (with -ffp-contract=fast, a * b + c is one fused multiply-add
 * where the target has one).
 * 2^t, t <= 0: t = n + f, |f| <= 1/2, 2^f = 1 + f P(f) with P a degree-5
 * least-squares fit of (2^f - 1) / f on Chebyshev nodes (relative error
 * 1.1e-7; 1.8e-7 evaluated in fp32), times 2^n by VSCALEFPS (AVX-512).
 */
#ifndef ATTN_PRIM_EXP_H
#define ATTN_PRIM_EXP_H

#include <immintrin.h>

/* 16 lanes: one AVX-512 register, two AVX2 ones, four SSE ones. Inlined
 * always, so the vector ABI note GCC gives about returning such a vector
 * does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vf16 __attribute__((vector_size(64)));
typedef int vi16 __attribute__((vector_size(64)));
#define VL 16
#define VINLINE static inline __attribute__((always_inline))

/* x in every lane; a where mask is set, else b. Macros rather than
 * functions, so that code of any target can use them (clang will not pass
 * a 512-bit vector to a function compiled for another target). */
#define VSPLAT(x) ((vf16){} + (x))
#define VSELECT(mask, a, b) ((vf16)(((vi16)(a) & (mask)) | ((vi16)(b) & ~(mask))))

/* Where the last step adds the 1 of e^r = 1 + r + r^2 p(r): the row kernels
 * add it last, (r^2 p + r) + 1; the fused kernel adds it to r first,
 * r^2 p + (r + 1). Both are kept because the answers of every path are
 * kept bit for bit: they differ in the last bit for about 4 % of inputs. */
enum { VEXP_ONE_LAST = 0, VEXP_ONE_FIRST = 1 };

/* The polynomial as a function `name` with attributes `attr`. exp.h
 * defines vexp_neg for callers of every target; the fp32 block defines its
 * own with target("avx512f"), for the same reason as above. */
#define VEXP_NEG_FUNCTION(name, attr)                                                              \
    attr VINLINE vf16 name(vf16 x, const int one) {                                                \
        const vf16 lo = VSPLAT(-87.3f), magic = VSPLAT(12582912.0f); /* 1.5 * 2^23 */              \
        vi16 tiny = x < lo;                                                                        \
        x = VSELECT(tiny, lo, x);                                                                  \
        vf16 t = x * VSPLAT(1.44269504088896341f) + magic;                                         \
        vf16 n = t - magic;                                                                        \
        vi16 ni = (vi16)t - (vi16)magic;                                                           \
        vf16 r = x - n * VSPLAT(0.693359375f) - n * VSPLAT(-2.12194440e-4f);                       \
        vf16 p = VSPLAT(1.9875691500e-4f);                                                         \
        p = p * r + VSPLAT(1.3981999507e-3f);                                                      \
        p = p * r + VSPLAT(8.3334519073e-3f);                                                      \
        p = p * r + VSPLAT(4.1665795894e-2f);                                                      \
        p = p * r + VSPLAT(1.6666665459e-1f);                                                      \
        p = p * r + VSPLAT(5.0000001201e-1f);                                                      \
        if (one == VEXP_ONE_FIRST)                                                                 \
            p = p * r * r + (r + VSPLAT(1.0f));                                                    \
        else                                                                                       \
            p = p * r * r + r + VSPLAT(1.0f);                                                      \
        vf16 scale = (vf16)((ni + 127) << 23);                                                     \
        return VSELECT(tiny, VSPLAT(0.0f), p * scale);                                             \
    }

VEXP_NEG_FUNCTION(vexp_neg, )

/* 2^t for t <= 0 (-FLT_MAX included: 0) as a function `name` of an AVX-512
 * target `attr`. */
#define VEXP2_NEG_FUNCTION(name, attr)                                                             \
    attr VINLINE __m512 name(__m512 t) {                                                           \
        const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23: rounds to an integer */   \
        __m512 n = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);                                  \
        __m512 f = _mm512_sub_ps(t, n);                                                            \
        __m512 p = _mm512_set1_ps(1.321867225e-3f);                                                \
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.671698324e-3f));                                \
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550893024e-2f));                                \
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402223796e-1f));                                \
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931468844e-1f));                                \
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));                                           \
        return _mm512_scalef_ps(p, n);                                                             \
    }

#endif
