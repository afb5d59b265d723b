/* kv_pages.c - bf16 keys and values into and out of their pages
 * (kv_pages.h): a token at a time (a cache step), a whole sequence at once
 * (a forward, AVX512-BF16 where the path has it), and a cache as rows of
 * bits for a session's state file.
 */
#include <immintrin.h>
#include <string.h>

#include "../platform/cpu.h"
#include "kv_pages.h"

#define BF16VEC __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

void attn_kv_bf16_put(attn_bf16 *kv, int G, int D, size_t t, const float *k, const float *v) {
    attn_bf16 *page = kv + t / ATTN_KV_PAGE * attn_kv_page_elems(G, D);
    int slot = (int)(t % ATTN_KV_PAGE);
    for (int g = 0; g < G; g++) {
        attn_bf16 *h = page + (size_t)g * attn_kv_head_elems(D);
        for (int d = 0; d < D; d++) {
            h[attn_kv_key_at(D, slot, d)] = attn_bf16_of_ftz(k[(size_t)g * D + d]);
            h[attn_kv_value_at(D, slot, d)] = attn_bf16_of_ftz(v[(size_t)g * D + d]);
        }
    }
}

void attn_kv_bf16_get(const attn_bf16 *kv, int G, int D, size_t t, float *k, float *v) {
    const attn_bf16 *page = kv + t / ATTN_KV_PAGE * attn_kv_page_elems(G, D);
    int slot = (int)(t % ATTN_KV_PAGE);
    for (int g = 0; g < G; g++) {
        const attn_bf16 *h = page + (size_t)g * attn_kv_head_elems(D);
        for (int d = 0; d < D; d++) {
            k[(size_t)g * D + d] = attn_bf16_to_f32(h[attn_kv_key_at(D, slot, d)]);
            v[(size_t)g * D + d] = attn_bf16_to_f32(h[attn_kv_value_at(D, slot, d)]);
        }
    }
}

/* Where token t's part of a page starts: the page's first element, and t's slot in it. */
static inline size_t kv_page_of(int G, int D, size_t t, int *slot) {
    *slot = (int)(t % ATTN_KV_PAGE);
    return t / ATTN_KV_PAGE * attn_kv_page_elems(G, D);
}

void attn_kv16_to_rows(const uint16_t *kv16, int G, int D, size_t tokens, uint16_t *rows) {
    size_t gd = (size_t)G * D;
    for (size_t t = 0; t < tokens; t++) {
        int slot;
        const attn_bf16 *page = kv16 + kv_page_of(G, D, t, &slot);
        uint16_t *k = rows + t * 2 * gd, *v = k + gd; /* row t: keys (G,D), values (G,D) */
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) {
                k[(size_t)g * D + d] =
                    page[(size_t)g * attn_kv_head_elems(D) + attn_kv_key_at(D, slot, d)];
                v[(size_t)g * D + d] =
                    page[(size_t)g * attn_kv_head_elems(D) + attn_kv_value_at(D, slot, d)];
            }
    }
}

void attn_kv16_from_rows(uint16_t *kv16, int G, int D, size_t tokens, const uint16_t *rows) {
    size_t gd = (size_t)G * D, page_elems = attn_kv_page_elems(G, D);
    if (tokens % ATTN_KV_PAGE) /* the last page: zeros in the slots past tokens */
        memset(kv16 + tokens / ATTN_KV_PAGE * page_elems, 0, sizeof(attn_bf16) * page_elems);
    for (size_t t = 0; t < tokens; t++) {
        int slot;
        attn_bf16 *page = kv16 + kv_page_of(G, D, t, &slot);
        const uint16_t *k = rows + t * 2 * gd, *v = k + gd;
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) {
                page[(size_t)g * attn_kv_head_elems(D) + attn_kv_key_at(D, slot, d)] =
                    k[(size_t)g * D + d];
                page[(size_t)g * attn_kv_head_elems(D) + attn_kv_value_at(D, slot, d)] =
                    v[(size_t)g * D + d];
            }
    }
}

/* 16 widths of a row, from d: bf16 in the low halves of 16 32-bit lanes
 * (zeros for a row past the sequence: NULL). */
BF16VEC static inline __m512i widths16(const float *row, int d) {
    if (!row) return _mm512_setzero_si512();
    return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + d)));
}

/* One head's keys in one page: per block of 16 tokens and 32 widths, each
 * token's 16 pairs of widths scattered to the 16 rows of 64 bytes. */
BF16VEC static void pack_keys(attn_bf16 *h, int D, const float *const *rows) {
    const __m512i rows16 =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(16));
    for (int t = 0; t < ATTN_KV_PAGE; t++)
        for (int d = 0; d < D; d += 32) {
            __m512bh b = rows[t] ? _mm512_cvtne2ps_pbh(_mm512_loadu_ps(rows[t] + d + 16),
                                                       _mm512_loadu_ps(rows[t] + d))
                                 : (__m512bh)_mm512_setzero_si512();
            attn_bf16 *at = h + attn_kv_key_at(D, t, d);
            _mm512_i32scatter_epi32(at, rows16, (__m512i)b, 4);
        }
}

/* One head's values in one page: token pairs, the two tokens' widths
 * interleaved. */
BF16VEC static void pack_values(attn_bf16 *h, int D, const float *const *rows) {
    for (int u = 0; u < ATTN_KV_PAGE / 2; u++)
        for (int d = 0; d < D; d += 16) {
            __m512i lo = widths16(rows[2 * u], d), hi = widths16(rows[2 * u + 1], d);
            _mm512_storeu_si512(h + attn_kv_value_at(D, 2 * u, d),
                                _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

void attn_kv_bf16_pack(attn_bf16 *kv, int G, int D, size_t S, const float *k, size_t ldk,
                       const float *v, size_t ldv) {
    size_t full = S / ATTN_KV_PAGE * ATTN_KV_PAGE, page = attn_kv_page_elems(G, D);
    if (attn_bf16_path() == ATTN_BF16_NONE || D % 32) {
        if (full < S) /* the last page: zeros in the slots past S */
            memset(kv + full / ATTN_KV_PAGE * page, 0, sizeof(attn_bf16) * page);
        for (size_t t = 0; t < S; t++)
            attn_kv_bf16_put(kv, G, D, t, k + t * ldk, v + t * ldv);
        return;
    }
    for (size_t p = 0; p * ATTN_KV_PAGE < S; p++)
        for (int g = 0; g < G; g++) {
            const float *kr[ATTN_KV_PAGE], *vr[ATTN_KV_PAGE];
            for (size_t t = 0, at = p * ATTN_KV_PAGE; t < ATTN_KV_PAGE; t++, at++) {
                kr[t] = at < S ? k + at * ldk + (size_t)g * D : NULL;
                vr[t] = at < S ? v + at * ldv + (size_t)g * D : NULL;
            }
            attn_bf16 *h = kv + p * page + (size_t)g * attn_kv_head_elems(D);
            pack_keys(h, D, kr);
            pack_values(h, D, vr);
        }
}
