/* test_rand.h - random inputs and models for the Check suites, drawn from
 * one 64-bit linear congruential stream (Knuth's MMIX constants):
 *   frand        uniform in [-1, 1), from the state's top 24 bits
 *   urand        uniform in [0, 1), the same draw
 *   rand_u32     the state's high 32 bits; rand_int(lo, hi) uniform in [lo, hi]
 *   RAND_UNIT    sqrt(3): frand() * RAND_UNIT has variance 1
 *   rand_floats  n draws frand() * scale, in a new buffer
 *   rand_bools   n bytes, each 1 when its draw frand() > above (a mask)
 *   rand_model   attn_model_init, every float of the model's mem drawn in
 *                mem's order (attn.h: q_w | k_w | v_w | q_b | k_b | v_b |
 *                out_w | out_b), then attn_model_pack; rand_model_biases
 *                draws the biases at a scale of their own (0: zeros)
 *   xcalloc      calloc that fails the test when memory runs out.
 * Each test binary has its own stream, seeded with TEST_RAND_SEED (0 unless
 * defined before this header); a suite reseeds it by setting g_rng.
 * test_fp32_bits pins the bits of forwards on these inputs and models: a
 * change to frand, rand_floats, rand_bools or rand_model's order changes its
 * hashes. */
#ifndef ATTND_TESTS_TEST_RAND_H
#define ATTND_TESTS_TEST_RAND_H

#include "../core/attn.h"
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0
#endif

#define RAND_UNIT 1.7320508f /* sqrt(3) */

static uint64_t g_rng = TEST_RAND_SEED;

static inline uint64_t rand_next(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return g_rng;
}

static inline float frand(void) { /* uniform in [-1, 1) */
    return (float)((rand_next() >> 40) / 8388608.0) - 1.0f;
}

static inline float urand(void) { /* uniform in [0, 1): exact from frand */
    return (frand() + 1.0f) * 0.5f;
}

static inline uint32_t rand_u32(void) {
    return (uint32_t)(rand_next() >> 32);
}

static inline int rand_int(int lo, int hi) { /* uniform in [lo, hi] */
    return lo + (int)(rand_u32() % (uint32_t)(hi - lo + 1));
}

static inline void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

static inline float *rand_floats(size_t n, float scale) {
    float *p = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static inline uint8_t *rand_bools(size_t n, float above) {
    uint8_t *p = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() > above;
    return p;
}

/* Initialises m for hp (kdim and vdim 0: embed_dim), draws every float of
 * mem in mem's order, frand() * scale for the weight matrices and
 * frand() * bias_scale for the biases, and packs m. The biases are drawn
 * whatever hp->bias and bias_scale (bias_scale 0 leaves them zero), so the
 * draws that follow a model depend on its shape alone. The core applies
 * mem's biases whatever hp->bias says: a suite that wants the zeros attn.h
 * asks of a model without biases passes bias_scale 0. */
static inline void rand_model_biases(attn_model *m, const attn_hparams *hp, float scale,
                                     float bias_scale) {
    attn_hparams h = *hp;
    if (!h.kdim) h.kdim = h.embed_dim;
    if (!h.vdim) h.vdim = h.embed_dim;
    char err[256] = "";
    ck_assert_msg(attn_model_init(m, &h, err, sizeof err) == 0, "%s", err);
    for (float *p = m->mem; p < m->mem + m->n_floats; p++) {
        int bias = (p >= m->q_b && p < m->out_w) || p >= m->out_b;
        float d = frand();
        *p = !bias ? d * scale : bias_scale != 0 ? d * bias_scale : 0.0f;
    }
    ck_assert_msg(attn_model_pack(m, err, sizeof err) == 0, "%s", err);
}

/* rand_model_biases with the biases at the weights' scale. */
static inline void rand_model(attn_model *m, const attn_hparams *hp, float scale) {
    rand_model_biases(m, hp, scale, scale);
}

#endif
