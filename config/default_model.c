/* default_model.c - the embedded default model: weights drawn from a fixed
 * seed the way torch initialises nn.MultiheadAttention, so that a fresh
 * attnd with no files serves something deterministic.
 *
 * The recipe (docs/config.md, "The embedded default model"; tests/gen_weights.py
 * re-implements it for E = kdim = vdim and writes
 * tests/data/weights/default_model.json, which test_safetensors checks):
 *   PRNG    splitmix64 (splitmix.c), state = the seed (ATTND_DEFAULT_SEED for
 *           the default model), one 64-bit draw per float.
 *   uniform u = (x >> 11) * 2^-53 in [0, 1); w = (float)((2u - 1) * bound),
 *           computed in double, rounded once to float.
 *   order   in_proj_weight (3E,E) row-major, then out_proj.weight (E,E);
 *           when kdim or vdim differ from E: q_proj_weight (E,E),
 *           k_proj_weight (E,Kd), v_proj_weight (E,Vd), then out_proj.weight.
 *   bounds  xavier_uniform: sqrt(6 / (fan_in + fan_out)) over each matrix
 *           ((3E,E) packed: sqrt(6 / 4E)); out_proj.weight:
 *           kaiming_uniform(a=sqrt(5)) = 1 / sqrt(E). Biases are zero.
 * It reads no files and does no I/O.
 */
#include <math.h>
#include <stdint.h>

#include "default_model.h"
#include "splitmix.h"

/* Fills w (n floats) with U(-bound, bound) from the generator. */
static void fill_uniform(float *w, size_t n, double bound, uint64_t *state) {
    for (size_t i = 0; i < n; i++) {
        double u = (double)(attnd_splitmix64(state) >> 11) * 0x1.0p-53;
        w[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

int attnd_seeded_model(attn_model *m, const attn_hparams *hp, uint64_t seed, char *err,
                       size_t errlen) {
    if (attn_model_init(m, hp, err, errlen) != 0) return -1;
    size_t E = (size_t)hp->embed_dim, Kd = (size_t)hp->kdim, Vd = (size_t)hp->vdim;
    uint64_t state = seed;
    if (Kd == E && Vd == E) {
        /* q_w, k_w, v_w are contiguous: in_proj_weight (3E,E). */
        fill_uniform(m->q_w, 3 * E * E, sqrt(6.0 / (double)(E + 3 * E)), &state);
    } else {
        fill_uniform(m->q_w, E * E, sqrt(6.0 / (double)(E + E)), &state);
        fill_uniform(m->k_w, E * Kd, sqrt(6.0 / (double)(Kd + E)), &state);
        fill_uniform(m->v_w, E * Vd, sqrt(6.0 / (double)(Vd + E)), &state);
    }
    fill_uniform(m->out_w, E * E, 1.0 / sqrt((double)E), &state);
    /* attn_model_init zeroed the biases, as torch's constant_(0) does. */
    if (attn_model_pack(m, err, errlen) != 0) {
        attn_model_free(m);
        return -1;
    }
    return 0;
}

void attnd_default_hparams(attn_hparams *hp) {
    *hp = (attn_hparams){.embed_dim = ATTND_DEFAULT_E,
                         .num_heads = ATTND_DEFAULT_H,
                         .kdim = ATTND_DEFAULT_E,
                         .vdim = ATTND_DEFAULT_E,
                         .bias = 1,
                         .causal = 0};
}

int attnd_default_model(attn_model *m, char *err, size_t errlen) {
    attn_hparams hp;
    attnd_default_hparams(&hp);
    return attnd_seeded_model(m, &hp, ATTND_DEFAULT_SEED, err, errlen);
}
