/* vexp.h - e^x for x <= 0 on 16 floats at once: the one exponential of the
 * softmax, included by the row kernels (softmax.c) and the fused AVX-512
 * kernel (fused.c). Header-only, no state; functions are always inlined
 * into callers compiled for AVX-512, AVX2 + FMA or the baseline, and take
 * the arithmetic of their target (with -ffp-contract=fast, a * b + c is one
 * fused multiply-add where the target has one).
 *
 * Range reduction x = n ln2 + r, |r| <= ln2/2, and a degree-6 polynomial
 * (Cephes expf coefficients): relative error about 2e-7; 0 below the float
 * range and at -inf.
 */
#ifndef ATTN_VEXP_H
#define ATTN_VEXP_H

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

/* The polynomial as a function `name` with attributes `attr`. vexp.h
 * defines vexp_neg for callers of every target; fused.c defines its own
 * with target("avx512f"), for the same reason as above. */
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

#endif
