/* bf16.c - fp32 <-> bf16 conversions (bf16.h): one value, and rows on the
 * current path (AVX512-BF16's conversion where present, integer rounding
 * otherwise; the same bits either way).
 */
#include <immintrin.h>
#include <string.h>

#include "../platform/cpu.h"
#include "bf16.h"

/* fp32 bits -> bf16 bits, branch-free so that loops of it vectorise. */
static inline attn_bf16 round_bits(uint32_t u) {
    uint32_t r = (u + 0x7fffu + (u >> 16 & 1u)) >> 16; /* to nearest, ties to even */
    uint32_t nan = u >> 16 | 0x40u;                    /* quiet, sign and payload top kept */
    uint32_t zero = u >> 16 & 0x8000u;                 /* zero or subnormal: signed zero */
    r = (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
    r = (u & 0x7f800000u) == 0 ? zero : r;
    return (attn_bf16)r;
}

attn_bf16 attn_bf16_of_ftz(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return round_bits(u);
}

void attn_bf16_round_portable(attn_bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        dst[i] = round_bits(u);
    }
}

#define BF16VEC __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BF16VEC static void round_avx512(attn_bf16 *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512(dst + i, (__m512i)b);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)b);
    }
}

void attn_bf16_round(attn_bf16 *dst, const float *src, size_t n) {
    if (attn_bf16_path() >= ATTN_BF16_AVX512)
        round_avx512(dst, src, n);
    else
        attn_bf16_round_portable(dst, src, n);
}

BF16VEC static void widen_avx512(float *dst, const attn_bf16 *src, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
}

void attn_bf16_widen(float *dst, const attn_bf16 *src, size_t n) {
    if (attn_bf16_path() >= ATTN_BF16_AVX512) {
        widen_avx512(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = attn_bf16_to_f32(src[i]);
}
