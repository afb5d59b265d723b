/* routes.c - the route table and its matcher. See routes.h. */
#include "routes.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "handlers.h"

/* compute whose model the header lines tell */
#define MODEL_COMPUTE (ROUTE_COMPUTE | ROUTE_QUEUE_FIRST)

// clang-format off
const attnd_route attnd_routes[R_COUNT] = {
/*   id                  method     pattern                                      handler                      label                                       flags */
    {R_ATTENTION,       "POST",    "/v1/attention",                              attnd_handle_attention,      "/v1/attention",                            MODEL_COMPUTE},
    {R_MODEL_ATTENTION, "POST",    "/v1/models/{name}/attention",                attnd_handle_attention,      "/v1/models/:name/attention",               MODEL_COMPUTE},
    {R_V1_MODELS,       "GET",     "/v1/models",                                 attnd_handle_models,         "/v1/models",                               0},
    {R_HEALTH,          "GET",     "/health",                                    attnd_handle_health,         "/health",                                  ROUTE_OPEN},
    {R_METRICS,         "GET",     "/metrics",                                   attnd_handle_metrics,        "/metrics",                                 ROUTE_OPEN},
    {R_OPENAPI,         "GET",     "/openapi.json",                              attnd_handle_openapi,        "/openapi.json",                            0},
    {R_V2,              "GET",     "/v2",                                        attnd_handle_v2,             "/v2",                                      0},
    {R_V2_LIVE,         "GET",     "/v2/health/live",                            attnd_handle_v2_live,        "/v2/health/live",                          ROUTE_OPEN},
    {R_V2_READY,        "GET",     "/v2/health/ready",                           attnd_handle_v2_ready,       "/v2/health/ready",                         ROUTE_OPEN},
    {R_V2_MODEL,        "GET",     "/v2/models/{name}",                          attnd_handle_v2_model,       "/v2/models/:name",                         0},
    {R_V2_MODEL_READY,  "GET",     "/v2/models/{name}/ready",                    attnd_handle_v2_model_ready, "/v2/models/:name/ready",                   0},
    {R_V2_INFER,        "POST",    "/v2/models/{name}/infer",                    attnd_handle_v2_infer,       "/v2/models/:name/infer",                   MODEL_COMPUTE},
    {R_V2_VMODEL,       "GET",     "/v2/models/{name}/versions/{version}",       attnd_handle_v2_model,       "/v2/models/:name/versions/:version",       0},
    {R_V2_VMODEL_READY, "GET",     "/v2/models/{name}/versions/{version}/ready", attnd_handle_v2_model_ready, "/v2/models/:name/versions/:version/ready", 0},
    {R_V2_VINFER,       "POST",    "/v2/models/{name}/versions/{version}/infer", attnd_handle_v2_infer,       "/v2/models/:name/versions/:version/infer", MODEL_COMPUTE},
    {R_REPO_INDEX,      "POST",    "/v2/repository/index",                       attnd_handle_repo_index,     "/v2/repository/index",                     0},
    {R_REPO_LOAD,       "POST",    "/v2/repository/models/{name}/load",          attnd_handle_repo_load,      "/v2/repository/models/:name/load",         0},
    {R_REPO_UNLOAD,     "POST",    "/v2/repository/models/{name}/unload",        attnd_handle_repo_unload,    "/v2/repository/models/:name/unload",       0},
    {R_SESSIONS,        "POST",    "/v1/sessions",                               attnd_handle_session_open,   "/v1/sessions",                             ROUTE_COMPUTE},
    {R_SESSION_STEP,    "POST",    "/v1/sessions/{name}/attention",              attnd_handle_session_step,   "/v1/sessions/:id/attention",               ROUTE_COMPUTE},
    {R_SESSION,         "DELETE",  "/v1/sessions/{name}",                        attnd_handle_session_delete, "/v1/sessions/:id",                         0},
    {R_SESSION_STATE,   "GET",     "/v1/sessions/{name}/state",                  attnd_handle_session_state,  "/v1/sessions/:id/state",                   0},
    {R_UI,              "GET",     "/ui",                                        attnd_handle_ui,             "/ui",                                      ROUTE_OPEN},
    {R_UI_FILE,         "GET",     "/ui/{name}",                                 attnd_handle_ui,             "/ui/:name",                                ROUTE_OPEN},
    {R_PREFLIGHT,       "OPTIONS", "*",                                          attnd_handle_preflight,      "*",                                        ROUTE_PREFLIGHT},
};
// clang-format on

const char *attnd_route_label(attnd_route_id id) {
    return id < R_COUNT ? attnd_routes[id].label : "unknown";
}

const char *attnd_route_template(const attnd_route *r, char *buf, size_t n) {
    size_t k = 0;
    int open = 0; /* inside a ":x" segment */
    for (const char *p = r->label; *p && k + 2 < n; p++) {
        if (*p == ':') {
            buf[k++] = '{';
            open = 1;
            continue;
        }
        if (*p == '/' && open) buf[k++] = '}', open = 0;
        buf[k++] = *p;
    }
    if (open && k + 1 < n) buf[k++] = '}';
    buf[k] = '\0';
    return buf;
}

void attnd_route_labels(const char *labels[R_COUNT + 1]) {
    for (int i = 0; i <= R_COUNT; i++)
        labels[i] = attnd_route_label((attnd_route_id)i);
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

/* The first row whose pattern the path matches (the preflight's "*"
 * matches no path of its own), its captures in m; NULL when none. */
static const attnd_route *path_row(const char *path, attnd_route_match *m) {
    for (int i = 0; i < R_COUNT; i++)
        if (strcmp(attnd_routes[i].pattern, "*") != 0 && match(attnd_routes[i].pattern, path, m))
            return &attnd_routes[i];
    return NULL;
}

/* The row that answers method on every path another row has, when the
 * table holds one for it (with options set: the preflight); or NULL. */
static const attnd_route *any_path_row(const char *method, int options) {
    for (int i = 0; i < R_COUNT; i++) {
        const attnd_route *r = &attnd_routes[i];
        if (strcmp(r->pattern, "*") == 0 && strcmp(r->method, method) == 0 &&
            (options || !(r->flags & ROUTE_PREFLIGHT)))
            return r;
    }
    return NULL;
}

int attnd_route_find(const char *method, const char *path, int options, attnd_route_match *m) {
    memset(m, 0, sizeof(*m));
    const attnd_route *hit = path_row(path, m);
    if (!hit) return m->status = 404;
    int get = strcmp(hit->method, "GET") == 0;
    snprintf(m->allow, sizeof(m->allow), "%s%s", get ? "GET, HEAD" : hit->method,
             options ? ", OPTIONS" : "");
    m->path = hit;
    if (strcmp(method, hit->method) == 0 || (get && strcmp(method, "HEAD") == 0))
        m->route = hit;
    else
        m->route = any_path_row(method, options);
    return m->status = m->route ? 0 : 405;
}
