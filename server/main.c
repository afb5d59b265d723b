/* main.c - attnd: read the config, start the server, wait for SIGTERM or
 * SIGINT, drain, exit 0. The only place that exits. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/config.h"
#include "../core/attn.h"
#include "http.h"

void openblas_set_num_threads(int n);

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    attnd_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[1024] = "";
    int help = 0;
    if (attnd_config_from_args(&cfg, argc, argv, &help, err, sizeof(err)) < 0) {
        fprintf(stderr, "attnd: %s\n", err);
        attnd_config_free(&cfg);
        return 2;
    }
    if (help) {
        attnd_config_usage(stdout, argv[0]);
        attnd_config_free(&cfg);
        return 0;
    }
    /* the core owns parallelism; OpenBLAS stays single-threaded */
    openblas_set_num_threads(1);

    /* every thread started from here on inherits the blocked signals; main
     * takes them with sigwait */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    printf("attnd starting: blas core %s, %d worker%s x %d thread%s, %d http thread%s\n",
           attn_blas_corename(), cfg.worker_threads, cfg.worker_threads == 1 ? "" : "s",
           cfg.blas_threads, cfg.blas_threads == 1 ? "" : "s", cfg.http_threads,
           cfg.http_threads == 1 ? "" : "s");
    if (cfg.config_path)
        printf("config %s\n", cfg.config_path);
    else
        printf("no config file: serving the embedded default model\n");
    attnd_server *srv = attnd_server_new(&cfg, err, sizeof(err));
    if (!srv) {
        fprintf(stderr, "attnd: %s\n", err);
        attnd_config_free(&cfg);
        return 1;
    }
    const char *host = cfg.host;
    int v6 = strchr(host, ':') != NULL;
    printf("listening on %s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", attnd_server_port(srv));

    int sig = 0;
    sigwait(&set, &sig);
    printf("%s: draining\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    attnd_server_drain(srv);
    attnd_server_free(srv);
    attnd_config_free(&cfg);
    printf("stopped\n");
    return 0;
}
