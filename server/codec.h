/* codec.h - bytes in and bytes out for the server: a growable text buffer
 * (buffer.c), UTF-8 and JSON string escaping (utf8.c), float32 text both
 * ways, exact and fast (floattext.c: 9 significant digits, the same text as
 * "%.9g", which every float32 parses back from bit for bit; decimals to the
 * nearest float32, as strtof), base64 (base64.c), and the monotonic clock
 * the server times with (clock.c).
 * No HTTP, no threads, no JSON objects: plain functions on plain buffers.
 */
#ifndef ATTND_CODEC_H
#define ATTND_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer. A failed allocation sets `oom` and turns every
 * later write into a no-op, so a writer checks once at the end. */
typedef struct {
    char *p;    /* bytes, NUL-terminated when len < cap; owned */
    size_t len; /* bytes written */
    size_t cap; /* bytes allocated */
    int oom;    /* 1 after an allocation failed */
} sbuf;

void sb_init(sbuf *b);
void sb_free(sbuf *b);                 /* frees p; the buffer is reusable after sb_init */
int sb_reserve(sbuf *b, size_t extra); /* room for extra more bytes; 0 or -1 */
void sb_put(sbuf *b, const void *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_putc(sbuf *b, char c);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (who frees them) and empties b. Returns NULL
 * when b->oom. */
char *sb_take(sbuf *b, size_t *len);

/* s as a JSON string, quotes included; control characters escaped and
 * bytes that are not UTF-8 written as U+FFFD, so the output is always valid
 * JSON whatever s holds (paths and names come from clients). */
void sb_json_str(sbuf *b, const char *s);
/* Length of the valid UTF-8 sequence at s (s < end), or 0. */
size_t utf8_seq_len(const unsigned char *s, const unsigned char *end);

/* Room fmt_f32 needs at dst: the longest text ("-1.23456789e-38") is 15
 * bytes, and it may scribble up to 19 bytes (whole-word copies are faster
 * than exact ones). */
#define F32_TEXT_MAX 24
/* Writes v as "%.9g" would (no NUL) into dst (F32_TEXT_MAX bytes of room);
 * returns the length of the text. A NaN or an infinity, which the server
 * never sends, is written as 0. */
size_t fmt_f32(char *dst, float v);
/* The nine decimal digits of n < 10^9, leading zeros kept, at d (no NUL). */
void fmt_digits9(char *d, uint32_t n);
/* n floats separated by commas, no brackets. */
void sb_floats(sbuf *b, const float *x, size_t n);
/* A row-major tensor of rank 1..4 as nested JSON arrays. */
void sb_tensor_json(sbuf *b, const float *x, int rank, const int *shape);

/* Parses a JSON number (strict grammar) at s[0..n) into *v; returns the
 * bytes consumed, or 0 when s does not start with a number. Exact: the
 * double nearest the decimal (numbers past the double range are +-inf). */
size_t parse_number(const char *s, size_t n, double *v);
/* The same grammar to the float32 nearest the decimal, ties to even: the
 * float strtof gives, for any number of digits and any exponent (+-inf past
 * the float32 range, +-0 below it). */
size_t parse_f32(const char *s, size_t n, float *v);
/* A run of numbers "n1, n2, ..." at s[0..n) (whitespace allowed around
 * them), up to max of them, into out: the tight loop of a tensor's rows.
 * Stops at the first number that is not finite, at anything not a number
 * after a comma, or after max numbers; returns the bytes consumed, which
 * end after the last number read and the whitespace after it (before the
 * comma that follows it, if any), and sets *count. */
size_t parse_f32_row(const char *s, size_t n, float *out, size_t max, size_t *count);

/* Standard base64 with '=' padding. */
void sb_b64(sbuf *b, const void *data, size_t n);
/* The same into dst (room for (n + 2) / 3 * 4 bytes, no NUL); returns the
 * bytes written. Data cut at multiples of 3 bytes encodes to the pieces of
 * the whole's text. */
size_t b64_encode(char *dst, const void *data, size_t n);
/* Upper bound of the bytes n base64 characters decode to. */
size_t b64_decoded_max(size_t n);
/* Decodes s[0..n) (standard alphabet, padding optional) into out (room
 * for cap bytes). With breaks_ok, line breaks (\n, \r\n) anywhere are
 * skipped: wrapped text, as MIME, base64.encodebytes and the base64 tool
 * write it. Returns 0 and sets *outlen, or -1 when s is not base64 or does
 * not fit (b64_explain says which). */
int b64_decode(const char *s, size_t n, void *out, size_t cap, size_t *outlen, int breaks_ok);
/* What is wrong with s[0..n) as base64, in words, with the position of the
 * first bad character ("character 12 is '-': this is URL-safe base64..."). */
void b64_explain(const char *s, size_t n, int breaks_ok, char *buf, size_t cap);

/* Microseconds of CLOCK_MONOTONIC. */
uint64_t mono_us(void);

#endif
