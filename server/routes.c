/* routes.c - the route table and its matcher. See routes.h. */
#include "routes.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

// clang-format off
const attnd_route attnd_routes[R_COUNT] = {
    {R_ATTENTION,       "POST", "/v1/attention",                               0},
    {R_MODEL_ATTENTION, "POST", "/v1/models/{name}/attention",                 0},
    {R_V1_MODELS,       "GET",  "/v1/models",                                  0},
    {R_HEALTH,          "GET",  "/health",                                     1},
    {R_METRICS,         "GET",  "/metrics",                                    1},
    {R_OPENAPI,         "GET",  "/openapi.json",                               0},
    {R_V2,              "GET",  "/v2",                                         0},
    {R_V2_LIVE,         "GET",  "/v2/health/live",                             1},
    {R_V2_READY,        "GET",  "/v2/health/ready",                            1},
    {R_V2_MODEL,        "GET",  "/v2/models/{name}",                           0},
    {R_V2_MODEL_READY,  "GET",  "/v2/models/{name}/ready",                     0},
    {R_V2_INFER,        "POST", "/v2/models/{name}/infer",                     0},
    {R_V2_VMODEL,       "GET",  "/v2/models/{name}/versions/{version}",        0},
    {R_V2_VMODEL_READY, "GET",  "/v2/models/{name}/versions/{version}/ready",  0},
    {R_V2_VINFER,       "POST", "/v2/models/{name}/versions/{version}/infer",  0},
    {R_SESSIONS,        "POST", "/v1/sessions",                                0},
    {R_SESSION_STEP,    "POST", "/v1/sessions/{name}/attention",               0},
    {R_SESSION,       "DELETE", "/v1/sessions/{name}",                         0},
};
// clang-format on

/* Patterns with {x} written :x, which every Prometheus parser takes. */
static const char *const LABELS[R_COUNT] = {
    "/v1/attention",
    "/v1/models/:name/attention",
    "/v1/models",
    "/health",
    "/metrics",
    "/openapi.json",
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/:name",
    "/v2/models/:name/ready",
    "/v2/models/:name/infer",
    "/v2/models/:name/versions/:version",
    "/v2/models/:name/versions/:version/ready",
    "/v2/models/:name/versions/:version/infer",
    "/v1/sessions",
    "/v1/sessions/:id/attention",
    "/v1/sessions/:id",
};

const char *attnd_route_label(attnd_route_id id) {
    return id < R_COUNT ? LABELS[id] : "unknown";
}

/* Matches one pattern; fills the captures of m on success. */
static int match(const char *pat, const char *path, attnd_route_match *m) {
    char name[ROUTE_CAPTURE_MAX] = "", version[ROUTE_CAPTURE_MAX] = "";
    const char *p = pat, *s = path;
    while (*p) {
        if (*p == '{') {
            const char *pe = strchr(p, '}');
            const char *se = strchr(s, '/');
            if (!se) se = s + strlen(s);
            size_t n = (size_t)(se - s);
            if (n == 0 || n >= ROUTE_CAPTURE_MAX) return 0;
            char *dst = strncmp(p, "{name}", 6) == 0 ? name : version;
            memcpy(dst, s, n);
            dst[n] = '\0';
            p = pe + 1;
            s = se;
        } else {
            if (*p != *s) return 0;
            p++;
            s++;
        }
    }
    if (*s) return 0;
    memcpy(m->name, name, sizeof(name));
    memcpy(m->version, version, sizeof(version));
    return 1;
}

int attnd_route_find(const char *method, const char *path, int options, attnd_route_match *m) {
    memset(m, 0, sizeof(*m));
    const attnd_route *hit = NULL;
    for (int i = 0; i < R_COUNT; i++)
        if (match(attnd_routes[i].pattern, path, m)) {
            hit = &attnd_routes[i];
            break;
        }
    if (!hit) return m->status = 404;
    int get = strcmp(hit->method, "GET") == 0;
    snprintf(m->allow, sizeof(m->allow), "%s%s", get ? "GET, HEAD" : hit->method,
             options ? ", OPTIONS" : "");
    m->route = hit;
    if (strcmp(method, hit->method) == 0 || (options && strcmp(method, "OPTIONS") == 0) ||
        (get && strcmp(method, "HEAD") == 0))
        return m->status = 0;
    return m->status = 405;
}
