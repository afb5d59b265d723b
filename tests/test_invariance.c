/* test_invariance.c - Check suite for the projection kernel (core/kernels/gemm.c)
 * and for batch invariance (docs/performance.md):
 *
 *   kernel     every kernel the CPU runs (AVX-512, AVX2 + FMA) equals the
 *              plain fmaf formula bit for bit, the baseline kernel is within
 *              1e-6 of it, and cutting the product into any tiles changes
 *              no bit;
 *   batch      a sequence's output and attention matrix are bit-identical
 *              alone and in mixed batches (before, after and between other
 *              sequences of other lengths; in a cross-attention batch that
 *              takes its query as key and value) at 1, 2 and 3 threads, on
 *              the fused path (D = 16) and the OpenBLAS-tile path (D = 12).
 * memcmp, never a tolerance, for invariance.
 */
#include "../core/attn.h"
#include "../core/kernels/gemm.h"

#include "check_run.h"
#define TEST_RAND_SEED 42
#include "test_rand.h"
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the kernel --------------------------------------------------------------- */

typedef struct {
    int N, K;
    size_t M;
    float *W, *bias, *A;
    attn_packed pw;
} gcase;

static void gcase_new(gcase *g, size_t M, int N, int K) {
    g->M = M;
    g->N = N;
    g->K = K;
    g->W = rand_floats((size_t)N * K, 1.0f);
    g->bias = rand_floats((size_t)N, 1.0f);
    g->A = rand_floats(M * (size_t)K, 1.0f);
    ck_assert_int_eq(attn_packed_init(&g->pw, g->W, g->bias, N, K), 0);
}

static void gcase_free(gcase *g) {
    attn_packed_free(&g->pw);
    free(g->W);
    free(g->bias);
    free(g->A);
}

/* Shapes with tails in every direction: rows past the 12- and 6-row
 * kernels, columns past a panel, K past a K block; and rows 4 KiB apart
 * (K = 1024), whose inputs gemm_tile may copy before reading (gemm.c). */
static const int SHAPES[][3] = {{1, 16, 8},    {29, 70, 300}, {13, 33, 129},
                                {96, 512, 64}, {7, 5, 3},     {14, 40, 1024}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

/* Every kernel, on weights packed in K blocks of 128 and of 256 (gemm.c
 * picks one from the CPU's L1 size), against the formula; the rows 4 KiB
 * apart of the K = 1024 shape read in place in the first half, copied in
 * the second (gemm.c copies them on a CPU whose L1 has under 12 ways). */
START_TEST(test_kernel_equals_formula) {
    int levels[] = {ATTN_ISA_AVX512, ATTN_ISA_AVX2, ATTN_ISA_BASE};
    int kcs[] = {128, 256};
    int cpu = gemm_level(), ran = 0;
    for (int s = 0; s < 2 * NSHAPES; s++) {
        int was_copy = gemm_force_copy(s >= NSHAPES);
        gcase g;
        int was_kc = gemm_force_kc(kcs[s / NSHAPES]);
        gcase_new(&g, (size_t)SHAPES[s % NSHAPES][0], SHAPES[s % NSHAPES][1],
                  SHAPES[s % NSHAPES][2]);
        gemm_force_kc(was_kc);
        ck_assert_int_eq(g.pw.kc, kcs[s / NSHAPES]);
        size_t n = g.M * (size_t)g.N;
        float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        gemm_ref(want, (size_t)g.N, g.A, (size_t)g.K, &g.pw, 0, g.M, 0, g.N);
        for (int l = 0; l < 3; l++) {
            if (levels[l] > cpu) continue; /* the CPU cannot run it */
            int was = gemm_force_level(levels[l]);
            memset(got, 0xff, n * sizeof(float)); /* NaN: a column left unwritten shows */
            gemm_tile(got, (size_t)g.N, g.A, (size_t)g.K, &g.pw, 0, g.M, 0, g.pw.panels);
            gemm_force_level(was);
            ran++;
            if (levels[l] == ATTN_ISA_BASE) { /* no fma: the products are rounded */
                double worst = 0;
                for (size_t i = 0; i < n; i++) {
                    double d = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1.0);
                    if (!(d <= worst)) worst = d; /* NaN too */
                }
                ck_assert_msg(worst < 1e-5, "baseline kernel, shape %d: off by %g", s, worst);
                continue;
            }
            for (size_t i = 0; i < n; i++)
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                    ck_abort_msg(
                        "level %d, K block %d, M=%zu N=%d K=%d: output %zu is %.9g, formula %.9g",
                        levels[l], g.pw.kc, g.M, g.N, g.K, i, got[i], want[i]);
        }
        free(want);
        free(got);
        gcase_free(&g);
        gemm_force_copy(was_copy);
    }
    ck_assert_int_ge(ran, 2 * NSHAPES); /* at least the baseline ran on every shape */
}
END_TEST

/* Any cut of C into tiles gives the same bits as one call. */
START_TEST(test_tiles_change_nothing) {
    gcase g;
    gcase_new(&g, 203, 100, 257);
    size_t n = g.M * (size_t)g.N;
    float *whole = malloc(n * sizeof(float)), *cut = malloc(n * sizeof(float));
    gemm_tile(whole, (size_t)g.N, g.A, (size_t)g.K, &g.pw, 0, g.M, 0, g.pw.panels);
    const int rows[] = {1, 5, 12, 13, 97}, panels[] = {1, 2, 3, 7};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++) {
            memset(cut, 0, n * sizeof(float));
            for (size_t r0 = 0; r0 < g.M; r0 += (size_t)rows[a]) {
                size_t r1 = r0 + (size_t)rows[a] < g.M ? r0 + (size_t)rows[a] : g.M;
                for (int j0 = 0; j0 < g.pw.panels; j0 += panels[b])
                    gemm_tile(cut + r0 * g.N, (size_t)g.N, g.A + r0 * g.K, (size_t)g.K, &g.pw, 0,
                              r1 - r0, j0, j0 + panels[b]);
            }
            ck_assert_msg(memcmp(whole, cut, n * sizeof(float)) == 0,
                          "tiles of %d rows x %d panels differ from one call", rows[a], panels[b]);
        }
    free(whole);
    free(cut);
    gcase_free(&g);
}
END_TEST

/* ---- batch invariance ----------------------------------------------------------- */

typedef struct {
    int L;
    float *query; /* (L,E) */
    uint8_t *kpm; /* (L) or NULL */
    int causal;
} iseq;

typedef struct {
    float *out;  /* (L,E) of the watched sequence */
    float *attn; /* (H,L,L) of it, when asked */
} iresult;

static attn_model g_model;

static void make_model(int E, int H) {
    attn_hparams hp = {.embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1};
    rand_model(&g_model, &hp, 1.0f / sqrtf((float)E));
}

static void iseq_new(iseq *s, int L, int E, int masked) {
    s->L = L;
    s->query = rand_floats((size_t)L * E, 1.0f);
    s->kpm = NULL;
    s->causal = masked && L % 2;
    if (masked && L > 2) {
        s->kpm = calloc((size_t)L, 1);
        s->kpm[L / 3] = 1;
    }
}

static void iseq_free(iseq *s) {
    free(s->query);
    free(s->kpm);
}

/* Runs seqs[0..n) as one batch at `threads` threads and returns the outputs
 * (and attention matrix, if `weights`) of seqs[watch]. cross: the batch
 * goes as cross-attention with each query copied in as key and value. */
static iresult run(const iseq *seqs, int n, int watch, int threads, int cross,
                   attn_weights_mode weights) {
    int E = g_model.hp.embed_dim, H = g_model.hp.num_heads;
    size_t T = 0, off = 0;
    for (int i = 0; i < n; i++)
        T += (size_t)seqs[i].L;
    float *q = malloc(T * E * sizeof(float)), *out = malloc(T * E * sizeof(float));
    attn_seq *ss = calloc((size_t)n, sizeof(attn_seq));
    iresult res = {0};
    const iseq *w = &seqs[watch];
    if (weights != ATTN_WEIGHTS_NONE) res.attn = malloc((size_t)H * w->L * w->L * sizeof(float));
    size_t wat = 0;
    for (int i = 0; i < n; i++) {
        memcpy(q + off * E, seqs[i].query, (size_t)seqs[i].L * E * sizeof(float));
        ss[i] = (attn_seq){.L = seqs[i].L,
                           .S = seqs[i].L,
                           .causal = seqs[i].causal,
                           .key_padding_mask = seqs[i].kpm};
        if (i == watch) {
            wat = off;
            ss[i].weights = weights;
            ss[i].attn = res.attn;
        }
        off += (size_t)seqs[i].L;
    }
    attn_batch b = {.B = n, .seqs = ss, .query = q, .out = out};
    if (cross) b.key = b.value = q;
    attn_ctx *ctx = attn_ctx_new(threads);
    char err[256] = "";
    ck_assert_msg(attn_forward(ctx, &g_model, &b, err, sizeof(err)) == 0, "%s", err);
    attn_ctx_free(ctx);
    res.out = malloc((size_t)w->L * E * sizeof(float));
    memcpy(res.out, out + wat * E, (size_t)w->L * E * sizeof(float));
    free(q);
    free(out);
    free(ss);
    return res;
}

/* H: heads of the attention matrix (1 for the mean over heads). */
static void same(const iresult *a, const iresult *b, int L, int E, int H, const char *what) {
    ck_assert_msg(memcmp(a->out, b->out, (size_t)L * E * sizeof(float)) == 0,
                  "%s: output differs from the sequence alone", what);
    if (a->attn)
        ck_assert_msg(memcmp(a->attn, b->attn, (size_t)H * L * L * sizeof(float)) == 0,
                      "%s: attention matrix differs from the sequence alone", what);
}

static void iresult_free(iresult *r) {
    free(r->out);
    free(r->attn);
}

/* E, H: D = 16 takes the fused path on AVX-512, D = 12 the OpenBLAS tiles. */
static const int MODELS[][2] = {{64, 4}, {48, 4}};

START_TEST(test_batch_invariance) {
    make_model(MODELS[_i][0], MODELS[_i][1]);
    int E = g_model.hp.embed_dim, H = g_model.hp.num_heads;
    const int lens[] = {37, 1, 130, 12, 301, 64, 5};
    enum { NS = sizeof lens / sizeof lens[0] };
    iseq seqs[NS];
    for (int i = 0; i < NS; i++)
        iseq_new(&seqs[i], lens[i], E, i % 2);
    attn_weights_mode modes[] = {ATTN_WEIGHTS_NONE, ATTN_WEIGHTS_HEADS, ATTN_WEIGHTS_MEAN};
    for (int w = 0; w < 2; w++) { /* watch seqs[0] (L 37), then seqs[2] (L 130, masked) */
        int x = w ? 2 : 0, L = seqs[x].L;
        for (int m = 0; m < 3; m++) {
            int Hw = modes[m] == ATTN_WEIGHTS_MEAN ? 1 : H;
            iresult alone = run(&seqs[x], 1, 0, 1, 0, modes[m]);
            for (int threads = 1; threads <= 3; threads++) {
                char what[128];
                iresult r = run(&seqs[x], 1, 0, threads, 0, modes[m]);
                snprintf(what, sizeof what, "alone, %d threads, mode %d", threads, m);
                same(&alone, &r, L, E, Hw, what);
                iresult_free(&r);
                r = run(seqs, NS, x, threads, 0, modes[m]); /* between others */
                snprintf(what, sizeof what, "in a batch of %d, %d threads, mode %d", NS, threads,
                         m);
                same(&alone, &r, L, E, Hw, what);
                iresult_free(&r);
                r = run(seqs + x, NS - x, 0, threads, 0, modes[m]); /* first of a batch */
                snprintf(what, sizeof what, "first of %d, %d threads, mode %d", NS - x, threads, m);
                same(&alone, &r, L, E, Hw, what);
                iresult_free(&r);
                r = run(seqs, NS, x, threads, 1, modes[m]); /* cross-attention batch */
                snprintf(what, sizeof what, "cross batch of %d, %d threads, mode %d", NS, threads,
                         m);
                same(&alone, &r, L, E, Hw, what);
                iresult_free(&r);
            }
            iresult_free(&alone);
        }
    }
    for (int i = 0; i < NS; i++)
        iseq_free(&seqs[i]);
    attn_model_free(&g_model);
}
END_TEST

static Suite *invariance_suite(void) {
    Suite *s = suite_create("invariance");
    TCase *k = tcase_create("kernel");
    tcase_add_test(k, test_kernel_equals_formula);
    tcase_add_test(k, test_tiles_change_nothing);
    suite_add_tcase(s, k);
    TCase *b = tcase_create("batch");
    tcase_set_timeout(b, 300);
    tcase_add_loop_test(b, test_batch_invariance, 0, 2);
    suite_add_tcase(s, b);
    return s;
}

int main(void) {
    return check_run(invariance_suite());
}
