/* state.h - a KV-cache session's state as a file that can move between
 * replicas and survive a restart (SPEC section 11): a safetensors file of
 * the session's cached keys, values and positions, with the model's name,
 * a fingerprint of its weights, the length and the precision in its
 * "__metadata__".
 *
 * Pure functions over plain arrays: no session table, no HTTP, no files.
 * The writer turns a cache into bytes; the reader checks bytes (through
 * config/safetensors.c's header parser) and gives a cache back, refusing
 * with one sentence whatever is wrong. Whether the model and fingerprint
 * are the ones a replica serves is the caller's question.
 */
#ifndef ATTND_SESSION_STATE_H
#define ATTND_SESSION_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "../../core/attn.h"
#include "../base/buffer.h"

/* The file (docs/api.md, "Session state files"):
 *   keys      (len, G, D)  F32, or BF16 with precision "bf16" (and "int8" of a
 *                          model that keeps its cache in bf16: keys as the cache holds them)
 *   values    (len, G, D)  same dtype
 *   positions (len)        I32, token t's rotary position: t
 *   __metadata__ {"format": "attnd-session-state", "format_version": "1",
 *                 "model": name, "fingerprint": "fnv1a64:<16 hex>",
 *                 "length": "<len>", "precision": "fp32" | "bf16" | "int8"}
 * The session's own cache holds row t as token t's key (G, D) then its
 * value (G, D): the codec splits rows into the two tensors and joins them
 * back, bit for bit.
 */
#define ATTND_STATE_FORMAT "attnd-session-state"
#define ATTND_STATE_VERSION "1"
/* "fnv1a64:" and 16 lowercase hex digits */
#define ATTND_FINGERPRINT_LEN 24
#define ATTND_STATE_MAX_HEADS 65536 /* G and D, each: the config's bounds */

typedef enum {
    ATTND_STATE_FP32 = 0, /* the cache is float (F32 in the file) */
    ATTND_STATE_BF16 = 1  /* the cache is bf16 bits, uint16_t (BF16 in the file) */
} attnd_state_precision;

/* What the writer is given and what the reader gives back. */
typedef struct {
    char *model;                     /* the model's name (reader: owned) */
    char *fingerprint;               /* attnd_weights_fingerprint's string (reader: owned) */
    attnd_state_precision precision; /* the cache's: what keys and values are stored as */
    int int8;           /* 1: the model computes in int8, and the file says "precision": "int8" (its
                           cache, as the model keeps it, in BF16 or F32 by precision) */
    int len;            /* cached tokens, >= 0 */
    int G, D;           /* key/value heads and head width, 1..ATTND_STATE_MAX_HEADS */
    void *kv;           /* (len, 2*G*D): row t = key (G,D) then value (G,D); float for
                           FP32, uint16_t bf16 bits for BF16 (reader: owned, NULL when
                           len == 0) */
    int32_t *positions; /* (len) (reader: owned; writer: NULL writes 0..len-1) */
} attnd_state;

/* What a reader accepts at most. */
typedef struct {
    size_t max_bytes; /* the whole file */
    int max_tokens;   /* len */
} attnd_state_limits;

/* Appends the file for st to out (check out->oom at the end). Refuses (-1,
 * a sentence in err, nothing appended) a name that is not 1 to 63 bytes of
 * UTF-8, a fingerprint that is empty or over 128 bytes, len < 0, or G or D
 * out of range. Writes what it is given: the reader checks positions and
 * values. */
int attnd_state_write(attnd_sbuf *out, const attnd_state *st, char *err, size_t errlen);

/* Reads a file of n bytes into *st (zeroed first). Refuses, naming what is
 * wrong: past lim (bytes or tokens), a header that lies about its length,
 * JSON that is not a safetensors header, offsets out of range, reversed,
 * overlapping or leaving bytes unused, tensors missing or unknown, dtypes
 * other than the precision's, shapes that disagree with each other or with
 * "length", metadata missing, not strings, or of another format or
 * version, positions other than 0..len-1 (a session's tokens sit at the
 * positions of their index; a restored session continues at len), and NaN
 * or Inf in the keys or values. On failure *st holds nothing to free. */
int attnd_state_read(const unsigned char *bytes, size_t n, const attnd_state_limits *lim,
                     attnd_state *st, char *err, size_t errlen);

/* Frees what attnd_state_read gave; safe on a zeroed state. */
void attnd_state_free(attnd_state *st);

/* The weights' fingerprint, "fnv1a64:" and 16 lowercase hex digits: 64-bit
 * FNV-1a over the hyper-parameters that shape the cache and the answers
 * (each as 8 little-endian bytes: attn_hparams' integers in their order,
 * `causal` left out as a request default, then its reals, the bits of each
 * double) and then every weight byte the model computes with: as loaded
 * (attn_model.mem), and for a model packed in bf16 its biases then its
 * bf16 matrices (attn_model_weight_blocks).
 * FNV-1a needs no library; it tells one model from another, not one from
 * a forgery (a state file is its caller's own data anyway). Computed once
 * per model at load (its cost: docs/performance.md, "Weights are
 * constants"). */
void attnd_weights_fingerprint(const attn_model *m, char out[ATTND_FINGERPRINT_LEN + 1]);

#endif
