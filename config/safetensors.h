/* safetensors.h - the safetensors reader: a file's header parsed and
 * checked (every dtype, shape and offset against the file's real size, no
 * two tensors overlapping), tensors found by name, its "__metadata__" kept,
 * and F32, F16 and BF16 data converted to float. It knows nothing of models or roles
 * (weights.c decides which tensors a model needs).
 */
#ifndef ATTND_CONFIG_SAFETENSORS_H
#define ATTND_CONFIG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

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
    ST_C64,     /* complex: two F32 */
    ST_F8_E8M0, /* the MX formats' shared scales */
    ST_F4,      /* sub-byte, packed: 4 bits */
    ST_F6_E2M3, /* 6 bits */
    ST_F6_E3M2, /* 6 bits */
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

/* One entry of the header's "__metadata__" object. */
typedef struct {
    char *key;   /* owned */
    char *value; /* owned; NULL when the JSON value is not a string (the format wants strings) */
} st_meta;

typedef struct {
    st_tensor *tensors; /* (n), owned, in header order */
    int n;
    st_meta *meta;       /* (n_meta), owned, in header order: "__metadata__", which readers of
                            weights ignore and readers of session state files check */
    int n_meta;          /* entries; -1 when "__metadata__" is there but not an object */
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
void st_header_free(st_header *h);                                /* safe on a zeroed header */
const st_tensor *st_find(const st_header *h, const char *name);   /* NULL when absent */
const st_meta *st_meta_find(const st_header *h, const char *key); /* NULL when absent */
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t b);
/* Converts n little-endian F32, F16 or BF16 values at src to floats. */
void st_to_f32(float *dst, const unsigned char *src, st_dtype d, size_t n);
/* pread()s exactly n bytes at file offset off into dst, retrying short
 * reads and EINTR. Returns 0, or -1 at an error or the end of the file
 * (errno is set by pread at an error, left alone at the end). */
int st_read_full(int fd, void *dst, size_t n, uint64_t off);

#endif
