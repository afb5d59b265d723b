/* main.c - attnd: read the config, start the server, wait for a stop
 * signal, drain, exit. The only place that exits; its codes are
 * attnd_exit's (server.h), one meaning each.
 *
 * Signals (docs/config.md, "Signals and exit codes"):
 *   SIGTERM, SIGINT, SIGQUIT  drain: stop accepting, answer every admitted
 *   SIGPWR, SIGRTMIN+3/+4     request, exit 0; exit 5 when server.drain_grace_s
 *                             passed with answers unfinished (SIGPWR: LXC's
 *                             stop; SIGRTMIN+3, +4: systemd's halt and
 *                             poweroff, which nspawn --boot sends PID 1)
 *   SIGHUP                    the config file read again and its models
 *                             applied (server/reload.h); the other sections
 *                             need a restart
 *   SIGUSR1, SIGUSR2          logged and ignored
 *   SIGPIPE                   ignored (a client that left is seen as such)
 *   SIGCONT, SIGWINCH         left to their default: no effect on a running
 *                             daemon (systemd sends SIGCONT after SIGTERM)
 */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/config.h"
#include "../core/attn.h"
#include "base/cpus.h"
#include "obs/log.h"
#include "server.h"

/* The signals main() takes with sigwait; every thread inherits them blocked. */
static void stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
    sigaddset(set, SIGPWR);
    sigaddset(set, SIGRTMIN + 3);
    sigaddset(set, SIGRTMIN + 4);
}

static int stops(int sig) {
    return sig == SIGTERM || sig == SIGINT || sig == SIGQUIT || sig == SIGPWR ||
           sig == SIGRTMIN + 3 || sig == SIGRTMIN + 4;
}

/* "TERM", "RTMIN+3": a signal's name for the log (buf for the real-time ones). */
static const char *sig_name(int sig, char buf[16]) {
    const char *abbrev = sig < SIGRTMIN ? sigabbrev_np(sig) : NULL;
    if (abbrev) return abbrev;
    snprintf(buf, 16, "RTMIN+%d", sig - SIGRTMIN);
    return buf;
}

/* Waits for a signal that stops the daemon; applies the config on SIGHUP,
 * logs and ignores the others. */
static int wait_for_stop(attnd_server *srv, const sigset_t *set) {
    for (;;) {
        int sig = 0;
        if (sigwait(set, &sig) != 0) continue;
        if (stops(sig)) return sig;
        if (sig == SIGHUP) {
            attnd_log(LOG_INFO, "SIGHUP: reading the config file again");
            attnd_server_reload(srv);
            continue;
        }
        char buf[16];
        attnd_log(LOG_WARN, "SIG%s: ignored (SIGHUP applies the config file's models)",
                  sig_name(sig, buf));
    }
}

static void warn_note(void *arg, const char *sentence) {
    (void)arg;
    attnd_log(LOG_WARN, "%s", sentence);
}

/* The flags, the ATTND_* variables and the config file into cfg, the log
 * set up from the first line (the flag's or variable's format, a refused
 * config included; the config file's once it is read). Returns -1 when the
 * daemon is to run, else the exit code (--help and --version print and
 * give ATTND_EXIT_OK). */
static int configure(int argc, char **argv, attnd_config *cfg) {
    char err[1024] = "";
    int want = ATTND_WANT_RUN;
    const char *log_format, *log_level;
    attnd_config_log_early(argc, argv, &log_format, &log_level);
    attnd_log_setup(log_format, log_level, 1);
    int rc = attnd_config_from_args(cfg, argc, argv, &want, err, sizeof(err));
    if (rc < 0) {
        attnd_log(LOG_ERROR, "attnd: %s", err);
        return rc == -2 ? ATTND_EXIT_WEIGHTS : ATTND_EXIT_CONFIG;
    }
    if (want == ATTND_WANT_HELP) attnd_config_usage(stdout, argv[0]);
    if (want == ATTND_WANT_VERSION) printf("attnd %s\n", ATTND_VERSION);
    if (want != ATTND_WANT_RUN) return ATTND_EXIT_OK;
    attnd_log_setup(cfg->log_format, cfg->log_level, cfg->access_log);
    attnd_config_env_notes(cfg, warn_note, NULL);
    return -1;
}

/* One compute pool and the HTTP threads, by default from the CPUs the
 * process may use (affinity mask, cgroup quota), and the start-up line
 * that says what runs: the version, the OpenBLAS kernels, CPUs and
 * threads, and where the models come from. */
static void size_threads(attnd_config *cfg) {
    const attn_blas_info *blas = attn_blas_get_info();
    attnd_cpus cpus;
    attnd_cpus_count(&cpus);
    char note[320];
    attnd_threads_resolve(cfg, &cpus, note, sizeof(note));
    attnd_log(LOG_INFO,
              "attnd %s starting: blas core %s (%s), cpu features %s; %d cpu%s (affinity %d, "
              "cgroup quota %d), %d compute thread%s%s, %d http thread%s",
              ATTND_VERSION, blas->core,
              blas->by_user ? "from OPENBLAS_CORETYPE" : "chosen from the cpu features",
              blas->features, cpus.n, cpus.n == 1 ? "" : "s", cpus.affinity, cpus.quota,
              cfg->compute_threads, cfg->compute_threads == 1 ? "" : "s",
              cfg->pin ? " (pinned, one cpu each)" : "", cfg->http_pollers,
              cfg->http_pollers == 1 ? "" : "s");
    if (blas->warning) attnd_log(LOG_WARN, "%s", blas->warning);
    if (note[0]) attnd_log(LOG_WARN, "%s", note);
    if (cfg->config_path)
        attnd_log(LOG_INFO, "config %s", cfg->config_path);
    else
        attnd_log(LOG_INFO, "no config file: serving the embedded default model");
}

/* Serves until a stop signal, then drains: the exit code. */
static int serve(attnd_config *cfg, const sigset_t *set) {
    char err[1024] = "";
    attnd_exit why = ATTND_EXIT_OK;
    attnd_server *srv = attnd_server_new(cfg, &why, err, sizeof(err));
    if (!srv) {
        if (err[0]) attnd_log(LOG_ERROR, "attnd: %s", err); /* "": logged where it failed */
        return why;
    }
    const char *host = cfg->host;
    int v6 = strchr(host, ':') != NULL;
    attnd_log(LOG_INFO, "listening on %s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "",
              attnd_server_port(srv));
    int sig = wait_for_stop(srv, set);
    char name[16];
    attnd_log(LOG_INFO, "SIG%s: draining", sig_name(sig, name));
    int cut = attnd_server_drain(srv);
    attnd_server_free(srv);
    if (cut) {
        attnd_log(LOG_WARN, "stopped: %d request%s cut short at the drain deadline", cut,
                  cut == 1 ? "" : "s");
        return ATTND_EXIT_DRAIN;
    }
    attnd_log(LOG_INFO, "stopped");
    return ATTND_EXIT_OK;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Buffers of 1 MiB and more get mappings of their own, always: glibc
     * otherwise raises this threshold after the first such free, and the
     * weights of a model unloaded or replaced would then stay in the heap,
     * counted in the process's memory, until a malloc_trim that locks every
     * arena while it walks them (requests wait behind it). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    attnd_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[1024] = "";
    int rc = configure(argc, argv, &cfg);
    if (rc >= 0) goto done;
    /* OpenBLAS's kernels are chosen from the CPU's features before it loads,
     * and before any thread starts (it sets environment variables) */
    if (attn_blas_init(err, sizeof(err)) < 0) {
        attnd_log(LOG_ERROR, "attnd: %s", err);
        rc = ATTND_EXIT_INTERNAL;
        goto done;
    }
    sigset_t set;
    stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    size_threads(&cfg);
    rc = serve(&cfg, &set);
done:
    attnd_config_free(&cfg);
    return rc;
}
