/* decoder.h - the decoder options of a model in the config file: the
 * "rope" object, and the checks (and layout-dependent defaults) that run
 * once every key of a model is read. read.c calls both for each model.
 */
#ifndef ATTND_CONFIG_DECODER_H
#define ATTND_CONFIG_DECODER_H

#include <stddef.h>

#include <jansson.h>

#include "weights.h"

/* Reads the "rope" object at `path` into mc->hp.rope (dim -1 until
 * attnd_model_check sets it to the head width); null is no rope, as if the
 * key were left out. src names the file. */
int attnd_rope_parse(attnd_model_config *mc, json_t *obj, const char *src, const char *path,
                     char *err, size_t errlen);

/* After every key of a model is read: settles the defaults that depend
 * on other keys (kdim, vdim, bias and causal by layout, rope.dim) and
 * refuses every bad combination, naming the key (under at: "models[3]."
 * in the file, "" for an entry on its own) and the reason. */
int attnd_model_check(attnd_model_config *mc, const char *at, const char *src, char *err,
                      size_t errlen);

#endif
