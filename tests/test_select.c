/* test_select.c - Check suite for selections of the attention matrices in
 * core/ (attn_select: some heads, a range of rows, top-k; core/select/select.c).
 *
 *   bits      on random models (nn.MultiheadAttention with the fused kernel
 *             and with the OpenBLAS tiles, cross-attention with masks,
 *             grouped heads with rotary positions, a KV-cache step) and
 *             selections (heads in any order, rows across block edges,
 *             means over some heads, top-k from 1 to S), at 1, 2 and 3
 *             threads: the selected weights are the full path's bits at
 *             the same (head, row); a mean over every head is the full
 *             mean's bits, one over some heads within 1e-6 of the mean of
 *             the full weights; top-k is exactly the k largest of the
 *             selection's own rows (descending, the lower key first among
 *             equal weights); the output is the no-weights path's bits; and
 *             the reference forward agrees within 1e-5. The same for bf16
 *             models on each bf16 path the CPU has (AVX512-BF16, AMX; one
 *             it lacks is said and skipped): a model that attends in bf16
 *             (head widths 32 and 64, grouped heads with rotary positions,
 *             cross-attention with masks, a step on a cache of bf16 pages)
 *             gives its own whole matrix's bits at the selected (head, row),
 *             the whole mean's bits, top-k of those numbers, outputs of the
 *             same bits with or without a matrix, and the reference's bf16
 *             formula within 2e-3 (test_bf16_forward's bound); one whose
 *             head width (8) keeps its attention in fp32 as an fp32 model.
 *   refusals  every bad selection is refused by the forward with a
 *             sentence: heads out of range or repeated, rows empty,
 *             reversed or past L, top-k of 0 or more than S or without its
 *             index buffer, a selection with no weights asked for.
 *   cost      a forward's workspace for 1 head x 10 rows of L = S = 4096
 *             holds no (L,S) matrix: it exceeds the no-weights
 *             workspace by less than one head's matrix.
 */
#include "../core/attn.h"
#include "../core/kernels/kv_pages.h"
#include "../core/platform/cpu.h"

#include "check_run.h"
#include "test_rand.h"
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Check's ck_assert records every call; loops over elements use this. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ------------------------------------------------------------ the cases */

/* A model and one sequence of it. */
typedef struct {
    const char *name;
    attn_hparams hp;
    int L, S;   /* S ignored for self-attention */
    int cross;  /* 1: a key (and value) of S rows */
    int masks;  /* 1: key padding, boolean and float masks */
    int causal; /* 1: causal */
    int step;   /* > 0: a KV-cache step of L rows after `step` cached tokens */
    int fused;  /* 0: the OpenBLAS tiles for the output */
    int path;   /* a bf16 model (hp.precision): the bf16 path forced (bf16.h) */
} scase;

/* bf16 models (head widths the bf16 block takes, and one it does not). */
#define B16 .bias = 1, .precision = ATTN_BF16
#define B16_MHA                                                                                    \
    { .embed_dim = 128, .num_heads = 4, .kdim = 128, .vdim = 128, B16 }
#define B16_GQA                                                                                    \
    {                                                                                              \
        .embed_dim = 128, .num_heads = 8, .kdim = 128, .vdim = 128, .num_kv_heads = 2,             \
        .head_dim = 64, .rope = {.dim = 64, .theta = 10000}, B16                                   \
    }
#define B16_CROSS                                                                                  \
    { .embed_dim = 128, .num_heads = 2, .kdim = 72, .vdim = 40, B16 }
#define B16_D8                                                                                     \
    { .embed_dim = 64, .num_heads = 8, .kdim = 64, .vdim = 64, B16 }
#define AVX ATTN_BF16_AVX512
#define AMX ATTN_BF16_AMX

static const scase CASES[] = {
    {"mha d16 self causal",
     {.embed_dim = 64, .num_heads = 4, .kdim = 64, .vdim = 64, .bias = 1},
     300,
     300,
     0,
     0,
     1,
     0,
     1,
     0},
    {"mha d16 self, tiles",
     {.embed_dim = 64, .num_heads = 4, .kdim = 64, .vdim = 64, .bias = 1},
     300,
     300,
     0,
     0,
     0,
     0,
     0,
     0},
    {"mha d24 cross masks",
     {.embed_dim = 48, .num_heads = 2, .kdim = 40, .vdim = 56, .bias = 1},
     150,
     700,
     1,
     1,
     0,
     0,
     1,
     0},
    {"mha small S",
     {.embed_dim = 32, .num_heads = 4, .kdim = 32, .vdim = 32, .bias = 0},
     200,
     40,
     1,
     0,
     0,
     0,
     1,
     0},
    {"gqa rope d16",
     {.embed_dim = 64,
      .num_heads = 8,
      .kdim = 64,
      .vdim = 64,
      .bias = 0,
      .num_kv_heads = 2,
      .head_dim = 16,
      .rope = {.dim = 16, .theta = 10000}},
     200,
     200,
     0,
     0,
     1,
     0,
     1,
     0},
    {"mha step",
     {.embed_dim = 32, .num_heads = 4, .kdim = 32, .vdim = 32, .bias = 1},
     20,
     0,
     0,
     0,
     0,
     150,
     1,
     0},
    {"bf16 d32 causal avx512", B16_MHA, 300, 300, 0, 0, 1, 0, 1, AVX},
    {"bf16 d32 causal amx", B16_MHA, 300, 300, 0, 0, 1, 0, 1, AMX},
    {"bf16 gqa rope avx512", B16_GQA, 200, 200, 0, 0, 1, 0, 1, AVX},
    {"bf16 gqa rope amx", B16_GQA, 200, 200, 0, 0, 0, 0, 1, AMX},
    {"bf16 cross masks avx512", B16_CROSS, 150, 700, 1, 1, 0, 0, 1, AVX},
    {"bf16 cross masks amx", B16_CROSS, 150, 700, 1, 1, 0, 0, 1, AMX},
    {"bf16 step avx512", B16_MHA, 20, 0, 0, 0, 0, 150, 1, AVX},
    {"bf16 step amx", B16_MHA, 20, 0, 0, 0, 0, 150, 1, AMX},
    {"bf16 d8 (attention fp32)", B16_D8, 100, 100, 0, 0, 1, 0, 1, AMX},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

/* A selection to try, against a case's L, S and H (-1 in rows: L-1, L). */
typedef struct {
    attn_weights_mode mode;
    int heads[4], n_heads; /* n_heads 0: every head */
    int row0, row1;        /* both 0: every row; row0 -1: the last row */
    int top_k;             /* -1: S */
} ssel;

static const ssel SELS[] = {
    {ATTN_WEIGHTS_HEADS, {1, 0}, 2, 5, 140, 0}, {ATTN_WEIGHTS_HEADS, {0}, 0, 0, 0, 7},
    {ATTN_WEIGHTS_MEAN, {3, 1}, 2, 0, 0, 0},    {ATTN_WEIGHTS_MEAN, {0}, 0, -1, 0, -1},
    {ATTN_WEIGHTS_HEADS, {0}, 0, 127, 129, 1},  {ATTN_WEIGHTS_MEAN, {1}, 1, 3, 12, 5},
    {ATTN_WEIGHTS_HEADS, {0}, 0, 10, 20, 0},
};
#define NSELS ((int)(sizeof SELS / sizeof SELS[0]))

/* A case's inputs, made once per test. */
typedef struct {
    attn_model m;
    int L, S, H;
    float *query, *key, *value; /* (L,E), (S,Kd), (S,Vd): key NULL for self */
    uint8_t *kpm, *mask_bool;   /* (S), (L,S) or NULL */
    float *mask_add;            /* (L,S) or NULL */
    void *kv0;                  /* a step's cache as the prefix left it (floats, or bf16
                                   pages for a model with attn16), or NULL */
    size_t kv_bytes;
} inputs;

/* One forward's results. */
typedef struct {
    float *out;   /* (L,E) */
    float *attn;  /* attn_select_floats */
    int32_t *idx; /* the same count, with top-k */
    size_t nattn;
} result;

static void result_free(result *r) {
    free(r->out);
    free(r->attn);
    free(r->idx);
    memset(r, 0, sizeof *r);
}

static attn_seq seq_of(const inputs *in, const scase *c, void *kv) {
    attn_seq s = {.L = in->L, .S = in->S, .causal = c->causal};
    s.key_padding_mask = in->kpm;
    s.attn_mask_bool = in->mask_bool;
    s.attn_mask_add = in->mask_add;
    if (kv) {
        if (in->m.attn16)
            s.kv16 = kv;
        else
            s.kv = kv;
        s.cached = c->step;
        s.causal = 0;
    }
    return s;
}

/* A forward of one sequence with weights mode w and selection sel, on
 * nthreads threads (0: the reference). */
static result run(const inputs *in, const scase *c, attn_weights_mode w, const attn_select *sel,
                  int nthreads) {
    result r = {0};
    void *kv = NULL;
    if (in->kv0) { /* every run steps from the same cache */
        kv = xcalloc(in->kv_bytes, 1);
        memcpy(kv, in->kv0, in->kv_bytes);
    }
    attn_seq s = seq_of(in, c, kv);
    s.weights = w;
    if (sel) s.sel = *sel;
    r.nattn = attn_select_floats(&s, in->H);
    r.out = xcalloc((size_t)in->L * in->m.hp.embed_dim, sizeof(float));
    r.attn = xcalloc(r.nattn, sizeof(float));
    r.idx = xcalloc(r.nattn, sizeof(int32_t));
    s.attn = r.attn;
    s.attn_idx = r.idx;
    attn_batch b = {
        .B = 1, .seqs = &s, .query = in->query, .key = in->key, .value = in->value, .out = r.out};
    char err[256] = "";
    int rc;
    if (nthreads == 0) {
        rc = attn_forward_ref(&in->m, &b, err, sizeof err);
    } else {
        attn_ctx *ctx = attn_ctx_new(nthreads);
        ck_assert(ctx != NULL);
        int was = attn_set_fused(c->fused);
        rc = attn_forward(ctx, &in->m, &b, err, sizeof err);
        attn_set_fused(was);
        attn_ctx_free(ctx);
    }
    ck_assert_msg(rc == 0, "%s: %s", c->name, err);
    free(kv);
    return r;
}

static void inputs_make(inputs *in, const scase *c) {
    memset(in, 0, sizeof *in);
    g_rng = 0x5e1ec7ULL + (uint64_t)(c - CASES);
    rand_model(&in->m, &c->hp, RAND_UNIT / sqrtf((float)c->hp.embed_dim)); /* variance 1/E */
    const attn_hparams *hp = &in->m.hp;
    in->H = hp->num_heads;
    in->L = c->L;
    in->S = c->step ? c->step + c->L : c->cross ? c->S : c->L;
    in->query = rand_floats((size_t)c->L * hp->embed_dim, RAND_UNIT);
    if (c->cross) {
        in->key = rand_floats((size_t)in->S * hp->kdim, RAND_UNIT);
        in->value = rand_floats((size_t)in->S * hp->vdim, RAND_UNIT);
    }
    if (c->masks) {
        in->kpm = xcalloc((size_t)in->S, 1);
        in->mask_add = rand_floats((size_t)in->L * in->S, 0.5f * RAND_UNIT);
        in->mask_bool = rand_bools((size_t)in->L * in->S, 0.6f); /* a fifth hidden */
        for (int j = 0; j < in->S; j++)
            in->kpm[j] = j % 7 == 3;
        memset(in->mask_bool + 4 * (size_t)in->S, 1, (size_t)in->S); /* row 4 sees nothing */
    }
    if (c->step) { /* the prefix through a step of its own, from an empty cache */
        in->kv_bytes = attn_kv_bytes(&in->m, (size_t)in->S); /* pages zeroed, as a cache has them */
        in->kv0 = xcalloc(in->kv_bytes, 1);
        float *prefix = rand_floats((size_t)c->step * hp->embed_dim, RAND_UNIT);
        float *out = xcalloc((size_t)c->step * hp->embed_dim, sizeof(float));
        attn_seq s = seq_of(in, c, in->kv0);
        s.L = s.S = c->step;
        s.cached = 0;
        attn_batch b = {.B = 1, .seqs = &s, .query = prefix, .out = out};
        char err[256] = "";
        attn_ctx *ctx = attn_ctx_new(1);
        ck_assert_msg(attn_forward(ctx, &in->m, &b, err, sizeof err) == 0, "%s", err);
        attn_ctx_free(ctx);
        free(prefix);
        free(out);
    }
}

static void inputs_free(inputs *in) {
    attn_model_free(&in->m);
    free(in->query);
    free(in->key);
    free(in->value);
    free(in->kpm);
    free(in->mask_bool);
    free(in->mask_add);
    free(in->kv0);
}

/* The selection sd for a case of L rows, S keys and H heads. */
static attn_select select_of(const ssel *sd, const inputs *in) {
    attn_select s = {.row0 = sd->row0, .row1 = sd->row1, .top_k = sd->top_k};
    if (sd->n_heads) {
        s.heads = sd->heads;
        s.n_heads = sd->n_heads;
    }
    if (sd->row0 < 0) {
        s.row0 = in->L - 1;
        s.row1 = in->L;
    }
    if (s.row1 > in->L) s.row1 = in->L;
    if (s.row0 >= s.row1 && s.row1) s.row0 = s.row1 - 1;
    if (sd->top_k < 0) s.top_k = in->S;
    return s;
}

/* ------------------------------------------------------------ expectations */

/* The k largest of w (S), descending, the lower key first among equals:
 * k passes, each taking the best not yet taken. */
static void naive_top_k(float *val, int32_t *idx, const float *w, int S, int k) {
    uint8_t *taken = xcalloc((size_t)S, 1);
    for (int m = 0; m < k; m++) {
        int best = -1;
        for (int j = 0; j < S; j++)
            if (!taken[j] && (best < 0 || w[j] > w[best])) best = j;
        taken[best] = 1;
        val[m] = w[best];
        idx[m] = best;
    }
    free(taken);
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        d2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

/* Whole rows of the selection sel, from the full path's weights full
 * (H,L,S): bits for heads, a mean in double (to compare within 1e-6). */
static float *expected_rows(const inputs *in, const attn_select *sel, attn_weights_mode w,
                            const float *full) {
    int L = in->L, S = in->S, H = in->H;
    int r0 = sel->row1 ? sel->row0 : 0, r1 = sel->row1 ? sel->row1 : L;
    int nh = sel->heads ? sel->n_heads : H;
    float *e = xcalloc((size_t)(w == ATTN_WEIGHTS_HEADS ? nh : 1) * (r1 - r0) * S, sizeof(float));
    for (int i = r0; i < r1; i++)
        for (int j = 0; j < S; j++) {
            double sum = 0;
            for (int c = 0; c < nh; c++) {
                int h = sel->heads ? sel->heads[c] : c;
                float x = full[((size_t)h * L + i) * S + j];
                sum += x;
                if (w == ATTN_WEIGHTS_HEADS) e[((size_t)c * (r1 - r0) + (i - r0)) * S + j] = x;
            }
            if (w == ATTN_WEIGHTS_MEAN) e[(size_t)(i - r0) * S + j] = (float)(sum / nh);
        }
    return e;
}

/* The selection's answer r against whole rows `rows` (their count n of S):
 * equal bits, or for a mean over some heads within 1e-6; with top-k each
 * answer row is the naive top-k of the matching row of `rows`. */
static void check_answer(const scase *c, const attn_select *sel, const result *r, const float *rows,
                         size_t n, int S, int exact) {
    int k = sel->top_k;
    if (!k) {
        if (exact)
            REQUIRE(memcmp(r->attn, rows, n * sizeof(float)) == 0, "%s: weights differ in bits",
                    c->name);
        else
            REQUIRE(rel_err(r->attn, rows, n) < 1e-6, "%s: mean off by %g", c->name,
                    rel_err(r->attn, rows, n));
        return;
    }
    float *val = xcalloc((size_t)k, sizeof(float));
    int32_t *idx = xcalloc((size_t)k, sizeof(int32_t));
    for (size_t row = 0; row < n / (size_t)S; row++) {
        naive_top_k(val, idx, rows + row * S, S, k);
        REQUIRE(memcmp(val, r->attn + row * k, sizeof(float) * k) == 0 &&
                    memcmp(idx, r->idx + row * k, sizeof(int32_t) * k) == 0,
                "%s: top-%d of answer row %zu differs (first: %d %g, want %d %g)", c->name, k, row,
                r->idx[row * k], (double)r->attn[row * k], idx[0], (double)val[0]);
    }
    free(val);
    free(idx);
}

START_TEST(test_bits) {
    const scase *c = &CASES[_i / NSELS];
    const ssel *sd = &SELS[_i % NSELS];
    if (c->path && c->path > attn_bf16_level()) {
        printf("%s: %s is not on this CPU: not run\n", c->name, attn_bf16_name(c->path));
        return;
    }
    if (c->path) attn_bf16_force(c->path);
    inputs in;
    inputs_make(&in, c);
    if (c->path) /* a bf16 model: its attention in bf16 unless its head width is not the block's */
        REQUIRE(in.m.precision == ATTN_BF16 && in.m.attn16 == !strstr(c->name, "attention fp32"),
                "%s: precision %d, attn16 %d", c->name, (int)in.m.precision, in.m.attn16);
    attn_select sel = select_of(sd, &in);
    if (sel.heads) /* a case with fewer heads keeps those it has */
        for (int a = 0; a < sel.n_heads; a++)
            if (sel.heads[a] >= in.H) sel.n_heads = a;
    if (sel.heads && sel.n_heads == 0) sel.heads = NULL;
    result none = run(&in, c, ATTN_WEIGHTS_NONE, NULL, 2);
    result full = run(&in, c, ATTN_WEIGHTS_HEADS, NULL, 2);
    attn_select whole = sel; /* the same rows and heads, whole rows */
    whole.top_k = 0;
    result rows = run(&in, c, sd->mode, &whole, 2);
    float *want = expected_rows(&in, &sel, sd->mode, full.attn);
    int all_heads = !sel.heads || sel.n_heads == in.H;
    if (sd->mode == ATTN_WEIGHTS_MEAN && all_heads && !sel.heads) { /* the full mean's bits */
        result mean = run(&in, c, ATTN_WEIGHTS_MEAN, NULL, 2);
        int r0 = sel.row1 ? sel.row0 : 0;
        memcpy(want, mean.attn + (size_t)r0 * in.S, rows.nattn * sizeof(float));
        result_free(&mean);
    }
    check_answer(c, &whole, &rows, want, rows.nattn, in.S,
                 sd->mode == ATTN_WEIGHTS_HEADS || !sel.heads);
    int part = sel.top_k || sel.row1 || (sel.heads && !(sel.n_heads == in.H && sel.heads[0] == 0));
    const result *out_path = part ? &none : &full; /* the whole matrix takes the full path */
    for (int t = 1; t <= 3; t++) {
        result got = run(&in, c, sd->mode, &sel, t);
        REQUIRE(memcmp(got.out, out_path->out, sizeof(float) * in.L * in.m.hp.embed_dim) == 0,
                "%s: output differs from the %s path (%d threads)", c->name,
                part ? "no-weights" : "full", t);
        check_answer(c, &sel, &got, rows.attn, rows.nattn, in.S, 1);
        result_free(&got);
    }
    result ref = run(&in, c, sd->mode, &sel, 0);
    result got = run(&in, c, sd->mode, &sel, 1);
    double e = rel_err(got.attn, ref.attn, got.nattn);
    double bound = in.m.attn16 ? 2e-3 : 1e-5; /* bf16: test_bf16_forward's TIGHT_REF */
    REQUIRE(e < bound, "%s: selection against the reference: %g", c->name, e);
    printf("%-22s sel %d: %zu floats, reference %.2e\n", c->name, _i % NSELS, got.nattn, e);
    result_free(&ref);
    result_free(&got);
    free(want);
    result_free(&rows);
    result_free(&full);
    result_free(&none);
    inputs_free(&in);
    attn_bf16_force(-1);
}
END_TEST

/* ------------------------------------------------------------ refusals */

START_TEST(test_refusals) {
    inputs in;
    inputs_make(&in, &CASES[0]); /* H = 4, L = S = 300 */
    static const int dup[] = {1, 1}, out[] = {4}, neg[] = {-1};
    struct {
        attn_weights_mode w;
        attn_select sel;
        int no_idx;
        const char *says;
    } bad[] = {
        {ATTN_WEIGHTS_HEADS, {.heads = dup, .n_heads = 2}, 0, "repeated"},
        {ATTN_WEIGHTS_HEADS, {.heads = out, .n_heads = 1}, 0, "out of [0, 4)"},
        {ATTN_WEIGHTS_MEAN, {.heads = neg, .n_heads = 1}, 0, "head -1"},
        {ATTN_WEIGHTS_HEADS, {.heads = out, .n_heads = 0}, 0, "0 selected heads"},
        {ATTN_WEIGHTS_HEADS, {.row0 = 5, .row1 = 5}, 0, "[5, 5)"},
        {ATTN_WEIGHTS_HEADS, {.row0 = 9, .row1 = 3}, 0, "[9, 3)"},
        {ATTN_WEIGHTS_MEAN, {.row0 = 0, .row1 = 301}, 0, "[0, 301)"},
        {ATTN_WEIGHTS_HEADS, {.top_k = 301}, 0, "top-k 301"},
        {ATTN_WEIGHTS_HEADS, {.top_k = -1}, 0, "top-k -1"},
        {ATTN_WEIGHTS_HEADS, {.top_k = 3}, 1, "index buffer"},
        {ATTN_WEIGHTS_NONE, {.top_k = 3}, 0, "needs weights"},
        {ATTN_WEIGHTS_NONE, {.row0 = 1, .row1 = 2}, 0, "needs weights"},
    };
    float *out_buf = xcalloc((size_t)in.L * 64, sizeof(float));
    float *attn = xcalloc((size_t)4 * in.L * in.S, sizeof(float));
    int32_t *idx = xcalloc((size_t)4 * in.L * in.S, sizeof(int32_t));
    attn_ctx *ctx = attn_ctx_new(1);
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        attn_seq s = {.L = in.L, .S = in.S, .weights = bad[t].w, .sel = bad[t].sel};
        s.attn = attn;
        s.attn_idx = bad[t].no_idx ? NULL : idx;
        attn_batch b = {.B = 1, .seqs = &s, .query = in.query, .out = out_buf};
        char err[256] = "", err_ref[256] = "";
        ck_assert_int_eq(attn_forward(ctx, &in.m, &b, err, sizeof err), -1);
        ck_assert_int_eq(attn_forward_ref(&in.m, &b, err_ref, sizeof err_ref), -1);
        ck_assert_msg(strstr(err, bad[t].says) != NULL, "case %zu: '%s' lacks '%s'", t, err,
                      bad[t].says);
        ck_assert_str_eq(err, err_ref);
    }
    attn_ctx_free(ctx);
    free(out_buf);
    free(attn);
    free(idx);
    inputs_free(&in);
}
END_TEST

/* ------------------------------------------------------------ cost */

START_TEST(test_workspace) {
    attn_model m;
    attn_hparams hp = {.embed_dim = 512, .num_heads = 8, .kdim = 512, .vdim = 512, .bias = 1};
    char err[256] = "";
    ck_assert(attn_model_init(&m, &hp, err, sizeof err) == 0);
    enum { L = 4096 };
    static const int head[] = {3};
    float dummy;
    int32_t idx;
    attn_seq s = {.L = L, .S = L, .attn = &dummy, .attn_idx = &idx};
    attn_batch b = {.B = 1, .seqs = &s, .query = &dummy, .out = &dummy};
    for (int t = 1; t <= 4; t++) {
        s.weights = ATTN_WEIGHTS_NONE;
        s.sel = (attn_select){0};
        size_t none = attn_workspace_bytes(&m, &b, t);
        s.weights = ATTN_WEIGHTS_HEADS;
        s.sel = (attn_select){.heads = head, .n_heads = 1, .row0 = 100, .row1 = 110};
        size_t sel = attn_workspace_bytes(&m, &b, t);
        ck_assert_uint_eq(attn_select_floats(&s, 8), 10 * L);
        s.sel.top_k = 5;
        size_t topk = attn_workspace_bytes(&m, &b, t);
        ck_assert_uint_eq(attn_select_floats(&s, 8), 10 * 5);
        printf("workspace at %d threads: none %zu, 1 head x 10 rows %zu, with top-5 %zu bytes\n", t,
               none, sel, topk);
        ck_assert_msg(sel >= none && sel - none < (size_t)L * L * sizeof(float),
                      "a selection's workspace grows by a whole (L,S) matrix");
        ck_assert(topk >= sel && topk - none < (size_t)L * L * sizeof(float));
    }
    attn_model_free(&m);
}
END_TEST

static Suite *select_suite(void) {
    Suite *s = suite_create("select");
    TCase *tb = tcase_create("bits");
    tcase_set_timeout(tb, 300);
    tcase_add_loop_test(tb, test_bits, 0, NCASES * NSELS);
    suite_add_tcase(s, tb);
    TCase *tr = tcase_create("refusals");
    tcase_add_test(tr, test_refusals);
    tcase_add_test(tr, test_workspace);
    suite_add_tcase(s, tr);
    return s;
}

int main(void) {
    return check_run(select_suite());
}
