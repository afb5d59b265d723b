/* bf16.h - bf16 numbers (bf16.c): the one conversion from fp32 of the
 * core's bf16 kernels, and back. What "bf16" means in every kernel and
 * reference (SPEC section 8):
 *   - fp32 -> bf16 rounds to nearest even; NaN stays NaN (quiet, sign and top
 *     payload bits kept); a subnormal fp32 becomes a zero of its sign, as
 *     AVX512-BF16's vcvtne2ps2bf16 does (the portable code does the same, so
 *     every path gives the same bits); a finite value that rounds past the
 *     largest bf16 becomes infinity. Hence attn_bf16_of_ftz: the server's
 *     rounder for answers in bf16 (server/codec/half.c, attnd_bf16_of_keep)
 *     keeps subnormals instead.
 *   - products take bf16 operands; the product of two bf16 is exact in fp32;
 *     the products are summed in fp32 (the order depends on the path: the
 *     tests bound the difference, tests/test_bf16.c).
 *   - softmax, its running maximum and sum, biases and outputs are fp32.
 */
#ifndef ATTN_PRIM_BF16_H
#define ATTN_PRIM_BF16_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef uint16_t attn_bf16; /* the upper half of a float32's bits */

attn_bf16 attn_bf16_of_ftz(float x); /* the rounding above, one value: subnormals to zero */
static inline float attn_bf16_to_f32(attn_bf16 b) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)b << 16};
    return v.f;
}
/* dst (n) = bf16 of src (n), on the current path (AVX512-BF16 where present,
 * portable integer rounding otherwise: the same bits either way). */
void attn_bf16_round(attn_bf16 *dst, const float *src, size_t n);
void attn_bf16_round_portable(attn_bf16 *dst, const float *src, size_t n);
void attn_bf16_widen(float *dst, const attn_bf16 *src, size_t n); /* exact */

/* log2(e) in fp32: the block's scores are in log2 units, its queries scaled
 * by scale * ATTN_LOG2E (a product in fp32) before they are rounded. */
#define ATTN_LOG2E 1.44269504088896341f
/* An additive mask value in log2 units. Values below -1e30 count as -1e30
 * (still a weight of 0 beside any ordinary score, and uniform weights when
 * every key of a row has it, as in torch), so that torch's finfo.min scaled
 * by log2(e) stays finite; -inf stays -inf: the key is hidden. */
static inline float attn_bf16_mask_log2(float a) {
    return a == -INFINITY ? -INFINITY : (a < -1e30f ? -1e30f : a) * ATTN_LOG2E;
}

#endif
