/* config_internal.h - what the files of config/ share with each other and with their
 * tests and fuzz targets: the seeded weight generator, the safetensors
 * reader and the loaders that work from memory. The server needs only
 * config.h.
 */
#ifndef ATTND_CONFIG_INTERNAL_H
#define ATTND_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config.h"
#include "refuse.h"

/* ---- the embedded default model (default_model.c) ---- */

#define ATTND_DEFAULT_E 512
#define ATTND_DEFAULT_H 8
/* "attnd" in ASCII; the splitmix64 state the default weights start from. */
#define ATTND_DEFAULT_SEED 0x6174746E64ULL

/* One splitmix64 step: advances *state, returns the next 64 random bits. */
uint64_t attnd_splitmix64(uint64_t *state);
/* E=512, H=8, kdim=vdim=512, bias=1, causal=0. */
void attnd_default_hparams(attn_hparams *hp);
/* Initialises m for hp and draws its weights from seed as documented in
 * default_model.c. Returns 0 or -1 with err set (from attn_model_init). */
int attnd_seeded_model(attn_model *m, const attn_hparams *hp, uint64_t seed, char *err,
                       size_t errlen);

/* ---- the safetensors reader (safetensors.c) ---- */

#define ST_MAX_DIMS 8
/* The largest JSON header accepted, bytes (the format's own limit). */
#define ST_MAX_HEADER 100000000ULL

/* Every dtype the format defines; only F32, F16 and BF16 can be loaded as
 * weights, the rest are known so that their offsets can be checked. */
typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_DTYPE_COUNT
} st_dtype;

typedef struct {
    char *name; /* owned */
    st_dtype dtype;
    int ndim; /* 0 (a scalar) .. ST_MAX_DIMS */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;      /* product of shape, checked for overflow */
    uint64_t begin, end; /* data_offsets, bytes from the start of the data */
} st_tensor;

typedef struct {
    st_tensor *tensors; /* (n), owned, in header order */
    int n;
    uint64_t data_start; /* 8 + header length: file offset of the data */
    uint64_t file_size;  /* bytes */
} st_header;

/* Parses a safetensors header from the first len bytes of a file of
 * file_size bytes (len >= 8 + header length, or the whole file). Checks
 * the header length, the JSON, every dtype and shape, and every offset
 * against the file's size, and that no two tensors overlap. `file` only
 * names the file in err. On failure h holds nothing to free. */
int st_header_parse(st_header *h, const unsigned char *buf, size_t len, uint64_t file_size,
                    const char *file, char *err, size_t errlen);
/* Reads and parses the header of an open file. */
int st_header_read(st_header *h, int fd, const char *file, char *err, size_t errlen);
void st_header_free(st_header *h);                              /* safe on a zeroed header */
const st_tensor *st_find(const st_header *h, const char *name); /* NULL when absent */
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t b);
/* Converts n little-endian F32, F16 or BF16 values at src to floats. */
void st_to_f32(float *dst, const unsigned char *src, st_dtype d, size_t n);

/* ---- the model loader (weights.c) ---- */

/* attnd_model_load over a whole safetensors file held in memory; `file`
 * only names it in messages. */
int attnd_model_load_mem(attn_model *m, const attnd_model_config *mc, const void *buf, size_t len,
                         const char *file, char *err, size_t errlen);
/* The role names used in the "tensors" map ("q_weight", ...). */
const char *attnd_role_name(attnd_role r);
/* Index of a layout name, or -1. */
int attnd_layout_index(const char *name);

/* ---- the config parser (config.c) ---- */

/* Parses config JSON held in memory as if read from `file` (whose folder
 * resolves weight paths); check_files = 0 skips the weights-exist check
 * (fuzzing). Same contract as attnd_config_load_file. */
int attnd_config_load_mem(attnd_config *c, const char *text, size_t len, const char *file,
                          int check_files, char *err, size_t errlen);

/* ---- the decoder options of a model (decoder.c) ---- */

/* Reads the "rope" object at `path` into mc->hp.rope (dim -1 until
 * attnd_model_check sets it to the head width). */
int attnd_rope_parse(attnd_model_config *mc, json_t *obj, const char *src, const char *path,
                     char *err, size_t errlen);
/* After every key of models[idx] is read: settles the defaults that depend
 * on other keys (kdim, vdim, bias and causal by layout, rope.dim) and
 * refuses every bad combination, naming the key and the reason. */
int attnd_model_check(attnd_model_config *mc, int idx, const char *src, char *err,
                      size_t errlen);

#endif
