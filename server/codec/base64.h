/* base64.h - standard base64 (RFC 4648 section 4, '=' padding) both ways,
 * for tensor objects in request bodies and base64 answers; text wrapped
 * in lines is read too, and what is wrong with text that is not base64 is
 * said in words. Pure and thread-safe.
 */
#ifndef ATTND_BASE64_H
#define ATTND_BASE64_H

#include <stddef.h>

#include "../base/buffer.h"

/* Standard base64 with '=' padding. */
void attnd_sb_b64(attnd_sbuf *b, const void *data, size_t n);
/* The same into dst (room for (n + 2) / 3 * 4 bytes, no NUL); returns the
 * bytes written. Data cut at multiples of 3 bytes encodes to the pieces of
 * the whole's text. */
size_t attnd_b64_encode(char *dst, const void *data, size_t n);
/* Upper bound of the bytes n base64 characters decode to. */
size_t attnd_b64_decoded_max(size_t n);
/* Decodes s[0..n) (standard alphabet, padding optional) into out (room
 * for cap bytes). With breaks_ok, line breaks (\n, \r\n) anywhere are
 * skipped: wrapped text, as MIME, base64.encodebytes and the base64 tool
 * write it. Returns 0 and sets *outlen, or -1 when s is not base64 or does
 * not fit (attnd_b64_explain says which). */
int attnd_b64_decode(const char *s, size_t n, void *out, size_t cap, size_t *outlen, int breaks_ok);
/* What is wrong with s[0..n) as base64, in words, with the position of the
 * first bad character ("character 12 is '-': this is URL-safe base64..."). */
void attnd_b64_explain(const char *s, size_t n, int breaks_ok, char *buf, size_t cap);

#endif
