/* weights.h - a model as the config describes it (attnd_model_config), and
 * loading its weights into an attn_model: from a safetensors file, by
 * layout, "tensors" map and prefix, or from the embedded default seed when
 * it names no file. Errors name the file and the tensor.
 * It reads weights files; it never parses the config file (read.c fills
 * attnd_model_config by the rows of keys.c, decoder.c checks its decoder
 * options).
 */
#ifndef ATTND_CONFIG_WEIGHTS_H
#define ATTND_CONFIG_WEIGHTS_H

#include <stddef.h>

#include "../core/attn.h"
#include "enums.h"

/* The eight weight roles a model's tensors fill: weight and bias alternate,
 * q, k, v, then out (weights.c relies on that order). */
typedef enum {
    ROLE_Q_WEIGHT,
    ROLE_Q_BIAS,
    ROLE_K_WEIGHT,
    ROLE_K_BIAS,
    ROLE_V_WEIGHT,
    ROLE_V_BIAS,
    ROLE_OUT_WEIGHT,
    ROLE_OUT_BIAS,
    ROLE_COUNT
} attnd_role;

#define ATTND_NAME_MAX 64

typedef struct {
    char name[ATTND_NAME_MAX]; /* [A-Za-z0-9._-]+, unique; "default" when no config */
    attn_hparams hp;           /* embed_dim, num_heads, kdim, vdim, bias, causal, and the
                                  decoder options num_kv_heads, head_dim, scale, rope */
    char *weights;             /* absolute or cwd-relative path after resolution against
                                  the config's folder; NULL = embedded default weights */
    char *prefix;              /* prepended to every tensor name; "" by default */
    char *layout;              /* a word of attnd_layouts (enums.h); "torch" by default */
    char *precision;           /* a word of attnd_precisions (enums.h), "fp32" by default;
                                  attnd_model_check sets hp.precision from it */
    char *tensors[ROLE_COUNT]; /* explicit names from the "tensors" map (before prefix), or NULL */
    int max_positions;         /* rotary positions must stay below it; 0 = no limit */
} attnd_model_config;

/* Loads one model's weights: safetensors per mc (checking every offset,
 * dtype and shape), or the embedded default weights when mc->weights is
 * NULL. m is initialised here. Errors name the file and the tensor. */
int attnd_model_load(attn_model *m, const attnd_model_config *mc, char *err, size_t errlen);

/* attnd_model_load over a whole safetensors file held in memory; `file`
 * only names it in messages. */
int attnd_model_load_mem(attn_model *m, const attnd_model_config *mc, const void *buf, size_t len,
                         const char *file, char *err, size_t errlen);

/* The role names of the "tensors" map ("q_weight", ...) <-> attnd_role. */
extern const attnd_enum attnd_roles;
/* A role's name; "?" out of range. */
const char *attnd_role_name(attnd_role r);

#endif
