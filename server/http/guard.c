/* guard.c - connection records, whole-phase read deadlines and eviction of
 * the slowest incomplete request. See guard.h.
 *
 * Records sit in one doubly linked list under one mutex. The deadline
 * thread wakes every GUARD_TICK_MS and shuts down the connections whose
 * deadline passed; eviction happens at once, in attnd_guard_open. Both scan
 * the list: it holds at most max_conns records.
 */
#include "guard.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "../base/clock.h"
#include "../obs/log.h"

/* How often deadlines are checked, ms: a connection lives at most this
 * much past its deadline. */
#define GUARD_TICK_MS 100
/* How often, at most, one warning line sums up the connections closed. */
#define GUARD_REPORT_US 10000000u

struct guard_conn {
    guard_conn *prev, *next;
    int fd; /* the connection's socket; owned by the HTTP library */
    guard_phase phase;
    uint64_t since_us;    /* attnd_mono_us() when the phase began */
    uint64_t deadline_us; /* 0 = none (GUARD_BUSY) */
    const char *cut;      /* why it was shut down, or NULL */
};

struct attnd_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the thread to stop */
    pthread_t thread;
    int started, stop;
    guard_conn *head; /* every open connection */
    int count;        /* records in the list */
    int ncut;         /* of which shut down and not yet closed */
    int max_conns, reserve;
    int closed[4]; /* since the last report: header_timeout, body_timeout, linger_timeout,
                      evicted */
    uint64_t reported_us;
    uint64_t header_us, body_us, linger_us; /* linger_us: at most body_us */
};

/* Mutex held. */
static void set_phase(attnd_guard *g, guard_conn *c, guard_phase p) {
    c->phase = p;
    c->since_us = attnd_mono_us();
    c->deadline_us = p == GUARD_HEADER   ? c->since_us + g->header_us
                     : p == GUARD_BODY   ? c->since_us + g->body_us
                     : p == GUARD_LINGER ? c->since_us + g->linger_us
                                         : 0;
}

/* Mutex held. The descriptor is still open: records leave the list before
 * the HTTP library closes it (attnd_guard_close). */
static void cut(attnd_guard *g, guard_conn *c, const char *why) {
    if (c->cut) return;
    c->cut = why;
    g->ncut++;
    g->closed[why[0] == 'h' ? 0 : why[0] == 'b' ? 1 : why[0] == 'l' ? 2 : 3]++;
    shutdown(c->fd, SHUT_RDWR);
}

/* Mutex held. The connection, other than `except`, that has waited longest
 * for the rest of its request, or NULL. */
static guard_conn *slowest(attnd_guard *g, const guard_conn *except) {
    guard_conn *best = NULL;
    for (guard_conn *c = g->head; c; c = c->next)
        if (c != except && !c->cut && c->phase != GUARD_BUSY &&
            (!best || c->since_us < best->since_us))
            best = c;
    return best;
}

/* Mutex held. One warning line for what was closed since the last one, at
 * most every GUARD_REPORT_US, so that a slowloris shows in the log without
 * flooding it. */
static void report(attnd_guard *g, uint64_t now) {
    if (now - g->reported_us < GUARD_REPORT_US) return;
    if (g->closed[0] + g->closed[1] + g->closed[2] + g->closed[3] == 0) return;
    attnd_log(LOG_WARN,
              "connections closed by the guard in the last %.0f s: %d past the header deadline, "
              "%d past the body deadline, %d evicted for a slot, %d still sending a refused "
              "body at the linger deadline",
              (double)(now - g->reported_us) / 1e6, g->closed[0], g->closed[1], g->closed[3],
              g->closed[2]);
    g->closed[0] = g->closed[1] = g->closed[2] = g->closed[3] = 0;
    g->reported_us = now;
}

static void *guard_main(void *arg) {
    attnd_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        uint64_t now = attnd_mono_us();
        for (guard_conn *c = g->head; c; c = c->next)
            if (c->deadline_us && now >= c->deadline_us)
                cut(g, c,
                    c->phase == GUARD_HEADER   ? "header_timeout"
                    : c->phase == GUARD_LINGER ? "linger_timeout"
                                               : "body_timeout");
        report(g, now);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += GUARD_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

attnd_guard *attnd_guard_new(int max_conns, int header_ms, int body_ms, int linger_ms, char *err,
                             size_t errlen) {
    attnd_guard *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    g->max_conns = max_conns;
    g->reserve = max_conns / 16 > 1 ? max_conns / 16 : 1;
    g->header_us = (uint64_t)header_ms * 1000u;
    g->body_us = (uint64_t)body_ms * 1000u;
    g->linger_us = (uint64_t)(linger_ms < body_ms ? linger_ms : body_ms) * 1000u;
    g->reported_us = attnd_mono_us();
    if (pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        snprintf(err, errlen, "cannot start the connection guard thread");
        attnd_guard_free(g);
        return NULL;
    }
    g->started = 1;
    return g;
}

void attnd_guard_free(attnd_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->started) pthread_join(g->thread, NULL);
    while (g->head) {
        guard_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

guard_conn *attnd_guard_open(attnd_guard *g, int fd) {
    guard_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        shutdown(fd, SHUT_RDWR);
        return NULL;
    }
    c->fd = fd;
    pthread_mutex_lock(&g->mu);
    set_phase(g, c, GUARD_HEADER);
    c->next = g->head;
    if (g->head) g->head->prev = c;
    g->head = c;
    g->count++;
    if (g->count - g->ncut > g->max_conns - g->reserve) {
        guard_conn *v = slowest(g, c);
        if (v) cut(g, v, "evicted");
    }
    pthread_mutex_unlock(&g->mu);
    return c;
}

void attnd_guard_close(attnd_guard *g, guard_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    g->count--;
    if (c->cut) g->ncut--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void attnd_guard_phase(attnd_guard *g, guard_conn *c, guard_phase p) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    set_phase(g, c, p);
    pthread_mutex_unlock(&g->mu);
}

const char *attnd_guard_cut(attnd_guard *g, guard_conn *c) {
    if (!c) return NULL;
    pthread_mutex_lock(&g->mu);
    const char *why = c->cut;
    pthread_mutex_unlock(&g->mu);
    return why;
}
