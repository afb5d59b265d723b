/* route.h - what a route is: its id, its row in the table and what the
 * matcher finds for a request. Types only, so that the request record
 * (hreq.h) and the handlers can name them from below the table (routes.c),
 * which lists the handlers and so sits above them.
 */
#ifndef ATTND_ROUTE_H
#define ATTND_ROUTE_H

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
    R_REPO_INDEX,      /* POST /v2/repository/index */
    R_REPO_LOAD,       /* POST /v2/repository/models/{name}/load */
    R_REPO_UNLOAD,     /* POST /v2/repository/models/{name}/unload */
    R_SESSIONS,        /* POST /v1/sessions: open a KV-cache session */
    R_SESSION_STEP,    /* POST /v1/sessions/{name}/attention: a step ({name} is the id) */
    R_SESSION,         /* DELETE /v1/sessions/{name} */
    R_SESSION_STATE,   /* GET  /v1/sessions/{name}/state: its state file */
    R_UI,              /* GET  /ui: the viewer's page (server/ui/) */
    R_UI_FILE,         /* GET  /ui/{name}: its script and style sheet */
    R_PREFLIGHT,       /* OPTIONS on any path above, with CORS on: the preflight */
    R_COUNT,
    R_UNKNOWN = R_COUNT /* metrics label for paths no route matches */
} attnd_route_id;

/* What the HTTP side does with a route besides calling its handler. */
enum {
    ROUTE_OPEN = 1,        /* answered without the API key */
    ROUTE_COMPUTE = 2,     /* its body becomes a job: refused while draining, counted against
                              the body budget as it arrives */
    ROUTE_QUEUE_FIRST = 4, /* its model ({name}, or the only one) is known before the body:
                              a full queue refuses it before the body is kept */
    ROUTE_PREFLIGHT = 8    /* a CORS preflight: in the table only with CORS on, on every path
                              another row has (pattern "*"); answered from its header lines
                              alone: no credentials, no body checks */
};

/* The HTTP side's request (hreq.h), which every handler answers. */
typedef struct attnd_http_req attnd_http_req;
/* Answers the request into its reply, or queues it; returns 0, or -1 with
 * the request's error set (glue.c sends either). */
typedef int (*attnd_route_fn)(attnd_http_req *h);

typedef struct {
    attnd_route_id id;
    const char *method;    /* "GET" (HEAD too), "POST", "DELETE" or "OPTIONS" */
    const char *pattern;   /* {name} and {version} match one non-empty segment; "*": the path
                              of any other row */
    attnd_route_fn handle; /* handlers.c */
    const char *label;     /* for metrics: the pattern with {x} written :x, which every
                              Prometheus parser takes */
    unsigned flags;        /* ROUTE_* */
} attnd_route;

#define ROUTE_CAPTURE_MAX 128

typedef struct {
    const attnd_route *route;        /* the row that answers (status 0), or NULL */
    const attnd_route *path;         /* the row whose pattern the path matched: Allow lists its
                                        methods, metrics and traces name the request by it (a
                                        preflight too); NULL for 404 */
    int status;                      /* 0 matched, 404 no such path, 405 wrong method */
    char allow[32];                  /* for 405 and OPTIONS: "GET, HEAD, OPTIONS" */
    char name[ROUTE_CAPTURE_MAX];    /* {name}, "" when none */
    char version[ROUTE_CAPTURE_MAX]; /* {version}, "" when none */
} attnd_route_match;

#endif
