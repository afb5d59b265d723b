/* half.c - float32 to float16 and bfloat16, rounded to nearest even
 * (half.h). Integer arithmetic on the bits, so that the result does not
 * depend on the FPU's rounding mode; subnormal halves go through an exact
 * float product and an integer rounding. */
#include "half.h"

#include <string.h>

#include "../../config/safetensors.h"

size_t attnd_elem_size(attnd_elem e) {
    return e == ATTND_ELEM_F16 || e == ATTND_ELEM_BF16 ? 2 : 4;
}

/* n >> s rounded to nearest, ties to even (1 <= s <= 31). */
static uint32_t shift_even(uint32_t n, int s) {
    uint32_t q = n >> s, rest = n & ((1u << s) - 1), half = 1u << (s - 1);
    return q + (rest > half || (rest == half && (q & 1u)));
}

uint16_t attnd_f16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN: a quiet NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* 65520 and up round past 65504: inf */
    if (a >= 0x38800000u)                        /* a normal half: 2^-14 and up */
        return sign | (uint16_t)shift_even(a - 0x38000000u, 13); /* exponent 127 -> 15 bias */
    if (a < 0x33000000u) return sign; /* at most half the least subnormal: 0 */
    /* a subnormal half, m * 2^-24: the float's significand shifted into place */
    int e = (int)(a >> 23);                   /* 102..112 here */
    uint32_t m = (a & 0x7fffffu) | 0x800000u; /* value = m * 2^(e - 150) */
    return sign | (uint16_t)shift_even(m, 126 - e);
}

uint16_t attnd_bf16_of_keep(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float attnd_elem_round(float x, attnd_elem e) {
    if (e == ATTND_ELEM_F16) return st_f16_to_f32(attnd_f16_of(x));
    if (e == ATTND_ELEM_BF16) return st_bf16_to_f32(attnd_bf16_of_keep(x));
    return x;
}

void attnd_elems_of(void *dst, const float *src, size_t n, attnd_elem e) {
    if (e != ATTND_ELEM_F16 && e != ATTND_ELEM_BF16) {
        memcpy(dst, src, n * 4);
        return;
    }
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = e == ATTND_ELEM_F16 ? attnd_f16_of(src[i]) : attnd_bf16_of_keep(src[i]);
        d[2 * i] = (unsigned char)(h & 0xff);
        d[2 * i + 1] = (unsigned char)(h >> 8);
    }
}
