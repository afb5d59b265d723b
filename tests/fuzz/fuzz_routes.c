/* fuzz_routes.c - libFuzzer target: the route table and the header
 * handling of server/http.c, in process. The bytes are lines: method, URL
 * (percent-escaped, as it arrives), Inference-Header-Content-Length,
 * X-Request-Id, Authorization (a missing line is an absent header). They
 * go the daemon's way: the URL through its unescape callback, then the
 * route matcher (server/routes.c); the headers through the same static
 * helpers the request handler calls, which is why this file includes
 * server/http.c whole. Each answer is held to an independent statement of
 * what it should be: a matched route's pattern with its captures put back
 * is the path; a size is digits only and within its limit; a request id is
 * 1 to 64 of [A-Za-z0-9._:-]; the API key matches only "Bearer <key>".
 *   make fuzz-smoke; make fuzz-long
 */
#include "../../server/http.c"

#include <errno.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

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
static void fill(const char *pat, const route_match *m, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = pat; *p && n < cap - 1;) {
        const char *cap_s = NULL;
        if (strncmp(p, "{name}", 6) == 0) cap_s = m->name, p += 6;
        else if (strncmp(p, "{version}", 9) == 0) cap_s = m->version, p += 9;
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
        route_match m;
        int st = route_find(method, path, options, &m);
        CHECK(st == m.status && (st == 0 || st == 404 || st == 405));
        CHECK((st == 404) == (m.route == NULL));
        CHECK(memchr(m.name, 0, sizeof(m.name)) && memchr(m.version, 0, sizeof(m.version)));
        if (!m.route) continue;
        char back[512];
        fill(m.route->pattern, &m, back, sizeof(back));
        CHECK(strcmp(back, path) == 0);
        CHECK(!strchr(m.name, '/') && !strchr(m.version, '/'));
        CHECK(strstr(m.route->pattern, "{name}") ? m.name[0] != '\0' : m.name[0] == '\0');
        int same = strcmp(method, m.route->method) == 0 ||
                   (strcmp(method, "HEAD") == 0 && strcmp(m.route->method, "GET") == 0) ||
                   (options && strcmp(method, "OPTIONS") == 0);
        CHECK((st == 0) == same);
    }
}

static void check_size(const char *s) {
    static const uint64_t limits[] = {0, 1, 255, 65536, UINT64_MAX};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        uint64_t v = 12345;
        int rc = parse_size(s, limits[i], &v);
        int digits = s[0] != '\0' && strspn(s, "0123456789") == strlen(s);
        errno = 0;
        unsigned long long ref = digits ? strtoull(s, NULL, 10) : 0;
        int fits = digits && errno != ERANGE && ref <= limits[i];
        CHECK((rc == 0) == fits);
        CHECK(rc == 0 ? v == ref : v == 12345);
    }
}

static void check_id(const char *s) {
    size_t n = strlen(s);
    int want = n >= 1 && n <= 64 &&
               strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:") == n;
    CHECK(sane_id(s) == want);
}

static void check_key(const char *hdr) {
    attnd_server s;
    memset(&s, 0, sizeof(s));
    s.api_key = "k3y";
    s.api_key_len = 3;
    int want = 0;
    if (hdr && strncasecmp(hdr, "Bearer ", 7) == 0) {
        const char *t = hdr + 7 + strspn(hdr + 7, " ");
        want = strcmp(t, "k3y") == 0;
    }
    CHECK(key_ok(&s, hdr) == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    char method[64], url[1024], path[1024], ihcl[64], id[128], auth[256];
    if (!next_line(&p, end, method, sizeof(method))) return 0;
    if (next_line(&p, end, url, sizeof(url))) {
        memcpy(path, url, sizeof(url));
        size_t n = unescape(NULL, NULL, path);
        CHECK(n == strlen(path) && n <= strlen(url));
        char *q = strchr(path, '?'); /* libmicrohttpd takes the query off first */
        if (q) *q = '\0';
        check_route(method, path);
    }
    if (next_line(&p, end, ihcl, sizeof(ihcl))) check_size(ihcl);
    if (next_line(&p, end, id, sizeof(id))) check_id(id);
    check_key(next_line(&p, end, auth, sizeof(auth)));
    return 0;
}
