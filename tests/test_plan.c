/* test_plan.c - Check suite for attn_plan_describe (core/forward/plan.c): the
 * loops a forward would run, for models (multi-head, grouped heads with
 * rotary positions, cross-attention with other key and value widths),
 * batches (one or many sequences, causal, an attention matrix asked for,
 * a KV-cache step) and 1 to 64 threads. Each loop's tasks must add up to
 * the batch's whole work: the projection tiles to every output of every
 * part exactly once (rows x columns per part, each over the part's inputs),
 * the rows of step 2 to the batch's rows, the attention tasks to every
 * (query row, head) against the keys it reads; a projection splits into at
 * least three tiles per thread unless its tiles are at their smallest; the
 * attention tasks of the fused kernel (whose rows' bits do not depend on
 * their block) are cut smaller only when the threads outnumber them, until
 * they do not or their blocks are at their smallest, and the attention
 * tasks of the OpenBLAS tiles never depend on the thread count. A bf16
 * model's plan holds its rounding loops (every input row once) and, where
 * it attends in bf16, its packing loop (every page of whole sequences).
 * And the forward runs the loops the plan lists: the same kinds and task
 * counts, for fp32 and bf16 models, selections and cache steps.
 */
#include "../core/attn.h"
#include "../core/kernels/block.h"
#include "../core/kernels/kv_pages.h"
#include "../core/platform/ctx.h"

#include "check_run.h"
#include "test_rand.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int g_threads[] = {1, 2, 3, 8, 16, 64};
#define NTHREADS ((int)(sizeof(g_threads) / sizeof(g_threads[0])))

/* The batch's work per loop, from its shape alone. */
typedef struct {
    uint64_t proj[3];  /* q, k, v: outputs (rows x columns) */
    uint64_t out;      /* outputs of the out projection */
    uint64_t rows;     /* query rows (step 2) */
    uint64_t attn;     /* (query row, head, key) triples the attention reads, causal's exactly */
    uint64_t attn_all; /* the same with every key of every row */
} work;

static work work_of(const attn_model *m, const attn_batch *b) {
    const attn_hparams *hp = &m->hp;
    uint64_t H = hp->num_heads, G = hp->num_kv_heads, D = hp->head_dim, T = 0, U = 0;
    work w = {0};
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        T += s->L;
        U += s->S;
        for (int r = 0; r < s->L; r++) {
            int step = s->kv || s->kv16, shift = step ? s->cached : 0, keys = s->S;
            if ((s->causal || step) && r + 1 + shift < keys) keys = r + 1 + shift;
            w.attn += H * keys;
        }
        w.attn_all += H * s->L * s->S;
    }
    uint64_t M = b->key ? U : T;
    w.proj[0] = T * H * D;
    w.proj[1] = w.proj[2] = M * G * D;
    w.out = T * hp->embed_dim;
    w.rows = T;
    return w;
}

/* Checks one plan against the batch's work. */
static void check_plan(const attn_plan *p, const attn_model *m, const attn_batch *b) {
    const attn_hparams *hp = &m->hp;
    work w = work_of(m, b);
    uint64_t proj[4] = {0}, rows = 0, attn = 0;
    int K[4] = {hp->embed_dim, b->key ? hp->kdim : hp->embed_dim, b->key ? hp->vdim : hp->embed_dim,
                hp->num_heads * hp->head_dim};
    size_t next = 0, round = 0, out_round = 0, pages = 0, want_pages = 0;
    int has_prep = hp->rope.dim > 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        has_prep |= s->kv || s->kv16;
        if (m->attn16 && !s->kv16) want_pages += attn_kv_pages((size_t)s->S);
    }
    for (int l = 0; l < p->nloops; l++) {
        ck_assert_uint_eq(p->loops[l].first, next); /* loops follow each other */
        ck_assert_uint_gt(p->loops[l].ntasks, 0);
        if (l > 0) ck_assert_int_gt(p->loops[l].kind, p->loops[l - 1].kind);
        for (size_t t = next; t < next + p->loops[l].ntasks; t++) {
            const attn_plan_task *k = &p->tasks[t];
            ck_assert_int_eq(k->loop, p->loops[l].kind);
            ck_assert_int_gt(k->rows, 0);
            if (k->loop == ATTN_LOOP_PROJ || k->loop == ATTN_LOOP_OUT) {
                ck_assert_int_eq(k->depth, K[k->part]);
                ck_assert_int_le(k->rows, 192);
                ck_assert_int_le(k->cols, 256);
                proj[k->part] += (uint64_t)k->rows * k->cols;
            } else if (k->loop == ATTN_LOOP_PREP) {
                rows += (uint64_t)k->rows;
            } else if (k->loop == ATTN_LOOP_ROUND || k->loop == ATTN_LOOP_OUT_ROUND) {
                *(k->loop == ATTN_LOOP_ROUND ? &round : &out_round) += (size_t)k->rows;
            } else if (k->loop == ATTN_LOOP_PACK) {
                pages++;
            } else {
                ck_assert_int_eq(k->depth, hp->head_dim);
                ck_assert_int_le(k->cols, b->seqs[k->part].S);
                if (k->loop == ATTN_LOOP_ATTEND) attn += (uint64_t)k->rows * k->heads * k->cols;
            }
        }
        next += p->loops[l].ntasks;
    }
    ck_assert_uint_eq(next, p->ntasks);
    /* a bf16 model rounds each distinct input row once, and the heads */
    size_t inputs = b->key ? w.rows + (w.proj[1] / (hp->num_kv_heads * hp->head_dim)) *
                                          (b->value && b->value != b->key ? 2 : 1)
                           : w.rows;
    ck_assert_uint_eq(round, m->precision == ATTN_BF16 ? inputs : 0);
    ck_assert_uint_eq(out_round, m->precision == ATTN_BF16 ? w.rows : 0);
    ck_assert_uint_eq(pages, want_pages);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(proj[i] == w.proj[i], "part %d: tiles cover %llu outputs of %llu", i,
                      (unsigned long long)proj[i], (unsigned long long)w.proj[i]);
    ck_assert_uint_eq(proj[3], w.out);
    ck_assert_uint_eq(rows, has_prep ? w.rows : 0);
    /* a causal block reads the keys of its last row: at least the exact work, at most all */
    ck_assert_msg(attn >= w.attn && attn <= w.attn_all, "attention work %llu not in [%llu, %llu]",
                  (unsigned long long)attn, (unsigned long long)w.attn,
                  (unsigned long long)w.attn_all);
    if (w.attn == w.attn_all) ck_assert_uint_eq(attn, w.attn);
}

/* Tiles of one thread's plan: each part in tiles of 192 rows x 256 columns. */
static size_t whole_tiles(const attn_model *m, const attn_batch *b, attn_loop_kind kind) {
    const attn_hparams *hp = &m->hp;
    work w = work_of(m, b);
    size_t T = w.rows, M = b->key ? 0 : T;
    for (int i = 0; b->key && i < b->B; i++)
        M += (size_t)b->seqs[i].S;
    int HD = hp->num_heads * hp->head_dim, GD = hp->num_kv_heads * hp->head_dim;
    if (kind == ATTN_LOOP_OUT) return (T + 191) / 192 * ((hp->embed_dim + 255) / 256);
    return (T + 191) / 192 * ((HD + 255) / 256) + 2 * ((M + 191) / 192) * ((GD + 255) / 256);
}

/* Plans b on m at every thread count; checks each, and that the tiles of a
 * projection are at least three per thread or at their smallest, the fused
 * path's attention tasks at least one per thread or at their smallest, and
 * cut as at one thread when that gives each thread one; the other
 * attention tasks the same at every count. */
static void check_all_once(const attn_model *m, const attn_batch *b) {
    char err[256] = "";
    int fused = !m->attn16 && attn_fused_supported(m->hp.head_dim); /* tasks cut for threads */
    attn_plan one;
    ck_assert_msg(attn_plan_describe(&one, m, b, 1, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < NTHREADS; i++) {
        int n = g_threads[i];
        attn_plan p;
        ck_assert_msg(attn_plan_describe(&p, m, b, n, err, sizeof err) == 0, "%s", err);
        check_plan(&p, m, b);
        for (int l = 0; l < p.nloops; l++) {
            size_t first = p.loops[l].first, nt = p.loops[l].ntasks;
            attn_loop_kind kind = p.loops[l].kind;
            int as_one = !fused || one.loops[l].ntasks >= (size_t)n; /* no cut needed */
            if (kind == ATTN_LOOP_ATTEND && as_one) { /* cut from each sequence alone */
                ck_assert_uint_eq(nt, one.loops[l].ntasks);
                ck_assert(memcmp(p.tasks + first, one.tasks + one.loops[l].first,
                                 nt * sizeof *p.tasks) == 0);
            }
            if (kind == ATTN_LOOP_ATTEND && fused && nt < (size_t)n)
                for (size_t t = first; t < first + nt; t++) /* blocks at their fewest lanes */
                    ck_assert_msg(p.tasks[t].heads == m->hp.num_heads ||
                                      p.tasks[t].rows / 2 * p.tasks[t].heads < 16,
                                  "%zu attention tasks for %d threads, one of %d rows x %d heads",
                                  nt, n, p.tasks[t].rows, p.tasks[t].heads);
            if ((kind == ATTN_LOOP_PROJ || kind == ATTN_LOOP_OUT) && nt < 3 * (size_t)n && n > 1)
                for (size_t t = first; t < first + nt; t++) /* smallest: 24 rows, 2 panels */
                    ck_assert_msg(p.tasks[t].rows <= 24 && p.tasks[t].cols <= 32,
                                  "%zu tiles for %d threads, one of %d x %d", nt, n,
                                  p.tasks[t].rows, p.tasks[t].cols);
            if (n == 1 && (kind == ATTN_LOOP_PROJ || kind == ATTN_LOOP_OUT))
                ck_assert_uint_eq(nt, whole_tiles(m, b, kind));
        }
        attn_plan_free(&p);
    }
    attn_plan_free(&one);
}

/* check_all_once on the fused path (where the CPU has it) and on the
 * OpenBLAS tiles. */
static void check_all(const attn_model *m, const attn_batch *b) {
    check_all_once(m, b);
    int was = attn_set_fused(0);
    check_all_once(m, b);
    attn_set_fused(was);
}

START_TEST(test_plan_mha) {
    attn_hparams hp = {.embed_dim = 512, .num_heads = 8, .kdim = 512, .vdim = 512, .bias = 1};
    attn_model m = {0};
    rand_model(&m, &hp, 1.0f); /* the plan reads shapes, not weights */
    int Ls[] = {1, 5, 128, 700, 4096};
    for (int i = 0; i < 5; i++) {
        attn_seq s = {.L = Ls[i], .S = Ls[i]};
        attn_batch b = {.B = 1, .seqs = &s};
        check_all(&m, &b);
        s.causal = 1;
        check_all(&m, &b);
        s.causal = 0;
        s.weights = ATTN_WEIGHTS_MEAN;
        check_all(&m, &b);
    }
    attn_seq many[32];
    for (int i = 0; i < 32; i++)
        many[i] = (attn_seq){.L = 1 + (i * 37) % 90, .S = 1 + (i * 37) % 90, .causal = i % 3 == 0};
    attn_batch b = {.B = 32, .seqs = many};
    check_all(&m, &b);
    attn_model_free(&m);
}
END_TEST

START_TEST(test_plan_decoder) {
    attn_hparams hp = {.embed_dim = 256,
                       .num_heads = 8,
                       .kdim = 256,
                       .vdim = 256,
                       .num_kv_heads = 2,
                       .head_dim = 48,
                       .rope = {.dim = 48, .theta = 10000}};
    attn_model m = {0};
    rand_model(&m, &hp, 1.0f); /* the plan reads shapes, not weights */
    float kv[(40 + 7) * 2 * 2 * 48];
    attn_seq s[3] = {{.L = 300, .S = 300, .causal = 1},
                     {.L = 7, .S = 47, .kv = kv, .cached = 40},
                     {.L = 33, .S = 33, .weights = ATTN_WEIGHTS_HEADS}};
    attn_batch b = {.B = 3, .seqs = s};
    check_all(&m, &b);
    b.B = 1;
    b.seqs = &s[1]; /* a lone step */
    check_all(&m, &b);
    attn_model_free(&m);
}
END_TEST

START_TEST(test_plan_cross) {
    attn_hparams hp = {.embed_dim = 96, .num_heads = 6, .kdim = 40, .vdim = 72, .bias = 1};
    attn_model m = {0};
    rand_model(&m, &hp, 1.0f); /* the plan reads shapes, not weights */
    attn_seq s[2] = {{.L = 50, .S = 333}, {.L = 9, .S = 2}};
    float key = 0, value = 0; /* not read: marks cross-attention with its own value */
    attn_batch b = {.B = 2, .seqs = s, .key = &key, .value = &value};
    check_all(&m, &b);
    attn_model_free(&m);
}
END_TEST

START_TEST(test_plan_unpacked) {
    attn_hparams hp = {.embed_dim = 64, .num_heads = 4, .kdim = 64, .vdim = 64};
    attn_model m = {0};
    char err[256] = "";
    ck_assert_int_eq(attn_model_init(&m, &hp, err, sizeof err), 0);
    attn_seq s = {.L = 4, .S = 4};
    attn_batch b = {.B = 1, .seqs = &s};
    attn_plan p;
    ck_assert_int_eq(attn_plan_describe(&p, &m, &b, 2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "pack") != NULL, "%s", err);
    ck_assert_ptr_null(p.tasks);
    attn_plan_free(&p);
    attn_model_free(&m);
}
END_TEST

/* Runs b on m with n threads and holds the loops the forward ran to the
 * plan's: the same kinds, in order, with the same task counts. */
static void check_runs_plan(const attn_model *m, attn_batch *b, int n) {
    char err[256] = "";
    attn_ctx *ctx = attn_ctx_new(n);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_msg(attn_forward(ctx, m, b, err, sizeof err) == 0, "%s", err);
    attn_plan p;
    ck_assert_msg(attn_plan_describe(&p, m, b, n, err, sizeof err) == 0, "%s", err);
    const attn_ctx_loops *ran = attn_ctx_last_loops(ctx);
    ck_assert_int_eq(ran->nloops, p.nloops);
    for (int l = 0; l < p.nloops; l++) {
        ck_assert_int_eq(ran->kind[l], p.loops[l].kind);
        ck_assert_msg(ran->ntasks[l] == p.loops[l].ntasks,
                      "loop %d (kind %d): ran %zu tasks, plan %zu", l, (int)p.loops[l].kind,
                      ran->ntasks[l], p.loops[l].ntasks);
    }
    check_plan(&p, m, b);
    attn_plan_free(&p);
    attn_ctx_free(ctx);
}

/* A batch of m's: a whole causal sequence, a sequence whose matrix is asked
 * for, one that selects a part of it, and a cache step (in the cache the
 * model keeps: floats or bf16 pages) after `cached` tokens. */
static void check_runs(const attn_model *m, int cached) {
    const attn_hparams *hp = &m->hp;
    int E = hp->embed_dim, H = hp->num_heads;
    static const int head[] = {1};
    attn_seq s[4] = {{.L = 70, .S = 70, .causal = 1},
                     {.L = 20, .S = 20, .weights = ATTN_WEIGHTS_MEAN},
                     {.L = 40,
                      .S = 40,
                      .weights = ATTN_WEIGHTS_HEADS,
                      .sel = {.heads = head, .n_heads = 1, .row0 = 3, .row1 = 9, .top_k = 4}},
                     {.L = 5, .S = cached + 5, .cached = cached}};
    size_t T = 0;
    for (int i = 0; i < 4; i++)
        T += (size_t)s[i].L;
    float *q = rand_floats(T * (size_t)E, 1.0f), *out = xcalloc(T * (size_t)E, sizeof(float));
    float *attn1 = xcalloc(20 * 20, sizeof(float)), *attn2 = xcalloc(6 * 4, sizeof(float));
    int32_t *idx = xcalloc(6 * 4, sizeof(int32_t));
    void *cache = xcalloc(attn_kv_bytes(m, (size_t)cached + 5), 1);
    s[1].attn = attn1;
    s[2].attn = attn2;
    s[2].attn_idx = idx;
    if (m->attn16)
        s[3].kv16 = cache;
    else
        s[3].kv = cache;
    attn_batch b = {.B = 4, .seqs = s, .query = q, .out = out};
    for (int n = 1; n <= 3; n++) {
        check_runs_plan(m, &b, n);
        b.B = 3; /* and without the step */
        check_runs_plan(m, &b, n);
        b.B = 4;
    }
    (void)H;
    free(q);
    free(out);
    free(attn1);
    free(attn2);
    free(idx);
    free(cache);
}

START_TEST(test_plan_runs) {
    attn_hparams mha = {.embed_dim = 128, .num_heads = 4, .kdim = 128, .vdim = 128, .bias = 1};
    attn_hparams gqa = {.embed_dim = 256,
                        .num_heads = 8,
                        .kdim = 256,
                        .vdim = 256,
                        .num_kv_heads = 2,
                        .head_dim = 64,
                        .rope = {.dim = 64, .theta = 10000}};
    attn_hparams *hps[] = {&mha, &gqa};
    for (int i = 0; i < 2; i++)
        for (int prec = ATTN_FP32; prec <= ATTN_BF16; prec++) {
            attn_hparams hp = *hps[i];
            hp.precision = (attn_precision)prec;
            attn_model m = {0};
            rand_model(&m, &hp, 0.1f);
            if (prec == ATTN_BF16)
                printf("plan runs: %s model computes in %s, attends in %s\n", i ? "gqa" : "mha",
                       m.precision == ATTN_BF16 ? "bf16" : "fp32", m.attn16 ? "bf16" : "fp32");
            check_runs(&m, 37);
            attn_model_free(&m);
        }
}
END_TEST

START_TEST(test_plan_bf16) {
    attn_hparams hp = {.embed_dim = 256,
                       .num_heads = 4,
                       .kdim = 256,
                       .vdim = 256,
                       .bias = 1,
                       .precision = ATTN_BF16};
    attn_model m = {0};
    rand_model(&m, &hp, 1.0f); /* the plan reads shapes, not weights */
    attn_seq s[2] = {{.L = 300, .S = 300, .causal = 1}, {.L = 33, .S = 33}};
    attn_batch b = {.B = 2, .seqs = s};
    check_all(&m, &b);
    attn_seq x[2] = {{.L = 50, .S = 333}, {.L = 9, .S = 2}};
    float key = 0, value = 0; /* not read: marks cross-attention with its own value */
    attn_batch c = {.B = 2, .seqs = x, .key = &key, .value = &value};
    check_all(&m, &c);
    attn_model_free(&m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_plan_mha);
    tcase_add_test(tc, test_plan_decoder);
    tcase_add_test(tc, test_plan_cross);
    tcase_add_test(tc, test_plan_unpacked);
    tcase_add_test(tc, test_plan_bf16);
    tcase_add_test(tc, test_plan_runs);
    suite_add_tcase(s, tc);
    return check_run(s);
}
