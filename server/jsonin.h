/* jsonin.h - a small pull reader for request bodies. The request parsers
 * walk the body with it and read tensors straight into float arrays, one
 * pass, no object per number (a 512x1024 tensor is half a million numbers).
 * Strict RFC 8259: UTF-8, no comments, no trailing commas, no NaN.
 * A syntax error leaves a sentence with its byte offset in the reader.
 */
#ifndef ATTND_JSONIN_H
#define ATTND_JSONIN_H

#include <stddef.h>

#define JIN_MAX_DEPTH 64

typedef struct {
    const char *start; /* first byte of the body */
    const char *p;     /* next unread byte */
    const char *end;   /* one past the last byte */
    int depth;         /* containers open while skipping */
    char err[160];     /* the syntax error, when a call returned -1 */
} jin;

void jin_init(jin *j, const char *buf, size_t len);
/* Skips whitespace; returns the next byte, or -1 at the end. */
int jin_peek(jin *j);
/* Consumes c after whitespace, or fails. */
int jin_expect(jin *j, char c);
/* After an element of an array or object: 1 when `close` ended it, 0 after
 * a comma (another element follows), -1 on anything else. */
int jin_next(jin *j, char close);
/* A string, decoded (escapes, \u surrogates) and checked as UTF-8, into a
 * new NUL-terminated buffer the caller frees. Strings holding NUL (\u0000)
 * are refused. */
int jin_string(jin *j, char **out, size_t *len);
/* A string without escapes, as a span of the body (not NUL-terminated, not
 * checked for UTF-8 or control characters: for base64 text, whose decoder
 * refuses anything else). Returns 0, 1 when the string holds escapes (the
 * reader has not moved: read it with jin_string), -1 on error. */
int jin_string_span(jin *j, const char **s, size_t *n);
/* A string into buf (cap bytes with the NUL); longer ones are cut to fit
 * and *cut is set. */
int jin_string_buf(jin *j, char *buf, size_t cap, int *cut);
/* A number. */
int jin_number(jin *j, double *v);
/* A number as the nearest float32 (parse_f32: +-inf past its range). */
int jin_f32(jin *j, float *v);
/* true/false; 0 or -1. */
int jin_bool(jin *j, int *v);
/* null */
int jin_null(jin *j);
/* Skips any value. */
int jin_skip(jin *j);
/* Only whitespace is left. */
int jin_end(jin *j);
/* The kind of the next value, in words, for messages: "a string", "an
 * array", "a number", "an object", "a boolean", "null", "nothing". */
const char *jin_kind(jin *j);
/* Byte offset of the next unread byte. */
size_t jin_offset(const jin *j);

#endif
