/* ops.h - what a precision is to the layers above: two small tables of
 * operations, one row per precision, chosen once when a model is packed
 * (forward/model.c) and held by the model. Selection, task cutting and the
 * forward call through the row they are given and never test a precision:
 * a new precision is a new row (ops/fp32.c, ops/bf16.c, ops/int8.c are the
 * rows there are).
 *
 *   attn_proj_ops    the projections: pack the weights, prepare the inputs
 *                    once (bf16: round them), compute a tile of outputs;
 *   attn_attend_ops  the attention: rows per task, scratch, the outputs of
 *                    a block of rows, the weights of rows, and the outputs
 *                    from those weights.
 *
 * Also the plain types every attention operation shares: the attention of
 * one forward (attn_attend), where a sequence's rows are (attn_seq_at) and
 * a task (attn_task).
 * Legend: see attn.h.
 */
#ifndef ATTN_OPS_OPS_H
#define ATTN_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../attn.h"
#include "../prim/bf16.h"

/* ---- the attention of one forward ------------------------------------------ */

/* Where one sequence's rows are, once projected. */
typedef struct {
    size_t q0;          /* its first row in the batch's queries and projections */
    const float *k, *v; /* (S, G*D) at row stride ldkv: its keys and values */
    size_t ldkv;        /* (the projections, or a cache step's kv) */
    int shift;          /* position of query row 0: a step's cached tokens, else 0 */
    attn_seq view;      /* the sequence as the attention sees it: a step is causal */
    attn_bf16 *kv16;    /* a row with pages: its keys and values in bf16 pages (kv_pages.h), a
                           whole sequence's in the context's scratch, a step's in its cache */
    size_t page0;       /* a whole sequence's first page among the batch's (pages packed) */
} attn_seq_at;

/* One attention task: a block of query rows of one sequence, for one
 * key/value head and the query heads that read it, or for every head, or
 * the selected weights of the block (attn_select). */
enum {
    ATTN_TASK_FULL = -1,  /* every head: outputs and whole matrices */
    ATTN_TASK_SELECT = -2 /* the selected heads' weights of the block's selected rows */
};
typedef struct {
    int seq;  /* index into the batch */
    int head; /* key/value head (no matrix asked for), or ATTN_TASK_* */
    int i0;   /* first query row of the block */
    int i1;   /* one past the last */
} attn_task;

struct attn_attend_ops;

/* The attention of one forward: its shape, then (once the projections are
 * done) where its rows are. */
typedef struct {
    const struct attn_attend_ops *ops; /* the model's row */
    int H, G, D;
    float scale;
    int rows_alone; /* 1: decoder options (not plain MHA): a kernel call takes one row's R heads,
                       so that a row's bits never depend on its block */
    int kernel;     /* the row's own choice of kernel for this forward (prepare); the fp32
                       row: 1 the AVX-512 block, 0 OpenBLAS rows */
    int cut_rows;   /* query rows per no-matrix task, after any cut (tasks/attend.c) */
    float *q;       /* (T, H*D) at row stride ldq: queries in, head outputs out */
    size_t ldq;
    const attn_seq_at *seqs; /* (B) */
    const attn_task *tasks;
    float **tile; /* (threads) scratch */
} attn_attend;

/* mean (n) = P * inv, or += it when not first: a head's share of a mean. */
static inline void attn_mean_add(float *mean, const float *P, size_t n, float inv, int first) {
    for (size_t e = 0; e < n; e++)
        mean[e] = first ? P[e] * inv : mean[e] + P[e] * inv;
}

/* ---- the attention's row ---------------------------------------------------- */

typedef struct attn_attend_ops {
    const char *name;
    int pages; /* 1: keys and values are read from bf16 pages (kv_pages.h): whole sequences'
                  are packed before the attention, and a step's cache is pages (attn_seq.kv16) */
    /* 1 when this CPU runs this row for a model of hp (attn_model_init's). */
    int (*runs)(const attn_hparams *hp);
    /* Settles the row's own choice of kernel for one forward (a's shape set). */
    void (*prepare)(attn_attend *a);
    /* Lanes (query rows x the R heads of a row) per no-matrix task, before
     * any cut: a task takes lanes / R rows, at least one. */
    int (*block_lanes)(const attn_attend *a);
    /* The lanes of the next smaller task, where a row's bits do not depend
     * on its block, for a batch that leaves threads without a task; 0: no
     * smaller task (or no cut at all). */
    int (*fewer_lanes)(const attn_attend *a, int lanes);
    /* 1 when a no-matrix row's bits do not depend on the rows computed
     * with it (its block, their number): a session step of n rows is then
     * n steps of one, bit for bit (attn_model_rows_free). */
    int (*rows_free)(const attn_attend *a);
    /* Query rows whose weights over S keys are computed at once: the grid of
     * full and select tasks. */
    int (*weight_rows)(const attn_attend *a, int S);
    /* Scratch floats of a no-matrix task, and of a full task of `rows` rows
     * over S keys: their weights (weight_floats, rounded up to 16), then
     * what `outputs` needs. */
    size_t (*block_floats)(const attn_attend *a);
    size_t (*full_floats)(const attn_attend *a, int rows, int S);
    /* Scratch floats of weights of `rows` rows over S keys, at the start of
     * a select task's scratch. */
    size_t (*weight_floats)(const attn_attend *a, int rows, int S);
    /* The outputs of positions [i0, i1) of sa for the R query heads that
     * read key/value head g, over their queries. */
    void (*block)(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                  float *scratch);
    /* The attention weights of positions [r0, r1), within the block
     * [i0, i1) whose grid they are computed on, for the R heads that read g:
     * returns ((r1-r0)*R, S) floats in scratch, row (i-r0)*R + m for head
     * g*R + m at position i; zeros for keys a row may not see. The bits of
     * a row are those of the same row of the whole matrix. */
    float *(*weights)(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1, int r0,
                      int r1, float *scratch);
    /* The outputs of positions [i0, i1) for g's heads, given w, their
     * weights as `weights` returned them for r0 = i0, r1 = i1; scratch
     * after full_floats' weights. */
    void (*outputs)(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1,
                    const float *w, float *scratch);
} attn_attend_ops;

extern const attn_attend_ops attn_attend_fp32; /* ops/fp32.c */
extern const attn_attend_ops attn_attend_bf16; /* ops/bf16.c */

/* ---- the projections' row ----------------------------------------------------- */

/* Projection `which` of m (0 q, 1 k, 2 v, 3 out) as attn.h lays it out:
 * weights W (N,K), NULL once a row has freed them, and bias (N). */
typedef struct {
    const float *W, *bias;
    int N, K;
} attn_proj_shape;

static inline attn_proj_shape attn_proj_shape_of(const attn_model *m, int which) {
    const attn_hparams *hp = &m->hp;
    int E = hp->embed_dim, HD = hp->num_heads * hp->head_dim, GD = hp->num_kv_heads * hp->head_dim;
    switch (which) {
    case 0: /* (H*D, E) */
        return (attn_proj_shape){m->q_w, m->q_b, HD, E};
    case 1: /* (G*D, Kd) */
        return (attn_proj_shape){m->k_w, m->k_b, GD, hp->kdim};
    case 2: /* (G*D, Vd) */
        return (attn_proj_shape){m->v_w, m->v_b, GD, hp->vdim};
    default: /* (E, H*D) */
        return (attn_proj_shape){m->out_w, m->out_b, E, HD};
    }
}

/* One projection of a forward: inputs (M,K), packed weights, outputs (M,N). */
typedef struct {
    const struct attn_proj_ops *ops;
    const void *w;  /* the row's packed weights of this projection (NULL: sizes only) */
    int N, K;       /* outputs and inputs of the projection */
    const float *W; /* (N,K) the weights unpacked, where the model keeps them, or NULL */
    const float *A; /* (M,K) inputs at row stride lda */
    size_t lda;
    uint16_t *A16; /* prepared inputs (stride ld16) when the row prepares them, else NULL */
    size_t ld16;
    float *C; /* (M,N) outputs at row stride ldc */
    size_t ldc;
    size_t M;
} proj_part;

typedef struct attn_proj_ops {
    const char *name;
    attn_precision precision; /* what the model then computes in */
    /* 1 when this CPU runs this row for a model of hp. */
    int (*runs)(const attn_hparams *hp);
    /* Packs m's four weight matrices (q, k, v, out) into the row's own
     * field of m, once they are filled; 0, or -1 when out of memory (m then
     * holds no packed weights). A row may free m's fp32 matrices (m->q_w
     * NULL after): such a model is packed once. */
    int (*pack)(attn_model *m);
    void (*unpack)(attn_model *m); /* frees what pack made; safe when nothing was */
    /* The packed weights of projection `which` (0 q, 1 k, 2 v, 3 out), NULL before packing. */
    const void *(*weights)(const attn_model *m, int which);
    size_t (*bytes)(const void *w);                /* bytes the packed weights hold */
    const void *(*data)(const void *w, size_t *n); /* the weights' bytes as computed with */
    /* 16-bit elements of M rows of K inputs prepared (0: tiles read A as it
     * is): M rows at one stride, prepared_elems(2, K) - prepared_elems(1, K),
     * and a fixed tail a row may read past its last row (int8: AMX reads
     * whole tiles of rows); and rows [r0, r1) of part p prepared into p->A16
     * (zeros past K; the task with the last row fills the tail too). */
    size_t (*prepared_elems)(size_t M, int K);
    void (*prepare)(const proj_part *p, size_t r0, size_t r1);
    /* C[r0:r1, 16*j0 : 16*j1) of part p, clipped to N. */
    void (*tile)(const proj_part *p, size_t r0, size_t r1, int j0, int j1);
} attn_proj_ops;

extern const attn_proj_ops attn_proj_fp32; /* ops/fp32.c */
extern const attn_proj_ops attn_proj_bf16; /* ops/bf16.c */
extern const attn_proj_ops attn_proj_int8; /* ops/int8.c */

/* Shrinks m->mem to its biases and points q_b..out_b there, the weight
 * matrices NULL: for rows that hold the weights in their own packing alone
 * (ops/bf16.c). 0, or -1 when out of memory (m unchanged). */
int attn_keep_biases(attn_model *m);

#endif
