/* registry.h - the models the daemon knows, by name, and the versions of
 * each (SPEC section 12). A name keeps its place in the table (its slot:
 * the index of its queue in the scheduler) from its first load to the
 * end, unloaded or not, so that the index lists it and its counters go on.
 *
 * A load reads and packs the weights beside the version serving, then
 * switches in one step under the table's mutex: whoever asks for the model
 * after it gets the new version, whoever holds the old one (a queued or
 * running request, a session) keeps it until done, and the last to let go
 * frees it. Loads run one at a time; those the HTTP side asks for run on
 * the table's loader thread at a low priority, so that the compute keeps
 * the CPUs; the frees run there too, off the request path.
 * No HTTP: a request's answer is the caller's, through a callback.
 */
#ifndef ATTND_REGISTRY_H
#define ATTND_REGISTRY_H

#include <stddef.h>

#include "../../config/config.h"
#include "../base/buffer.h"
#include "../base/reply.h"
#include "version.h"

/* What the index says of a model (its "state"). */
typedef enum {
    MODEL_UNAVAILABLE = 0, /* no version serves: unloaded, or its load failed */
    MODEL_LOADING,         /* its first version is being loaded */
    MODEL_READY,           /* a version serves (a reload may be under way beside it) */
    MODEL_UNLOADING        /* unloaded, but requests or sessions still hold a version */
} attnd_model_state;

typedef struct attnd_models attnd_models;

/* An empty table; max_bytes bounds the weights held over every version
 * (limits.max_model_bytes; 0: no bound). NULL when out of memory. */
attnd_models *attnd_models_new(long long max_bytes);
/* Stops the loader (attnd_models_stop) and frees the table with the
 * versions it serves; nothing else may hold one. NULL is fine. */
void attnd_models_free(attnd_models *ms);

/* A load that comes from SIGHUP: when the model serves a version of the
 * same entry with the same weights (fingerprint), nothing changes. */
enum { LOAD_IF_CHANGED = 1 };

/* Loads mc as the next version of its model and switches to it; logs it.
 * Returns 0 with *version the one serving now (unchanged with
 * LOAD_IF_CHANGED when the weights are the same), or -1 with e set: 400
 * when the weights file cannot be read or does not fit the entry, 507 past
 * max_bytes, 500 out of memory. A failure leaves the version serving as it
 * was; its sentence becomes the index's reason. */
int attnd_models_load(attnd_models *ms, const attnd_model_config *mc, int flags, int *version,
                      attnd_error *e);
/* A load of name refused before it reached the table (its entry or its
 * weights path did not pass): counted and shown as the reason, as a load
 * that failed here is; a name that is not a model's is left out. */
void attnd_models_refused(attnd_models *ms, const char *name, const attnd_error *e);
/* Stops serving model name: new requests no longer find it, those holding
 * a version finish on it. 0 (a model already unloaded too), or -1 with the
 * 404 of a name never loaded. */
int attnd_models_unload(attnd_models *ms, const char *name, attnd_error *e);

/* The loader thread. A load given to it runs there; done is called there
 * with the result (rc and e as attnd_models_load gives them). */
typedef void (*attnd_load_done)(void *arg, int rc, int version, const attnd_error *e);
int attnd_models_start(attnd_models *ms); /* 0, or -1 when the thread cannot start */
/* Queues a load of mc (copied) on the loader thread. 0, or -1 with e set
 * (503 once stopping, 500 out of memory): done is then never called. */
int attnd_models_load_async(attnd_models *ms, const attnd_model_config *mc, attnd_load_done done,
                            void *arg, attnd_error *e);
/* attnd_models_load on the loader thread (at its priority), waited for. */
int attnd_models_load_wait(attnd_models *ms, const attnd_model_config *mc, int flags, int *version,
                           attnd_error *e);
/* Runs what is queued, then joins the loader; later frees run inline.
 * Later calls do nothing. */
void attnd_models_stop(attnd_models *ms);

/* The version of name serving now, with a reference for the caller, or
 * NULL with e set: the 404 of a name not served ("unknown model 'x'
 * (loaded: a, b)", or that it is not loaded). */
attnd_version *attnd_models_get(attnd_models *ms, const char *name, attnd_error *e);
/* 0 when version (a route's {version}, a message's model_version) is ""
 * or v's own; else -1 with the 404 that names the version serving, in the
 * one sentence HTTP and gRPC answer. */
int attnd_version_check(const attnd_version *v, const char *version, attnd_error *e);
/* The one model served when exactly one is, with a reference; else NULL. */
attnd_version *attnd_models_sole(attnd_models *ms);
/* A version of name still held (serving or not) whose weights have this
 * fingerprint, with a reference; NULL when none. */
attnd_version *attnd_models_find(attnd_models *ms, const char *name, const char *fingerprint);
/* The slot of name when it serves now, else -1. */
int attnd_models_slot(attnd_models *ms, const char *name);
/* Slots so far: every queue index is below it. */
int attnd_models_slots(attnd_models *ms);

/* The versions serving, by slot, each with a reference, into out[0..cap);
 * returns how many serve (which may be more than cap). */
int attnd_models_serving(attnd_models *ms, attnd_version **out, int cap);
/* "a, b, c": the names served, for messages (cut to fit, ending "...");
 * returns buf. */
const char *attnd_models_names(attnd_models *ms, char *buf, size_t cap);

/* POST /v2/repository/index: a JSON array of every model known, by name:
 * {"name", "version" (serving, or last served; absent when none), "state",
 * "reason"}; ready_only: the READY ones. NULL when out of memory. */
char *attnd_models_index(attnd_models *ms, int ready_only, size_t *len);
/* The start of the reason every model serving shows while the config file
 * failed to read at the last SIGHUP (the error follows it). */
#define ATTND_REASON_RELOAD_FAILED "the config file failed to read at the last SIGHUP: "
/* Sets the reason every model serving shows: a config that failed to read
 * (reason starts with ATTND_REASON_RELOAD_FAILED); "" once one reads again
 * clears that reason only: a model whose last load failed keeps saying
 * why, and those that do not serve keep theirs. */
void attnd_models_reason_serving(attnd_models *ms, const char *reason);

/* Counts a SIGHUP's reading of the config: ok 1 or 0. */
void attnd_models_count_reload(attnd_models *ms, int ok);
/* The table's metrics: loads and unloads by model and result, the version
 * serving, the bytes and versions held, the config reloads. */
void attnd_models_metrics(attnd_models *ms, attnd_sbuf *b);

#endif
