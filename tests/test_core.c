/* test_core.c - Check suite for core/: the attention math.
 *
 * Three groups:
 *   golden   every .json file in tests/data/golden (made by tests/gen_golden.py from
 *            torch.nn.MultiheadAttention): each sequence alone and packed into
 *            ragged batches, through attn_forward (1, 2, 3 threads, fused
 *            kernel on and off) and
 *            attn_forward_ref; outputs and attention matrices within a relative
 *            error of 1e-5 of torch.
 *   random   fixed-seed random shapes, weights, masks and weights modes:
 *            attn_forward (1, 2, 3 threads; fused kernel on and off) against
 *            attn_forward_ref, same tolerance.
 *   errors   bad hyper-parameters and bad batches are refused with a sentence.
 * In every group: no NaN or Inf anywhere, and a query row whose keys are all
 * hidden has attention weights exactly 0 and an output row equal to out_b.
 *
 * ATTND_GOLDEN_DIR overrides the golden folder (default tests/data/golden,
 * relative to the repository root, where `make test-unit` runs).
 */
#include "../core/attn.h"
#include "../core/kernels/gemm.h"
#include "../core/platform/ctx.h"

#include "check_run.h"
#include "test_rand.h"
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* For loops over elements: Check's ck_assert records its location on every
 * call, even a passing one, which is slow over millions of elements. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

#define REL_TOL 1e-5    /* ||out - ref|| / ||ref||, SPEC section 1 */
#define HIDDEN_TOL 1e-6 /* fully hidden row: |out - out_b| */
#define MAX_GOLDEN 64

/* Largest differences seen in this process, printed by each test. */
static double g_max_rel;
static double g_max_abs;

/* ------------------------------------------------------------ sequences */

/* One test sequence: inputs, masks and, for golden data, torch's answer. */
typedef struct {
    int L, S;                  /* query and key length */
    int causal;                /* 1: hide key j > query i */
    attn_weights_mode weights; /* which matrix to ask for */
    float *query;              /* (L,E), owned */
    float *key;                /* (S,Kd) owned, or NULL: self-attention */
    float *value;              /* (S,Vd) owned, or NULL: value = key */
    uint8_t *kpm;              /* (S) owned, or NULL */
    uint8_t *mask_bool;        /* (L,S) owned, or NULL */
    float *mask_add;           /* (L,S) owned, or NULL */
    float *want_out;           /* (L,E) torch's output, or NULL (random tests) */
    float *want_attn;          /* (H,L,S) or (L,S) torch's weights, or NULL */
} tseq;

static void tseq_free(tseq *s) {
    free(s->query);
    free(s->key);
    free(s->value);
    free(s->kpm);
    free(s->mask_bool);
    free(s->mask_add);
    free(s->want_out);
    free(s->want_attn);
    memset(s, 0, sizeof(*s));
}

static size_t attn_floats(const attn_model *m, const tseq *s) {
    if (s->weights == ATTN_WEIGHTS_HEADS) return (size_t)m->hp.num_heads * s->L * s->S;
    if (s->weights == ATTN_WEIGHTS_MEAN) return (size_t)s->L * s->S;
    return 0;
}

static float *nan_filled(size_t n) {
    float *p = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* ------------------------------------------------------------ checks */

/* ||a - ref|| / ||ref|| in double; the absolute norm when ref is all zeros.
 * Also records the largest element difference. */
static double rel_err(const float *a, const float *ref, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        d2 += d * d;
        r2 += (double)ref[i] * ref[i];
        if (fabs(d) > g_max_abs) g_max_abs = fabs(d);
    }
    double e = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    if (!(e <= g_max_rel)) g_max_rel = e;
    return e;
}

static void assert_finite(const float *a, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        REQUIRE(isfinite(a[i]), "%s: element %zu is %f", what, i, (double)a[i]);
}

static int key_hidden(const tseq *s, int i, int j) {
    if (s->kpm && s->kpm[j]) return 1;
    if (s->mask_bool && s->mask_bool[(size_t)i * s->S + j]) return 1;
    if (s->mask_add && isinf(s->mask_add[(size_t)i * s->S + j]) &&
        s->mask_add[(size_t)i * s->S + j] < 0)
        return 1;
    return s->causal && j > i;
}

/* Rows whose keys are all hidden: weights exactly 0, output row == out_b.
 * Returns how many such rows the sequence has. */
static int check_hidden_rows(const attn_model *m, const tseq *s, const float *out,
                             const float *attn, const char *what) {
    int E = m->hp.embed_dim, H = m->hp.num_heads, rows = 0;
    for (int i = 0; i < s->L; i++) {
        int all = 1;
        for (int j = 0; j < s->S && all; j++)
            all = key_hidden(s, i, j);
        if (!all) continue;
        rows++;
        for (int e = 0; e < E; e++) {
            double d = fabs((double)out[(size_t)i * E + e] - m->out_b[e]);
            REQUIRE(d <= HIDDEN_TOL, "%s: hidden row %d col %d: out %g, out_b %g", what, i, e,
                    (double)out[(size_t)i * E + e], (double)m->out_b[e]);
        }
        int nh = s->weights == ATTN_WEIGHTS_HEADS ? H : s->weights == ATTN_WEIGHTS_MEAN ? 1 : 0;
        for (int h = 0; h < nh; h++)
            for (int j = 0; j < s->S; j++) {
                float w = attn[((size_t)h * s->L + i) * s->S + j];
                REQUIRE(w == 0.0f, "%s: hidden row %d head %d key %d: weight %g", what, i, h, j,
                        (double)w);
            }
    }
    return rows;
}

/* Every check of one sequence's result against the expected one. */
static void check_seq(const attn_model *m, const tseq *s, const float *out, const float *attn,
                      const float *want_out, const float *want_attn, const char *what) {
    size_t no = (size_t)s->L * m->hp.embed_dim, na = attn_floats(m, s);
    assert_finite(out, no, what);
    double e = rel_err(out, want_out, no);
    ck_assert_msg(e <= REL_TOL, "%s: output relative error %g > %g", what, e, REL_TOL);
    if (na) {
        assert_finite(attn, na, what);
        e = rel_err(attn, want_attn, na);
        ck_assert_msg(e <= REL_TOL, "%s: attention relative error %g > %g", what, e, REL_TOL);
    }
    check_hidden_rows(m, s, out, attn, what);
}

/* ------------------------------------------------------------ batches */

enum kv_mode {
    KV_SELF = 0,     /* key = value = NULL: every sequence self-attention */
    KV_KEY_ONLY = 1, /* key packed, value NULL: value = key */
    KV_EXPLICIT = 2  /* key and value packed for every sequence */
};

/* Results of one sequence of a run. */
typedef struct {
    float *out;  /* (L,E) */
    float *attn; /* attn_floats(), or NULL */
} tres;

static void tres_free(tres *r, int n) {
    for (int i = 0; i < n; i++) {
        free(r[i].out);
        free(r[i].attn);
    }
    free(r);
}

/* attn_workspace_bytes of the last batch run_batch ran on a context. */
static size_t g_ws_bound;

/* Packs seqs[idx[0..n)] into one ragged batch, runs the fast path (ctx) or
 * the reference (ctx == NULL), and returns each sequence's results. A self
 * sequence in a KV_EXPLICIT batch gets key = value = its query; a sequence
 * without value gets value = its key. */
static tres *run_batch(const attn_model *m, const tseq *seqs, const int *idx, int n,
                       enum kv_mode kv, attn_ctx *ctx, const char *what) {
    int E = m->hp.embed_dim, Kd = m->hp.kdim, Vd = m->hp.vdim;
    size_t T = 0, U = 0;
    for (int i = 0; i < n; i++) {
        T += seqs[idx[i]].L;
        U += seqs[idx[i]].S;
    }
    float *q = xcalloc(T * E, sizeof(float));
    float *k = kv != KV_SELF ? xcalloc(U * Kd, sizeof(float)) : NULL;
    float *v = kv == KV_EXPLICIT ? xcalloc(U * Vd, sizeof(float)) : NULL;
    float *out = nan_filled(T * E);
    attn_seq *as = xcalloc(n, sizeof(attn_seq));
    tres *res = xcalloc(n, sizeof(tres));
    size_t t = 0, u = 0;
    for (int i = 0; i < n; i++) {
        const tseq *s = &seqs[idx[i]];
        memcpy(q + t * E, s->query, sizeof(float) * s->L * E);
        if (kv != KV_SELF) {
            const float *sk = s->key ? s->key : s->query;
            ck_assert(s->key || Kd == E);
            memcpy(k + u * Kd, sk, sizeof(float) * s->S * Kd);
        } else {
            ck_assert(s->key == NULL);
        }
        if (kv == KV_EXPLICIT) {
            const float *sv = s->value ? s->value : s->key ? s->key : s->query;
            ck_assert(s->value || (s->key ? Kd : E) == Vd);
            memcpy(v + u * Vd, sv, sizeof(float) * s->S * Vd);
        } else if (kv == KV_KEY_ONLY) {
            ck_assert(s->value == NULL);
        }
        as[i].L = s->L;
        as[i].S = s->S;
        as[i].causal = s->causal;
        as[i].key_padding_mask = s->kpm;
        as[i].attn_mask_bool = s->mask_bool;
        as[i].attn_mask_add = s->mask_add;
        as[i].weights = s->weights;
        size_t na = attn_floats(m, s);
        res[i].attn = na ? nan_filled(na) : NULL;
        as[i].attn = res[i].attn;
        t += s->L;
        u += s->S;
    }
    attn_batch b = {.B = n, .seqs = as, .query = q, .key = k, .value = v, .out = out};
    char err[256] = "";
    if (ctx) g_ws_bound = attn_workspace_bytes(m, &b, attn_ctx_threads(ctx));
    int rc = ctx ? attn_forward(ctx, m, &b, err, sizeof(err))
                 : attn_forward_ref(m, &b, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s: %s returned %d: %s", what,
                  ctx ? "attn_forward" : "attn_forward_ref", rc, err);
    t = 0;
    for (int i = 0; i < n; i++) {
        const tseq *s = &seqs[idx[i]];
        res[i].out = xcalloc((size_t)s->L * E, sizeof(float));
        memcpy(res[i].out, out + t * E, sizeof(float) * s->L * E);
        t += s->L;
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(as);
    return res;
}

/* ------------------------------------------------------------ golden data */

static char g_golden[MAX_GOLDEN][512];
static int g_ngolden;

static const char *golden_dir(void) {
    const char *d = getenv("ATTND_GOLDEN_DIR");
    return d && *d ? d : "tests/data/golden";
}

static int cmp_str(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}

static void scan_golden(void) {
    DIR *d = opendir(golden_dir());
    struct dirent *de;
    g_ngolden = 0;
    if (!d) return;
    while ((de = readdir(d)) != NULL && g_ngolden < MAX_GOLDEN) {
        size_t n = strlen(de->d_name);
        if (n > 5 && strcmp(de->d_name + n - 5, ".json") == 0)
            snprintf(g_golden[g_ngolden++], sizeof(g_golden[0]), "%s/%s", golden_dir(), de->d_name);
    }
    closedir(d);
    qsort(g_golden, g_ngolden, sizeof(g_golden[0]), cmp_str);
}

/* Flattens a nested JSON array of numbers into dst; returns the count. */
static size_t flatten(const json_t *j, float *dst, size_t cap, size_t n, const char *what) {
    if (json_is_array(j)) {
        size_t i;
        const json_t *x;
        json_array_foreach(j, i, x) n = flatten(x, dst, cap, n, what);
        return n;
    }
    REQUIRE(json_is_number(j), "%s: not a number", what);
    REQUIRE(n < cap, "%s: more than %zu values", what, cap);
    dst[n] = (float)json_number_value(j);
    return n + 1;
}

/* A (rows x cols) float matrix, or a flat vector when cols == 0. */
static float *json_floats(const json_t *j, size_t count, const char *what) {
    float *p = xcalloc(count, sizeof(float));
    size_t n = flatten(j, p, count, 0, what);
    ck_assert_msg(n == count, "%s: %zu values, want %zu", what, n, count);
    return p;
}

static uint8_t *json_bools(const json_t *j, size_t count, const char *what) {
    uint8_t *p = xcalloc(count, 1);
    size_t n = 0, i, k;
    const json_t *x, *y;
    json_array_foreach(j, i, x) {
        if (json_is_array(x)) {
            json_array_foreach(x, k, y) {
                REQUIRE(json_is_boolean(y) && n < count, "%s: bad bool", what);
                p[n++] = json_is_true(y);
            }
        } else {
            REQUIRE(json_is_boolean(x) && n < count, "%s: bad bool", what);
            p[n++] = json_is_true(x);
        }
    }
    ck_assert_msg(n == count, "%s: %zu bools, want %zu", what, n, count);
    return p;
}

static int json_int(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "golden: %s is not an integer", key);
    return (int)json_integer_value(v);
}

/* Copies a state_dict tensor into the model, where attn.h says it lives. */
static void load_tensor(attn_model *m, const char *name, const json_t *val) {
    size_t E = m->hp.embed_dim, Kd = m->hp.kdim, Vd = m->hp.vdim;
    float *dst;
    size_t n;
    if (strcmp(name, "in_proj_weight") == 0)
        dst = m->q_w, n = 3 * E * E; /* q_w | k_w | v_w are contiguous */
    else if (strcmp(name, "q_proj_weight") == 0)
        dst = m->q_w, n = E * E;
    else if (strcmp(name, "k_proj_weight") == 0)
        dst = m->k_w, n = E * Kd;
    else if (strcmp(name, "v_proj_weight") == 0)
        dst = m->v_w, n = E * Vd;
    else if (strcmp(name, "in_proj_bias") == 0)
        dst = m->q_b, n = 3 * E; /* q_b | k_b | v_b are contiguous */
    else if (strcmp(name, "out_proj.weight") == 0)
        dst = m->out_w, n = E * E;
    else if (strcmp(name, "out_proj.bias") == 0)
        dst = m->out_b, n = E;
    else {
        ck_abort_msg("golden: unknown tensor %s", name);
        return;
    }
    float *p = json_floats(val, n, name);
    memcpy(dst, p, n * sizeof(float));
    free(p);
}

typedef struct {
    attn_model m;
    int n;      /* sequences */
    tseq *seqs; /* (n) */
} golden;

static void golden_load(golden *g, const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    ck_assert_msg(root != NULL, "%s:%d: %s", path, jerr.line, jerr.text);
    attn_hparams hp = {.embed_dim = json_int(root, "embed_dim"),
                       .num_heads = json_int(root, "num_heads"),
                       .kdim = json_int(root, "kdim"),
                       .vdim = json_int(root, "vdim"),
                       .bias = json_is_true(json_object_get(root, "bias")),
                       .causal = 0};
    char err[256] = "";
    memset(g, 0, sizeof(*g));
    ck_assert_msg(attn_model_init(&g->m, &hp, err, sizeof(err)) == 0, "%s: %s", path, err);
    const char *name;
    json_t *val;
    int nt = 0;
    json_object_foreach(json_object_get(root, "weights"), name, val) {
        load_tensor(&g->m, name, val);
        nt++;
    }
    ck_assert_msg(nt == (hp.kdim == hp.embed_dim && hp.vdim == hp.embed_dim ? 1 : 3) +
                            (hp.bias ? 3 : 1),
                  "%s: %d tensors", path, nt);
    ck_assert_msg(attn_model_pack(&g->m, err, sizeof(err)) == 0, "%s: %s", path, err);

    int E = hp.embed_dim, H = hp.num_heads;
    json_t *arr = json_object_get(root, "sequences");
    g->n = (int)json_array_size(arr);
    ck_assert_msg(g->n > 0, "%s: no sequences", path);
    g->seqs = xcalloc(g->n, sizeof(tseq));
    size_t i;
    json_t *js;
    json_array_foreach(arr, i, js) {
        tseq *s = &g->seqs[i];
        json_t *q = json_object_get(js, "query"), *k = json_object_get(js, "key");
        json_t *v = json_object_get(js, "value");
        s->L = (int)json_array_size(q);
        s->S = json_is_null(k) ? s->L : (int)json_array_size(k);
        s->query = json_floats(q, (size_t)s->L * E, "query");
        if (!json_is_null(k)) s->key = json_floats(k, (size_t)s->S * hp.kdim, "key");
        if (!json_is_null(v)) s->value = json_floats(v, (size_t)s->S * hp.vdim, "value");
        json_t *kpm = json_object_get(js, "key_padding_mask");
        if (!json_is_null(kpm)) s->kpm = json_bools(kpm, s->S, "key_padding_mask");
        json_t *am = json_object_get(js, "attn_mask");
        const char *kind = json_string_value(json_object_get(js, "attn_mask_kind"));
        if (!json_is_null(am)) {
            ck_assert(kind != NULL);
            if (strcmp(kind, "bool") == 0)
                s->mask_bool = json_bools(am, (size_t)s->L * s->S, "attn_mask");
            else
                s->mask_add = json_floats(am, (size_t)s->L * s->S, "attn_mask");
        }
        s->causal = json_is_true(json_object_get(js, "causal"));
        const char *att = json_string_value(json_object_get(js, "attention"));
        ck_assert(att != NULL);
        s->weights = strcmp(att, "heads") == 0  ? ATTN_WEIGHTS_HEADS
                     : strcmp(att, "mean") == 0 ? ATTN_WEIGHTS_MEAN
                                                : ATTN_WEIGHTS_NONE;
        s->want_out = json_floats(json_object_get(js, "output"), (size_t)s->L * E, "output");
        if (s->weights != ATTN_WEIGHTS_NONE)
            s->want_attn = json_floats(json_object_get(js, "attn_weights"),
                                       s->weights == ATTN_WEIGHTS_HEADS ? (size_t)H * s->L * s->S
                                                                        : (size_t)s->L * s->S,
                                       "attn_weights");
    }
    json_decref(root);
}

static void golden_free(golden *g) {
    for (int i = 0; g->seqs && i < g->n; i++)
        tseq_free(&g->seqs[i]);
    free(g->seqs);
    attn_model_free(&g->m);
}

/* Runs one batch of golden sequences through every path (the reference;
 * the fast path with each context, fused kernel on, then off) and checks each
 * sequence against torch. */
static void golden_batch(const golden *g, const int *idx, int n, enum kv_mode kv, attn_ctx **ctxs,
                         int nctx, const char *what) {
    char label[1024];
    int fused_default = attn_set_fused(1);
    for (int c = -1; c < 2 * nctx; c++) {
        attn_ctx *ctx = c < 0 ? NULL : ctxs[c % nctx];
        int fused = c < nctx;
        attn_set_fused(fused);
        tres *r = run_batch(&g->m, g->seqs, idx, n, kv, ctx, what);
        for (int i = 0; i < n; i++) {
            const tseq *s = &g->seqs[idx[i]];
            if (ctx)
                snprintf(label, sizeof(label),
                         "%s, fast %d thread(s) fused %s, sequence %d of %d (golden #%d)", what,
                         attn_ctx_threads(ctx), fused ? "on" : "off", i, n, idx[i]);
            else
                snprintf(label, sizeof(label), "%s, reference, sequence %d of %d (golden #%d)",
                         what, i, n, idx[i]);
            check_seq(&g->m, s, r[i].out, r[i].attn, s->want_out, s->want_attn, label);
        }
        tres_free(r, n);
    }
    attn_set_fused(fused_default);
}

START_TEST(test_golden_present) {
    ck_assert_msg(g_ngolden >= 6, "%d golden files in %s; run tests/gen_golden.py", g_ngolden,
                  golden_dir());
}
END_TEST

/* Every golden file, once per projection kernel: the one the CPU runs, then
 * AVX2 + FMA and the baseline (loop index / g_ngolden). */
static const int GEMM_LEVELS[] = {-1, ATTN_ISA_AVX2, ATTN_ISA_BASE};

START_TEST(test_golden_file) {
    ck_assert_int_lt(_i, 3 * g_ngolden);
    const char *path = g_golden[_i % g_ngolden];
    int level = GEMM_LEVELS[_i / g_ngolden];
    if (level > gemm_level()) {
        printf("golden %s: projection kernel level %d is beyond this CPU\n", path, level);
        return;
    }
    gemm_force_level(level);
    golden g;
    g_max_rel = g_max_abs = 0;
    golden_load(&g, path);
    attn_ctx *ctxs[3];
    for (int c = 0; c < 3; c++) {
        ctxs[c] = attn_ctx_new(c + 1);
        ck_assert(ctxs[c] != NULL);
        ck_assert_int_eq(attn_ctx_threads(ctxs[c]), c + 1);
    }
    const attn_hparams *hp = &g.m.hp;
    int *idx = xcalloc(g.n, sizeof(int)), n;
    char what[600];

    /* each sequence alone, in its own form (key NULL for self, value NULL when absent) */
    for (int i = 0; i < g.n; i++) {
        const tseq *s = &g.seqs[i];
        enum kv_mode kv = !s->key ? KV_SELF : !s->value ? KV_KEY_ONLY : KV_EXPLICIT;
        snprintf(what, sizeof(what), "%s alone", path);
        golden_batch(&g, &i, 1, kv, ctxs, 3, what);
    }
    /* every self sequence in one ragged batch, key NULL */
    n = 0;
    for (int i = 0; i < g.n; i++)
        if (!g.seqs[i].key) idx[n++] = i;
    if (n > 1) {
        snprintf(what, sizeof(what), "%s self batch", path);
        golden_batch(&g, idx, n, KV_SELF, ctxs, 3, what);
    }
    /* every sequence with a key and no value, value NULL */
    n = 0;
    for (int i = 0; i < g.n; i++)
        if (g.seqs[i].key && !g.seqs[i].value) idx[n++] = i;
    if (n > 0 && hp->kdim == hp->vdim) {
        snprintf(what, sizeof(what), "%s key-only batch", path);
        golden_batch(&g, idx, n, KV_KEY_ONLY, ctxs, 3, what);
    }
    /* every sequence, key and value explicit, forwards and backwards */
    int all_ok = 1;
    for (int i = 0; i < g.n; i++) {
        const tseq *s = &g.seqs[i];
        if (!s->key && (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim)) all_ok = 0;
        if (s->key && !s->value && hp->kdim != hp->vdim) all_ok = 0;
    }
    ck_assert(all_ok);
    for (int i = 0; i < g.n; i++)
        idx[i] = i;
    snprintf(what, sizeof(what), "%s mixed batch", path);
    golden_batch(&g, idx, g.n, KV_EXPLICIT, ctxs, 3, what);
    for (int i = 0; i < g.n; i++)
        idx[i] = g.n - 1 - i;
    snprintf(what, sizeof(what), "%s mixed batch reversed", path);
    golden_batch(&g, idx, g.n, KV_EXPLICIT, ctxs, 3, what);

    printf("golden %s, projection kernel %s: %d sequences ok; against torch, largest relative "
           "error %.3g, largest element difference %.3g\n",
           path,
           level < 0                ? "of this CPU"
           : level == ATTN_ISA_AVX2 ? "AVX2"
                                    : "baseline",
           g.n, g_max_rel, g_max_abs);
    gemm_force_level(-1);
    free(idx);
    for (int c = 0; c < 3; c++)
        attn_ctx_free(ctxs[c]);
    golden_free(&g);
}
END_TEST

/* ------------------------------------------------------------ random tests */

/* A random shape: fixed lengths when lo == hi. */
typedef struct {
    const char *name;
    int E, H, Kd, Vd, bias;
    int B;          /* sequences */
    int Lmin, Lmax; /* query lengths */
    int Smin, Smax; /* key lengths; ignored for self-attention */
    int self;       /* 1: key NULL (self-attention) */
    int value_null; /* 1: value NULL (value = key) */
    int masks;      /* 1: random padding, bool and float masks, causal */
    int causal;     /* 1: every sequence causal (after the masks) */
    int edges;      /* 1: lengths from g_edges instead of [Lmin,Lmax], [Smin,Smax] */
} rcase;

/* Lengths around the core's row and key blocks (64, 128, 256). */
static const int g_edges[] = {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 513};
#define NEDGES ((int)(sizeof(g_edges) / sizeof(g_edges[0])))

static const rcase g_cases[] = {
    {"L=1 S=1 H=1", 8, 1, 8, 8, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},
    {"L=1 self, B=3", 32, 4, 32, 32, 1, 3, 1, 1, 0, 0, 1, 0, 1, 0, 0},
    {"S=1 cross, B=4", 16, 2, 12, 20, 1, 4, 1, 9, 1, 1, 0, 0, 1, 0, 0},
    {"E=30 H=3 ragged self", 30, 3, 30, 30, 1, 5, 1, 40, 0, 0, 1, 0, 1, 0, 0},
    {"E=20 H=4 Kd=12 Vd=28", 20, 4, 12, 28, 1, 4, 1, 30, 1, 50, 0, 0, 1, 0, 0},
    {"E=20 H=5 no bias", 20, 5, 20, 20, 0, 3, 1, 25, 1, 25, 1, 0, 1, 0, 0},
    {"E=24 H=3 Kd=Vd=10 value=key", 24, 3, 10, 10, 1, 3, 2, 20, 3, 40, 0, 1, 1, 0, 0},
    {"long S=300", 64, 4, 64, 64, 1, 2, 5, 20, 300, 300, 0, 1, 1, 0, 0},
    {"long S=700", 48, 2, 40, 24, 1, 1, 33, 33, 700, 700, 0, 0, 1, 0, 0},
    {"large L=600 self", 64, 8, 64, 64, 1, 1, 600, 600, 0, 0, 1, 0, 1, 0, 0},
    {"large L=600 S=700 cross", 32, 2, 32, 32, 1, 1, 600, 600, 700, 700, 0, 0, 0, 0, 0},
    {"B=5 ragged up to 300", 64, 8, 64, 64, 1, 5, 1, 300, 0, 0, 1, 0, 1, 0, 0},
    {"E=128 H=16 D=8", 128, 16, 128, 128, 1, 3, 1, 130, 1, 130, 0, 0, 1, 0, 0},
    {"E=96 H=1 D=96", 96, 1, 96, 96, 0, 2, 50, 200, 50, 200, 0, 0, 1, 0, 0},
    {"D=64 cross long S", 256, 4, 256, 256, 1, 3, 1, 200, 100, 500, 0, 1, 1, 0, 0},
    {"D=128 self ragged", 256, 2, 256, 256, 1, 3, 1, 300, 0, 0, 1, 0, 1, 0, 0},
    {"D=32 large L=600", 128, 4, 128, 128, 1, 1, 600, 600, 0, 0, 1, 0, 1, 0, 0},
    {"D=48 Kd=40 Vd=24", 96, 2, 40, 24, 0, 2, 20, 130, 60, 260, 0, 0, 1, 0, 0},
    {"D=144 cross", 288, 2, 288, 288, 1, 1, 50, 50, 300, 300, 0, 0, 1, 0, 0},
    {"block edges causal D=16", 64, 4, 64, 64, 1, NEDGES, 0, 0, 0, 0, 1, 0, 0, 1, 1},
    {"block edges causal D=8", 64, 8, 64, 64, 1, NEDGES, 0, 0, 0, 0, 1, 0, 0, 1, 1},
    {"block edges causal D=64 masks", 128, 2, 128, 128, 1, NEDGES, 0, 0, 0, 0, 1, 0, 1, 1, 1},
    {"block edges cross D=32", 64, 2, 48, 48, 1, NEDGES, 0, 0, 0, 0, 0, 1, 1, 0, 1},
    {"block edges cross causal D=16", 32, 2, 32, 32, 1, NEDGES, 0, 0, 0, 0, 0, 0, 0, 1, 1},
};
#define NCASES ((int)(sizeof(g_cases) / sizeof(g_cases[0])))

/* Random masks for one sequence, some with fully hidden rows. */
static void rand_masks(tseq *s) {
    int L = s->L, S = s->S;
    s->causal = rand_int(0, 2) == 0;
    int r = rand_int(0, 5);
    if (r >= 3) {
        s->kpm = xcalloc(S, 1);
        int all = rand_int(0, 9) == 0;
        for (int j = 0; j < S; j++)
            s->kpm[j] = all || urand() < 0.25f;
    }
    r = rand_int(0, 5);
    if (r == 1 || r == 3) {
        s->mask_bool = xcalloc((size_t)L * S, 1);
        for (size_t i = 0; i < (size_t)L * S; i++)
            s->mask_bool[i] = urand() < 0.25f;
        if (rand_int(0, 1)) memset(s->mask_bool + (size_t)rand_int(0, L - 1) * S, 1, S);
    }
    if (r == 2 || r == 3) {
        s->mask_add = rand_floats((size_t)L * S, 1.5f * RAND_UNIT);
        for (size_t i = 0; i < (size_t)L * S; i++)
            if (urand() < 0.1f) s->mask_add[i] = -INFINITY;
        if (rand_int(0, 1)) {
            float *row = s->mask_add + (size_t)rand_int(0, L - 1) * S;
            for (int j = 0; j < S; j++)
                row[j] = -INFINITY;
        }
    }
}

/* Draws case i: its model and its sequences (same draws on every call). */
static tseq *make_case(int i, attn_model *m) {
    const rcase *c = &g_cases[i];
    g_rng = 0x5eed0000ULL + (uint64_t)i;
    attn_hparams hp = {
        .embed_dim = c->E, .num_heads = c->H, .kdim = c->Kd, .vdim = c->Vd, .bias = c->bias};
    /* weights of variance 1/E, biases of variance 1/4 (zeros without bias) */
    rand_model_biases(m, &hp, RAND_UNIT / sqrtf((float)c->E), c->bias ? 0.5f * RAND_UNIT : 0.0f);
    tseq *seqs = xcalloc(c->B, sizeof(tseq));
    for (int b = 0; b < c->B; b++) {
        tseq *s = &seqs[b];
        s->L = c->edges ? g_edges[b % NEDGES] : rand_int(c->Lmin, c->Lmax);
        s->S = c->self ? s->L : c->edges ? g_edges[(b + 5) % NEDGES] : rand_int(c->Smin, c->Smax);
        s->query = rand_floats((size_t)s->L * c->E, RAND_UNIT);
        if (!c->self) {
            s->key = rand_floats((size_t)s->S * c->Kd, RAND_UNIT);
            if (!c->value_null) s->value = rand_floats((size_t)s->S * c->Vd, RAND_UNIT);
        }
        if (c->masks) rand_masks(s);
        if (c->causal) s->causal = 1;
    }
    return seqs;
}

static void free_case(int i, attn_model *m, tseq *seqs) {
    for (int b = 0; b < g_cases[i].B; b++)
        tseq_free(&seqs[b]);
    free(seqs);
    attn_model_free(m);
}

static int count_hidden_rows(const tseq *s) {
    int rows = 0;
    for (int r = 0; r < s->L; r++) {
        int all = 1;
        for (int j = 0; j < s->S && all; j++)
            all = key_hidden(s, r, j);
        rows += all;
    }
    return rows;
}

/* attn_forward with 1, 2 and 3 threads against attn_forward_ref, for one
 * random case, in each weights mode and in a mix of modes. */
START_TEST(test_random_case) {
    const rcase *c = &g_cases[_i];
    attn_model m;
    tseq *seqs = make_case(_i, &m);
    int *idx = xcalloc(c->B, sizeof(int));
    int hidden_rows = 0;
    for (int b = 0; b < c->B; b++) {
        idx[b] = b;
        hidden_rows += count_hidden_rows(&seqs[b]);
    }
    enum kv_mode kv = c->self ? KV_SELF : c->value_null ? KV_KEY_ONLY : KV_EXPLICIT;
    attn_ctx *ctxs[3];
    for (int t = 0; t < 3; t++) {
        ctxs[t] = attn_ctx_new(t + 1);
        ck_assert(ctxs[t] != NULL);
    }
    g_max_rel = g_max_abs = 0;
    char what[256];
    int fused_default = attn_set_fused(1);
    for (int mode = 0; mode < 4; mode++) {
        for (int b = 0; b < c->B; b++)
            seqs[b].weights =
                mode < 3 ? (attn_weights_mode)mode : (attn_weights_mode)rand_int(0, 2);
        tres *ref = run_batch(&m, seqs, idx, c->B, kv, NULL, c->name);
        for (int b = 0; b < c->B; b++) {
            snprintf(what, sizeof(what), "%s, mode %d, reference, sequence %d", c->name, mode, b);
            assert_finite(ref[b].out, (size_t)seqs[b].L * c->E, what);
            if (ref[b].attn) assert_finite(ref[b].attn, attn_floats(&m, &seqs[b]), what);
            check_hidden_rows(&m, &seqs[b], ref[b].out, ref[b].attn, what);
        }
        for (int f = 1; f >= 0; f--) {
            attn_set_fused(f);
            for (int t = 0; t < 3; t++) {
                tres *r = run_batch(&m, seqs, idx, c->B, kv, ctxs[t], c->name);
                for (int b = 0; b < c->B; b++) {
                    snprintf(what, sizeof(what), "%s, mode %d, %d threads, fused %s, sequence %d",
                             c->name, mode, t + 1, f ? "on" : "off", b);
                    check_seq(&m, &seqs[b], r[b].out, r[b].attn, ref[b].out, ref[b].attn, what);
                }
                tres_free(r, c->B);
            }
        }
        attn_set_fused(fused_default);
        tres_free(ref, c->B);
    }
    printf("random %-28s B=%d E=%d H=%d: fast vs reference, largest relative error %.3g, "
           "largest element difference %.3g (%d fully hidden rows)\n",
           c->name, c->B, c->E, c->H, g_max_rel, g_max_abs, hidden_rows);
    for (int t = 0; t < 3; t++)
        attn_ctx_free(ctxs[t]);
    free(idx);
    free_case(_i, &m, seqs);
}
END_TEST

/* attn_workspace_bytes bounds the scratch a fresh context takes for the
 * batch, as allocated: buffers of 256 KiB and more take whole 2 MiB pages
 * (core/platform/mem.c), which a bound of the bytes asked for alone falls short of. */
START_TEST(test_workspace_bounds_scratch) {
    const rcase *c = &g_cases[_i];
    attn_model m;
    tseq *seqs = make_case(_i, &m);
    int *idx = xcalloc(c->B, sizeof(int));
    for (int b = 0; b < c->B; b++)
        idx[b] = b;
    enum kv_mode kv = c->self ? KV_SELF : c->value_null ? KV_KEY_ONLY : KV_EXPLICIT;
    for (int mode = 0; mode < 3; mode++) {
        for (int b = 0; b < c->B; b++)
            seqs[b].weights = (attn_weights_mode)mode;
        for (int t = 1; t <= 3; t++) {
            attn_ctx *ctx = attn_ctx_new(t);
            ck_assert(ctx != NULL);
            tres_free(run_batch(&m, seqs, idx, c->B, kv, ctx, c->name), c->B);
            size_t held = attn_ctx_scratch_bytes(ctx);
            ck_assert_msg(held > 0 && held <= g_ws_bound,
                          "%s, mode %d, %d threads: the context holds %zu bytes of scratch, "
                          "attn_workspace_bytes says %zu",
                          c->name, mode, t, held, g_ws_bound);
            attn_ctx_free(ctx);
        }
    }
    free(idx);
    free_case(_i, &m, seqs);
}
END_TEST

/* The random masks must produce fully hidden rows somewhere, or the
 * hidden-row contract goes untested. */
START_TEST(test_random_has_hidden_rows) {
    int rows = 0;
    for (int i = 0; i < NCASES; i++) {
        attn_model m;
        tseq *seqs = make_case(i, &m);
        for (int b = 0; b < g_cases[i].B; b++)
            rows += count_hidden_rows(&seqs[b]);
        free_case(i, &m, seqs);
    }
    ck_assert_msg(rows >= 5, "only %d fully hidden rows in the random cases", rows);
}
END_TEST

/* ------------------------------------------------------------ errors and contracts */

START_TEST(test_init_errors) {
    attn_model m;
    char err[256];
    attn_hparams bad[] = {
        {.embed_dim = 10, .num_heads = 3, .kdim = 10, .vdim = 10}, /* E not divisible by H */
        {.embed_dim = 0, .num_heads = 1, .kdim = 0, .vdim = 0},    /* E = 0 */
        {.embed_dim = 8, .num_heads = 0, .kdim = 8, .vdim = 8},    /* H = 0 */
        {.embed_dim = 8, .num_heads = 2, .kdim = -3, .vdim = 8},   /* kdim < 0 */
        {.embed_dim = 8, .num_heads = 2, .kdim = 8, .vdim = -1},   /* vdim < 0 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&m, 0, sizeof(m));
        err[0] = '\0';
        ck_assert_int_eq(attn_model_init(&m, &bad[i], err, sizeof(err)), -1);
        ck_assert_msg(strlen(err) > 0, "case %zu: no error message", i);
        attn_model_free(&m); /* still safe */
    }
    /* a tiny err buffer is not overrun */
    char tiny[4] = {'x', 'x', 'x', 'x'};
    ck_assert_int_eq(attn_model_init(&m, &bad[0], tiny, 3), -1);
    ck_assert(tiny[3] == 'x');
    attn_model_free(&m);
    /* a good model, freed twice */
    attn_hparams hp = {.embed_dim = 12, .num_heads = 3, .kdim = 5, .vdim = 7, .bias = 1};
    ck_assert_int_eq(attn_model_init(&m, &hp, err, sizeof(err)), 0);
    ck_assert_uint_eq(m.n_floats, 12 * 12 + 12 * 5 + 12 * 7 + 3 * 12 + 12 * 12 + 12);
    ck_assert(m.k_w == m.q_w + 12 * 12 && m.v_w == m.k_w + 12 * 5 && m.q_b == m.v_w + 12 * 7);
    ck_assert(m.k_b == m.q_b + 12 && m.v_b == m.k_b + 12 && m.out_w == m.v_b + 12);
    ck_assert(m.out_b == m.out_w + 12 * 12);
    for (size_t i = 0; i < m.n_floats; i++)
        REQUIRE(m.mem[i] == 0.0f, "weight %zu not zeroed", i);
    attn_model_free(&m);
    attn_model_free(&m);
    attn_ctx_free(NULL);
}
END_TEST

/* A batch that must be refused by both forwards, with a sentence. */
static void expect_refused(const attn_model *m, attn_batch *b, const char *what) {
    char err[256];
    attn_ctx *ctx = attn_ctx_new(2);
    ck_assert(ctx != NULL);
    err[0] = '\0';
    ck_assert_msg(attn_forward(ctx, m, b, err, sizeof(err)) == -1, "%s: attn_forward accepted",
                  what);
    ck_assert_msg(strlen(err) > 0, "%s: attn_forward gave no message", what);
    err[0] = '\0';
    ck_assert_msg(attn_forward_ref(m, b, err, sizeof(err)) == -1, "%s: attn_forward_ref accepted",
                  what);
    ck_assert_msg(strlen(err) > 0, "%s: attn_forward_ref gave no message", what);
    attn_ctx_free(ctx);
}

START_TEST(test_forward_errors) {
    char err[256];
    attn_model m;
    float q[4 * 8] = {0}, k[4 * 8] = {0}, out[4 * 8];
    attn_seq s = {.L = 4, .S = 4};
    attn_batch b = {.B = 1, .seqs = &s, .query = q, .out = out};

    /* self-attention when kdim != E */
    attn_hparams hp = {.embed_dim = 8, .num_heads = 2, .kdim = 4, .vdim = 8, .bias = 1};
    ck_assert_int_eq(attn_model_init(&m, &hp, err, sizeof(err)), 0);
    expect_refused(&m, &b, "self-attention with kdim 4 != E 8");
    attn_model_free(&m);

    /* self-attention when vdim != E */
    attn_hparams hp2 = {.embed_dim = 8, .num_heads = 2, .kdim = 8, .vdim = 6, .bias = 1};
    ck_assert_int_eq(attn_model_init(&m, &hp2, err, sizeof(err)), 0);
    expect_refused(&m, &b, "self-attention with vdim 6 != E 8");
    /* value = key when kdim != vdim */
    b.key = k;
    expect_refused(&m, &b, "value NULL with kdim 8 != vdim 6");
    attn_model_free(&m);

    attn_hparams hp3 = {.embed_dim = 8, .num_heads = 2, .kdim = 8, .vdim = 8, .bias = 1};
    ck_assert_int_eq(attn_model_init(&m, &hp3, err, sizeof(err)), 0);
    b.key = NULL;
    s.S = 3; /* self-attention needs S == L */
    expect_refused(&m, &b, "self-attention with S != L");
    s.S = 4;
    s.L = 0;
    expect_refused(&m, &b, "L = 0");
    s.L = 4;
    b.B = 0;
    expect_refused(&m, &b, "B = 0");
    b.B = 1;
    /* and the same batch, fixed, is accepted */
    ck_assert_int_eq(attn_forward_ref(&m, &b, err, sizeof(err)), 0);
    attn_model_free(&m);
}
END_TEST

/* SPEC section 5: without attention matrices the core never holds a full
 * L x S matrix per head, so the workspace of a long sequence stays below
 * one L x S float matrix. */
START_TEST(test_workspace_tiled) {
    char err[256];
    attn_model m;
    attn_hparams hp = {.embed_dim = 512, .num_heads = 8, .kdim = 512, .vdim = 512, .bias = 1};
    ck_assert_int_eq(attn_model_init(&m, &hp, err, sizeof(err)), 0);
    attn_seq s = {.L = 8192, .S = 8192, .weights = ATTN_WEIGHTS_NONE};
    attn_batch b = {.B = 1, .seqs = &s};
    for (int t = 1; t <= 3; t++) {
        size_t ws = attn_workspace_bytes(&m, &b, t);
        ck_assert_msg(ws < (size_t)8192 * 8192 * sizeof(float),
                      "%d threads: workspace %zu bytes holds a full L x S matrix", t, ws);
    }
    s.weights = ATTN_WEIGHTS_HEADS;
    ck_assert(attn_workspace_bytes(&m, &b, 1) > 0);
    attn_model_free(&m);
    ck_assert(attn_blas_corename() != NULL && attn_blas_corename()[0] != '\0');
}
END_TEST

static Suite *core_suite(void) {
    Suite *s = suite_create("core");
    TCase *tg = tcase_create("golden");
    tcase_set_timeout(tg, 300);
    tcase_add_test(tg, test_golden_present);
    tcase_add_loop_test(tg, test_golden_file, 0, 3 * g_ngolden);
    suite_add_tcase(s, tg);
    TCase *tr = tcase_create("random");
    tcase_set_timeout(tr, 600);
    tcase_add_loop_test(tr, test_random_case, 0, NCASES);
    tcase_add_test(tr, test_random_has_hidden_rows);
    suite_add_tcase(s, tr);
    TCase *te = tcase_create("errors");
    tcase_set_timeout(te, 60);
    tcase_add_test(te, test_init_errors);
    tcase_add_test(te, test_forward_errors);
    tcase_add_test(te, test_workspace_tiled);
    tcase_add_loop_test(te, test_workspace_bounds_scratch, 0, NCASES);
    suite_add_tcase(s, te);
    return s;
}

int main(void) {
    scan_golden();
    return check_run(core_suite());
}
