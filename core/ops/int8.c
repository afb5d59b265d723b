/* int8.c - the int8 row of the projections' table (ops.h): SPEC section 8's
 * last paragraph.
 *
 * Weights quantized and packed once (kernels/gemm_int8.c: symmetric int8,
 * one fp32 scale per output channel), the fp32 matrices then freed (the
 * biases stay fp32); each input row quantized once (prepare: its scale, then
 * its values + 128 for VPDPBUSD) and read by every tile of it; tiles sum in
 * int32 and scale back in fp32 (gemm_int8.h has the formula). Every int8
 * path gives the same bits. The attention is a bf16 model's row (bf16.c)
 * where the CPU has bf16 kernels, else fp32's (forward/model.c's table).
 * Legend: see attn.h.
 */
#include <stdlib.h>
#include <string.h>

#include "../kernels/gemm_int8.h"
#include "../platform/cpu.h"
#include "ops.h"

/* This CPU has an int8 path, and every input width keeps the int32 sums exact. */
static int proj_runs(const attn_hparams *hp) {
    int qd = hp->num_heads * attn_hparams_head_dim(hp);
    int widths[4] = {hp->embed_dim, hp->kdim, hp->vdim, qd};
    for (int i = 0; i < 4; i++)
        if (widths[i] > ATTN_INT8_KMAX) return 0;
    return hp->precision == ATTN_INT8 && attn_int8_path() != ATTN_INT8_NONE;
}

static void proj_unpack(attn_model *m) {
    for (int i = 0; m->packed8 && i < 4; i++)
        attn_packed_int8_free(&m->packed8[i]);
    free(m->packed8);
    m->packed8 = NULL;
}

static int proj_pack(attn_model *m) {
    m->packed8 = calloc(4, sizeof *m->packed8);
    int bad = !m->packed8;
    for (int i = 0; !bad && i < 4; i++) {
        attn_proj_shape p = attn_proj_shape_of(m, i);
        bad = attn_packed_int8_init(&m->packed8[i], p.W, p.bias, p.N, p.K) < 0;
    }
    if (bad || attn_keep_biases(m) < 0) {
        proj_unpack(m);
        return -1;
    }
    const float *bias[4] = {m->q_b, m->k_b, m->v_b, m->out_b};
    for (int i = 0; i < 4; i++)
        m->packed8[i].bias = bias[i];
    return 0;
}

static const void *proj_weights(const attn_model *m, int which) {
    return m->packed8 ? &m->packed8[which] : NULL;
}

/* The weights, then their scales, column fix-ups and padded bias. */
static size_t proj_bytes(const void *w) {
    const attn_packed_int8 *pw = w;
    size_t cols = (size_t)pw->panels * ATTN_PANEL;
    return cols * (size_t)pw->kq * 4 + cols * 12;
}

/* The quantized weights and their scales (and fix-ups): what the model computes with. */
static const void *proj_data(const void *w, size_t *n) {
    const attn_packed_int8 *pw = w;
    size_t cols = (size_t)pw->panels * ATTN_PANEL;
    *n = cols * (size_t)pw->kq * 4 + cols * 8;
    return pw->p;
}

/* A row's bytes in 16-bit elements, and a tail of a tile's rows past the last. */
static size_t proj_prepared_elems(size_t M, int K) {
    return (M + ATTN_INT8_ROWPAD - 1) * (attn_int8_row_bytes(K) / 2);
}

static void proj_prepare(const proj_part *p, size_t r0, size_t r1) {
    size_t bytes = 2 * p->ld16;
    uint8_t *a = (uint8_t *)p->A16;
    for (size_t r = r0; r < r1 && r < p->M; r++)
        attn_int8_prepare_row(a + r * bytes, p->A + r * p->lda, p->K);
    if (r1 >= p->M) /* the tail: rows an AMX tile reads and drops */
        memset(a + p->M * bytes, 0, (ATTN_INT8_ROWPAD - 1) * bytes);
}

static void proj_tile(const proj_part *p, size_t r0, size_t r1, int j0, int j1) {
    gemm_int8_tile(p->C, p->ldc, (const uint8_t *)p->A16, 2 * p->ld16, p->w, r0, r1, j0, j1);
}

const attn_proj_ops attn_proj_int8 = {
    .name = "int8",
    .precision = ATTN_INT8,
    .runs = proj_runs,
    .pack = proj_pack,
    .unpack = proj_unpack,
    .weights = proj_weights,
    .bytes = proj_bytes,
    .data = proj_data,
    .prepared_elems = proj_prepared_elems,
    .prepare = proj_prepare,
    .tile = proj_tile,
};
