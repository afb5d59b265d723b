/* floattext.h - float32 as decimal text both ways, exact and fast:
 * printing gives 9 significant digits, the text of "%.9g", which every
 * float32 parses back from bit for bit; reading gives the float32 nearest
 * the decimal, as strtof does (floattext.c says how both stay fast).
 * Plain functions on plain buffers.
 */
#ifndef ATTND_FLOATTEXT_H
#define ATTND_FLOATTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "../base/buffer.h"

/* Room attnd_fmt_f32 needs at dst: the longest text ("-1.23456789e-38") is 15
 * bytes, and it may scribble up to 19 bytes (whole-word copies are faster
 * than exact ones). */
#define F32_TEXT_MAX 24
/* Writes v as "%.9g" would (no NUL) into dst (F32_TEXT_MAX bytes of room);
 * returns the length of the text. A NaN or an infinity, which the server
 * never sends, is written as 0. */
size_t attnd_fmt_f32(char *dst, float v);
/* The nine decimal digits of n < 10^9, leading zeros kept, at d (no NUL). */
void attnd_fmt_digits9(char *d, uint32_t n);
/* n floats separated by commas, no brackets. */
void attnd_sb_floats(attnd_sbuf *b, const float *x, size_t n);
/* A row-major tensor of rank 1..4 as nested JSON arrays. */
void attnd_sb_tensor_json(attnd_sbuf *b, const float *x, int rank, const int *shape);

/* Parses a JSON number (strict grammar) at s[0..n) into *v; returns the
 * bytes consumed, or 0 when s does not start with a number. Exact: the
 * double nearest the decimal (numbers past the double range are +-inf). */
size_t attnd_parse_number(const char *s, size_t n, double *v);
/* The same grammar to the float32 nearest the decimal, ties to even: the
 * float strtof gives, for any number of digits and any exponent (+-inf past
 * the float32 range, +-0 below it). */
size_t attnd_parse_f32(const char *s, size_t n, float *v);
/* A run of numbers "n1, n2, ..." at s[0..n) (whitespace allowed around
 * them), up to max of them, into out: the tight loop of a tensor's rows.
 * Stops at the first number that is not finite, at anything not a number
 * after a comma, or after max numbers; returns the bytes consumed, which
 * end after the last number read and the whitespace after it (before the
 * comma that follows it, if any), and sets *count. */
size_t attnd_parse_f32_row(const char *s, size_t n, float *out, size_t max, size_t *count);

#endif
