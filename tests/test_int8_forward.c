/* test_int8_forward.c - Check suite for int8 models through the one
 * forward (SPEC section 8, its last paragraph; core/kernels/gemm_int8.h).
 *
 * Every numeric test runs on each int8 path the CPU has, AMX-INT8,
 * AVX512-VNNI and AVX-VNNI (attn_int8_force, as workers.int8_kernels caps
 * them); a path it lacks is skipped with a line that says so. Groups:
 *   kernels    the projection kernels of every path against the int8 formula
 *              in plain loops, bit for bit (every path sums the same int32
 *              and scales back alike); the vector quantizer against the
 *              scalar one, ties to even.
 *   golden     the fp32 goldens (tests/data/golden, decoder/) served by an
 *              int8 model: outputs and attention matrices within 3e-2 of
 *              float64. The int8 goldens (tests/data/golden/int8,
 *              tests/gen_golden_int8.py): within 3e-2 of the exact layer and
 *              within TIGHT of the int8 formula computed there from the
 *              quantized numbers; each sequence alone, all in one batch, at
 *              1 and 3 threads.
 *   reference  random int8 models against attn_forward_ref's int8 formula,
 *              within TIGHT_REF.
 *   invariance bit for bit: a sequence alone and in mixed batches at 1, 2 and
 *              3 threads; a session's steps and the whole causal sequence;
 *              every int8 path the same bits.
 *   fallback   with the int8 kernels capped at "none" an int8 model is a bf16
 *              model (its answers a bf16 model's bits).
 *   model      what attn_model_pack settles (precision, bytes under 0.3 of
 *              an fp32 model's), refusals.
 *
 * The bounds, measured and chosen (docs/performance.md, "int8 models"):
 * TIGHT = 1e-3 against the float64 int8 formula. The forward's fp32 sums
 * differ from float64 by ~1e-6 relative, and now and then such a difference
 * moves an input of the output projection across a rounding boundary of
 * its quantization (one 1/127 step of its row's largest value); the
 * largest seen is printed. A forward that skipped the quantization (float
 * projections) or truncated instead of rounding is 5e-3 to 2e-2 away (the
 * generator checks every sequence for more than 5 x TIGHT), so TIGHT tells
 * them apart where 3e-2 does not.
 * ATTND_GOLDEN_DIR overrides the golden folder (default tests/data/golden).
 */
#include "../config/config.h"
#include "../core/attn.h"
#include "../core/kernels/gemm_int8.h"
#include "../core/kernels/kv_pages.h"
#include "../core/platform/cpu.h"

#include "check_run.h"
#define TEST_RAND_SEED 131
#include "test_rand.h"
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

#define LOOSE 3e-2     /* against float64: SPEC section 8 */
#define TIGHT 1e-3     /* against the int8 formula in float64 (the file's opening) */
#define TIGHT_REF 1e-3 /* against attn_forward_ref (the same formula, double sums) */

static const int PATHS[] = {ATTN_INT8_AVX, ATTN_INT8_AVX512, ATTN_INT8_AMX};
#define NPATHS 3

/* Largest errors seen by a test, printed at its end. */
static double g_worst_loose, g_worst_tight;

/* ------------------------------------------------------------ helpers */

/* Forces int8 path p when the CPU has it (returns 1), else says so. The
 * AVX-VNNI path runs in its EVEX form on a CPU with AVX512-VNNI but without
 * the VEX one (gemm_int8.c). */
static int use_path(int p, const char *test) {
    if (p > attn_int8_level()) {
        printf("%s: %s is not on this CPU: its kernels were not run\n", test, attn_int8_name(p));
        return 0;
    }
    attn_int8_force(p);
    return 1;
}

/* ||a - ref|| / ||ref|| in double (the absolute norm when ref is zeros). */
static double rel_err(const float *a, const float *ref, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        d2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

static void require_finite(const float *a, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        REQUIRE(isfinite(a[i]), "%s: element %zu is %g", what, i, (double)a[i]);
}

static void require_same(const void *a, const void *b, size_t bytes, const char *what) {
    REQUIRE(memcmp(a, b, bytes) == 0, "%s: the bits differ", what);
}

static void forward_on(attn_ctx *ctx, const attn_model *m, attn_batch *b) {
    char err[256] = "";
    ck_assert_msg(attn_forward(ctx, m, b, err, sizeof err) == 0, "%s", err);
}

static void forward_n(int threads, const attn_model *m, attn_batch *b) {
    attn_ctx *ctx = attn_ctx_new(threads);
    ck_assert(ctx != NULL);
    forward_on(ctx, m, b);
    attn_ctx_free(ctx);
}

static size_t attn_floats(const attn_model *m, const attn_seq *s) {
    if (s->weights == ATTN_WEIGHTS_HEADS) return (size_t)m->hp.num_heads * s->L * s->S;
    if (s->weights == ATTN_WEIGHTS_MEAN) return (size_t)s->L * s->S;
    return 0;
}

/* ------------------------------------------------------------ golden files */

static const char *golden_dir(void) {
    const char *d = getenv("ATTND_GOLDEN_DIR");
    return d && *d ? d : "tests/data/golden";
}

/* The .json files of dir (sorted), into names; returns how many (0 when
 * there is no such folder: test_goldens_present says so). Runs before the
 * tests: no ck_assert here. */
static int list_json(const char *dir, char names[][512], int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".json") == 0)
            snprintf(names[n++], 512, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, 512, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* Numbers, booleans (1/0) and nested arrays of them, flattened; NULL for
 * null. *n gets the count. */
static void flatten(const json_t *v, float *dst, size_t *n) {
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            flatten(json_array_get(v, i), dst, n);
        return;
    }
    if (dst) dst[*n] = json_is_boolean(v) ? (float)json_is_true(v) : (float)json_number_value(v);
    (*n)++;
}

static float *floats_of(const json_t *v, size_t *n) {
    *n = 0;
    if (!v || json_is_null(v)) return NULL;
    flatten(v, NULL, n);
    float *p = xcalloc(*n, sizeof(float));
    *n = 0;
    flatten(v, p, n);
    return p;
}

/* The golden's model through attnd's config and weights loader: its
 * "config" entry, or one made from an fp32 golden's fields (torch names). */
static void golden_model(const json_t *root, const char *file, attn_model *m) {
    char err[512] = "", text[4096];
    const json_t *cfg = json_object_get(root, "config");
    if (cfg) {
        char *entry = json_dumps(cfg, JSON_COMPACT);
        snprintf(text, sizeof text, "{\"models\":[%s]}", entry);
        free(entry);
    } else {
        const char *name = json_string_value(json_object_get(root, "name"));
        snprintf(text, sizeof text,
                 "{\"models\":[{\"name\":\"%s\",\"embed_dim\":%d,\"num_heads\":%d,\"kdim\":%d,"
                 "\"vdim\":%d,\"bias\":%s,\"weights\":\"%s.safetensors\"}]}",
                 name, (int)json_integer_value(json_object_get(root, "embed_dim")),
                 (int)json_integer_value(json_object_get(root, "num_heads")),
                 (int)json_integer_value(json_object_get(root, "kdim")),
                 (int)json_integer_value(json_object_get(root, "vdim")),
                 json_is_true(json_object_get(root, "bias")) ? "true" : "false", name);
    }
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_mem(&c, text, strlen(text), file, 1, err, sizeof err) == 0,
                  "%s: %s", file, err);
    ck_assert_msg(attnd_model_load(m, &c.models[0], err, sizeof err) == 0, "%s: %s", file, err);
    attnd_config_free(&c);
}

/* A model loaded as fp32 computes in int8 from here: packed again (a
 * model loaded as int8 is packed once: its float matrices went). */
static void as_int8(attn_model *m) {
    char err[256] = "";
    m->hp.precision = ATTN_INT8;
    ck_assert_msg(attn_model_pack(m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(m->precision, ATTN_INT8);
}

/* One golden sequence: its inputs as an attn_seq, the answers it expects. */
typedef struct {
    attn_seq s;
    float *query, *key, *value; /* (L,E), (S,Kd) or NULL, (S,Vd) or NULL */
    float *mask_add;
    uint8_t *kpm, *mask_bool;
    int32_t *pos;
    float *want, *want_attn;     /* float64 reference: (L,E), matrix or NULL */
    float *want16, *want16_attn; /* the int8 formula's, or NULL (fp32 goldens) */
    size_t nattn;                /* floats of the matrix */
} gseq;

static uint8_t *bytes_of(const json_t *v, size_t *n) {
    float *f = floats_of(v, n);
    if (!f) return NULL;
    uint8_t *b = xcalloc(*n, 1);
    for (size_t i = 0; i < *n; i++)
        b[i] = f[i] != 0;
    free(f);
    return b;
}

static void gseq_load(gseq *g, const json_t *js, const attn_model *m) {
    size_t n, nq, nk;
    memset(g, 0, sizeof *g);
    g->query = floats_of(json_object_get(js, "query"), &nq);
    g->key = floats_of(json_object_get(js, "key"), &nk);
    g->value = floats_of(json_object_get(js, "value"), &n);
    g->s.L = (int)(nq / (size_t)m->hp.embed_dim);
    g->s.S = g->key ? (int)(nk / (size_t)m->hp.kdim) : g->s.L;
    g->s.causal = json_is_true(json_object_get(js, "causal"));
    const char *mode = json_string_value(json_object_get(js, "attention"));
    g->s.weights = strcmp(mode, "heads") == 0  ? ATTN_WEIGHTS_HEADS
                   : strcmp(mode, "mean") == 0 ? ATTN_WEIGHTS_MEAN
                                               : ATTN_WEIGHTS_NONE;
    g->nattn = attn_floats(m, &g->s);
    g->want = floats_of(json_object_get(js, "output"), &n);
    g->want_attn = floats_of(json_object_get(js, "attn_weights"), &n);
    g->want16 = floats_of(json_object_get(js, "output_int8"), &n);
    g->want16_attn = floats_of(json_object_get(js, "attn_weights_int8"), &n);
    const json_t *pos = json_object_get(js, "positions");
    if (json_is_array(pos)) {
        g->pos = xcalloc(json_array_size(pos), sizeof(int32_t));
        for (size_t i = 0; i < json_array_size(pos); i++)
            g->pos[i] = (int32_t)json_integer_value(json_array_get(pos, i));
        g->s.positions = g->pos;
    }
    g->s.key_padding_mask = g->kpm = bytes_of(json_object_get(js, "key_padding_mask"), &n);
    const char *kind = json_string_value(json_object_get(js, "attn_mask_kind"));
    if (kind && strcmp(kind, "bool") == 0)
        g->s.attn_mask_bool = g->mask_bool = bytes_of(json_object_get(js, "attn_mask"), &n);
    if (kind && strcmp(kind, "float") == 0)
        g->s.attn_mask_add = g->mask_add = floats_of(json_object_get(js, "attn_mask"), &n);
}

static void gseq_free(gseq *g) {
    free(g->query);
    free(g->key);
    free(g->value);
    free(g->mask_add);
    free(g->kpm);
    free(g->mask_bool);
    free(g->pos);
    free(g->want);
    free(g->want_attn);
    free(g->want16);
    free(g->want16_attn);
}

typedef struct {
    attn_model m;
    json_t *root;
    int n;
    gseq *seqs;
} golden;

static void golden_load(golden *g, const char *path) {
    json_error_t e;
    memset(g, 0, sizeof *g);
    g->root = json_load_file(path, 0, &e);
    ck_assert_msg(g->root != NULL, "%s:%d: %s", path, e.line, e.text);
    golden_model(g->root, path, &g->m);
    const char *asked = json_string_value(
        json_object_get(json_object_get(g->root, "config"), "precision")); /* forward goldens */
    if (asked)
        ck_assert_msg(strcmp(asked, "int8") == 0 && g->m.precision == ATTN_INT8 && !g->m.q_w,
                      "%s: the config's \"precision\" did not make an int8 model", path);
    as_int8(&g->m); /* the fp32 goldens: packed again, as int8 */
    const json_t *arr = json_object_get(g->root, "sequences");
    g->n = (int)json_array_size(arr);
    g->seqs = xcalloc((size_t)g->n, sizeof(gseq));
    /* the formula's attention is bf16 where the head width takes it: a CPU
     * without bf16 kernels attends in fp32, and is held to float64 alone */
    int formula = !json_is_true(json_object_get(g->root, "attention_bf16")) || g->m.attn16;
    if (!formula) printf("%s: attention in fp32 here: against float64 alone\n", path);
    for (int i = 0; i < g->n; i++) {
        gseq_load(&g->seqs[i], json_array_get(arr, (size_t)i), &g->m);
        if (formula) continue;
        free(g->seqs[i].want16);
        free(g->seqs[i].want16_attn);
        g->seqs[i].want16 = g->seqs[i].want16_attn = NULL;
    }
}

static void golden_free(golden *g) {
    for (int i = 0; i < g->n; i++)
        gseq_free(&g->seqs[i]);
    free(g->seqs);
    json_decref(g->root);
    attn_model_free(&g->m);
}

/* Answers of some golden sequences in one batch. */
typedef struct {
    float *out;   /* (T,E) */
    float **attn; /* per sequence, its matrix or NULL */
    size_t *off;  /* per sequence, its first output row */
} gres;

/* Runs sequences idx[0..n) of g as one batch on ctx: cross-attention when
 * any has a key (then every sequence gives its key and value: a
 * self-attention one its query), else self-attention (key NULL). */
static gres golden_run(const golden *g, const int *idx, int n, attn_ctx *ctx) {
    int E = g->m.hp.embed_dim, Kd = g->m.hp.kdim, Vd = g->m.hp.vdim, cross = 0;
    size_t T = 0, U = 0;
    for (int i = 0; i < n; i++) {
        T += (size_t)g->seqs[idx[i]].s.L;
        U += (size_t)g->seqs[idx[i]].s.S;
        cross |= g->seqs[idx[i]].key != NULL;
    }
    gres r = {xcalloc(T * E, sizeof(float)), xcalloc((size_t)n, sizeof(float *)),
              xcalloc((size_t)n, sizeof(size_t))};
    attn_seq *seqs = xcalloc((size_t)n, sizeof(attn_seq));
    float *q = xcalloc(T * E, sizeof(float)), *k = cross ? xcalloc(U * Kd, 4) : NULL;
    float *v = cross ? xcalloc(U * Vd, 4) : NULL;
    for (int i = 0, t = 0, u = 0; i < n; i++) {
        const gseq *s = &g->seqs[idx[i]];
        seqs[i] = s->s;
        r.off[i] = (size_t)t;
        memcpy(q + (size_t)t * E, s->query, sizeof(float) * (size_t)s->s.L * E);
        if (cross) { /* self-attention: key = value = query; value = key when absent */
            const float *key = s->key ? s->key : s->query, *value = s->value ? s->value : key;
            memcpy(k + (size_t)u * Kd, key, sizeof(float) * (size_t)s->s.S * Kd);
            memcpy(v + (size_t)u * Vd, value, sizeof(float) * (size_t)s->s.S * Vd);
        }
        if (s->nattn) seqs[i].attn = r.attn[i] = xcalloc(s->nattn, sizeof(float));
        t += s->s.L;
        u += s->s.S;
    }
    attn_batch b = {.B = n, .seqs = seqs, .query = q, .key = k, .value = v, .out = r.out};
    forward_on(ctx, &g->m, &b);
    free(seqs);
    free(q);
    free(k);
    free(v);
    return r;
}

static void gres_free(gres *r, int n) {
    for (int i = 0; i < n; i++)
        free(r->attn[i]);
    free(r->attn);
    free(r->off);
    free(r->out);
}

/* Sequence i of a batch's answers against its golden within LOOSE of float64
 * and, where the golden has them, TIGHT of the bf16 formula. */
static void golden_check(const golden *g, const gseq *s, const float *out, const float *attn,
                         const char *what) {
    size_t n = (size_t)s->s.L * g->m.hp.embed_dim;
    require_finite(out, n, what);
    double e = rel_err(out, s->want, n);
    REQUIRE(e <= LOOSE, "%s: output %.3g from float64 (bound %g)", what, e, LOOSE);
    if (e > g_worst_loose) g_worst_loose = e;
    if (s->want16) {
        e = rel_err(out, s->want16, n);
        REQUIRE(e <= TIGHT, "%s: output %.3g from the int8 formula (bound %g)", what, e, TIGHT);
        if (e > g_worst_tight) g_worst_tight = e;
    }
    if (!s->nattn) return;
    require_finite(attn, s->nattn, what);
    e = rel_err(attn, s->want_attn, s->nattn);
    REQUIRE(e <= LOOSE, "%s: attention %.3g from float64 (bound %g)", what, e, LOOSE);
    if (e > g_worst_loose) g_worst_loose = e;
    if (s->want16_attn) {
        e = rel_err(attn, s->want16_attn, s->nattn);
        REQUIRE(e <= TIGHT, "%s: attention %.3g from the int8 formula (bound %g)", what, e, TIGHT);
        if (e > g_worst_tight) g_worst_tight = e;
    }
}

/* Every sequence of g alone, and every one in one batch (cross-attention
 * models: all; self-attention: all, key NULL), at 1 and 3 threads. */
static void golden_all(const golden *g, const char *path, const char *pathname) {
    attn_ctx *ctx[2] = {attn_ctx_new(1), attn_ctx_new(3)};
    ck_assert(ctx[0] && ctx[1]);
    int *idx = xcalloc((size_t)g->n, sizeof(int));
    char what[700];
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < g->n; i++) {
            idx[i] = i;
            gres r = golden_run(g, &i, 1, ctx[c]);
            snprintf(what, sizeof what, "%s, %s, sequence %d alone, %d thread(s)", path, pathname,
                     i, attn_ctx_threads(ctx[c]));
            golden_check(g, &g->seqs[i], r.out, r.attn[0], what);
            gres_free(&r, 1);
        }
        gres r = golden_run(g, idx, g->n, ctx[c]);
        for (int i = 0; i < g->n; i++) {
            snprintf(what, sizeof what, "%s, %s, sequence %d of a batch of %d, %d thread(s)", path,
                     pathname, i, g->n, attn_ctx_threads(ctx[c]));
            golden_check(g, &g->seqs[i], r.out + r.off[i] * g->m.hp.embed_dim, r.attn[i], what);
        }
        gres_free(&r, g->n);
    }
    free(idx);
    attn_ctx_free(ctx[0]);
    attn_ctx_free(ctx[1]);
}

static char g_files[64][512];
static int g_nfiles;

/* The fp32 goldens (the .json files of tests/data/golden and its decoder
 * folder), then the int8 goldens (those of int8/), in g_files. */
static void find_goldens(void) {
    char dir[512];
    g_nfiles = list_json(golden_dir(), g_files, 64);
    snprintf(dir, sizeof dir, "%s/decoder", golden_dir());
    g_nfiles += list_json(dir, g_files + g_nfiles, 64 - g_nfiles);
    snprintf(dir, sizeof dir, "%s/int8", golden_dir());
    g_nfiles += list_json(dir, g_files + g_nfiles, 64 - g_nfiles);
}

START_TEST(test_goldens_present) {
    int forward = 0;
    for (int i = 0; i < g_nfiles; i++)
        forward += strstr(g_files[i], "/int8/") != NULL;
    ck_assert_msg(g_nfiles - forward >= 10 && forward >= 5,
                  "%d fp32 and %d int8 goldens: run tests/gen_golden*.py", g_nfiles - forward,
                  forward);
}
END_TEST

START_TEST(test_golden_file) {
    ck_assert_int_lt(_i, g_nfiles);
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(PATHS[p], g_files[_i])) continue;
        golden g;
        g_worst_loose = g_worst_tight = 0;
        golden_load(&g, g_files[_i]);
        golden_all(&g, g_files[_i], attn_int8_kernels());
        printf("golden %s on %s (attention in %s): %d sequences; largest relative error %.3g "
               "from float64%s",
               g_files[_i], attn_int8_kernels(), g.m.attn16 ? "bf16" : "fp32", g.n, g_worst_loose,
               g.seqs[0].want16 ? "" : "\n");
        if (g.seqs[0].want16) printf(", %.3g from the int8 formula\n", g_worst_tight);
        golden_free(&g);
    }
    attn_int8_force(-1);
}
END_TEST

/* ------------------------------------------------------------ random models */

typedef struct {
    const char *name;
    attn_hparams hp;
    int cross; /* 1: key and value given */
} rmodel;

#define RBASE .kdim = 0, .vdim = 0, .bias = 1, .precision = ATTN_INT8
static const rmodel RMODELS[] = {
    {"mha d32", {.embed_dim = 128, .num_heads = 4, RBASE}, 0},
    {"mha d64", {.embed_dim = 256, .num_heads = 4, RBASE}, 0},
    {"gqa d64 rope",
     {.embed_dim = 128,
      .num_heads = 8,
      .num_kv_heads = 2,
      .head_dim = 64,
      .rope = {.dim = 64, .theta = 10000},
      RBASE},
     0},
    {"mqa d128 scale rope3",
     {.embed_dim = 96,
      .num_heads = 4,
      .num_kv_heads = 1,
      .head_dim = 128,
      .scale = 0.07,
      .rope = {.dim = 32, .theta = 500000, .style = ATTN_ROPE_INTERLEAVED},
      RBASE},
     0},
    {"gqa d256", {.embed_dim = 64, .num_heads = 4, .num_kv_heads = 2, .head_dim = 256, RBASE}, 0},
    {"cross d64",
     {.embed_dim = 128, .num_heads = 2, .kdim = 72, .vdim = 40, .bias = 1, .precision = ATTN_INT8},
     1},
    {"mha d48 (attention fp32)", {.embed_dim = 96, .num_heads = 2, RBASE}, 0},
    {"mha d8 (attention fp32)", {.embed_dim = 64, .num_heads = 8, RBASE}, 0},
};
#define NRMODELS ((int)(sizeof RMODELS / sizeof RMODELS[0]))

/* The scale of every weight and bias of the random models (rand_model). */
#define RM_SCALE 0.17f

/* A batch of random sequences with every option, buffers owned. */
typedef struct {
    attn_batch b;
    attn_seq seqs[8];
    void *own[64];
    int nown;
} rbatch;

static void *own(rbatch *r, void *p) {
    r->own[r->nown++] = p;
    return p;
}

static void rbatch_free(rbatch *r) {
    for (int i = 0; i < r->nown; i++)
        free(r->own[i]);
    memset(r, 0, sizeof *r);
}

/* Sequence lengths and options: (L, S, causal, masks: 1 kpm, 2 bool with a
 * hidden row, 4 float, weights). */
static const int RSEQS[][5] = {
    {1, 1, 0, 0, ATTN_WEIGHTS_NONE},     {37, 37, 1, 1, ATTN_WEIGHTS_HEADS},
    {600, 600, 1, 0, ATTN_WEIGHTS_NONE}, {33, 70, 0, 4, ATTN_WEIGHTS_MEAN},
    {130, 130, 0, 2, ATTN_WEIGHTS_NONE}, {64, 64, 1, 5, ATTN_WEIGHTS_HEADS},
    {9, 200, 0, 1, ATTN_WEIGHTS_MEAN},
};
#define NRSEQS ((int)(sizeof RSEQS / sizeof RSEQS[0]))

static void rand_masks(rbatch *r, attn_seq *s, int masks) {
    size_t LS = (size_t)s->L * s->S;
    if (masks & 1) {
        uint8_t *k = own(r, xcalloc((size_t)s->S, 1));
        for (int j = 1; j < s->S; j += 4)
            k[j] = 1;
        s->key_padding_mask = k;
    }
    if (masks & 2) {
        uint8_t *b = own(r, rand_bools(LS, 0.6f));
        if (s->L > 2) memset(b + 2 * (size_t)s->S, 1, (size_t)s->S); /* row 2: every key hidden */
        s->attn_mask_bool = b;
    }
    if (masks & 4) {
        float *a = own(r, rand_floats(LS, 3.0f));
        for (size_t e = 0; e < LS; e += 5)
            a[e] = e % 2 ? -INFINITY : -3.0e38f;
        s->attn_mask_add = a;
    }
}

/* The model's batch: every RSEQS sequence a self-attention model can take
 * (S == L), or all of them for cross-attention. */
static void rand_batch(rbatch *r, const attn_model *m, int cross) {
    memset(r, 0, sizeof *r);
    int E = m->hp.embed_dim, n = 0;
    size_t T = 0, U = 0;
    for (int i = 0; i < NRSEQS; i++) {
        if (!cross && RSEQS[i][0] != RSEQS[i][1]) continue;
        attn_seq *s = &r->seqs[n++];
        *s = (attn_seq){
            .L = RSEQS[i][0], .S = RSEQS[i][1], .causal = RSEQS[i][2], .weights = RSEQS[i][4]};
        rand_masks(r, s, RSEQS[i][3]);
        if (attn_floats(m, s)) s->attn = own(r, xcalloc(attn_floats(m, s), sizeof(float)));
        T += (size_t)s->L;
        U += (size_t)s->S;
    }
    r->b = (attn_batch){.B = n,
                        .seqs = r->seqs,
                        .query = own(r, rand_floats(T * E, 1.7f)),
                        .out = own(r, xcalloc(T * E, sizeof(float)))};
    if (cross) {
        r->b.key = own(r, rand_floats(U * m->hp.kdim, 1.7f));
        r->b.value = own(r, rand_floats(U * m->hp.vdim, 1.7f));
    }
}

/* A copy of r's outputs and matrices (same order). */
static float *answers(const attn_model *m, const rbatch *r, size_t *n) {
    size_t T = 0, na = 0;
    for (int i = 0; i < r->b.B; i++) {
        T += (size_t)r->seqs[i].L;
        na += attn_floats(m, &r->seqs[i]);
    }
    size_t no = T * m->hp.embed_dim;
    float *a = xcalloc(no + na, sizeof(float));
    memcpy(a, r->b.out, no * sizeof(float));
    for (int i = 0; i < r->b.B; i++) {
        size_t k = attn_floats(m, &r->seqs[i]);
        if (k) memcpy(a + no, r->seqs[i].attn, k * sizeof(float));
        no += k;
    }
    *n = no;
    return a;
}

START_TEST(test_random_vs_reference) {
    const rmodel *rm = &RMODELS[_i];
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(PATHS[p], rm->name)) continue;
        attn_model m;
        rand_model(&m, &rm->hp, RM_SCALE);
        rbatch r;
        rand_batch(&r, &m, rm->cross);
        char err[256] = "", what[256];
        ck_assert_msg(attn_forward_ref(&m, &r.b, err, sizeof err) == 0, "%s", err);
        size_t n;
        float *ref = answers(&m, &r, &n);
        double worst = 0;
        for (int t = 1; t <= 3; t += 2) {
            forward_n(t, &m, &r.b);
            float *got = answers(&m, &r, &n);
            snprintf(what, sizeof what, "%s on %s, %d thread(s)", rm->name, attn_int8_kernels(), t);
            require_finite(got, n, what);
            /* per sequence: outputs and matrices */
            size_t o = 0, a = 0, no = 0;
            for (int i = 0; i < r.b.B; i++)
                no += (size_t)r.seqs[i].L * m.hp.embed_dim;
            a = no;
            for (int i = 0; i < r.b.B; i++) {
                size_t lo = (size_t)r.seqs[i].L * m.hp.embed_dim, la = attn_floats(&m, &r.seqs[i]);
                double e = rel_err(got + o, ref + o, lo);
                double ea = la ? rel_err(got + a, ref + a, la) : 0;
                REQUIRE(e <= TIGHT_REF && ea <= TIGHT_REF,
                        "%s, sequence %d (L %d, S %d): %.3g (outputs), %.3g (matrix) from the "
                        "reference, bound %g",
                        what, i, r.seqs[i].L, r.seqs[i].S, e, ea, TIGHT_REF);
                worst = fmax(worst, fmax(e, ea));
                o += lo;
                a += la;
            }
            free(got);
        }
        printf("random %s on %s (attention in %s): largest relative error %.3g from the "
               "reference's int8 formula\n",
               rm->name, attn_int8_kernels(), m.attn16 ? "bf16" : "fp32", worst);
        free(ref);
        rbatch_free(&r);
        attn_model_free(&m);
    }
    attn_int8_force(-1);
}
END_TEST

/* ------------------------------------------------------------ invariance */

/* Sequence x of r, alone, in r's batch, and first of a batch that starts
 * there, at 1, 2 and 3 threads: the same bits. */
START_TEST(test_batch_invariance) {
    const rmodel *rm = &RMODELS[_i];
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(PATHS[p], rm->name)) continue;
        attn_model m;
        rand_model(&m, &rm->hp, RM_SCALE);
        rbatch r;
        rand_batch(&r, &m, rm->cross);
        forward_n(1, &m, &r.b);
        size_t n;
        float *whole = answers(&m, &r, &n);
        int E = m.hp.embed_dim;
        for (int t = 1; t <= 3; t++) {
            forward_n(t, &m, &r.b);
            float *again = answers(&m, &r, &n);
            require_same(whole, again, n * sizeof(float), "the batch at another thread count");
            free(again);
        }
        /* each sequence alone: its rows of the batch's answers */
        size_t q0 = 0, u0 = 0;
        for (int i = 0; i < r.b.B; i++) {
            attn_seq s = r.seqs[i];
            size_t lo = (size_t)s.L * E, la = attn_floats(&m, &s);
            float *out = xcalloc(lo, sizeof(float)), *attn = xcalloc(la, sizeof(float));
            float *keep = s.attn ? xcalloc(la, sizeof(float)) : NULL;
            if (keep) memcpy(keep, s.attn, la * sizeof(float));
            s.attn = la ? attn : NULL;
            attn_batch b = {.B = 1, .seqs = &s, .query = r.b.query + q0 * E, .out = out};
            if (rm->cross) {
                b.key = r.b.key + u0 * m.hp.kdim;
                b.value = r.b.value + u0 * m.hp.vdim;
            }
            forward_n(2, &m, &b);
            char what[200];
            snprintf(what, sizeof what, "%s on %s: sequence %d alone and in its batch", rm->name,
                     attn_int8_kernels(), i);
            require_same(out, r.b.out + q0 * E, lo * sizeof(float), what);
            if (keep) require_same(attn, keep, la * sizeof(float), what);
            q0 += (size_t)s.L;
            u0 += (size_t)s.S;
            free(out);
            free(attn);
            free(keep);
        }
        free(whole);
        rbatch_free(&r);
        attn_model_free(&m);
    }
    attn_int8_force(-1);
}
END_TEST

/* A cache of bf16 pages for `tokens` tokens, grown as a session grows it:
 * new pages zeroed (bf16.h). */
static uint16_t *cache_grow(const attn_model *m, uint16_t *kv, size_t had, size_t tokens) {
    size_t old = had ? attn_kv_bytes(m, had) : 0, want = attn_kv_bytes(m, tokens);
    if (want <= old) return kv;
    uint16_t *p = realloc(kv, want);
    ck_assert(p != NULL);
    memset((char *)p + old, 0, want - old);
    return p;
}

/* A session's steps against the whole causal sequence: outputs, mean
 * weights and the weights' rows, bit for bit; and the whole sequence's
 * outputs with and without its matrix. */
START_TEST(test_steps_bitwise) {
    const rmodel *rm = &RMODELS[_i];
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(PATHS[p], rm->name)) continue;
        if (rm->cross) return; /* steps are self-attention */
        attn_model m;
        rand_model(&m, &rm->hp, RM_SCALE);
        if (!m.attn16) { /* test_decoder holds fp32 caches to the same */
            printf("steps %s: attention and cache in fp32 (head width %d)\n", rm->name,
                   m.hp.head_dim);
            attn_model_free(&m);
            continue;
        }
        enum { L = 100 };
        const int split[] = {13, 1, 2, 1, 15, 16, 20, 32};
        int E = m.hp.embed_dim, H = m.hp.num_heads;
        float *q = rand_floats((size_t)L * E, 1.7f), *whole = xcalloc((size_t)L * E, 4);
        float *plain = xcalloc((size_t)L * E, 4), *stepped = xcalloc((size_t)L * E, 4);
        float *wa = xcalloc((size_t)H * L * L, 4), *sa = xcalloc((size_t)H * L * L, 4);
        for (int w = 0; w < 3; w++) {
            attn_seq s = {.L = L, .S = L, .causal = 1, .weights = w, .attn = wa};
            attn_batch b = {.B = 1, .seqs = &s, .query = q, .out = whole};
            forward_n(2, &m, &b);
            if (w == 0) memcpy(plain, whole, sizeof(float) * L * E);
            require_same(plain, whole, sizeof(float) * L * E,
                         "outputs with and without their attention matrix");
            uint16_t *kv = NULL;
            for (int k = 0, len = 0; len < L; len += split[k], k++) {
                kv = cache_grow(&m, kv, (size_t)len, (size_t)(len + split[k]));
                attn_seq st = {.L = split[k],
                               .S = len + split[k],
                               .weights = w,
                               .attn = sa,
                               .kv16 = kv,
                               .cached = len};
                attn_batch sb = {.B = 1,
                                 .seqs = &st,
                                 .query = q + (size_t)len * E,
                                 .out = stepped + (size_t)len * E};
                forward_n(1 + k % 3, &m, &sb);
                for (int h = 0; w && h < (w == ATTN_WEIGHTS_HEADS ? H : 1); h++)
                    for (int r = 0; r < split[k]; r++)
                        REQUIRE(memcmp(sa + ((size_t)h * split[k] + r) * st.S,
                                       wa + ((size_t)h * L + len + r) * L,
                                       sizeof(float) * st.S) == 0,
                                "%s: head %d row %d's weights differ through steps", rm->name, h,
                                len + r);
            }
            char what[200];
            snprintf(what, sizeof what, "%s on %s, weights %d: steps and the whole sequence",
                     rm->name, attn_int8_kernels(), w);
            require_same(whole, stepped, sizeof(float) * L * E, what);
            free(kv);
        }
        free(q);
        free(whole);
        free(plain);
        free(stepped);
        free(wa);
        free(sa);
        attn_model_free(&m);
    }
    attn_int8_force(-1);
}
END_TEST

/* A step after a cache of 45 tokens against the reference (each on its own
 * copy of the cache): outputs and matrices within TIGHT_REF, and the rows
 * it wrote into its pages. */
START_TEST(test_steps_vs_reference) {
    const rmodel *rm = &RMODELS[_i];
    for (int p = 0; p < NPATHS; p++) {
        if (rm->cross || !use_path(PATHS[p], rm->name)) return;
        attn_model m;
        rand_model(&m, &rm->hp, RM_SCALE);
        if (!m.attn16) {
            attn_model_free(&m);
            return;
        }
        enum { C = 45, N = 7 };
        int E = m.hp.embed_dim, H = m.hp.num_heads, GD = m.hp.num_kv_heads * m.hp.head_dim;
        float *x = rand_floats((size_t)(C + N) * E, 1.7f), *out = xcalloc((size_t)(C + N) * E, 4);
        float *ref = xcalloc((size_t)N * E, 4), *a = xcalloc((size_t)H * N * (C + N), 4);
        float *ra = xcalloc((size_t)H * N * (C + N), 4);
        uint16_t *kv = cache_grow(&m, NULL, 0, C + N);
        attn_seq fill = {.L = C, .S = C, .kv16 = kv};
        attn_batch fb = {.B = 1, .seqs = &fill, .query = x, .out = out};
        forward_n(1, &m, &fb);
        size_t bytes = attn_kv_bytes(&m, C + N);
        uint16_t *kv2 = malloc(bytes);
        memcpy(kv2, kv, bytes);
        attn_seq st = {
            .L = N, .S = C + N, .weights = ATTN_WEIGHTS_HEADS, .attn = a, .kv16 = kv, .cached = C};
        attn_batch sb = {.B = 1, .seqs = &st, .query = x + (size_t)C * E, .out = out};
        forward_n(2, &m, &sb);
        st.kv16 = kv2;
        st.attn = ra;
        sb.out = ref;
        char err[256] = "";
        ck_assert_msg(attn_forward_ref(&m, &sb, err, sizeof err) == 0, "%s", err);
        double e = rel_err(out, ref, (size_t)N * E), ea = rel_err(a, ra, (size_t)H * N * (C + N));
        REQUIRE(e <= TIGHT_REF && ea <= TIGHT_REF,
                "%s on %s: a step %.3g (outputs), %.3g "
                "(matrix) from the reference",
                rm->name, attn_int8_kernels(), e, ea);
        float *k1 = xcalloc((size_t)GD, 4), *v1 = xcalloc((size_t)GD, 4);
        float *k2 = xcalloc((size_t)GD, 4), *v2 = xcalloc((size_t)GD, 4);
        for (int t = 0; t < C + N; t++) {
            attn_kv_bf16_get(kv, m.hp.num_kv_heads, m.hp.head_dim, (size_t)t, k1, v1);
            attn_kv_bf16_get(kv2, m.hp.num_kv_heads, m.hp.head_dim, (size_t)t, k2, v2);
            double ek = rel_err(k1, k2, (size_t)GD), ev = rel_err(v1, v2, (size_t)GD);
            REQUIRE(t < C ? ek == 0 && ev == 0 : ek <= 8e-3 && ev <= 8e-3,
                    "%s: cache token %d: keys %.3g, values %.3g from the reference's", rm->name, t,
                    ek, ev);
        }
        printf("step %s on %s: %.3g (outputs), %.3g (matrix) from the reference\n", rm->name,
               attn_int8_kernels(), e, ea);
        free(k1);
        free(v1);
        free(k2);
        free(v2);
        free(x);
        free(out);
        free(ref);
        free(a);
        free(ra);
        free(kv);
        free(kv2);
        attn_model_free(&m);
    }
    attn_int8_force(-1);
}
END_TEST

/* Steps of two sessions ride in one batch with whole sequences, each with
 * the bits it gets alone, and write their own pages only. */
START_TEST(test_steps_in_a_batch) {
    for (int p = 0; p < NPATHS; p++) {
        if (!use_path(PATHS[p], "steps in a batch")) continue;
        attn_model m;
        rand_model(&m, &RMODELS[2].hp, RM_SCALE); /* gqa d64 rope */
        int E = m.hp.embed_dim;
        float *pre = rand_floats((size_t)70 * E, 1.7f),
              *x = rand_floats((size_t)(3 + 1 + 40) * E, 1.7f);
        float *alone = xcalloc((size_t)44 * E, 4), *mixed = xcalloc((size_t)44 * E, 4);
        float *scratch = xcalloc((size_t)70 * E, 4);
        uint16_t *c1 = cache_grow(&m, NULL, 0, 70), *c2 = cache_grow(&m, NULL, 0, 40);
        attn_seq fill1 = {.L = 67, .S = 67, .kv16 = c1}, fill2 = {.L = 39, .S = 39, .kv16 = c2};
        attn_batch f1 = {.B = 1, .seqs = &fill1, .query = pre, .out = scratch};
        attn_batch f2 = {.B = 1, .seqs = &fill2, .query = pre, .out = scratch};
        forward_n(1, &m, &f1);
        forward_n(1, &m, &f2);
        size_t bytes1 = attn_kv_bytes(&m, 70), bytes2 = attn_kv_bytes(&m, 40);
        uint16_t *k1 = malloc(bytes1), *k2 = malloc(bytes2);
        memcpy(k1, c1, bytes1);
        memcpy(k2, c2, bytes2);
        attn_seq s[3] = {{.L = 3, .S = 70, .kv16 = c1, .cached = 67},
                         {.L = 1, .S = 40, .kv16 = c2, .cached = 39},
                         {.L = 40, .S = 40, .causal = 1}};
        for (int i = 0, t = 0; i < 3; t += s[i].L, i++) {
            attn_batch b = {
                .B = 1, .seqs = &s[i], .query = x + (size_t)t * E, .out = alone + (size_t)t * E};
            forward_n(1, &m, &b);
        }
        memcpy(c1, k1, bytes1);
        memcpy(c2, k2, bytes2);
        attn_seq order[3] = {s[2], s[0], s[1]};
        float *xo = xcalloc((size_t)44 * E, 4);
        memcpy(xo, x + (size_t)4 * E, sizeof(float) * 40 * E);
        memcpy(xo + (size_t)40 * E, x, sizeof(float) * 4 * E);
        attn_batch b = {.B = 3, .seqs = order, .query = xo, .out = mixed};
        forward_n(3, &m, &b);
        require_same(alone, mixed + (size_t)40 * E, sizeof(float) * 4 * E, "steps in a batch");
        require_same(alone + (size_t)4 * E, mixed, sizeof(float) * 40 * E,
                     "a whole sequence beside steps");
        free(xo);
        free(pre);
        free(x);
        free(alone);
        free(mixed);
        free(scratch);
        free(c1);
        free(c2);
        free(k1);
        free(k2);
        attn_model_free(&m);
    }
    attn_int8_force(-1);
}
END_TEST

/* ------------------------------------------------------------ golden steps */

/* The causal self-attention sequences of the int8 goldens (no mask, no
 * positions of their own) through a session's steps of 1 to 17 tokens: the
 * outputs within LOOSE of float64 and TIGHT of the int8 formula. */
static int golden_steps(const golden *g, const gseq *s, const char *path) {
    if (!s->s.causal || s->key || s->pos || s->kpm || s->mask_bool || s->mask_add || !s->want16)
        return 0;
    int L = s->s.L, E = g->m.hp.embed_dim;
    float *out = xcalloc((size_t)L * E, sizeof(float));
    void *kv = xcalloc(attn_kv_bytes(&g->m, (size_t)L) + 1, 1);
    for (int len = 0, k = 0; len < L; k++) {
        int n = 1 + (k * 7) % 17;
        n = n < L - len ? n : L - len;
        attn_seq st = {.L = n, .S = len + n, .cached = len};
        if (g->m.attn16)
            st.kv16 = kv;
        else
            st.kv = kv;
        attn_batch b = {
            .B = 1, .seqs = &st, .query = s->query + (size_t)len * E, .out = out + (size_t)len * E};
        forward_n(1 + k % 2, &g->m, &b);
        len += n;
    }
    size_t no = (size_t)L * E;
    double e = rel_err(out, s->want, no), e8 = rel_err(out, s->want16, no);
    REQUIRE(e <= LOOSE && e8 <= TIGHT, "%s on %s: steps %.3g from float64, %.3g from the formula",
            path, attn_int8_kernels(), e, e8);
    printf("golden steps %s (L %d) on %s: %.3g from float64, %.3g from the int8 formula\n", path, L,
           attn_int8_kernels(), e, e8);
    free(out);
    free(kv);
    return 1;
}

START_TEST(test_golden_steps) {
    int seen = 0;
    for (int f = 0; f < g_nfiles; f++) {
        if (!strstr(g_files[f], "/int8/")) continue;
        for (int p = 0; p < NPATHS; p++) {
            if (!use_path(PATHS[p], g_files[f])) continue;
            golden g;
            golden_load(&g, g_files[f]);
            for (int i = 0; i < g.n; i++)
                seen += golden_steps(&g, &g.seqs[i], g_files[f]);
            golden_free(&g);
        }
    }
    attn_int8_force(-1);
    /* a CPU with no int8 kernel (or valgrind's, which shows no AVX-512 and
     * no VNNI) runs none of the paths, each said above */
    if (attn_int8_level() < ATTN_INT8_AVX)
        ck_assert_msg(seen == 0, "%d golden sequences through steps with no int8 kernel", seen);
    else
        ck_assert_msg(seen >= 3, "%d golden sequences through steps", seen);
}
END_TEST

/* ------------------------------------------------------------ fallback, model */

/* With the int8 kernels capped at "none", an int8 model packs as a bf16 one
 * and answers with a bf16 model's bits (outputs, matrices). */
START_TEST(test_fallback_bf16) {
    const rmodel *rm = &RMODELS[_i];
    attn_model m8, m16;
    attn_hparams hp16 = rm->hp;
    hp16.precision = ATTN_BF16;
    ck_assert_int_eq(attn_set_int8_kernels("none"), 0);
    ck_assert_str_eq(attn_int8_kernels(), "none");
    uint64_t seed = g_rng;
    rand_model(&m8, &rm->hp, RM_SCALE);
    g_rng = seed;
    rand_model(&m16, &hp16, RM_SCALE);
    ck_assert_int_eq(m8.hp.precision, ATTN_INT8);
    ck_assert_int_eq(m8.precision, m16.precision); /* bf16, or fp32 without bf16 kernels */
    ck_assert_int_eq(m8.attn16, m16.attn16);
    ck_assert_ptr_null(m8.packed8);
    ck_assert_uint_eq(attn_model_bytes(&m8), attn_model_bytes(&m16));
    rbatch r;
    rand_batch(&r, &m8, rm->cross);
    forward_n(2, &m8, &r.b);
    size_t n;
    float *a8 = answers(&m8, &r, &n);
    forward_n(2, &m16, &r.b);
    float *a16 = answers(&m16, &r, &n);
    require_same(a8, a16, n * sizeof(float), "an int8 model without int8 kernels and bf16");
    free(a8);
    free(a16);
    rbatch_free(&r);
    attn_model_free(&m8);
    attn_model_free(&m16);
    ck_assert_int_eq(attn_set_int8_kernels("auto"), 0);
}
END_TEST

/* Every int8 path the CPU has gives the same bits, the forward's and the
 * projections' alike (gemm_int8.h). */
START_TEST(test_paths_agree) {
    const rmodel *rm = &RMODELS[_i];
    attn_model m;
    rand_model(&m, &rm->hp, RM_SCALE);
    rbatch r;
    rand_batch(&r, &m, rm->cross);
    float *first = NULL;
    const char *first_name = NULL;
    size_t n;
    for (int p = NPATHS - 1; p >= 0; p--) {
        if (!use_path(PATHS[p], rm->name)) continue;
        forward_n(2, &m, &r.b);
        float *a = answers(&m, &r, &n);
        if (!first) {
            first = a;
            first_name = attn_int8_name(PATHS[p]);
            continue;
        }
        char what[200];
        snprintf(what, sizeof what, "%s: %s and %s", rm->name, first_name, attn_int8_kernels());
        require_same(first, a, n * sizeof(float), what);
        free(a);
    }
    free(first);
    rbatch_free(&r);
    attn_model_free(&m);
    attn_int8_force(-1);
}
END_TEST

START_TEST(test_model_settled) {
    const int cpu = attn_int8_level(), b16 = attn_bf16_level();
    printf("int8 kernels of this CPU: %s (AVX-VNNI's VEX form: %s)\n", attn_int8_name(cpu),
           attn_int8_vex() ? "yes" : "no");
    ck_assert_int_eq(attn_set_int8_kernels("avx9000"), -1);
    for (int i = 0; i < NRMODELS; i++) {
        attn_model m8, m32;
        attn_hparams hp32 = RMODELS[i].hp;
        hp32.precision = ATTN_FP32;
        rand_model(&m8, &RMODELS[i].hp, RM_SCALE);
        rand_model(&m32, &hp32, RM_SCALE);
        int D = m8.hp.head_dim;
        ck_assert_int_eq(m8.precision, cpu ? ATTN_INT8 : b16 ? ATTN_BF16 : ATTN_FP32);
        ck_assert_int_eq(m8.attn16, b16 && D % 32 == 0 && D <= 256);
        /* weights in int8 once (a scale per output channel), fp32 matrices freed */
        double ratio = (double)attn_model_bytes(&m8) / (double)attn_model_bytes(&m32);
        printf("%s: %zu bytes as int8, %zu as fp32 (%.3f)\n", RMODELS[i].name,
               attn_model_bytes(&m8), attn_model_bytes(&m32), ratio);
        if (cpu) {
            ck_assert(ratio < 0.3);
            ck_assert_ptr_null(m8.q_w);
            ck_assert_ptr_nonnull(m8.packed8);
            char err[128];
            ck_assert_int_eq(attn_model_pack(&m8, err, sizeof err), 0); /* packed once */
            ck_assert_int_eq(m8.precision, ATTN_INT8);
        }
        attn_model_free(&m8);
        attn_model_free(&m32);
    }
}
END_TEST

/* An unknown precision is refused with a sentence. */
START_TEST(test_refused) {
    attn_hparams bad = RMODELS[1].hp;
    bad.precision = 7;
    bad.kdim = bad.vdim = bad.embed_dim;
    attn_model mb;
    char err[256];
    ck_assert_int_eq(attn_model_init(&mb, &bad, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "precision") != NULL, "%s", err);
}
END_TEST

/* ------------------------------------------------------------ kernels */

/* Prepared rows of x (M, K): the layout of gemm_int8.h, ATTN_INT8_ROWPAD
 * rows of padding after them. */
static uint8_t *prepare_rows(const float *x, size_t M, int K, size_t *ld) {
    *ld = attn_int8_row_bytes(K);
    uint8_t *a = xcalloc((M + ATTN_INT8_ROWPAD) * *ld, 1);
    for (size_t r = 0; r < M; r++)
        attn_int8_prepare_row(a + r * *ld, x + r * (size_t)K, K);
    return a;
}

/* The vector quantizer of every path against the scalar formula; and ties
 * go to even (x / s = k + 1/2 exactly). */
START_TEST(test_quantize) {
    enum { K = 203 };
    float *x = rand_floats(K, 2.0f);
    int8_t q[K];
    x[7] = 2.0f; /* the row's largest: s = 2/127 */
    float s = attn_int8_quantize(q, x, K);
    ck_assert(s == 2.0f / 127.0f);
    for (int p = -1; p < NPATHS; p++) {
        if (p >= 0 && !use_path(PATHS[p], "quantize")) continue;
        size_t ld;
        uint8_t *a = prepare_rows(x, 1, K, &ld);
        float sa;
        memcpy(&sa, a, sizeof sa);
        ck_assert(sa == s);
        for (int k = 0; k < K; k++)
            REQUIRE(a[ATTN_INT8_HEAD + k] == q[k] + 128, "input %d: %d, not %d", k,
                    a[ATTN_INT8_HEAD + k], q[k] + 128);
        free(a);
    }
    attn_int8_force(-1);
    /* ties: with s = 1 (max 127), 2.5 -> 2, 3.5 -> 4, -0.5 -> 0, -1.5 -> -2 */
    float t[6] = {127.0f, 2.5f, 3.5f, -0.5f, -1.5f, 126.5f};
    int8_t qt[6], want[6] = {127, 2, 4, 0, -2, 126};
    ck_assert(attn_int8_quantize(qt, t, 6) == 1.0f);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(qt[i], want[i]);
    free(x);
}
END_TEST

/* Inputs at and a few ulps either side of (k + 1/2) s, where a product by
 * 1/s and the formula's division may round apart (the vector quantizers
 * take the product only far from such points, gemm_int8.c), at scales
 * from 2^-40 to 2^40, in rows whose widths leave 64-, 32-input and scalar
 * tails: every path's bytes against the scalar formula. */
START_TEST(test_quantize_near_ties) {
    enum { K = 1000, ROWS = 400 };
    float *x = xcalloc(K, sizeof *x);
    int8_t *q = xcalloc(K, 1);
    long checked = 0, near = 0;
    for (int p = -1; p < NPATHS; p++) {
        if (p >= 0 && !use_path(PATHS[p], "quantize near ties")) continue;
        g_rng = TEST_RAND_SEED;
        for (int row = 0; row < ROWS; row++) {
            int n = row % 3 == 0 ? K : row % 3 == 1 ? 203 : 96 + row % 64;
            float m = ldexpf(1.0f + 0.5f * frand(), (int)(rand_u32() % 81) - 40), s = m / 127.0f;
            for (int k = 0; k < n; k++) {
                float v = frand() * m;
                if (rand_u32() % 4) { /* a half-integer step, then 0 to 8 ulps off */
                    v = ((float)(rand_u32() % 254) - 126.5f) * s;
                    for (int u = (int)(rand_u32() % 9); u > 0; u--)
                        v = nextafterf(v, rand_u32() % 2 ? INFINITY : -INFINITY);
                    near++;
                }
                x[k] = fabsf(v) > m ? copysignf(m, v) : v;
            }
            x[rand_u32() % (uint32_t)n] = rand_u32() % 2 ? m : -m;
            float sq = attn_int8_quantize(q, x, (size_t)n), sa;
            size_t ld;
            uint8_t *a = prepare_rows(x, 1, n, &ld);
            memcpy(&sa, a, sizeof sa);
            REQUIRE(sa == sq, "row %d: scale %g, not %g", row, (double)sa, (double)sq);
            for (int k = 0; k < n; k++, checked++)
                REQUIRE(a[ATTN_INT8_HEAD + k] == (uint8_t)(q[k] + 128),
                        "path %d, row %d, input %d (%.9g, s %.9g): %d, not %d", p, row, k,
                        (double)x[k], (double)sq, a[ATTN_INT8_HEAD + k], q[k] + 128);
            free(a);
        }
    }
    attn_int8_force(-1);
    printf("quantize near ties: %ld inputs, %ld of them at or near a half step\n", checked, near);
    free(x);
    free(q);
}
END_TEST

/* Every path's tiles against the formula in plain loops, bit for bit, over
 * shapes with tails of rows, columns and inputs; a tile's outputs the same
 * whatever its rows and panels. */
START_TEST(test_kernel_bits) {
    static const int shapes[][3] = {{1, 16, 64}, {37, 40, 200}, {70, 129, 96}, {33, 64, 1000}};
    for (int sh = 0; sh < 4; sh++) {
        int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
        float *W = rand_floats((size_t)N * K, 0.3f), *bias = rand_floats((size_t)N, 0.5f);
        float *x = rand_floats((size_t)M * K, 1.7f);
        attn_packed_int8 pw;
        ck_assert_int_eq(attn_packed_int8_init(&pw, W, bias, N, K), 0);
        size_t ld;
        uint8_t *a = prepare_rows(x, (size_t)M, K, &ld);
        float *ref = xcalloc((size_t)M * N, 4), *got = xcalloc((size_t)M * N, 4);
        gemm_int8_ref(ref, (size_t)N, a, ld, &pw, 0, (size_t)M, 0, N);
        for (int p = 0; p < NPATHS; p++) {
            if (!use_path(PATHS[p], "kernel")) continue;
            memset(got, 0, sizeof(float) * (size_t)M * N);
            gemm_int8_tile(got, (size_t)N, a, ld, &pw, 0, (size_t)M, 0, pw.panels);
            char what[128];
            snprintf(what, sizeof what, "%s, M %d N %d K %d", attn_int8_kernels(), M, N, K);
            require_same(ref, got, sizeof(float) * (size_t)M * N, what);
            memset(got, 0, sizeof(float) * (size_t)M * N); /* odd tiles: 5 rows x 1 panel */
            for (int r = 0; r < M; r += 5)
                for (int j = 0; j < pw.panels; j++)
                    gemm_int8_tile(got, (size_t)N, a, ld, &pw, (size_t)r,
                                   (size_t)(r + 5 < M ? r + 5 : M), j, j + 1);
            require_same(ref, got, sizeof(float) * (size_t)M * N, what);
        }
        attn_int8_force(-1);
        free(W);
        free(bias);
        free(x);
        free(a);
        free(ref);
        free(got);
        attn_packed_int8_free(&pw);
    }
}
END_TEST

/* The formula's int32 sums against a float64 recomputation from the
 * quantized numbers, and its outputs within fp32 rounding of it; the
 * formula without quantizing the inputs, or truncating instead of rounding,
 * lies far past that bound. */
START_TEST(test_kernel_vs_double) {
    enum { M = 20, N = 48, K = 300 };
    float *W = rand_floats((size_t)N * K, 0.3f), *bias = rand_floats(N, 0.5f);
    float *x = rand_floats((size_t)M * K, 1.7f), *got = xcalloc((size_t)M * N, 4);
    attn_packed_int8 pw;
    ck_assert_int_eq(attn_packed_int8_init(&pw, W, bias, N, K), 0);
    size_t ld;
    uint8_t *a = prepare_rows(x, M, K, &ld);
    gemm_int8_tile(got, N, a, ld, &pw, 0, M, 0, pw.panels);
    double worst = 0, worst_skip = 1e9, worst_trunc = 1e9;
    for (int r = 0; r < M; r++) {
        float sa;
        memcpy(&sa, a + r * ld, sizeof sa);
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc +=
                    (a[r * ld + ATTN_INT8_HEAD + k] - 128) * (double)attn_packed_int8_at(&pw, n, k);
            double y = acc * sa * pw.scale[n] + bias[n], mag = fabs(acc * sa * pw.scale[n]);
            double e = fabs(got[r * N + n] - y) / (mag + fabs(bias[n]));
            worst = fmax(worst, e);
        }
    }
    /* norm-wise: the skipped and truncated variants */
    double d2s = 0, d2t = 0, r2 = 0;
    for (int r = 0; r < M; r++) {
        float sa;
        memcpy(&sa, a + r * ld, sizeof sa);
        for (int n = 0; n < N; n++) {
            double fl = bias[n], tr = 0, y = got[r * N + n];
            for (int k = 0; k < K; k++) {
                double w = attn_packed_int8_at(&pw, n, k), xv = x[r * K + k];
                fl += xv * w * pw.scale[n];
                tr += trunc(xv / sa) * w;
            }
            tr = tr * sa * pw.scale[n] + bias[n];
            d2s += (fl - y) * (fl - y);
            d2t += (tr - y) * (tr - y);
            r2 += y * y;
        }
    }
    worst_skip = sqrt(d2s / r2);
    worst_trunc = sqrt(d2t / r2);
    printf("kernel: %.3g from the float64 formula (bound 4 x 2^-24 of |sum| + |bias|); a "
           "forward without input quantization %.3g, with truncation %.3g\n",
           worst, worst_skip, worst_trunc);
    ck_assert(worst <= 4.0 / (1 << 24));
    ck_assert(worst_skip > 1000 * 4.0 / (1 << 24) && worst_trunc > 1000 * 4.0 / (1 << 24));
    free(W);
    free(bias);
    free(x);
    free(got);
    free(a);
    attn_packed_int8_free(&pw);
}
END_TEST

static Suite *int8_forward_suite(void) {
    Suite *s = suite_create("int8_forward");
    TCase *t = tcase_create("golden");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, test_goldens_present);
    tcase_add_loop_test(t, test_golden_file, 0, g_nfiles);
    tcase_add_test(t, test_golden_steps);
    suite_add_tcase(s, t);
    t = tcase_create("reference");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, test_random_vs_reference, 0, NRMODELS);
    tcase_add_loop_test(t, test_steps_vs_reference, 0, NRMODELS);
    suite_add_tcase(s, t);
    t = tcase_create("invariance");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, test_batch_invariance, 0, NRMODELS);
    tcase_add_loop_test(t, test_steps_bitwise, 0, NRMODELS);
    tcase_add_test(t, test_steps_in_a_batch);
    tcase_add_loop_test(t, test_paths_agree, 0, NRMODELS);
    suite_add_tcase(s, t);
    t = tcase_create("model");
    tcase_add_loop_test(t, test_fallback_bf16, 0, NRMODELS);
    tcase_add_test(t, test_model_settled);
    tcase_add_test(t, test_refused);
    suite_add_tcase(s, t);
    t = tcase_create("kernels");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_quantize);
    tcase_add_test(t, test_quantize_near_ties);
    tcase_add_test(t, test_kernel_bits);
    tcase_add_test(t, test_kernel_vs_double);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    find_goldens();
    return check_run(int8_forward_suite());
}
