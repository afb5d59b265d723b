/* half.h - the element types an answer's tensors may travel in, and
 * float32 to the two 16-bit floats (IEEE binary16 "float16", and
 * "bfloat16": float32's top half), rounded to nearest, ties to even, as
 * numpy's float16 and torch's bfloat16 round: subnormals are kept, what
 * rounds past the largest finite value is infinity, NaN stays NaN. The way
 * back is exact (config/safetensors.h: st_f16_to_f32, st_bf16_to_f32).
 * Plain functions on plain buffers; little-endian bytes, as every tensor
 * attnd writes.
 */
#ifndef ATTND_HALF_H
#define ATTND_HALF_H

#include <stddef.h>
#include <stdint.h>

/* An answer tensor's elements in memory are float (the first three) or
 * int32_t; on the wire (base64, binary) each takes attnd_elem_size bytes. */
typedef enum { ATTND_ELEM_F32 = 0, ATTND_ELEM_F16, ATTND_ELEM_BF16, ATTND_ELEM_I32 } attnd_elem;

size_t attnd_elem_size(attnd_elem e); /* 4, 2, 2, 4 */

uint16_t attnd_f16_of(float x); /* binary16 bits of x, rounded to nearest even */
/* bfloat16 bits of x, rounded to nearest even; a subnormal x keeps its
 * subnormal bf16 (the core's attn_bf16_of_ftz flushes it to zero). */
uint16_t attnd_bf16_of_keep(float x);
/* x rounded to e's precision, as a float (F32 and I32: x itself). */
float attnd_elem_round(float x, attnd_elem e);
/* dst (n elements of e, attnd_elem_size(e) bytes each) = src (n floats)
 * rounded to e (F32: copied; I32: not a float type, copied as it is). */
void attnd_elems_of(void *dst, const float *src, size_t n, attnd_elem e);

#endif
