/* http.h - the attnd server: loads the models, starts the scheduler and the
 * libmicrohttpd daemon, answers every route, drains on request.
 * HTTP threads parse, check and queue; they never compute and never wait for
 * a worker: a request waiting for compute has its connection suspended.
 */
#ifndef ATTND_HTTP_H
#define ATTND_HTTP_H

#include <stddef.h>

#include "../config/config.h"

typedef struct attnd_server attnd_server;

/* Loads every model of cfg (cfg must outlive the server), starts workers
 * and the HTTP daemon. Logs the models to stdout. Returns NULL with err set. */
attnd_server *attnd_server_new(const attnd_config *cfg, char *err, size_t errlen);

/* The port it listens on (the chosen one when cfg->port is 0). */
int attnd_server_port(const attnd_server *s);

/* Draining: /health answers 503, new connections are refused, requests on
 * open connections get 503, and every admitted request is answered. Returns
 * once nothing is in flight (or after request_timeout_ms plus 10 s). */
void attnd_server_drain(attnd_server *s);

/* Stops the daemon and the workers and frees everything. NULL is fine. */
void attnd_server_free(attnd_server *s);

#endif
