/* fuzz_routes.c - libFuzzer target: the route table and the header
 * handling of the HTTP side, in process. The bytes are lines: method, URL
 * (percent-escaped, as it arrives), Inference-Header-Content-Length,
 * X-Request-Id, Authorization, Content-Length, Origin (a missing line is an
 * absent header). They go the daemon's way: the URL through its unescape
 * callback, then the route matcher (server/http/routes.c); the headers
 * through the same helpers the request handler calls (the size reader, the
 * request id maker of server/http/send.c, the key check), and the whole
 * first look at a request (examine: route, method, CORS origin, starting,
 * API key, draining, declared body size against max_body_bytes and the
 * body budget) on four servers (a key and one CORS origin; no key and "*";
 * draining; starting), which is why this file includes server/http/glue.c
 * whole. examine reads its headers through MHD_lookup_connection_value and
 * MHD_get_connection_values, which this file defines: the executable's
 * definitions come before the library's, so no connection is needed.
 * Header values are read without the blanks that end them. Each answer is held to an independent
 * statement of what it should be: a matched route's pattern with its captures put back is the path;
 * a size is digits only and within its limit; a client's request id is kept when it is 1 to 64 of
 * [A-Za-z0-9._:-] and replaced by 16 hex digits otherwise; the API key matches only "Bearer <key>";
 * examine refuses with the first of 404, 405, 503 while starting (but the health routes), 401, 503
 * while draining, then a Content-Length that is not digits (400), past max_body_bytes (413) or past
 * the body budget (429), the last three at once, and reserves at most 64 KiB for a body it has not
 * seen. make fuzz-smoke; make fuzz-long
 */
#include "../../server/http/glue.c"

#include <errno.h>

#include "fuzz_check.h"

/* The next line of the input as a NUL-terminated string (NUL bytes in it
 * cut it short, as they would a C header value), or NULL past the end. */
static const char *next_line(const char **p, const char *end, char *buf, size_t cap) {
    if (*p >= end) return NULL;
    size_t n = 0;
    while (*p < end && **p != '\n') {
        if (n < cap - 1) buf[n++] = **p;
        (*p)++;
    }
    if (*p < end) (*p)++;
    buf[n] = '\0';
    return buf;
}

/* The pattern with its captures put back. */
static void fill(const char *pat, const attnd_route_match *m, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = pat; *p && n < cap - 1;) {
        const char *cap_s = NULL;
        if (strncmp(p, "{name}", 6) == 0)
            cap_s = m->name, p += 6;
        else if (strncmp(p, "{version}", 9) == 0)
            cap_s = m->version, p += 9;
        if (cap_s) {
            for (; *cap_s && n < cap - 1; cap_s++)
                out[n++] = *cap_s;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
}

static void check_route(const char *method, const char *path) {
    for (int options = 0; options < 2; options++) {
        attnd_route_match m;
        int st = attnd_route_find(method, path, options, &m);
        FUZZ_CHECK(st == m.status && (st == 0 || st == 404 || st == 405));
        FUZZ_CHECK((st == 404) == (m.path == NULL));
        FUZZ_CHECK((st == 0) == (m.route != NULL));
        FUZZ_CHECK(memchr(m.name, 0, sizeof(m.name)) && memchr(m.version, 0, sizeof(m.version)));
        if (!m.path) continue;
        char back[512];
        fill(m.path->pattern, &m, back, sizeof(back));
        FUZZ_CHECK(strcmp(back, path) == 0);
        FUZZ_CHECK(!strchr(m.name, '/') && !strchr(m.version, '/'));
        FUZZ_CHECK(strstr(m.path->pattern, "{name}") ? m.name[0] != '\0' : m.name[0] == '\0');
        int same = strcmp(method, m.path->method) == 0 ||
                   (strcmp(method, "HEAD") == 0 && strcmp(m.path->method, "GET") == 0);
        int preflight = !same && options && strcmp(method, "OPTIONS") == 0;
        FUZZ_CHECK((st == 0) == (same || preflight));
        /* the path's own row answers, or the preflight row does */
        if (st == 0) FUZZ_CHECK(m.route == (preflight ? &attnd_routes[R_PREFLIGHT] : m.path));
    }
}

static void check_size(const char *s) {
    static const uint64_t limits[] = {0, 1, 255, 65536, UINT64_MAX};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        uint64_t v = 12345;
        int rc = attnd_http_size(s, limits[i], &v);
        int digits = s[0] != '\0' && strspn(s, "0123456789") == strlen(s);
        errno = 0;
        unsigned long long ref = digits ? strtoull(s, NULL, 10) : 0;
        int fits = digits && errno != ERANGE && ref <= limits[i];
        FUZZ_CHECK((rc == 0) == fits);
        FUZZ_CHECK(rc == 0 ? v == ref : v == 12345);
    }
}

static void check_id(const char *s) {
    size_t n = strlen(s);
    int want = n >= 1 && n <= 128; /* visible ASCII but the quote and the backslash */
    for (size_t i = 0; i < n && want; i++)
        want = s[i] > ' ' && s[i] < 0x7f && s[i] != '"' && s[i] != '\\';
    char id[ATTND_REQUEST_ID_MAX];
    FUZZ_CHECK(attnd_http_request_id(s, id) == want);
    if (want)
        FUZZ_CHECK(strcmp(id, s) == 0);
    else
        FUZZ_CHECK(strlen(id) == 16 && strspn(id, "0123456789abcdef") == 16);
}

static void check_key(const char *hdr) {
    attnd_http s;
    memset(&s, 0, sizeof(s));
    s.api_key = "k3y";
    s.api_key_len = 3;
    int want = 0;
    if (hdr && strncasecmp(hdr, "Bearer ", 7) == 0) {
        const char *t = hdr + 7 + strspn(hdr + 7, " ");
        want = strcmp(t, "k3y") == 0;
    }
    FUZZ_CHECK(key_ok(&s, hdr) == want);
}

/* ---- examine, without a connection ---- */

/* The header values of the request examine looks at (NULL: absent). */
typedef struct {
    const char *content_length, *origin, *authorization;
} fake_headers;

/* examine's connection is a fake_headers; see the file's header. */
const char *MHD_lookup_connection_value(struct MHD_Connection *connection, enum MHD_ValueKind kind,
                                        const char *key) {
    const fake_headers *f = (const fake_headers *)connection;
    if (kind != MHD_HEADER_KIND || !f) return NULL;
    if (strcasecmp(key, "Content-Length") == 0) return f->content_length;
    if (strcasecmp(key, "Origin") == 0) return f->origin;
    if (strcasecmp(key, "Authorization") == 0) return f->authorization;
    return NULL;
}

int MHD_get_connection_values(struct MHD_Connection *connection, enum MHD_ValueKind kind,
                              MHD_KeyValueIterator iterator, void *iterator_cls) {
    const fake_headers *f = (const fake_headers *)connection;
    const char *keys[] = {"Content-Length", "Origin", "Authorization"};
    const char *values[] = {f->content_length, f->origin, f->authorization};
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (kind == MHD_HEADER_KIND && values[i]) {
            n++;
            if (iterator && iterator(iterator_cls, kind, keys[i], values[i]) != MHD_YES) break;
        }
    return n;
}

/* v without the spaces and tabs that end it, in buf (NULL stays NULL). */
static const char *trimmed(const char *v, char *buf, size_t cap) {
    if (!v) return NULL;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    snprintf(buf, cap, "%.*s", (int)n, v);
    return buf;
}

enum { MAX_BODY = 1 << 20, BUDGET = 3 << 19 };

/* What examine must decide: the refusal's kind and whether it goes out at
 * once. */
static attnd_kind expected(const attnd_http *s, const char *method, const char *path,
                           const fake_headers *f, long long buffered, int *now) {
    attnd_route_match m;
    int st = attnd_route_find(method, path, s->cfg->n_cors_origins > 0, &m);
    *now = 0;
    if (st == 404) return AERR_NOT_FOUND;
    if (st == 405) return AERR_METHOD;
    if (strcmp(method, "OPTIONS") == 0) return AOK;
    if (atomic_load(&s->state) == S_STARTING && strcmp(path, "/health") != 0 &&
        strcmp(path, "/v2/health/live") != 0 && strcmp(path, "/v2/health/ready") != 0)
        return AERR_UNAVAILABLE;
    char ab[256], cb[64];
    int key = 1;
    if (s->api_key) {
        const char *a = trimmed(f->authorization, ab, sizeof ab);
        key = a && strncasecmp(a, "Bearer ", 7) == 0 &&
              strcmp(a + 7 + strspn(a + 7, " "), s->api_key) == 0;
    }
    int open = strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0 ||
               strncmp(path, "/v2/health/", 11) == 0 || strcmp(path, "/ui") == 0 ||
               strncmp(path, "/ui/", 4) == 0; /* the viewer's page and files */
    if (!open && !key) return AERR_UNAUTHORIZED;
    int compute = strcmp(m.path->method, "POST") == 0; /* every POST route computes */
    if (compute && atomic_load(&s->state) != S_READY) return AERR_UNAVAILABLE;
    const char *cl = trimmed(f->content_length, cb, sizeof cb);
    if (!cl) return AOK;
    *now = 1;
    if (!cl[0] || strspn(cl, "0123456789") != strlen(cl)) return AERR_BAD_REQUEST;
    errno = 0;
    unsigned long long n = strtoull(cl, NULL, 10);
    if (errno == ERANGE || n > (unsigned long long)MAX_BODY) return AERR_TOO_LARGE;
    if (compute && (long long)n > BUDGET - buffered) return AERR_QUEUE_FULL;
    *now = 0;
    return AOK;
}

static void check_examine(attnd_http *s, const char *method, const char *url, const char *path,
                          const fake_headers *f, long long buffered) {
    hreq *h = calloc(1, sizeof(*h));
    FUZZ_CHECK(h != NULL);
    h->srv = s;
    h->conn = (struct MHD_Connection *)f;
    snprintf(h->method, sizeof(h->method), "%s", method);
    snprintf(h->path, sizeof(h->path), "%s", url);
    atomic_store(&s->buffered, buffered);
    examine(h, path);
    int now;
    attnd_kind want = expected(s, method, path, f, buffered, &now);
    if (h->err.code != want)
        fprintf(stderr, "%s %s: examine said %d (%s), expected %d\n", method, path, h->err.code,
                h->err.msg, want);
    FUZZ_CHECK(h->err.code == want);
    FUZZ_CHECK(h->refuse_now == now);
    FUZZ_CHECK((h->err.code == AOK) == (h->err.msg[0] == '\0'));
    FUZZ_CHECK(memchr(h->err.msg, '\0', sizeof(h->err.msg)) != NULL);
    FUZZ_CHECK(h->in.cap <= BODY_RESERVE_MAX);
    /* the origin echoed, without its trailing blanks: only one configured
     * (or any, with "*") */
    char ob[128];
    const char *o = trimmed(f->origin, ob, sizeof ob);
    int allowed = 0;
    for (int i = 0; o && i < s->cfg->n_cors_origins; i++)
        allowed |=
            strcmp(s->cfg->cors_origins[i], "*") == 0 || strcmp(s->cfg->cors_origins[i], o) == 0;
    FUZZ_CHECK(allowed ? h->origin && strcmp(h->origin, o) == 0 : h->origin == NULL);
    FUZZ_CHECK(atomic_load(&s->buffered) == buffered); /* examine holds no body bytes */
    attnd_sb_free(&h->in);
    attnd_http_free_values(h);
    free(h);
}

/* Four servers: a key and one origin; no key and any origin; draining;
 * starting (a key and one origin). */
static void examine_all(const char *method, const char *url, const char *path,
                        const fake_headers *f, long long buffered) {
    static char *one[] = {"http://app.example"}, *any[] = {"*"};
    attnd_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_body_bytes = MAX_BODY;
    cfg.max_buffered_body_bytes = BUDGET;
    cfg.max_queue_requests = 1;
    static attnd_models *none; /* no model: no queue is looked at */
    if (!none) FUZZ_CHECK((none = attnd_models_new(0)) != NULL);
    attnd_parse_env env = {.models = none};
    attnd_http s;
    for (int v = 0; v < 4; v++) {
        memset(&s, 0, sizeof(s));
        s.cfg = &cfg;
        s.env = &env;
        cfg.cors_origins = v == 0 || v == 3 ? one : any;
        cfg.n_cors_origins = v == 2 ? 0 : 1;
        if (v != 1) {
            s.api_key = "k3y";
            s.api_key_len = 3;
        }
        atomic_init(&s.state, v == 2 ? S_DRAINING : v == 3 ? S_STARTING : S_READY);
        check_examine(&s, method, url, path, f, buffered);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    char method[64], url[1024], path[1024], ihcl[64], id[192], auth[256], cl[64], origin[128];
    if (!next_line(&p, end, method, sizeof(method))) return 0;
    int have_url = next_line(&p, end, url, sizeof(url)) != NULL;
    if (have_url) {
        memcpy(path, url, sizeof(url));
        size_t n = unescape(NULL, NULL, path);
        FUZZ_CHECK(n == strlen(path) && n <= strlen(url));
        char *q = strchr(path, '?'); /* libmicrohttpd takes the query off first */
        if (q) *q = '\0';
        check_route(method, path);
    }
    if (next_line(&p, end, ihcl, sizeof(ihcl))) check_size(ihcl);
    if (next_line(&p, end, id, sizeof(id))) check_id(id);
    fake_headers f = {NULL, NULL, next_line(&p, end, auth, sizeof(auth))};
    check_key(f.authorization);
    f.content_length = next_line(&p, end, cl, sizeof(cl));
    f.origin = next_line(&p, end, origin, sizeof(origin));
    if (have_url) {
        /* the body budget nearly spent, or not, by the input's length */
        long long buffered = size % 2 ? BUDGET - 1000 : 0;
        examine_all(method, url, path, &f, buffered);
    }
    return 0;
}
