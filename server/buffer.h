/* buffer.h - sbuf, the growable byte buffer every writer of the server
 * fills (answers, error bodies, metrics, log lines). A failed allocation
 * sets `oom` and turns every later write into a no-op, so a writer checks
 * once at the end. No HTTP, no threads: one buffer belongs to one writer.
 */
#ifndef ATTND_BUFFER_H
#define ATTND_BUFFER_H

#include <stddef.h>

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

#endif
