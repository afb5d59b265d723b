/* sizes.h - overflow-checked size arithmetic, the one helper every layer
 * uses for a size that comes from input (request shapes and lengths, header
 * values, file headers). A product or sum that would pass the limit, or
 * wrap, is reported instead of computed: the caller refuses the input with
 * a sentence that names the field. Header-only; no state.
 */
#ifndef ATTN_SIZES_H
#define ATTN_SIZES_H

#include <stddef.h>
#include <stdint.h>

/* *out = a * b. Returns 0, or -1 when the product passes limit or wraps
 * (*out is then limit + 1, saturated, so a caller that prints it shows
 * "more than the limit" rather than a wrapped number). */
static inline int sz_mul(uint64_t a, uint64_t b, uint64_t limit, uint64_t *out) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || r > limit) {
        *out = limit == UINT64_MAX ? UINT64_MAX : limit + 1;
        return -1;
    }
    *out = r;
    return 0;
}

/* *out = a + b, with the same contract as sz_mul. */
static inline int sz_add(uint64_t a, uint64_t b, uint64_t limit, uint64_t *out) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r) || r > limit) {
        *out = limit == UINT64_MAX ? UINT64_MAX : limit + 1;
        return -1;
    }
    *out = r;
    return 0;
}

/* The product of n dims (each >= 0), checked against limit at every step. */
static inline int sz_prod(const int64_t *dims, int n, uint64_t limit, uint64_t *out) {
    uint64_t r = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0 || sz_mul(r, (uint64_t)dims[i], limit, &r) < 0) {
            *out = limit == UINT64_MAX ? UINT64_MAX : limit + 1;
            return -1;
        }
    }
    *out = r;
    return 0;
}

#endif
