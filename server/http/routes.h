/* routes.h - the route table: every path attnd answers, one line each
 * (method, pattern, handler, metrics label, flags), the CORS preflight
 * included, and the matcher that turns (method, path) into a route, a 404
 * or a 405. It lists the handlers (handlers.h), so it sits above them; the
 * types are route.h's. This file knows no HTTP library.
 */
#ifndef ATTND_ROUTES_H
#define ATTND_ROUTES_H

#include <stddef.h>

#include "route.h"

extern const attnd_route attnd_routes[R_COUNT];

/* Matches path (no query string) for method. With options set (CORS on),
 * the preflight row answers OPTIONS on every path another row has, and
 * Allow lists it. Fills m; returns m->status. */
int attnd_route_find(const char *method, const char *path, int options, attnd_route_match *m);

/* The route's template as traces name it: its label with each ":x"
 * written "{x}" ("/v1/sessions/{id}/attention"), into buf; returns buf. */
const char *attnd_route_template(const attnd_route *r, char *buf, size_t n);

/* The label metrics use for a route id: its row's, or "unknown". */
const char *attnd_route_label(attnd_route_id id);
/* Every route's label by id, then "unknown" at R_UNKNOWN: what
 * attnd_metrics_init counts requests under. */
void attnd_route_labels(const char *labels[R_COUNT + 1]);

#endif
