/* default_model.h - the embedded default model: its size, its seed, and
 * the seeded weights that any hyper-parameters can be drawn with (the
 * recipe is in default_model.c and docs/config.md).
 */
#ifndef ATTND_CONFIG_DEFAULT_MODEL_H
#define ATTND_CONFIG_DEFAULT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/attn.h"

#define ATTND_DEFAULT_E 512
#define ATTND_DEFAULT_H 8
/* "attnd" in ASCII; the splitmix64 state the default weights start from. */
#define ATTND_DEFAULT_SEED 0x6174746E64ULL

/* E=512, H=8, kdim=vdim=512, bias=1, causal=0. */
void attnd_default_hparams(attn_hparams *hp);

/* Initialises m for hp and draws its weights from seed as documented in
 * default_model.c. Returns 0 or -1 with err set (from attn_model_init). */
int attnd_seeded_model(attn_model *m, const attn_hparams *hp, uint64_t seed, char *err,
                       size_t errlen);

/* The embedded default model: E=512, H=8, weights from ATTND_DEFAULT_SEED,
 * distributed as torch initialises nn.MultiheadAttention. */
int attnd_default_model(attn_model *m, char *err, size_t errlen);

#endif
