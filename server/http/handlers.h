/* handlers.h - the route handlers, one per route or pair of routes
 * (handlers.c): what the table (routes.c) lists. Each answers into the
 * request's reply or queues its job; glue.c sends either.
 */
#ifndef ATTND_HANDLERS_H
#define ATTND_HANDLERS_H

#include "route.h"

/* Each returns 0, or -1 with the request's error set (attnd_route_fn). */
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

/* The model repository (control.c): 403 unless server.model_control is
 * "explicit". */
int attnd_handle_repo_index(attnd_http_req *h);
int attnd_handle_repo_load(attnd_http_req *h); /* answered from the loader thread */
int attnd_handle_repo_unload(attnd_http_req *h);

/* OPTIONS on a route's path, with CORS on: the preflight row. */
int attnd_handle_preflight(attnd_http_req *h);

#endif
