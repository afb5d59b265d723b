/* server.h - the server's life: the models loaded, the bodies that
 * describe them written, the session table, the scheduler and its compute
 * pool, and the HTTP side started (server/http/), in that order; then,
 * on a stop signal, the drain; then everything stopped and freed. main.c
 * is its only caller.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include <stddef.h>

#include "../config/config.h"

/* The daemon's exit codes, one meaning each (docs/config.md lists them). */
typedef enum {
    ATTND_EXIT_OK = 0,       /* stopped by a signal, every admitted request answered */
    ATTND_EXIT_INTERNAL = 1, /* out of memory or threads, or another internal failure */
    ATTND_EXIT_CONFIG = 2,   /* the config file, a flag or an ATTND_* variable is wrong */
    ATTND_EXIT_WEIGHTS = 3,  /* a weights file is missing, unreadable or does not fit */
    ATTND_EXIT_LISTEN = 4,   /* cannot listen on the host and port */
    ATTND_EXIT_DRAIN = 5     /* the drain deadline passed with answers unfinished */
} attnd_exit;

typedef struct attnd_server attnd_server;

/* Loads every model of cfg (cfg must outlive the server), starts workers
 * and the HTTP daemon. Logs the models. Returns NULL with err set and *why
 * saying which kind of failure it was; err "" when the failure was logged
 * already (a model that did not load). */
attnd_server *attnd_server_new(const attnd_config *cfg, attnd_exit *why, char *err, size_t errlen);

/* SIGHUP: the config file read again and its models applied while
 * serving (reload.h). */
void attnd_server_reload(attnd_server *s);

/* The port it listens on (the chosen one when cfg->port is 0). */
int attnd_server_port(const attnd_server *s);
/* The gRPC port (the chosen one when cfg->grpc_port is -1); 0 when off. */
int attnd_server_grpc_port(const attnd_server *s);

/* Draining: /health answers 503, new connections are refused, requests on
 * open connections get 503, and every admitted request is answered while
 * cfg->drain_grace_s lasts. Past it, queued requests get 503 and answers
 * still going out are cut off; each such request is logged. Stops the HTTP
 * daemon and the workers. Returns the number of requests cut short (0 when
 * every admitted request was answered whole). */
int attnd_server_drain(attnd_server *s);

/* Stops the daemon and the workers and frees everything. NULL is fine. */
void attnd_server_free(attnd_server *s);

#endif
