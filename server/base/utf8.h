/* utf8.h - UTF-8 both ways: checking a client's bytes, encoding a code
 * point, and writing any bytes as a JSON string that is always valid
 * (paths and names come from clients). Plain functions on plain buffers.
 */
#ifndef ATTND_UTF8_H
#define ATTND_UTF8_H

#include <stddef.h>

#include "buffer.h"

/* s as a JSON string, quotes included; control characters escaped and
 * bytes that are not UTF-8 written as U+FFFD, so the output is always valid
 * JSON whatever s holds. */
void attnd_sb_json_str(attnd_sbuf *b, const char *s);
/* Length of the valid UTF-8 sequence at s (s < end), or 0. */
size_t attnd_utf8_seq_len(const unsigned char *s, const unsigned char *end);
/* Writes code point cp (at most 0x10ffff, not a surrogate) as UTF-8 at out
 * (room for 4 bytes, no NUL); returns the bytes written, 1 to 4. */
size_t attnd_utf8_put(char *out, unsigned cp);

#endif
