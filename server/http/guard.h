/* guard.h - connection slots and read deadlines, against clients that are
 * slow on purpose (slowloris) or that hold connections without finishing a
 * request: each connection's phase, its deadline and eviction (above
 * guard_phase).
 */
#ifndef ATTND_GUARD_H
#define ATTND_GUARD_H

#include <stddef.h>

/* Every open connection has a record with a phase:
 *   GUARD_HEADER  waiting for a request's header lines; deadline
 *                 header_timeout_ms from the connection's start or from its
 *                 last answer (so an idle keep-alive connection has it too);
 *   GUARD_BODY    header lines in, body arriving; deadline body_timeout_ms
 *                 from the last header line;
 *   GUARD_LINGER  refused at its header lines (413, 429), its body read
 *                 and dropped so that a client that reads only after it has
 *                 sent everything still hears the answer; deadline the
 *                 shorter of linger_ms and body_timeout_ms from the refusal:
 *                 a refused body gets no more time than an accepted one;
 *   GUARD_BUSY    the whole request is in (parsing, queued, computing or
 *                 being answered): no read deadline.
 * These are whole-phase deadlines, not idle timeouts: a byte that arrives
 * does not move them. A connection past its deadline is shut down with
 * shutdown(2); the HTTP library then reads EOF and closes it, so a
 * descriptor is never closed under its owner.
 *
 * Slots: when a new connection leaves fewer than `reserve` of max_conns
 * slots free, the connection not in GUARD_BUSY that has waited
 * longest is shut down the same way (evicted). Slow clients so cannot keep
 * every slot, and a connection whose request is complete is never evicted.
 *
 * No HTTP library in here: descriptors, one mutex and one thread.
 */
typedef enum { GUARD_HEADER = 0, GUARD_BODY, GUARD_LINGER, GUARD_BUSY } guard_phase;

typedef struct attnd_guard attnd_guard;
typedef struct guard_conn guard_conn;

/* Starts the deadline thread. max_conns: the connection limit; the reserve
 * is max_conns / 16, at least 1. Deadlines in ms (above). Returns NULL with
 * err set. */
attnd_guard *attnd_guard_new(int max_conns, int header_ms, int body_ms, int linger_ms, char *err,
                             size_t errlen);
/* Stops the thread and frees every record still held. NULL is fine. */
void attnd_guard_free(attnd_guard *g);

/* A connection on descriptor fd started (phase GUARD_HEADER); may evict
 * another one. Returns its record, or NULL when out of memory (then fd has
 * been shut down). */
guard_conn *attnd_guard_open(attnd_guard *g, int fd);
/* The connection is about to be closed: drops its record. NULL is fine. */
void attnd_guard_close(attnd_guard *g, guard_conn *c);
/* The connection entered phase p; its deadline starts now. NULL is fine. */
void attnd_guard_phase(attnd_guard *g, guard_conn *c, guard_phase p);
/* Why the guard shut the connection down ("header_timeout", "body_timeout",
 * "linger_timeout", "evicted"), or NULL when it did not. */
const char *attnd_guard_cut(attnd_guard *g, guard_conn *c);

#endif
