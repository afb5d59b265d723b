/* test_decoder.c - Check suite for the decoder options of core/: grouped
 * key/value heads (num_kv_heads), head_dim, scale and rotary positions.
 *
 * Groups:
 *   hparams   attn_model_init refuses every bad combination with a sentence
 *             naming it, and fills num_kv_heads, head_dim and scale.
 *   algebra   properties the reference must have whatever its code: G < H
 *             equals H heads with each key/value head copied to its group;
 *             rotary positions all 0 change nothing; shifting every
 *             position by the same amount changes nothing (rotary scores
 *             depend on j - i only); scale s equals default scale with Wq
 *             multiplied by s * sqrt(D).
 *   golden    tests/data/golden/decoder_*.json (tests/gen_golden_decoder.py,
 *             an independent float64 implementation cross-checked against
 *             Hugging Face transformers) through attn_forward_ref, within a
 *             relative error of 1e-5.
 */
#include "../core/attn.h"

#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL_TOL 1e-5

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ------------------------------------------------------------ helpers */

static uint64_t g_rng;

static double rng_unif(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}

static float rng_normal(void) {
    double u = rng_unif(), v = rng_unif();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

static float *rand_floats(size_t n, float scale) {
    float *p = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = rng_normal() * scale;
    return p;
}

/* Initialises m for hp and fills every weight (biases when hp->bias). */
static void rand_model(attn_model *m, const attn_hparams *hp) {
    char err[256] = "";
    ck_assert_msg(attn_model_init(m, hp, err, sizeof err) == 0, "%s", err);
    size_t nb = (size_t)(m->out_w - m->q_b); /* q_b, k_b, v_b */
    for (float *p = m->mem; p < m->q_b; p++)
        *p = rng_normal() * 0.3f;
    for (float *p = m->out_w; p < m->out_b; p++)
        *p = rng_normal() * 0.3f;
    if (hp->bias) {
        for (size_t i = 0; i < nb; i++)
            m->q_b[i] = rng_normal() * 0.5f;
        for (int i = 0; i < hp->embed_dim; i++)
            m->out_b[i] = rng_normal() * 0.5f;
    }
}

/* ||a - ref|| / ||ref|| in double. */
static double rel_err(const float *a, const float *ref, size_t n) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        d2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

/* Self-attention of one sequence q (L,E) through the reference; out (L,E). */
static void ref_self(const attn_model *m, const float *q, int L, int causal, const int32_t *pos,
                     float *out) {
    char err[256] = "";
    attn_seq s = {.L = L, .S = L, .causal = causal, .positions = pos};
    attn_batch b = {.B = 1, .seqs = &s, .query = q, .out = out};
    ck_assert_msg(attn_forward_ref(m, &b, err, sizeof err) == 0, "%s", err);
}

/* ------------------------------------------------------------ hparams */

typedef struct {
    attn_hparams hp;
    const char *want; /* a words the refusal must hold */
} bad_hp;

#define BASE .embed_dim = 16, .num_heads = 4, .kdim = 16, .vdim = 16, .bias = 1

START_TEST(test_hparams_refused) {
    const bad_hp cases[] = {
        {{BASE, .num_kv_heads = 3}, "num_kv_heads 3 does not divide num_heads 4"},
        {{BASE, .num_kv_heads = -1}, "num_kv_heads"},
        {{BASE, .num_kv_heads = 8}, "num_kv_heads 8 does not divide"},
        {{.embed_dim = 10, .num_heads = 4, .kdim = 10, .vdim = 10}, "not divisible"},
        {{BASE, .head_dim = -2}, "not divisible"},
        {{BASE, .scale = -0.5}, "scale"},
        {{BASE, .scale = INFINITY}, "scale"},
        {{BASE, .rope = {.dim = 3, .theta = 10000}}, "rope dim 3 must be even"},
        {{BASE, .rope = {.dim = 6, .theta = 10000}}, "head width 4"},
        {{BASE, .rope = {.dim = -2, .theta = 10000}}, "rope dim"},
        {{BASE, .rope = {.dim = 4, .theta = 0}}, "theta"},
        {{BASE, .rope = {.dim = 4, .theta = 10000, .style = 7}}, "style"},
        {{BASE, .rope = {.dim = 4, .theta = 1e4, .scaling = 9}}, "scaling"},
        {{BASE, .rope = {.dim = 4, .theta = 1e4, .scaling = ATTN_ROPE_SCALE_LINEAR}}, "factor"},
        {{BASE,
          .rope = {.dim = 4, .theta = 1e4, .scaling = ATTN_ROPE_SCALE_LLAMA3, .factor = 8,
                   .low_freq_factor = 4, .high_freq_factor = 1, .original_max_position = 64}},
         "low_freq_factor < high_freq_factor"},
        {{BASE,
          .rope = {.dim = 4, .theta = 1e4, .scaling = ATTN_ROPE_SCALE_LLAMA3, .factor = 8,
                   .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 0}},
         "original_max_position"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_model m;
        char err[256] = "";
        ck_assert_msg(attn_model_init(&m, &cases[i].hp, err, sizeof err) == -1, "case %zu taken",
                      i);
        ck_assert_msg(strstr(err, cases[i].want) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, err,
                      cases[i].want);
        ck_assert(m.mem == NULL);
        attn_model_free(&m);
    }
}
END_TEST

START_TEST(test_hparams_filled) {
    char err[256] = "";
    attn_model m;
    /* Qwen-like: H*D (8*6 = 48) differs from E (20); G = 2 */
    attn_hparams hp = {.embed_dim = 20, .num_heads = 8, .kdim = 20, .vdim = 20, .bias = 1,
                       .num_kv_heads = 2, .head_dim = 6};
    ck_assert_msg(attn_model_init(&m, &hp, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(m.hp.num_kv_heads, 2);
    ck_assert_int_eq(m.hp.head_dim, 6);
    ck_assert(fabs(m.hp.scale - 1 / sqrt(6.0)) < 1e-15);
    /* q_w (48,20) k_w (12,20) v_w (12,20) q_b 48 k_b 12 v_b 12 out_w (20,48) out_b 20 */
    ck_assert_uint_eq(m.n_floats, 48 * 20 + 2 * 12 * 20 + 48 + 2 * 12 + 20 * 48 + 20);
    ck_assert(m.k_w == m.q_w + 48 * 20 && m.v_w == m.k_w + 12 * 20);
    ck_assert(m.q_b == m.v_w + 12 * 20 && m.out_w == m.v_b + 12 && m.out_b == m.out_w + 20 * 48);
    attn_model_free(&m);
    /* defaults: G = H, D = E / H */
    attn_hparams plain = {BASE};
    ck_assert(attn_model_init(&m, &plain, err, sizeof err) == 0);
    ck_assert_int_eq(m.hp.num_kv_heads, 4);
    ck_assert_int_eq(m.hp.head_dim, 4);
    ck_assert(m.hp.scale == 0.5);
    attn_model_free(&m);
}
END_TEST

/* Rotary positions need self-attention; a negative position is refused;
 * the fast forward refuses decoder options until it computes them. */
START_TEST(test_batch_refused) {
    char err[256] = "";
    attn_model m;
    attn_hparams hp = {BASE, .num_kv_heads = 2, .rope = {.dim = 4, .theta = 10000}};
    g_rng = 7;
    rand_model(&m, &hp);
    float *x = rand_floats(3 * 16, 1), out[3 * 16];
    attn_seq s = {.L = 3, .S = 3};
    attn_batch b = {.B = 1, .seqs = &s, .query = x, .key = x, .out = out};
    ck_assert(attn_forward_ref(&m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "self-attention") != NULL, "%s", err);
    int32_t pos[3] = {4, -1, 5};
    b.key = NULL;
    s.positions = pos;
    ck_assert(attn_forward_ref(&m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "position -1 of row 1") != NULL, "%s", err);
    /* the fast forward refuses what it does not compute yet, rather than
     * answer as if the model were nn.MultiheadAttention */
    pos[1] = 2;
    attn_ctx *ctx = attn_ctx_new(1);
    ck_assert(ctx != NULL);
    ck_assert(attn_forward(ctx, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "fast forward does not serve") != NULL, "%s", err);
    attn_ctx_free(ctx);
    free(x);
    attn_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------ algebra */

/* G < H equals H heads whose key/value heads are copied over each group. */
START_TEST(test_gqa_is_repeated_heads) {
    const int E = 24, H = 6, G = 2, D = 5, L = 9, R = H / G;
    attn_hparams hp = {.embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1,
                       .num_kv_heads = G, .head_dim = D};
    attn_hparams hf = hp;
    hf.num_kv_heads = H;
    attn_model g, f;
    g_rng = 11;
    rand_model(&g, &hp);
    rand_model(&f, &hf);
    memcpy(f.q_w, g.q_w, sizeof(float) * H * D * E);
    memcpy(f.q_b, g.q_b, sizeof(float) * H * D);
    memcpy(f.out_w, g.out_w, sizeof(float) * E * H * D);
    memcpy(f.out_b, g.out_b, sizeof(float) * E);
    for (int h = 0; h < H; h++) {
        int src = h / R;
        memcpy(f.k_w + (size_t)h * D * E, g.k_w + (size_t)src * D * E, sizeof(float) * D * E);
        memcpy(f.v_w + (size_t)h * D * E, g.v_w + (size_t)src * D * E, sizeof(float) * D * E);
        memcpy(f.k_b + (size_t)h * D, g.k_b + (size_t)src * D, sizeof(float) * D);
        memcpy(f.v_b + (size_t)h * D, g.v_b + (size_t)src * D, sizeof(float) * D);
    }
    float *x = rand_floats((size_t)L * E, 1), a[9 * 24], b[9 * 24];
    for (int causal = 0; causal < 2; causal++) {
        ref_self(&g, x, L, causal, NULL, a);
        ref_self(&f, x, L, causal, NULL, b);
        double e = rel_err(a, b, (size_t)L * E);
        ck_assert_msg(e < 1e-6, "causal %d: grouped vs repeated heads differ by %g", causal, e);
    }
    free(x);
    attn_model_free(&g);
    attn_model_free(&f);
}
END_TEST

/* Every position 0: no rotation at all. */
START_TEST(test_rope_at_zero_is_identity) {
    const int E = 32, L = 7;
    for (int style = 0; style < 2; style++) {
        attn_hparams hp = {.embed_dim = E, .num_heads = 4, .kdim = E, .vdim = E, .bias = 1,
                           .num_kv_heads = 2,
                           .rope = {.dim = 6, .theta = 10000, .style = style}};
        attn_hparams plain = hp;
        plain.rope.dim = 0;
        attn_model r, p;
        g_rng = 21;
        rand_model(&r, &hp);
        ck_assert(attn_model_init(&p, &plain, (char[64]){0}, 64) == 0);
        memcpy(p.mem, r.mem, sizeof(float) * r.n_floats);
        int32_t zero[7] = {0};
        float *x = rand_floats((size_t)L * E, 1), a[7 * 32], b[7 * 32];
        ref_self(&r, x, L, 1, zero, a);
        ref_self(&p, x, L, 1, NULL, b);
        ck_assert_msg(rel_err(a, b, (size_t)L * E) < 1e-7, "style %d", style);
        /* and positions 0..L-1 do rotate */
        ref_self(&r, x, L, 1, NULL, a);
        ck_assert_msg(rel_err(a, b, (size_t)L * E) > 1e-3, "style %d: rotation had no effect",
                      style);
        free(x);
        attn_model_free(&r);
        attn_model_free(&p);
    }
}
END_TEST

/* Scores of rotated q and k depend on the position difference only: the same
 * rows at positions 1000.. give what they give at 0.. (to float rounding of
 * the larger angles), for both styles and every scaling. */
START_TEST(test_rope_shift_invariant) {
    const int E = 48, L = 10;
    const attn_rope ropes[] = {
        {.dim = 12, .theta = 10000, .style = ATTN_ROPE_HALF},
        {.dim = 8, .theta = 500000, .style = ATTN_ROPE_INTERLEAVED},
        {.dim = 12, .theta = 10000, .scaling = ATTN_ROPE_SCALE_LINEAR, .factor = 4},
        {.dim = 12, .theta = 500000, .style = ATTN_ROPE_INTERLEAVED,
         .scaling = ATTN_ROPE_SCALE_LLAMA3, .factor = 8, .low_freq_factor = 1,
         .high_freq_factor = 4, .original_max_position = 64},
    };
    for (size_t c = 0; c < sizeof ropes / sizeof ropes[0]; c++) {
        attn_hparams hp = {.embed_dim = E, .num_heads = 4, .kdim = E, .vdim = E, .bias = 1,
                           .num_kv_heads = 1, .rope = ropes[c]};
        attn_model m;
        g_rng = 31 + c;
        rand_model(&m, &hp);
        int32_t pos[10], far[10];
        for (int i = 0; i < L; i++) {
            pos[i] = i;
            far[i] = 1000 + i;
        }
        float *x = rand_floats((size_t)L * E, 1), a[10 * 48], b[10 * 48];
        ref_self(&m, x, L, 1, pos, a);
        ref_self(&m, x, L, 1, far, b);
        double e = rel_err(b, a, (size_t)L * E);
        ck_assert_msg(e < 1e-6, "rope case %zu: shifted positions differ by %g", c, e);
        free(x);
        attn_model_free(&m);
    }
}
END_TEST

/* scale s is the default scale with Wq and bq multiplied by s * sqrt(D). */
START_TEST(test_scale_is_query_scaling) {
    const int E = 16, H = 2, L = 6;
    attn_hparams hs = {.embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1,
                       .scale = 0.05};
    attn_hparams hd = hs;
    hd.scale = 0;
    attn_model s, d;
    g_rng = 41;
    rand_model(&s, &hs);
    ck_assert(attn_model_init(&d, &hd, (char[64]){0}, 64) == 0);
    memcpy(d.mem, s.mem, sizeof(float) * s.n_floats);
    double k = 0.05 * sqrt(8.0);
    for (float *p = d.q_w; p < d.k_w; p++)
        *p = (float)(*p * k);
    for (float *p = d.q_b; p < d.k_b; p++)
        *p = (float)(*p * k);
    float *x = rand_floats((size_t)L * E, 1), a[6 * 16], b[6 * 16];
    ref_self(&s, x, L, 0, NULL, a);
    ref_self(&d, x, L, 0, NULL, b);
    double e = rel_err(a, b, (size_t)L * E);
    ck_assert_msg(e < 1e-6, "scale: %g", e);
    free(x);
    attn_model_free(&s);
    attn_model_free(&d);
}
END_TEST

/* ------------------------------------------------------------ suite */

static Suite *decoder_suite(void) {
    Suite *s = suite_create("decoder");
    TCase *th = tcase_create("hparams");
    tcase_add_test(th, test_hparams_refused);
    tcase_add_test(th, test_hparams_filled);
    tcase_add_test(th, test_batch_refused);
    suite_add_tcase(s, th);
    TCase *ta = tcase_create("algebra");
    tcase_add_test(ta, test_gqa_is_repeated_heads);
    tcase_add_test(ta, test_rope_at_zero_is_identity);
    tcase_add_test(ta, test_rope_shift_invariant);
    tcase_add_test(ta, test_scale_is_query_scaling);
    suite_add_tcase(s, ta);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(decoder_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
