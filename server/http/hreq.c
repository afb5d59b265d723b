/* hreq.c - the helpers on one HTTP request (hreq.h) that the access
 * handler (glue.c) and the route handlers (handlers.c) share: a request
 * header's value, a header's decimal size, and letting its body go. They
 * sit below both, so that neither calls back into the other.
 */
#include "hreq.h"

#include <microhttpd.h>
#include <stdatomic.h>

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

const char *attnd_http_header(const hreq *h, const char *name) {
    return MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, name);
}
