/* buffer.c - attnd_sbuf, the growable byte buffer every writer fills (see
 * buffer.h). A failed allocation turns the buffer's later writes into no-ops
 * and is reported once, by attnd_sb_take or the oom flag. */
#include "buffer.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void attnd_sb_init(attnd_sbuf *b) {
    memset(b, 0, sizeof(*b));
}

void attnd_sb_free(attnd_sbuf *b) {
    if (!b) return;
    free(b->p);
    memset(b, 0, sizeof(*b));
}

int attnd_sb_reserve(attnd_sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) goto fail;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) goto fail;
    b->p = p;
    b->cap = cap;
    return 0;
fail:
    b->oom = 1;
    return -1;
}

void attnd_sb_put(attnd_sbuf *b, const void *s, size_t n) {
    if (attnd_sb_reserve(b, n) < 0) return;
    if (n) memcpy(b->p + b->len, s, n); /* nothing to copy: s may be NULL (an empty bytes field) */
    b->len += n;
    b->p[b->len] = '\0';
}

void attnd_sb_puts(attnd_sbuf *b, const char *s) {
    attnd_sb_put(b, s, strlen(s));
}

void attnd_sb_putc(attnd_sbuf *b, char c) {
    if (attnd_sb_reserve(b, 1) < 0) return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

void attnd_sb_printf(attnd_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof(tmp)) {
        attnd_sb_put(b, tmp, (size_t)n);
        return;
    }
    if (attnd_sb_reserve(b, (size_t)n) < 0) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *attnd_sb_take(attnd_sbuf *b, size_t *len) {
    if (b->oom) {
        attnd_sb_free(b);
        return NULL;
    }
    if (!b->p && attnd_sb_reserve(b, 0) < 0) return NULL;
    b->p[b->len] = '\0';
    char *p = b->p;
    if (len) *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}
