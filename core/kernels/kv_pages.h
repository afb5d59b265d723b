/* kv_pages.h - the one layout of bf16 keys and values, for a forward and a
 * KV cache alike, and its accessors: every file that reads or writes a page
 * goes through these (kv_pages.c packs and unpacks them).
 *
 * A sequence's keys and values are pages of ATTN_KV_PAGE (32) tokens. Page
 * p holds tokens [32p, 32p+32) of each of the G key/value heads (width D,
 * even; a multiple of 32 for the bf16 block's fast paths) in turn, head g
 * at p * page + g * head, page = G * head bf16, head = 64 D bf16:
 *   keys   (2, D/2, 16, 2)  key d of slot t at ((t/16 * D/2 + d/2) * 16 + t%16) * 2 + d%2
 *   values (16, D, 2)       value d of slot t at 32 D + ((t/2) * D + d) * 2 + t%2
 * so that 16 keys x 2 widths and 2 tokens x 16 values are each 64
 * contiguous bytes (an AMX tile row, a 512-bit register). Slots past the
 * last token hold zeros. Pages follow each other with no gap: a cache grows
 * by appending pages (realloc keeps every offset), a token at a time with
 * attn_kv_bf16_put; a forward packs projected keys and values at once with
 * attn_kv_bf16_pack. Memory: 4 G D bytes a token (half of fp32), counted
 * in whole pages. Grouped-query heads share a head's pages.
 */
#ifndef ATTN_KERNELS_KV_PAGES_H
#define ATTN_KERNELS_KV_PAGES_H

#include <stddef.h>

#include "../attn.h"
#include "../prim/bf16.h"

enum { ATTN_KV_PAGE = ATTN_KV16_PAGE };

/* bf16 elements of one head's part of a page, and of a whole page. */
static inline size_t attn_kv_head_elems(int D) {
    return 64 * (size_t)D;
}
static inline size_t attn_kv_page_elems(int G, int D) {
    return (size_t)G * attn_kv_head_elems(D);
}
/* Offsets, inside a head's part of a page, of slot t's key d and value d. */
static inline size_t attn_kv_key_at(int D, int t, int d) {
    return ((size_t)((t / 16) * (D / 2) + d / 2) * 16 + (size_t)(t % 16)) * 2 + (size_t)(d % 2);
}
static inline size_t attn_kv_value_at(int D, int t, int d) {
    return 32 * (size_t)D + ((size_t)(t / 2) * D + (size_t)d) * 2 + (size_t)(t % 2);
}
/* Pages of `tokens` tokens. */
static inline size_t attn_kv_pages(size_t tokens) {
    return (tokens + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
}
/* bf16 elements of a cache of `tokens` tokens (whole pages). */
static inline size_t attn_kv_bf16_elems(size_t tokens, int G, int D) {
    return attn_kv_pages(tokens) * attn_kv_page_elems(G, D);
}

/* One key/value head of a sequence, as the attention reads it. */
typedef struct {
    const attn_bf16 *head; /* page 0 of the head: kv + g * head elems; borrowed */
    size_t page;           /* bf16 elements from one page to the next */
    int S;                 /* tokens, >= 1; equals the attn_seq's S */
} attn_kv_bf16;

static inline attn_kv_bf16 attn_kv_bf16_head(const attn_bf16 *kv, int G, int D, int g, int S) {
    return (attn_kv_bf16){kv + (size_t)g * attn_kv_head_elems(D), attn_kv_page_elems(G, D), S};
}
/* Token j's key d and value d of one head, widened (exact). */
static inline float attn_kv_key(const attn_kv_bf16 *kv, int D, int j, int d) {
    const attn_bf16 *h = kv->head + (size_t)(j / ATTN_KV_PAGE) * kv->page;
    return attn_bf16_to_f32(h[attn_kv_key_at(D, j % ATTN_KV_PAGE, d)]);
}
static inline float attn_kv_value(const attn_kv_bf16 *kv, int D, int j, int d) {
    const attn_bf16 *h = kv->head + (size_t)(j / ATTN_KV_PAGE) * kv->page;
    return attn_bf16_to_f32(h[attn_kv_value_at(D, j % ATTN_KV_PAGE, d)]);
}

/* Token t's keys k (G*D) and values v (G*D), rounded to bf16, into kv (which
 * has room for token t's page). Writes nothing else: a cache zeroes a page
 * before its first token (realloc does not), so that the slots past the
 * last token hold zeros, which the block reads (with weight 0). */
void attn_kv_bf16_put(attn_bf16 *kv, int G, int D, size_t t, const float *k, const float *v);
/* Token t's keys and values back, widened to fp32 (exact). */
void attn_kv_bf16_get(const attn_bf16 *kv, int G, int D, size_t t, float *k, float *v);
/* A whole sequence: kv (attn_kv_bf16_elems(S, G, D)) from the rows of k and v
 * (S, G*D) at row strides ldk and ldv; the last page's tail is zeroed. */
void attn_kv_bf16_pack(attn_bf16 *kv, int G, int D, size_t S, const float *k, size_t ldk,
                       const float *v, size_t ldv);

#endif
