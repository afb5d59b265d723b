/* hreq.c - the helpers on one HTTP request (hreq.h) that the access
 * handler (glue.c) and the route handlers (handlers.c) share: a request
 * header's value (trimmed), a header's decimal size, and letting its body go. They
 * sit below both, so that neither calls back into the other.
 */
#include "hreq.h"

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/sizes.h"

void attnd_http_drop_body(hreq *h) {
    atomic_fetch_sub(&h->srv->buffered, h->in_held);
    h->in_held = 0;
    attnd_sb_free(&h->in);
}

int attnd_http_size(const char *s, uint64_t limit, uint64_t *v) {
    uint64_t r = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (sz_mul(r, 10, limit, &r) < 0 || sz_add(r, (uint64_t)(*s - '0'), limit, &r) < 0)
            return -1;
    }
    *v = r;
    return 0;
}

/* A trimmed copy of a header value, in the request's list. */
struct hvalue {
    struct hvalue *next;
    char s[];
};

const char *attnd_http_header(hreq *h, const char *name) {
    const char *v = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, name);
    size_t n = v ? strlen(v) : 0;
    if (!n || (v[n - 1] != ' ' && v[n - 1] != '\t')) return v;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    struct hvalue *c = malloc(sizeof *c + n + 1);
    if (!c) return v; /* out of memory: as sent */
    memcpy(c->s, v, n);
    c->s[n] = '\0';
    c->next = h->values;
    h->values = c;
    return c->s;
}

void attnd_http_free_values(hreq *h) {
    while (h->values) {
        struct hvalue *next = h->values->next;
        free(h->values);
        h->values = next;
    }
}
