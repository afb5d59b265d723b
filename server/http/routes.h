/* routes.h - the route table: every path attnd answers, one line each
 * (method, pattern, handler, metrics label, flags), and the matcher that
 * turns (method, path) into a route, a 404 or a 405. The handlers are
 * handlers.c's; this file knows no HTTP library.
 */
#ifndef ATTND_ROUTES_H
#define ATTND_ROUTES_H

#include <stddef.h>

typedef enum {
    R_ATTENTION,       /* POST /v1/attention */
    R_MODEL_ATTENTION, /* POST /v1/models/{name}/attention */
    R_V1_MODELS,       /* GET  /v1/models */
    R_HEALTH,          /* GET  /health */
    R_METRICS,         /* GET  /metrics */
    R_OPENAPI,         /* GET  /openapi.json */
    R_V2,              /* GET  /v2 */
    R_V2_LIVE,         /* GET  /v2/health/live */
    R_V2_READY,        /* GET  /v2/health/ready */
    R_V2_MODEL,        /* GET  /v2/models/{name} */
    R_V2_MODEL_READY,  /* GET  /v2/models/{name}/ready */
    R_V2_INFER,        /* POST /v2/models/{name}/infer */
    R_V2_VMODEL,       /* GET  /v2/models/{name}/versions/{version} */
    R_V2_VMODEL_READY, /* GET  /v2/models/{name}/versions/{version}/ready */
    R_V2_VINFER,       /* POST /v2/models/{name}/versions/{version}/infer */
    R_SESSIONS,        /* POST /v1/sessions: open a KV-cache session */
    R_SESSION_STEP,    /* POST /v1/sessions/{name}/attention: a step ({name} is the id) */
    R_SESSION,         /* DELETE /v1/sessions/{name} */
    R_SESSION_STATE,   /* GET  /v1/sessions/{name}/state: its state file */
    R_UI,              /* GET  /ui: the viewer's page (server/ui/) */
    R_UI_FILE,         /* GET  /ui/{name}: its script and style sheet */
    R_COUNT,
    R_UNKNOWN = R_COUNT /* metrics label for paths no route matches */
} attnd_route_id;

/* What the HTTP side does with a route besides calling its handler. */
enum {
    ROUTE_OPEN = 1,       /* answered without the API key */
    ROUTE_COMPUTE = 2,    /* its body becomes a job: refused while draining, counted against
                             the body budget as it arrives */
    ROUTE_QUEUE_FIRST = 4 /* its model ({name}, or the only one) is known before the body:
                             a full queue refuses it before the body is read */
};

/* The HTTP side's request (hreq.h), which every handler answers. */
typedef struct attnd_http_req attnd_http_req;
/* Answers the request into its reply, or queues it; returns 0, or -1 with
 * the request's error set (glue.c sends either). */
typedef int (*attnd_route_fn)(attnd_http_req *h);

typedef struct {
    attnd_route_id id;
    const char *method;    /* "GET" (HEAD too), "POST" or "DELETE" */
    const char *pattern;   /* {name} and {version} match one non-empty segment */
    attnd_route_fn handle; /* handlers.c */
    const char *label;     /* for metrics: the pattern with {x} written :x, which every
                              Prometheus parser takes */
    unsigned flags;        /* ROUTE_* */
} attnd_route;

extern const attnd_route attnd_routes[R_COUNT];

#define ROUTE_CAPTURE_MAX 128

typedef struct {
    const attnd_route *route;        /* the match, or NULL */
    int status;                      /* 0 matched, 404 no such path, 405 wrong method */
    char allow[32];                  /* for 405 and OPTIONS: "GET, HEAD, OPTIONS" */
    char name[ROUTE_CAPTURE_MAX];    /* {name}, "" when none */
    char version[ROUTE_CAPTURE_MAX]; /* {version}, "" when none */
} attnd_route_match;

/* Matches path (no query string) for method. With options set (CORS on),
 * OPTIONS matches every route and Allow lists it. Fills m; returns
 * m->status. */
int attnd_route_find(const char *method, const char *path, int options, attnd_route_match *m);

/* The route's template as traces name it: its label with each ":x"
 * written "{x}" ("/v1/sessions/{id}/attention"), into buf; returns buf. */
const char *attnd_route_template(const attnd_route *r, char *buf, size_t n);

/* The label metrics use for a route id: its row's, or "unknown". */
const char *attnd_route_label(attnd_route_id id);
/* Every route's label by id, then "unknown" at R_UNKNOWN: what
 * attnd_metrics_init counts requests under. */
void attnd_route_labels(const char *labels[R_COUNT + 1]);

/* The handlers of the table, one per route or pair of routes (handlers.c). */
int attnd_handle_attention(attnd_http_req *h); /* native compute */
int attnd_handle_models(attnd_http_req *h);
int attnd_handle_health(attnd_http_req *h);
int attnd_handle_metrics(attnd_http_req *h);
int attnd_handle_openapi(attnd_http_req *h);
int attnd_handle_v2(attnd_http_req *h); /* server metadata */
int attnd_handle_v2_live(attnd_http_req *h);
int attnd_handle_v2_ready(attnd_http_req *h);
int attnd_handle_v2_model(attnd_http_req *h); /* model metadata */
int attnd_handle_v2_model_ready(attnd_http_req *h);
int attnd_handle_v2_infer(attnd_http_req *h); /* v2 compute, sessions included */
int attnd_handle_session_open(attnd_http_req *h);
int attnd_handle_session_step(attnd_http_req *h);
int attnd_handle_session_delete(attnd_http_req *h);
int attnd_handle_session_state(attnd_http_req *h);
int attnd_handle_ui(attnd_http_req *h); /* the viewer's files; 404 when server.ui is off */

#endif
