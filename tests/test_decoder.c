/* test_decoder.c - Check suite for the decoder options of core/: grouped
 * key/value heads (num_kv_heads), head_dim, scale and rotary positions,
 * and KV-cache steps (attn_seq.kv), all through attn_forward.
 *
 * Groups:
 *   hparams   attn_model_init refuses every bad combination with a sentence
 *             naming it, and fills num_kv_heads, head_dim and scale.
 *   algebra   properties the reference must have whatever its code: G < H
 *             equals H heads with each key/value head copied to its group;
 *             rotary positions all 0 change nothing; shifting every
 *             position by the same amount changes nothing (rotary scores
 *             depend on j - i only); scale s equals default scale with Wq
 *             multiplied by s * sqrt(D); and attn_forward against the
 *             reference on batches the goldens do not cover.
 *   invariance bit for bit, with the fused kernel and the OpenBLAS tiles: a
 *             sequence alone and in a batch at 1 and 3 threads; a session's
 *             steps and the whole sequence; steps mixed with whole
 *             sequences and alone.
 *             Within 1e-5: steps mixed with whole sequences against the
 *             reference (outputs, weights, cache rows), for decoders and
 *             nn.MultiheadAttention.
 *   golden    every .json in tests/data/golden/decoder (tests/gen_golden_decoder.py,
 *             an independent float64 implementation cross-checked against
 *             Hugging Face transformers) through attn_forward_ref and
 *             attn_forward, within a relative error of 1e-5; sessions
 *             replayed step by step, a golden sequence and a 1000-token
 *             cache, against the whole sequence.
 */
#include "../config/config.h"
#include "../core/attn.h"

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

#define REL_TOL 1e-5

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ------------------------------------------------------------ helpers */

/* The scale of every weight and bias of the random models (rand_model):
 * variance 0.09, the weights' of the normal draws this suite once made. */
#define RM_SCALE (0.3f * RAND_UNIT)

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

/* attn_forward of b on a context of `threads` threads made for the call. */
static void forward(int threads, const attn_model *m, attn_batch *b) {
    char err[256] = "";
    attn_ctx *ctx = attn_ctx_new(threads);
    ck_assert(ctx != NULL);
    ck_assert_msg(attn_forward(ctx, m, b, err, sizeof err) == 0, "%s", err);
    attn_ctx_free(ctx);
}

/* A cache step of n rows after len cached tokens (attn.h, attn_seq.kv). */
static attn_seq step_seq(int n, int len, float *kv, attn_weights_mode w, float *attn) {
    return (attn_seq){.L = n, .S = len + n, .weights = w, .attn = attn, .kv = kv, .cached = len};
}

/* Fills an empty cache kv with the n tokens of x (n, E): one step through
 * attn_forward. */
static void prefill(const attn_model *m, float *kv, const float *x, int n) {
    float *out = xcalloc((size_t)n * m->hp.embed_dim, sizeof(float));
    attn_seq st = step_seq(n, 0, kv, ATTN_WEIGHTS_NONE, NULL);
    attn_batch b = {.B = 1, .seqs = &st, .query = x, .out = out};
    forward(1, m, &b);
    free(out);
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
        {{BASE, .rope = {.dim = 4,
                         .theta = 1e4,
                         .scaling = ATTN_ROPE_SCALE_LLAMA3,
                         .factor = 8,
                         .low_freq_factor = 4,
                         .high_freq_factor = 1,
                         .original_max_position = 64}},
         "low_freq_factor < high_freq_factor"},
        {{BASE, .rope = {.dim = 4,
                         .theta = 1e4,
                         .scaling = ATTN_ROPE_SCALE_LLAMA3,
                         .factor = 8,
                         .low_freq_factor = 1,
                         .high_freq_factor = 4,
                         .original_max_position = 0}},
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
    attn_hparams hp = {.embed_dim = 20,
                       .num_heads = 8,
                       .kdim = 20,
                       .vdim = 20,
                       .bias = 1,
                       .num_kv_heads = 2,
                       .head_dim = 6};
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

/* Rotary positions need self-attention; a negative position is refused. */
START_TEST(test_batch_refused) {
    char err[256] = "";
    attn_model m;
    attn_hparams hp = {BASE, .num_kv_heads = 2, .rope = {.dim = 4, .theta = 10000}};
    g_rng = 7;
    rand_model(&m, &hp, RM_SCALE);
    float *x = rand_floats(3 * 16, RAND_UNIT), out[3 * 16];
    attn_seq s = {.L = 3, .S = 3};
    attn_batch b = {.B = 1, .seqs = &s, .query = x, .key = x, .out = out};
    ck_assert(attn_forward_ref(&m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "self-attention") != NULL, "%s", err);
    int32_t pos[3] = {4, -1, 5};
    b.key = NULL;
    s.positions = pos;
    ck_assert(attn_forward_ref(&m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "position -1 of row 1") != NULL, "%s", err);
    /* attn_forward, the server's door, refuses them too */
    attn_ctx *ctx = attn_ctx_new(1);
    ck_assert(ctx != NULL);
    ck_assert(attn_forward(ctx, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "position -1 of row 1") != NULL, "%s", err);
    attn_ctx_free(ctx);
    free(x);
    attn_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------ algebra */

/* G < H equals H heads whose key/value heads are copied over each group. */
START_TEST(test_gqa_is_repeated_heads) {
    const int E = 24, H = 6, G = 2, D = 5, L = 9, R = H / G;
    attn_hparams hp = {.embed_dim = E,
                       .num_heads = H,
                       .kdim = E,
                       .vdim = E,
                       .bias = 1,
                       .num_kv_heads = G,
                       .head_dim = D};
    attn_hparams hf = hp;
    hf.num_kv_heads = H;
    attn_model g, f;
    g_rng = 11;
    rand_model(&g, &hp, RM_SCALE);
    rand_model(&f, &hf, RM_SCALE);
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
    float *x = rand_floats((size_t)L * E, RAND_UNIT), a[9 * 24], b[9 * 24];
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
        attn_hparams hp = {.embed_dim = E,
                           .num_heads = 4,
                           .kdim = E,
                           .vdim = E,
                           .bias = 1,
                           .num_kv_heads = 2,
                           .rope = {.dim = 6, .theta = 10000, .style = style}};
        attn_hparams plain = hp;
        plain.rope.dim = 0;
        attn_model r, p;
        g_rng = 21;
        rand_model(&r, &hp, RM_SCALE);
        ck_assert(attn_model_init(&p, &plain, (char[64]){0}, 64) == 0);
        memcpy(p.mem, r.mem, sizeof(float) * r.n_floats);
        int32_t zero[7] = {0};
        float *x = rand_floats((size_t)L * E, RAND_UNIT), a[7 * 32], b[7 * 32];
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
        {.dim = 12,
         .theta = 500000,
         .style = ATTN_ROPE_INTERLEAVED,
         .scaling = ATTN_ROPE_SCALE_LLAMA3,
         .factor = 8,
         .low_freq_factor = 1,
         .high_freq_factor = 4,
         .original_max_position = 64},
    };
    for (size_t c = 0; c < sizeof ropes / sizeof ropes[0]; c++) {
        attn_hparams hp = {.embed_dim = E,
                           .num_heads = 4,
                           .kdim = E,
                           .vdim = E,
                           .bias = 1,
                           .num_kv_heads = 1,
                           .rope = ropes[c]};
        attn_model m;
        g_rng = 31 + c;
        rand_model(&m, &hp, RM_SCALE);
        int32_t pos[10], far[10];
        for (int i = 0; i < L; i++) {
            pos[i] = i;
            far[i] = 1000 + i;
        }
        float *x = rand_floats((size_t)L * E, RAND_UNIT), a[10 * 48], b[10 * 48];
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
    attn_hparams hs = {
        .embed_dim = E, .num_heads = H, .kdim = E, .vdim = E, .bias = 1, .scale = 0.05};
    attn_hparams hd = hs;
    hd.scale = 0;
    attn_model s, d;
    g_rng = 41;
    rand_model(&s, &hs, RM_SCALE);
    ck_assert(attn_model_init(&d, &hd, (char[64]){0}, 64) == 0);
    memcpy(d.mem, s.mem, sizeof(float) * s.n_floats);
    double k = 0.05 * sqrt(8.0);
    for (float *p = d.q_w; p < d.k_w; p++)
        *p = (float)(*p * k);
    for (float *p = d.q_b; p < d.k_b; p++)
        *p = (float)(*p * k);
    float *x = rand_floats((size_t)L * E, RAND_UNIT), a[6 * 16], b[6 * 16];
    ref_self(&s, x, L, 0, NULL, a);
    ref_self(&d, x, L, 0, NULL, b);
    double e = rel_err(a, b, (size_t)L * E);
    ck_assert_msg(e < 1e-6, "scale: %g", e);
    free(x);
    attn_model_free(&s);
    attn_model_free(&d);
}
END_TEST

/* The decoder forward against the reference on random batches the goldens
 * do not cover: cross-attention (value given or = key) with grouped heads,
 * every mask and weights mode, rotary positions given per row. */
START_TEST(test_decoder_vs_ref) {
    typedef struct {
        int E, H, G, D, Kd, Vd, cross, value, rope;
    } rcase;
    const rcase cases[] = {
        {24, 6, 2, 5, 10, 14, 1, 1, 0},
        {24, 6, 3, 4, 10, 10, 1, 0, 0},
        {32, 4, 1, 16, 32, 32, 0, 0, 1},
        {40, 8, 4, 6, 40, 40, 0, 0, 1},
    };
    char err[256];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const rcase *k = &cases[c];
        attn_hparams hp = {.embed_dim = k->E,
                           .num_heads = k->H,
                           .kdim = k->Kd,
                           .vdim = k->Vd,
                           .bias = 1,
                           .num_kv_heads = k->G,
                           .head_dim = k->D,
                           .scale = 0.3};
        if (k->rope) hp.rope = (attn_rope){.dim = k->D - 2, .theta = 1000, .style = c % 2};
        attn_model m;
        g_rng = 100 + c;
        rand_model(&m, &hp, RM_SCALE);
        enum { B = 4 };
        attn_seq seqs[B], ref[B];
        int L[B] = {1, 7, 13, 5}, S[B] = {3, 7, 20, 5};
        size_t T = 0, U = 0, na[B];
        void *owned[B][4];
        for (int i = 0; i < B; i++) {
            if (!k->cross) S[i] = L[i];
            T += (size_t)L[i];
            U += (size_t)S[i];
        }
        float *q = rand_floats(T * k->E, RAND_UNIT), *key = rand_floats(U * k->Kd, RAND_UNIT);
        float *val = rand_floats(U * k->Vd, RAND_UNIT);
        float *o1 = xcalloc(T * k->E, sizeof(float)), *o2 = xcalloc(T * k->E, sizeof(float));
        for (int i = 0; i < B; i++) {
            attn_seq *s = &seqs[i];
            *s = (attn_seq){
                .L = L[i], .S = S[i], .causal = i % 2, .weights = (attn_weights_mode)(i % 3)};
            uint8_t *kpm = xcalloc(S[i], 1), *mb = xcalloc((size_t)L[i] * S[i], 1);
            float *ma = rand_floats((size_t)L[i] * S[i], RAND_UNIT);
            int32_t *pos = xcalloc(L[i], sizeof(int32_t));
            for (int j = 0; j < S[i]; j++)
                kpm[j] = j % 4 == 3;
            for (int j = 0; j < L[i] * S[i]; j++) {
                mb[j] = j % 5 == 2;
                if (j % 7 == 3) ma[j] = -INFINITY;
            }
            for (int j = 0; j < L[i]; j++)
                pos[j] = 40 + 3 * j;
            owned[i][0] = kpm;
            owned[i][1] = mb;
            owned[i][2] = ma;
            owned[i][3] = pos;
            if (i != 1) s->key_padding_mask = kpm;
            if (i == 2) s->attn_mask_bool = mb;
            if (i == 3 || i == 2) s->attn_mask_add = ma;
            if (k->rope && i != 0) s->positions = pos;
            na[i] =
                s->weights == ATTN_WEIGHTS_HEADS ? (size_t)k->H * L[i] * S[i] : (size_t)L[i] * S[i];
            s->attn = s->weights ? xcalloc(na[i], sizeof(float)) : NULL;
            ref[i] = *s;
            ref[i].attn = s->weights ? xcalloc(na[i], sizeof(float)) : NULL;
        }
        attn_batch b = {.B = B,
                        .seqs = seqs,
                        .query = q,
                        .key = k->cross ? key : NULL,
                        .value = k->cross && k->value ? val : NULL,
                        .out = o1};
        forward(1, &m, &b);
        b.seqs = ref;
        b.out = o2;
        ck_assert_msg(attn_forward_ref(&m, &b, err, sizeof err) == 0, "case %zu: %s", c, err);
        double e = rel_err(o1, o2, T * k->E);
        ck_assert_msg(e <= REL_TOL, "case %zu: output %g", c, e);
        /* and split over a 2-thread context on the OpenBLAS tiles: the same numbers */
        b.seqs = seqs;
        b.out = o1;
        int fused = attn_set_fused(0);
        forward(2, &m, &b);
        attn_set_fused(fused);
        e = rel_err(o1, o2, T * k->E);
        ck_assert_msg(e <= REL_TOL, "case %zu, 2 threads, OpenBLAS tiles: output %g", c, e);
        for (int i = 0; i < B; i++) {
            if (seqs[i].weights) {
                e = rel_err(seqs[i].attn, ref[i].attn, na[i]);
                ck_assert_msg(e <= REL_TOL, "case %zu seq %d: attention %g", c, i, e);
            }
            for (int o = 0; o < 4; o++)
                free(owned[i][o]);
            free(seqs[i].attn);
            free(ref[i].attn);
        }
        free(q);
        free(key);
        free(val);
        free(o1);
        free(o2);
        attn_model_free(&m);
    }
}
END_TEST

/* ------------------------------------------------------------ invariance */

/* Models for the invariance tests: which 0 and 1 are decoders with grouped
 * heads (G = 2 of H = 6), a head_dim of their own and rotary positions, D =
 * 10 (not a multiple of 16: the OpenBLAS tiles) and D = 16 (the fused
 * kernel where the CPU has AVX-512, a row's three query heads in its
 * lanes); which 2 is plain nn.MultiheadAttention (E = 32, H = 2, D = 16). */
static void invariance_model(attn_model *m, int which) {
    attn_hparams hp = {.embed_dim = which == 2 ? 32 : 40,
                       .num_heads = which == 2 ? 2 : 6,
                       .kdim = which == 2 ? 32 : 40,
                       .vdim = which == 2 ? 32 : 40,
                       .bias = 1,
                       .num_kv_heads = which == 2 ? 0 : 2,
                       .head_dim = which == 0   ? 10
                                   : which == 1 ? 16
                                                : 0};
    if (which < 2)
        hp.rope = (attn_rope){.dim = 8, .theta = 10000, .style = which ? ATTN_ROPE_INTERLEAVED : 0};
    g_rng = 77 + which;
    rand_model(m, &hp, RM_SCALE);
}

/* Loop test _i of n models: model _i % n, the fused kernel on for the first
 * n (where the CPU has it), off for the next n. Returns the old setting. */
static int inv_setup(attn_model *m, int i, int n) {
    invariance_model(m, i % n);
    return attn_set_fused(i < n);
}

/* A sequence's numbers do not depend on what shares its batch nor on the
 * thread count: each sequence alone on one thread equals, bit for bit, the
 * same sequence packed with the others over 3 threads (the projections'
 * kernel computes each output alike, docs/performance.md), outputs and
 * attention weights. */
START_TEST(test_decoder_batch_invariant) {
    attn_model m;
    int fused = inv_setup(&m, _i, 2);
    enum { B = 4 };
    const int L[B] = {7, 61, 1, 130}, E = m.hp.embed_dim, H = m.hp.num_heads;
    const attn_weights_mode w[B] = {ATTN_WEIGHTS_NONE, ATTN_WEIGHTS_HEADS, ATTN_WEIGHTS_MEAN,
                                    ATTN_WEIGHTS_NONE};
    attn_seq seqs[B];
    float *attn[B][2];
    size_t T = 0;
    for (int i = 0; i < B; i++) {
        for (int k = 0; k < 2; k++)
            attn[i][k] = xcalloc((size_t)H * L[i] * L[i], sizeof(float));
        seqs[i] = (attn_seq){.L = L[i], .S = L[i], .causal = i % 2, .weights = w[i]};
        T += (size_t)L[i];
    }
    float *q = rand_floats(T * E, RAND_UNIT), *all = xcalloc(T * E, sizeof(float));
    float *one = xcalloc(T * E, sizeof(float));
    for (int i = 0; i < B; i++)
        seqs[i].attn = attn[i][0];
    attn_batch b = {.B = B, .seqs = seqs, .query = q, .out = all};
    forward(3, &m, &b);
    for (int i = 0, t = 0; i < B; t += L[i], i++) {
        attn_seq alone = seqs[i];
        alone.attn = attn[i][1];
        attn_batch a = {
            .B = 1, .seqs = &alone, .query = q + (size_t)t * E, .out = one + (size_t)t * E};
        forward(1, &m, &a);
        REQUIRE(memcmp(attn[i][0], attn[i][1], sizeof(float) * (size_t)H * L[i] * L[i]) == 0,
                "case %d, sequence %d: attention weights in the batch differ from alone", _i, i);
    }
    for (size_t i = 0; i < T * E; i++)
        REQUIRE(memcmp(&all[i], &one[i], sizeof(float)) == 0,
                "case %d, float %zu (row %zu): %.9g in the batch over 3 threads, %.9g alone", _i, i,
                i / E, all[i], one[i]);
    for (int i = 0; i < B; i++)
        for (int k = 0; k < 2; k++)
            free(attn[i][k]);
    attn_set_fused(fused);
    free(q);
    free(all);
    free(one);
    attn_model_free(&m);
}
END_TEST

/* A session's steps give the very bits of the whole causal sequence, with
 * no attention matrix and with mean weights: rows projected in a step of a
 * few rows equal the same rows projected among many, and a row attends
 * alike in any block, so the cached keys, the scores and the outputs are
 * the same. Steps go through attn_forward as cache sequences. */
START_TEST(test_steps_bitwise) {
    attn_model m;
    int fused = inv_setup(&m, _i, 2);
    enum { L = 40 };
    const int E = m.hp.embed_dim;
    const int row = 2 * m.hp.num_kv_heads * m.hp.head_dim;
    const int split[] = {13, 1, 2, 1, 7, 16};
    float *q = rand_floats((size_t)L * E, RAND_UNIT),
          *whole = xcalloc((size_t)L * E, sizeof(float));
    float *stepped = xcalloc((size_t)L * E, sizeof(float));
    float *kv = xcalloc((size_t)L * row, sizeof(float));
    float *wmean = xcalloc((size_t)L * L, sizeof(float)), *smean = xcalloc((size_t)L * L, 4);
    char err[256];
    attn_ctx *ctx = attn_ctx_new(2);
    ck_assert(ctx != NULL);
    for (int mean = 0; mean < 2; mean++) {
        attn_weights_mode w = mean ? ATTN_WEIGHTS_MEAN : ATTN_WEIGHTS_NONE;
        attn_seq s = {.L = L, .S = L, .causal = 1, .weights = w, .attn = wmean};
        attn_batch b = {.B = 1, .seqs = &s, .query = q, .out = whole};
        forward(1, &m, &b);
        for (int k = 0, len = 0; len < L; len += split[k], k++) {
            attn_seq st = step_seq(split[k], len, kv, w, smean);
            attn_batch sb = {.B = 1,
                             .seqs = &st,
                             .query = q + (size_t)len * E,
                             .out = stepped + (size_t)len * E};
            ck_assert_msg(attn_forward(ctx, &m, &sb, err, sizeof err) == 0, "%s", err);
            for (int r = 0; mean && r < split[k]; r++)
                REQUIRE(memcmp(smean + (size_t)r * st.S, wmean + (size_t)(len + r) * L,
                               sizeof(float) * st.S) == 0,
                        "case %d: row %d's mean weights differ through steps", _i, len + r);
        }
        for (size_t i = 0; i < (size_t)L * E; i++)
            REQUIRE(memcmp(&whole[i], &stepped[i], sizeof(float)) == 0,
                    "case %d, weights %d: row %zu column %zu: %.9g through steps, %.9g as a whole "
                    "sequence",
                    _i, mean, i / E, i % E, stepped[i], whole[i]);
    }
    attn_ctx_free(ctx);
    attn_set_fused(fused);
    free(q);
    free(whole);
    free(stepped);
    free(kv);
    free(wmean);
    free(smean);
    attn_model_free(&m);
}
END_TEST

/* Cache steps ride in an ordinary batch (attn_seq.kv): a batch through
 * attn_forward that mixes two sessions' steps with whole sequences gives
 * each the very bits it gets alone, mean weights included, and writes each
 * step's key and value rows into its own cache. */
START_TEST(test_steps_in_a_batch) {
    attn_model m;
    invariance_model(&m, 0);
    const int E = m.hp.embed_dim, row = 2 * m.hp.num_kv_heads * m.hp.head_dim;
    enum { B = 4, CACHED = 9 };
    const int L[B] = {3, 11, 1, 5}; /* step, whole, step, whole */
    float *q = rand_floats(20 * (size_t)E, RAND_UNIT),
          *prefix = rand_floats(2 * CACHED * (size_t)E, RAND_UNIT);
    float *out = xcalloc(20 * (size_t)E, sizeof(float)), *alone = xcalloc(20 * (size_t)E, 4);
    float *kv[2], *kv_alone[2], attn[B][20 * 20], attn_alone[20 * 20];
    char err[256];
    attn_ctx *ctx = attn_ctx_new(2);
    ck_assert(ctx != NULL);
    for (int k = 0; k < 2; k++) { /* two sessions of CACHED tokens each, twice */
        kv[k] = xcalloc((CACHED + 3) * (size_t)row, sizeof(float));
        kv_alone[k] = xcalloc((CACHED + 3) * (size_t)row, sizeof(float));
        prefill(&m, kv[k], prefix + (size_t)k * CACHED * E, CACHED);
        prefill(&m, kv_alone[k], prefix + (size_t)k * CACHED * E, CACHED);
    }
    attn_seq seqs[B];
    for (int i = 0; i < B; i++) { /* steps (i even), whole causal sequences (i odd) */
        seqs[i] = step_seq(L[i], i % 2 ? 0 : CACHED, i % 2 ? NULL : kv[i / 2], ATTN_WEIGHTS_MEAN,
                           attn[i]);
        seqs[i].causal = i % 2;
    }
    attn_batch b = {.B = B, .seqs = seqs, .query = q, .out = out};
    ck_assert_msg(attn_forward(ctx, &m, &b, err, sizeof err) == 0, "%s", err);
    for (int i = 0, t = 0; i < B; t += L[i], i++) {
        attn_seq one = seqs[i];
        one.attn = attn_alone;
        if (one.kv) one.kv = kv_alone[i / 2];
        attn_batch a = {
            .B = 1, .seqs = &one, .query = q + (size_t)t * E, .out = alone + (size_t)t * E};
        forward(1, &m, &a);
        if (one.kv)
            REQUIRE(memcmp(kv[i / 2], kv_alone[i / 2], sizeof(float) * (CACHED + L[i]) * row) == 0,
                    "sequence %d: the cache rows differ", i);
        REQUIRE(memcmp(out + (size_t)t * E, alone + (size_t)t * E, sizeof(float) * L[i] * E) == 0,
                "sequence %d: outputs in the mixed batch differ from alone", i);
        REQUIRE(memcmp(attn[i], attn_alone, sizeof(float) * (size_t)L[i] * seqs[i].S) == 0,
                "sequence %d: mean weights in the mixed batch differ from alone", i);
    }
    seqs[1].kv = kv[0]; /* a step must not declare S other than cached + L */
    seqs[1].cached = 2;
    ck_assert(attn_forward(ctx, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "cached") != NULL, "%s", err);
    attn_ctx_free(ctx);
    for (int k = 0; k < 2; k++) {
        free(kv[k]);
        free(kv_alone[k]);
    }
    free(q);
    free(prefix);
    free(out);
    free(alone);
    attn_model_free(&m);
}
END_TEST

/* The batch of test_steps_vs_ref, run twice: [0] through attn_forward, [1]
 * through the reference, each with its own caches, outputs and weights. */
enum { VS_B = 4, VS_CACHED = 21, VS_T = 32 };
static const int VS_L[VS_B] = {4, 9, 6, 13}; /* step after VS_CACHED, whole, step from 0, whole */
typedef struct {
    attn_seq s[VS_B]; /* the sequences, kv and attn unset */
    float *attn[2][VS_B];
    size_t na[VS_B]; /* floats of each sequence's weights */
    float *kv[2][2]; /* [c][0]: the session after the prefix, [c][1]: a new one */
    float *out[2];   /* (VS_T, E) */
    uint8_t kpm[9];
    int32_t pos[13];
} vs_batch;

/* The sequences with the weights modes w, and the caches after a prefix
 * (through attn_forward, copied for the reference). */
static void vs_init(vs_batch *v, const attn_model *m, const attn_weights_mode *w) {
    int E = m->hp.embed_dim, row = 2 * m->hp.num_kv_heads * m->hp.head_dim;
    memset(v, 0, sizeof *v);
    for (int i = 0; i < 13; i++)
        v->pos[i] = 100 + 2 * i;
    v->kpm[1] = v->kpm[5] = 1;
    for (int i = 0; i < VS_B; i++) {
        const int L = VS_L[i];
        v->s[i] = i == 0   ? step_seq(L, VS_CACHED, NULL, w[i], NULL)
                  : i == 2 ? step_seq(L, 0, NULL, w[i], NULL)
                           : (attn_seq){.L = L, .S = L, .causal = i == 3, .weights = w[i]};
        if (i == 1) v->s[i].key_padding_mask = v->kpm;
        if (i == 3 && m->hp.rope.dim) v->s[i].positions = v->pos;
        v->na[i] = (size_t)(w[i] == ATTN_WEIGHTS_HEADS ? m->hp.num_heads : 1) * L * v->s[i].S;
        for (int c = 0; c < 2; c++)
            v->attn[c][i] = w[i] ? xcalloc(v->na[i], sizeof(float)) : NULL;
    }
    for (int c = 0; c < 2; c++) {
        v->out[c] = xcalloc(VS_T * (size_t)E, sizeof(float));
        for (int k = 0; k < 2; k++)
            v->kv[c][k] = xcalloc((VS_CACHED + VS_L[0]) * (size_t)row, sizeof(float));
    }
    float *prefix = rand_floats(VS_CACHED * (size_t)E, RAND_UNIT);
    prefill(m, v->kv[0][0], prefix, VS_CACHED);
    memcpy(v->kv[1][0], v->kv[0][0], sizeof(float) * VS_CACHED * row);
    free(prefix);
}

static void vs_free(vs_batch *v) {
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < VS_B; i++)
            free(v->attn[c][i]);
        free(v->out[c]);
        free(v->kv[c][0]);
        free(v->kv[c][1]);
    }
}

/* Runs the batch of queries q as v's run c. */
static void vs_run(vs_batch *v, const attn_model *m, const float *q, int c) {
    attn_seq seqs[VS_B];
    char err[256];
    for (int i = 0; i < VS_B; i++) {
        seqs[i] = v->s[i];
        seqs[i].attn = v->attn[c][i];
        if (i == 0 || i == 2) seqs[i].kv = v->kv[c][i / 2];
    }
    attn_batch b = {.B = VS_B, .seqs = seqs, .query = q, .out = v->out[c]};
    if (c == 0)
        forward(2, m, &b);
    else
        ck_assert_msg(attn_forward_ref(m, &b, err, sizeof err) == 0, "%s", err);
}

/* The fast forward against the reference on a batch that mixes cache steps
 * (after a prefix, and from an empty cache) with whole sequences (masked,
 * with positions), every weights mode on each kind (two rotations of the
 * modes over the sequences), for the decoders and nn.MultiheadAttention,
 * the fused kernel on and off: outputs, weights and the cache rows the
 * steps append, within 1e-5. */
START_TEST(test_steps_vs_ref) {
    const attn_weights_mode modes[2][VS_B] = {
        {ATTN_WEIGHTS_NONE, ATTN_WEIGHTS_HEADS, ATTN_WEIGHTS_MEAN, ATTN_WEIGHTS_NONE},
        {ATTN_WEIGHTS_HEADS, ATTN_WEIGHTS_NONE, ATTN_WEIGHTS_NONE, ATTN_WEIGHTS_MEAN}};
    attn_model m;
    int fused = inv_setup(&m, _i % 6, 3);
    const int E = m.hp.embed_dim, row = 2 * m.hp.num_kv_heads * m.hp.head_dim;
    vs_batch v;
    vs_init(&v, &m, modes[_i / 6]);
    float *q = rand_floats(VS_T * (size_t)E, RAND_UNIT);
    vs_run(&v, &m, q, 0);
    vs_run(&v, &m, q, 1);
    for (int i = 0; i < VS_B; i++)
        if (v.attn[0][i]) {
            double e = rel_err(v.attn[0][i], v.attn[1][i], v.na[i]);
            ck_assert_msg(e <= REL_TOL, "case %d, sequence %d: attention error %g", _i, i, e);
        }
    double e = rel_err(v.out[0], v.out[1], VS_T * (size_t)E);
    ck_assert_msg(e <= REL_TOL, "case %d: output error %g", _i, e);
    for (int k = 0; k < 2; k++) {
        int n = k ? VS_L[2] : VS_CACHED + VS_L[0];
        e = rel_err(v.kv[0][k], v.kv[1][k], (size_t)n * row);
        ck_assert_msg(e <= REL_TOL, "case %d: cache %d error %g", _i, k, e);
    }
    attn_set_fused(fused);
    vs_free(&v);
    free(q);
    attn_model_free(&m);
}
END_TEST

/* The forward reads the packed weights, which attn_model_pack makes: an
 * unpacked model is refused with a sentence saying so, for a whole
 * sequence and a cache step alike; and a forward needs a context. */
START_TEST(test_unpacked_refused) {
    attn_model m;
    invariance_model(&m, 0);
    float q[2 * 40], out[2 * 40], kv[2 * 40];
    memset(q, 0, sizeof q);
    char err[256] = "";
    struct attn_packed *packed = m.packed;
    m.packed = NULL; /* as before attn_model_pack */
    attn_ctx *ctx = attn_ctx_new(1);
    ck_assert(ctx != NULL);
    attn_seq s = {.L = 2, .S = 2};
    attn_batch b = {.B = 1, .seqs = &s, .query = q, .out = out};
    ck_assert(attn_forward(ctx, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "not packed") != NULL, "%s", err);
    s = step_seq(2, 0, kv, ATTN_WEIGHTS_NONE, NULL);
    err[0] = '\0';
    ck_assert(attn_forward(ctx, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "not packed") != NULL, "%s", err);
    m.packed = packed;
    err[0] = '\0';
    ck_assert(attn_forward(NULL, &m, &b, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "context") != NULL, "%s", err);
    attn_ctx_free(ctx);
    attn_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------ golden */

#define MAX_GOLDEN 16 /* ATTND_GOLDEN_DIR overrides the folder (tests/data/golden/decoder) */
static char g_golden[MAX_GOLDEN][512];
static int g_ngolden;

static const char *golden_dir(void) {
    const char *d = getenv("ATTND_GOLDEN_DIR");
    return d && *d ? d : "tests/data/golden/decoder";
}

static void find_golden(void) {
    DIR *d = opendir(golden_dir());
    struct dirent *e;
    while (d && (e = readdir(d)) && g_ngolden < MAX_GOLDEN) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".json") == 0)
            snprintf(g_golden[g_ngolden++], sizeof g_golden[0], "%s/%s", golden_dir(), e->d_name);
    }
    if (d) closedir(d);
}

/* Nested JSON arrays of numbers (or booleans) flattened; n set to the count. */
static void flatten(json_t *v, float *dst, size_t *n) {
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) flatten(x, dst, n);
        return;
    }
    if (dst) dst[*n] = json_is_boolean(v) ? (float)json_is_true(v) : (float)json_number_value(v);
    (*n)++;
}

static float *floats_of(json_t *v, size_t *n) {
    *n = 0;
    if (!v || json_is_null(v)) return NULL;
    flatten(v, NULL, n);
    float *p = xcalloc(*n, sizeof(float));
    *n = 0;
    flatten(v, p, n);
    return p;
}

/* The golden model: its "config" entry read as attnd reads a config file
 * (relative to the golden file), then its weights loaded from safetensors. */
static void golden_model(json_t *root, const char *file, attn_model *m) {
    char err[512] = "";
    char *entry = json_dumps(json_object_get(root, "config"), JSON_COMPACT);
    char text[4096];
    snprintf(text, sizeof text, "{\"models\":[%s]}", entry);
    free(entry);
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_mem(&c, text, strlen(text), file, 1, err, sizeof err) == 0,
                  "%s: %s", file, err);
    ck_assert_msg(attnd_model_load(m, &c.models[0], err, sizeof err) == 0, "%s: %s", file, err);
    attnd_config_free(&c);
}

/* One golden sequence: its inputs as an attn_seq, its expected answers. */
typedef struct {
    attn_seq s;
    float *query, *want_out, *want_attn, *attn;
    int32_t *pos;
    uint8_t *kpm, *mask;
} gseq;

static void gseq_load(gseq *g, json_t *js, const attn_model *m) {
    size_t n, nq;
    memset(g, 0, sizeof *g);
    g->query = floats_of(json_object_get(js, "query"), &nq);
    g->s.L = g->s.S = (int)(nq / (size_t)m->hp.embed_dim);
    g->s.causal = json_is_true(json_object_get(js, "causal"));
    g->want_out = floats_of(json_object_get(js, "output"), &n);
    g->want_attn = floats_of(json_object_get(js, "attn_weights"), &n);
    const char *mode = json_string_value(json_object_get(js, "attention"));
    g->s.weights = strcmp(mode, "heads") == 0  ? ATTN_WEIGHTS_HEADS
                   : strcmp(mode, "mean") == 0 ? ATTN_WEIGHTS_MEAN
                                               : ATTN_WEIGHTS_NONE;
    if (g->want_attn) g->attn = xcalloc(n, sizeof(float));
    g->s.attn = g->attn;
    json_t *pos = json_object_get(js, "positions");
    if (json_is_array(pos)) {
        g->pos = xcalloc(json_array_size(pos), sizeof(int32_t));
        for (size_t i = 0; i < json_array_size(pos); i++)
            g->pos[i] = (int32_t)json_integer_value(json_array_get(pos, i));
        g->s.positions = g->pos;
    }
    float *kpm = floats_of(json_object_get(js, "key_padding_mask"), &n);
    if (kpm) {
        g->kpm = xcalloc(n, 1);
        for (size_t i = 0; i < n; i++)
            g->kpm[i] = kpm[i] != 0;
        g->s.key_padding_mask = g->kpm;
    }
    free(kpm);
    float *am = floats_of(json_object_get(js, "attn_mask"), &n);
    if (am) {
        g->mask = xcalloc(n, 1);
        for (size_t i = 0; i < n; i++)
            g->mask[i] = am[i] != 0;
        g->s.attn_mask_bool = g->mask;
    }
    free(am);
}

static void gseq_free(gseq *g) {
    free(g->query);
    free(g->want_out);
    free(g->want_attn);
    free(g->attn);
    free(g->pos);
    free(g->kpm);
    free(g->mask);
}

/* A row whose keys are all hidden: output out_b, weights 0. */
static void check_hidden_rows(const attn_model *m, const gseq *g, const float *out,
                              const char *what) {
    int E = m->hp.embed_dim, L = g->s.L;
    int nh = g->s.weights == ATTN_WEIGHTS_HEADS ? m->hp.num_heads : 1;
    for (int i = 0; i < L; i++) {
        int all = 1;
        for (int j = 0; j < L && all; j++)
            all = (g->s.causal && j > i) || (g->kpm && g->kpm[j]) ||
                  (g->mask && g->mask[(size_t)i * L + j]);
        if (!all) continue;
        for (int e = 0; e < E; e++)
            REQUIRE(fabsf(out[(size_t)i * E + e] - m->out_b[e]) <= 1e-6f,
                    "%s: hidden row %d is not out_b", what, i);
        for (int h = 0; g->attn && h < nh; h++)
            for (int j = 0; j < L; j++)
                REQUIRE(g->attn[((size_t)h * L + i) * L + j] == 0.0f,
                        "%s: hidden row %d has a weight", what, i);
    }
}

static double g_worst;

/* Runs every sequence of one golden file through the reference, alone and
 * all packed in one batch. */
START_TEST(test_golden_file) {
    const char *file = g_golden[_i];
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    ck_assert_msg(root != NULL, "%s: %s", file, jerr.text);
    attn_model m;
    golden_model(root, file, &m);
    json_t *seqs = json_object_get(root, "sequences");
    size_t B = json_array_size(seqs), T = 0;
    int E = m.hp.embed_dim;
    gseq *g = xcalloc(B, sizeof(gseq));
    for (size_t i = 0; i < B; i++) {
        gseq_load(&g[i], json_array_get(seqs, i), &m);
        T += (size_t)g[i].s.L;
    }
    char err[256], what[600];
    double worst = 0;
    /* alone, through the reference and attn_forward (its default kernels,
     * then the OpenBLAS tiles) */
    const char *path[3] = {"ref", "attn_forward", "attn_forward, OpenBLAS tiles"};
    attn_ctx *ctx = attn_ctx_new(2);
    ck_assert(ctx != NULL);
    for (size_t k = 0; k < 3 * B; k++) {
        size_t i = k % B;
        int fast = (int)(k / B);
        float *out = xcalloc((size_t)g[i].s.L * E, sizeof(float));
        attn_batch b = {.B = 1, .seqs = &g[i].s, .query = g[i].query, .out = out};
        int fused = attn_set_fused(fast < 2);
        int rc = fast ? attn_forward(ctx, &m, &b, err, sizeof err)
                      : attn_forward_ref(&m, &b, err, sizeof err);
        attn_set_fused(fused);
        ck_assert_msg(rc == 0, "%s: %s", file, err);
        snprintf(what, sizeof what, "%s sequence %zu (%s)", file, i, path[fast]);
        double e = rel_err(out, g[i].want_out, (size_t)g[i].s.L * E);
        ck_assert_msg(e <= REL_TOL, "%s: output relative error %g", what, e);
        worst = fmax(worst, e);
        if (g[i].attn) {
            size_t na = (g[i].s.weights == ATTN_WEIGHTS_HEADS ? m.hp.num_heads : 1) *
                        (size_t)g[i].s.L * g[i].s.L;
            e = rel_err(g[i].attn, g[i].want_attn, na);
            ck_assert_msg(e <= REL_TOL, "%s: attention relative error %g", what, e);
        }
        check_hidden_rows(&m, &g[i], out, what);
        free(out);
    }
    /* packed: one ragged batch of every sequence */
    attn_seq *as = xcalloc(B, sizeof(attn_seq));
    float *q = xcalloc(T * E, sizeof(float)), *out = xcalloc(T * E, sizeof(float));
    for (size_t i = 0, t = 0; i < B; t += (size_t)g[i].s.L, i++) {
        as[i] = g[i].s;
        memcpy(q + t * E, g[i].query, sizeof(float) * g[i].s.L * E);
    }
    attn_batch b = {.B = (int)B, .seqs = as, .query = q, .out = out};
    for (int fast = 0; fast < 3; fast++) {
        memset(out, 0, sizeof(float) * T * E);
        int fused = attn_set_fused(fast < 2);
        int rc = fast ? attn_forward(ctx, &m, &b, err, sizeof err)
                      : attn_forward_ref(&m, &b, err, sizeof err);
        attn_set_fused(fused);
        ck_assert_msg(rc == 0, "%s: %s", file, err);
        for (size_t i = 0, t = 0; i < B; t += (size_t)g[i].s.L, i++) {
            double e = rel_err(out + t * E, g[i].want_out, (size_t)g[i].s.L * E);
            ck_assert_msg(e <= REL_TOL, "%s packed (%s), sequence %zu: relative error %g", file,
                          path[fast], i, e);
            worst = fmax(worst, e);
        }
    }
    printf("golden %s: %zu sequences ok through the reference and attn_forward (its kernels and "
           "the OpenBLAS tiles), alone and packed; largest relative error %.3g\n",
           file, B, worst);
    g_worst = fmax(g_worst, worst);
    attn_ctx_free(ctx);
    free(as);
    free(q);
    free(out);
    for (size_t i = 0; i < B; i++)
        gseq_free(&g[i]);
    free(g);
    attn_model_free(&m);
    json_decref(root);
}
END_TEST

/* The attention rows of a step of n rows at p0 of session k (0: per head
 * (H,n,S), 1: mean (n,S)) against the golden whole sequence's (H,L,L). */
static void check_step_attention(const gseq *g, const float *attn, int H, int k, int p0, int n,
                                 const char *file) {
    int L = g->s.L, S = p0 + n;
    float want[L], got[L];
    for (int r = 0; r < n; r++)
        for (int h = 0; h < (k == 0 ? H : 1); h++) {
            for (int j = 0; j < S; j++) {
                want[j] = 0;
                for (int hh = k == 0 ? h : 0; hh < (k == 0 ? h + 1 : H); hh++)
                    want[j] += g->want_attn[((size_t)hh * L + p0 + r) * L + j] / (k == 0 ? 1 : H);
                got[j] = attn[((size_t)h * n + r) * S + j];
            }
            double e = rel_err(got, want, (size_t)S);
            ck_assert_msg(e <= REL_TOL, "%s: session %d, row %d head %d: attention %g", file, k,
                          p0 + r, h, e);
        }
}

/* A session replayed step by step equals the whole sequence: sequence 0 of
 * each golden file (causal, positions 0..L-1) through attn_forward as the
 * cache steps of two sessions in each batch, one with a prefix of 5 and uneven steps, one a row
 * at a time; every step's output and attention rows against the golden
 * whole-sequence answer. */
START_TEST(test_steps_replay) {
    const char *file = g_golden[_i];
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    ck_assert_msg(root != NULL, "%s: %s", file, jerr.text);
    attn_model m;
    golden_model(root, file, &m);
    gseq g;
    gseq_load(&g, json_array_get(json_object_get(root, "sequences"), 0), &m);
    ck_assert(g.s.causal && !g.pos && !g.kpm && !g.mask && g.s.weights == ATTN_WEIGHTS_HEADS);
    const int E = m.hp.embed_dim, H = m.hp.num_heads, L = g.s.L;
    const int row = 2 * m.hp.num_kv_heads * m.hp.head_dim;
    const int split[2][16] = {{5, 1, 1, 2, 1, 3, 1, 1, 1},
                              {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
    float *kv[2], *attn[2];
    float *qb = xcalloc(2 * (size_t)L * E, sizeof(float)), *ob = xcalloc(2 * (size_t)L * E, 4);
    int len[2] = {0, 0}, at[2] = {0, 0};
    double worst = 0;
    attn_ctx *ctx = attn_ctx_new(3); /* the steps split over 3 threads */
    ck_assert(ctx != NULL);
    for (int k = 0; k < 2; k++) {
        kv[k] = xcalloc((size_t)L * row, sizeof(float));
        attn[k] = xcalloc((size_t)H * L * L, sizeof(float));
    }
    char err[256];
    while (len[0] < L || len[1] < L) {
        attn_seq st[2];
        int ns = 0, who[2], t0[2], t = 0;
        for (int k = 0; k < 2; k++) { /* the steps' query rows packed into qb */
            if (len[k] >= L) continue;
            int n = split[k][at[k]];
            attn_weights_mode w = k == 0 ? ATTN_WEIGHTS_HEADS : ATTN_WEIGHTS_MEAN;
            st[ns] = step_seq(n, len[k], kv[k], w, attn[k]);
            memcpy(qb + (size_t)t * E, g.query + (size_t)len[k] * E, sizeof(float) * n * E);
            t0[ns] = t;
            t += n;
            who[ns++] = k;
        }
        attn_batch b = {.B = ns, .seqs = st, .query = qb, .out = ob};
        ck_assert_msg(attn_forward(ctx, &m, &b, err, sizeof err) == 0, "%s: %s", file, err);
        for (int i = 0; i < ns; i++) {
            int k = who[i], n = st[i].L, p0 = len[k];
            const float *out = ob + (size_t)t0[i] * E;
            double e = rel_err(out, g.want_out + (size_t)p0 * E, (size_t)n * E);
            ck_assert_msg(e <= REL_TOL, "%s: session %d, step at %d (+%d): output error %g", file,
                          k, p0, n, e);
            worst = fmax(worst, e);
            check_step_attention(&g, attn[k], H, k, p0, n, file);
            len[k] += n;
            at[k]++;
        }
    }
    printf("steps %s: a session of uneven steps and one of single rows equal the whole "
           "sequence at every step; largest relative error %.3g\n",
           file, worst);
    for (int k = 0; k < 2; k++) {
        free(kv[k]);
        free(attn[k]);
    }
    free(qb);
    free(ob);
    attn_ctx_free(ctx);
    gseq_free(&g);
    attn_model_free(&m);
    json_decref(root);
}
END_TEST

/* The layer of test_long_cache_replay: grouped heads, llama3-scaled rotary
 * positions. */
enum { LONG_E = 64, LONG_G = 2, LONG_D = 8 };

static void long_model(attn_model *m) {
    attn_hparams hp = {.embed_dim = LONG_E,
                       .num_heads = 8,
                       .kdim = LONG_E,
                       .vdim = LONG_E,
                       .bias = 1,
                       .num_kv_heads = LONG_G,
                       .rope = {.dim = LONG_D,
                                .theta = 500000,
                                .style = ATTN_ROPE_HALF,
                                .scaling = ATTN_ROPE_SCALE_LLAMA3,
                                .factor = 8,
                                .low_freq_factor = 1,
                                .high_freq_factor = 4,
                                .original_max_position = 128}};
    g_rng = 1000;
    rand_model(m, &hp, RM_SCALE);
}

/* A long cache: 1000 tokens of a grouped-head, rotary (llama3-scaled)
 * layer fed through one session in uneven steps (a prefix of 37, then 1 to
 * 8 rows at a time) on a 2-thread context, beside a second session of
 * single rows in the same calls. Every step's output and mean attention
 * rows equal the same rows of the whole sequence through the reference
 * with causal = 1, to 1e-5, up to the last token, so that neither the
 * rotation at large positions nor the cache's addressing drifts. */
START_TEST(test_long_cache_replay) {
    enum { L = 1000, E = LONG_E, SHORT = 24, PREFIX = 37 };
    attn_model m;
    long_model(&m);
    const int row = 2 * LONG_G * LONG_D;
    float *x = rand_floats((size_t)L * E, RAND_UNIT);
    float *want = xcalloc((size_t)L * E, sizeof(float)),
          *want_attn = xcalloc((size_t)L * L, sizeof(float));
    char err[256];
    attn_seq whole = {.L = L, .S = L, .causal = 1, .weights = ATTN_WEIGHTS_MEAN, .attn = want_attn};
    attn_batch b = {.B = 1, .seqs = &whole, .query = x, .out = want};
    ck_assert_msg(attn_forward_ref(&m, &b, err, sizeof err) == 0, "%s", err);
    float *kv = xcalloc((size_t)L * row, sizeof(float)),
          *kv2 = xcalloc((size_t)SHORT * row, sizeof(float));
    /* a step's rows: at most PREFIX (the first), 8 after it; then the single row */
    float *qb = xcalloc((size_t)(PREFIX + 1) * E, sizeof(float));
    float *out = xcalloc((size_t)(PREFIX + 1) * E, sizeof(float));
    float *attn = xcalloc((size_t)PREFIX * L, sizeof(float));
    float attn2[SHORT];
    const int sizes[] = {1, 1, 2, 1, 5, 1, 3, 1, 1, 8};
    attn_ctx *ctx = attn_ctx_new(2);
    ck_assert(ctx != NULL);
    int len = 0, len2 = 0, k = 0;
    double worst = 0;
    while (len < L) {
        int n = len == 0 ? PREFIX : sizes[k++ % 10];
        if (n > L - len) n = L - len;
        attn_seq st[2] = {step_seq(n, len, kv, ATTN_WEIGHTS_MEAN, attn),
                          step_seq(1, len2, kv2, ATTN_WEIGHTS_MEAN, attn2)};
        memcpy(qb, x + (size_t)len * E, sizeof(float) * n * E);
        memcpy(qb + (size_t)n * E, x + (size_t)len2 * E, sizeof(float) * E);
        float *out2 = out + (size_t)n * E;
        int ns = len2 < SHORT ? 2 : 1;
        attn_batch sb = {.B = ns, .seqs = st, .query = qb, .out = out};
        ck_assert_msg(attn_forward(ctx, &m, &sb, err, sizeof err) == 0, "%s", err);
        double e = rel_err(out, want + (size_t)len * E, (size_t)n * E);
        ck_assert_msg(e <= REL_TOL, "step at %d (+%d): output error %g", len, n, e);
        worst = fmax(worst, e);
        for (int r = 0; r < n; r++) {
            e = rel_err(attn + (size_t)r * (len + n), want_attn + (size_t)(len + r) * L,
                        (size_t)(len + n));
            ck_assert_msg(e <= REL_TOL, "step at %d, row %d: attention error %g", len, r, e);
        }
        if (ns == 2) {
            e = rel_err(out2, want + (size_t)len2 * E, E);
            ck_assert_msg(e <= REL_TOL, "single-row session at %d: output error %g", len2, e);
            len2++;
        }
        len += n;
    }
    printf("long cache: %d tokens in %d steps equal the whole causal sequence; largest "
           "relative error %.3g\n",
           L, k + 1, worst);
    attn_ctx_free(ctx);
    free(x);
    free(want);
    free(want_attn);
    free(kv);
    free(kv2);
    free(qb);
    free(out);
    free(attn);
    attn_model_free(&m);
}
END_TEST

/* The llama layout's shape checks name everything that does not fit, in
 * one message: the weights of decoder_gqa_half (G = 2, no biases) under
 * changed hyper-parameters, each case with one or two keys changed. */
START_TEST(test_weights_refused) {
    char path[600], err[2048], text[4096];
    snprintf(path, sizeof path, "%s/gqa_half.json", golden_dir());
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    ck_assert_msg(root != NULL, "%s: %s", path, jerr.text);
#define T "\"model.layers.0.self_attn."
    struct {
        const char *key[2];
        json_t *value[2];
        const char *want[6]; /* NULL-ended: every one must be in the message */
    } cases[] = {
        {{"num_kv_heads"},
         {json_integer(4)},
         {"2 tensors do not fit model \"gqa_half\"", "num_kv_heads 4, head_dim 8)",
          T "k_proj.weight\" has shape [16, 64] but needs [32, 64] for role k_weight",
          T "v_proj.weight\" has shape [16, 64] but needs [32, 64] for role v_weight"}},
        {{"head_dim"},
         {json_integer(16)},
         {"4 tensors do not fit", "q_proj.weight\" has shape [64, 64] but needs [128, 64]",
          "k_proj.weight\" has shape [16, 64] but needs [32, 64]",
          "v_proj.weight\" has shape [16, 64] but needs [32, 64]",
          "o_proj.weight\" has shape [64, 64] but needs [64, 128] for role out_weight"}},
        {{"bias"},
         {json_true()},
         {"3 tensors do not fit", T "q_proj.bias\" is missing (role q_bias, layout llama)",
          T "k_proj.bias\" is missing (role k_bias", T "v_proj.bias\" is missing (role v_bias"}},
        {{"prefix"},
         {json_string("model.layers.1.self_attn.")},
         {"4 tensors do not fit",
          "\"model.layers.1.self_attn.q_proj.weight\" is missing (role q_weight, layout llama)",
          "\"model.layers.1.self_attn.o_proj.weight\" is missing (role out_weight"}},
        /* a missing tensor and a wrong shape together */
        {{"num_kv_heads", "tensors"},
         {json_integer(4), json_pack("{s:s}", "q_weight", "q.weight")},
         {"3 tensors do not fit", T "q.weight\" is missing (role q_weight, tensors map)",
          T "k_proj.weight\" has shape [16, 64]", T "v_proj.weight\" has shape [16, 64]"}},
        /* one misfit: one sentence */
        {{"tensors"},
         {json_pack("{s:s}", "out_weight", "k_proj.weight")},
         {"gqa_half.safetensors: tensor " T "k_proj.weight\" has shape [16, 64] but needs "
          "[64, 64] for role out_weight, for model \"gqa_half\" (embed_dim 64,"}},
    };
#undef T
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *entry = json_deep_copy(json_object_get(root, "config"));
        for (int k = 0; k < 2 && cases[i].key[k]; k++)
            json_object_set_new(entry, cases[i].key[k], cases[i].value[k]);
        char *js = json_dumps(entry, JSON_COMPACT);
        snprintf(text, sizeof text, "{\"models\":[%s]}", js);
        free(js);
        json_decref(entry);
        attnd_config c;
        attn_model m;
        ck_assert(attnd_config_defaults(&c) == 0);
        ck_assert_msg(attnd_config_load_mem(&c, text, strlen(text), path, 1, err, sizeof err) == 0,
                      "%s", err);
        err[0] = '\0';
        ck_assert_msg(attnd_model_load(&m, &c.models[0], err, sizeof err) == -1, "case %zu loaded",
                      i);
        for (int k = 0; k < 6 && cases[i].want[k]; k++)
            ck_assert_msg(strstr(err, cases[i].want[k]) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
                          err, cases[i].want[k]);
        ck_assert(m.mem == NULL);
        attnd_config_free(&c);
    }
    json_decref(root);
}
END_TEST

/* The golden files are there: a missing folder must not pass as "no tests". */
START_TEST(test_golden_present) {
    ck_assert_msg(g_ngolden >= 4, "found %d decoder golden files in %s", g_ngolden, golden_dir());
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
    tcase_add_test(ta, test_decoder_vs_ref);
    suite_add_tcase(s, ta);
    TCase *ti = tcase_create("invariance");
    tcase_add_loop_test(ti, test_decoder_batch_invariant, 0, 4);
    tcase_add_loop_test(ti, test_steps_bitwise, 0, 4);
    tcase_add_test(ti, test_steps_in_a_batch);
    tcase_add_loop_test(ti, test_steps_vs_ref, 0, 12);
    tcase_add_test(ti, test_unpacked_refused);
    suite_add_tcase(s, ti);
    TCase *tg = tcase_create("golden");
    tcase_set_timeout(tg, 120);
    tcase_add_test(tg, test_golden_present);
    tcase_add_test(tg, test_weights_refused);
    tcase_add_loop_test(tg, test_golden_file, 0, g_ngolden);
    tcase_add_loop_test(tg, test_steps_replay, 0, g_ngolden);
    tcase_add_test(tg, test_long_cache_replay);
    suite_add_tcase(s, tg);
    return s;
}

int main(void) {
    find_golden();
    return check_run(decoder_suite());
}
