/* buffer.h - attnd_sbuf, the growable byte buffer every writer of the server
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
} attnd_sbuf;

void attnd_sb_init(attnd_sbuf *b);
void attnd_sb_free(attnd_sbuf *b); /* frees p; the buffer is reusable after attnd_sb_init */
int attnd_sb_reserve(attnd_sbuf *b, size_t extra); /* room for extra more bytes; 0 or -1 */
void attnd_sb_put(attnd_sbuf *b, const void *s, size_t n);
void attnd_sb_puts(attnd_sbuf *b, const char *s);
void attnd_sb_putc(attnd_sbuf *b, char c);
void attnd_sb_printf(attnd_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (who frees them) and empties b. Returns NULL
 * when b->oom. */
char *attnd_sb_take(attnd_sbuf *b, size_t *len);

#endif
