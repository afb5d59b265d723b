/* bf16.h - the core's bf16 kernels (SPEC section 8), shared inside core/
 * only: conversions, projections on bf16 weights packed once, and the
 * attention block with bf16 operands. Not part of the API (attn.h); the
 * forward and the sessions call these.
 *
 * What "bf16" means here, in every kernel and reference:
 *   - fp32 -> bf16 rounds to nearest even; NaN stays NaN (quiet, sign and top
 *     payload bits kept); a subnormal fp32 becomes a zero of its sign, as
 *     AVX512-BF16's vcvtne2ps2bf16 does (the portable code does the same, so
 *     every path gives the same bits); a finite value that rounds past the
 *     largest bf16 becomes infinity.
 *   - products take bf16 operands; the product of two bf16 is exact in fp32;
 *     the products are summed in fp32 (the order depends on the path: the
 *     tests bound the difference, tests/test_bf16.c).
 *   - softmax, its running maximum and sum, biases and outputs are fp32.
 *
 * Paths, chosen at run time from CPUID and the OS (attn_bf16_level):
 *   AMX       AMX-BF16 tiles (TDPBF16PS), with AVX512-BF16 for conversions
 *             and the softmax; needs the OS's permission for tile data,
 *             asked once per process (arch_prctl).
 *   AVX512    AVX512-BF16 (VDPBF16PS) on AVX-512F/BW/VL.
 *   NONE      neither: the kernels below still compute, with plain loops
 *             (slow; tests use them), and a forward should use fp32 instead.
 * Thread-safety: every function may run on many threads at once, each with
 * its own outputs and scratch (attn_bf16_force aside: tests and benches set
 * it before work starts). The AMX tile configuration is per thread: each
 * AMX kernel loads it when it starts and releases the tiles when it
 * returns, so nothing is kept between calls. Callers own every buffer they
 * pass (weights packed here are the packed struct's).
 * Legend: see attn.h.
 */
#ifndef ATTN_BF16_H
#define ATTN_BF16_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"

typedef uint16_t attn_bf16; /* the upper half of a float32's bits */

/* ---- paths ------------------------------------------------------------------ */

enum { ATTN_BF16_NONE = 0, ATTN_BF16_AVX512 = 1, ATTN_BF16_AMX = 2 };

int attn_bf16_level(void);             /* the best path this CPU and OS run */
int attn_bf16_force(int level);        /* tests, benches: -1 = the CPU's; returns the previous;
                                          a level above the CPU's runs as the CPU's */
int attn_bf16_path(void);              /* the path the kernels take now */
const char *attn_bf16_name(int level); /* "amx-bf16", "avx512-bf16" or "none" */

/* ---- conversions --------------------------------------------------------------- */

attn_bf16 attn_bf16_of(float x); /* the rounding above, one value */
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

/* ---- projections: C (M,N) = bf16(A) (M,K) @ bf16(W)^T (K,N) + bias ------------ */

enum { ATTN_BF16_KSTEP = 32 }; /* K is padded with zeros to a multiple of this */

/* W packed for both kernels: panels of ATTN_PANEL (16) output columns, each
 * holding, pair of inputs by pair of inputs, the 16 columns' two weights side
 * by side ("VNNI pairs": an AMX B tile of 16 rows is 32 inputs x 16 columns):
 *   p[((j * kp + k/2) * 16 + n % 16) * 2 + k % 2] = bf16(W[16j + n % 16][k])
 * zeros past N and past K. One allocation, 64-byte aligned. */
typedef struct attn_packed_bf16 {
    int N, K;          /* W is (N,K): N outputs, K inputs */
    int panels;        /* ceil(N / 16) */
    int kp;            /* input pairs per panel: K rounded up to ATTN_BF16_KSTEP, halved */
    attn_bf16 *p;      /* (panels, kp, 16, 2); owned */
    const float *bias; /* (N), borrowed from the model (zeros when it has none) */
    float *bias16;     /* (panels * 16) the bias, zeros past N: AMX loads it as a tile; in p's
                          allocation */
} attn_packed_bf16;

/* W[n][k] in bf16, read from the packed layout above. */
static inline attn_bf16 attn_packed_bf16_at(const attn_packed_bf16 *pw, int n, int k) {
    size_t pair = ((size_t)(n / 16) * pw->kp + (size_t)(k / 2)) * 16 + (size_t)(n % 16);
    return pw->p[pair * 2 + (size_t)(k % 2)];
}

/* Rounds and packs W (N,K) once, and copies bias (N); again if either
 * changes. Returns 0 or -1 (out of memory). */
int attn_packed_bf16_init(attn_packed_bf16 *pw, const float *W, const float *bias, int N, int K);
void attn_packed_bf16_free(attn_packed_bf16 *pw); /* zeroed or NULL: no-op */
/* C[r0:r1, 16*j0 : 16*j1) clipped to N = bf16(A[r0:r1]) @ W^T + bias, on the
 * current path: gemm_tile's contract (internal.h) on bf16 weights. A row's
 * outputs do not depend on the rows, panels or thread of the call (each path
 * sums a row alone and in one order), so projections stay batch-invariant. */
void gemm_bf16_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                    size_t r0, size_t r1, int j0, int j1);
/* The same on rows rounded already: A (M, K rounded up to ATTN_BF16_KSTEP) in
 * bf16 at row stride lda (elements), zeros past K (attn_bf16_round a row,
 * then zero its tail). A caller that projects the same rows on many column
 * tiles rounds them once this way instead of once per tile; the outputs are
 * those of gemm_bf16_tile on the fp32 rows, bit for bit. */
void gemm_bf16_tile_rounded(float *C, size_t ldc, const attn_bf16 *A, size_t lda,
                            const attn_packed_bf16 *pw, size_t r0, size_t r1, int j0, int j1);
/* The formula, plainly: rows [r0,r1) x columns [c0,c1); c = bias, then
 * c += bf16(a_k) * w_k for k = 0..K-1 in fp32. */
void gemm_bf16_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                   size_t r0, size_t r1, int c0, int c1);

/* ---- keys and values in bf16: pages of 32 tokens ------------------------------ */

/* The one layout of bf16 keys and values, for a forward and a KV cache
 * alike. A sequence's keys and values are pages of ATTN_KV_PAGE tokens; page
 * p holds tokens [32p, 32p+32) of each of the G key/value heads (width D,
 * even; a multiple of 32 for attn_bf16_block's fast paths) in turn, head g at p * page + g * 64D
 * (page = G * 64D bf16, 128 G D bytes), as: keys   (2, D/2, 16, 2)  key d of token 32p + 16b + t at
 * ((b*D/2 + d/2)*16 + t)*2 + d%2 values (16, D, 2)       value d of token 32p + 2u + e at 32D +
 * (u*D + d)*2 + e so that 16 keys x 2 widths and 2 tokens x 16 values are each 64 contiguous bytes
 * (an AMX tile row, a 512-bit register). Token slots past the last token hold zeros. Pages follow
 * each other with no gap: a cache grows by appending pages (realloc keeps every offset), a token at
 * a time with attn_kv_bf16_put; a forward packs projected keys and values at once with
 * attn_kv_bf16_pack. Memory: 4 G D bytes a token (half of fp32), counted
 * in whole pages. Grouped-query heads share a head's pages (attn_bf16_block
 * takes the R query heads of a group together). */
enum { ATTN_KV_PAGE = ATTN_KV16_PAGE };

/* bf16 elements of a cache of `tokens` tokens (whole pages). */
size_t attn_kv_bf16_elems(size_t tokens, int G, int D);
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

/* One key/value head of a sequence, as the attention block reads it. */
typedef struct {
    const attn_bf16 *head; /* page 0 of the head: kv + g * 64D; borrowed */
    size_t page;           /* bf16 elements from one page to the next: G * 64D */
    int S;                 /* tokens, >= 1; equals the attn_seq's S */
} attn_kv_bf16;

static inline attn_kv_bf16 attn_kv_bf16_head(const attn_bf16 *kv, int G, int D, int g, int S) {
    return (attn_kv_bf16){kv + (size_t)g * 64 * D, (size_t)G * 64 * D, S};
}

/* ---- the attention block ------------------------------------------------------- */

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

enum { ATTN_BF16_ROWS = 512 }; /* rows (positions x heads) a block takes in one pass */
enum { ATTN_BF16_DMAX = 256 }; /* the widest head the block and its reference take */

/* 1 when the bf16 block runs D on the current path: D a multiple of 32 up to
 * 256, and AMX or AVX512-BF16 present. Other widths, and CPUs without either,
 * take the fp32 kernels. */
int attn_bf16_supported(int D);
size_t attn_bf16_scratch_bytes(int D); /* one thread's scratch for one block */

/* The online-softmax attention of Lb positions [i0, i0+Lb) of sequence s,
 * for the R query heads that share one key/value head (1 <= R <=
 * ATTN_BF16_ROWS; a call of more than ATTN_BF16_ROWS rows runs as several):
 * the block's rows are (position, head) pairs, row r at position i0 + r / R,
 * its query at q + (r / R) * ldq + (r % R) * D, its output at
 * out + (r / R) * ldo + (r % R) * D (out (Lb, R*D) at stride ldo; out may
 * be q). kv holds the head's s->S keys and values. Masks are s's, read at
 * the row's position: attn_fused_block's (causal, key padding, boolean,
 * additive); a row with every key hidden gets zeros. With k_j, v_j the bf16
 * keys and values, in log2 units:
 *   q~  = bf16(q * (scale * log2(e)))         (the product in fp32)
 *   x_j = q~ . k_j + m_j * log2(e)            (fp32 sums of exact products; m_j the
 *                                              additive mask, below -1e30 counted as -1e30)
 *   p_j = 2^(x_j - c), c an integer >= max_j x_j, 0 for a hidden key   (fp32)
 *   out = sum_j bf16(p_j) v_j / sum_j p_j     (fp32 sums)
 * c is the running maximum (the ceiling of the largest score so far), so
 * rescaling by 2^(c_old - c_new) is exact and bf16(p_j) does not depend on
 * where the key blocks fall: the result is that of one c for all keys, up
 * to fp32 rounding. scratch: attn_bf16_scratch_bytes(D), 64-byte aligned,
 * the calling thread's. On the NONE path (or a width attn_bf16_supported
 * refuses) it runs attn_bf16_block_ref, which takes any even D up to
 * ATTN_BF16_DMAX. */
void attn_bf16_block(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                     const attn_seq *s, int i0, int Lb, int R, int D, float scale, void *scratch);
/* One row's attention weights by the block's formula, in place: its scores
 * x (n, log2 units, -inf where a key is hidden) become p_j / sum_j p_j with
 * p_j = 2^(x_j - c), c = ceil(max_j x_j), the block's 2^t, sums in fp32;
 * all zeros when every key is hidden. */
void attn_bf16_weights_row(float *x, int n);
/* The same, plainly: one row at a time, libm's exp2, no scratch. Both
 * take an even D up to ATTN_BF16_DMAX; kv may be at any alignment. */
void attn_bf16_block_ref(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                         const attn_seq *s, int i0, int Lb, int R, int D, float scale);

/* ---- inside the kernels' files only ------------------------------------------ */

/* The AMX tile configuration every kernel uses (8 tiles of 16 rows x 64
 * bytes), loaded on the calling thread; attn_amx_end releases the tiles. */
void attn_amx_begin(void);
void attn_amx_end(void);

#endif
