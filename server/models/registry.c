/* registry.c - the table of models and their versions (registry.h): the
 * slots, the switch from one version to the next, the frees, and the
 * index. The loader thread is loader.c's.
 */
#include "registry.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../obs/log.h"
#include "../obs/prom.h"
#include "loader.h"

/* One name the table knows. Guarded by the table's mutex. */
typedef struct {
    char name[ATTND_NAME_MAX];
    attnd_version *serving; /* holds one reference; NULL when none serves */
    attnd_version *held;    /* every version of it still alive, newest first (older) */
    attnd_model_state state;
    int last_version;  /* versions given so far */
    char reason[1024]; /* why the last load or unload left it as it is; "" when fine */
    long long loads_ok, loads_failed, unloads_ok;
} slot;

struct attnd_models {
    pthread_mutex_t mu;      /* the slots, their versions, bytes */
    pthread_mutex_t load_mu; /* one load at a time */
    slot **slots;            /* (n), each allocated once: its place never moves */
    int n, cap;
    long long bytes;     /* weights of every version alive */
    int versions;        /* versions alive */
    long long max_bytes; /* 0: no bound */
    long long reloads_ok, reloads_failed;
    attnd_loader *loader; /* the loader thread, or NULL */
};

attnd_models *attnd_models_new(long long max_bytes) {
    attnd_models *ms = calloc(1, sizeof *ms);
    if (!ms) return NULL;
    pthread_mutex_init(&ms->mu, NULL);
    pthread_mutex_init(&ms->load_mu, NULL);
    ms->max_bytes = max_bytes;
    return ms;
}

/* ---- slots (mutex held) ---- */

static slot *find_slot(attnd_models *ms, const char *name) {
    for (int i = 0; i < ms->n; i++)
        if (strcmp(ms->slots[i]->name, name) == 0) return ms->slots[i];
    return NULL;
}

static int slot_index(attnd_models *ms, const slot *s) {
    for (int i = 0; i < ms->n; i++)
        if (ms->slots[i] == s) return i;
    return -1;
}

/* The slot of name, made when it is new; NULL when out of memory. */
static slot *add_slot(attnd_models *ms, const char *name) {
    slot *s = find_slot(ms, name);
    if (s) return s;
    if (ms->n == ms->cap) {
        int cap = ms->cap ? ms->cap * 2 : 8;
        slot **t = realloc(ms->slots, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        ms->slots = t;
        ms->cap = cap;
    }
    if (!(s = calloc(1, sizeof *s))) return NULL;
    snprintf(s->name, sizeof s->name, "%s", name);
    ms->slots[ms->n++] = s;
    return s;
}

/* ---- the end of a version ---- */

/* Frees what v holds. Its weights are buffers of a mebibyte or more, which
 * the allocator maps on their own (main.c sets the threshold) and so gives
 * back to the system here: the memory of a daemon that unloaded a model
 * drops. */
static void destroy(attnd_version *v) {
    attn_model_free(&v->model);
    attnd_model_config_free(&v->mc);
    free(v);
}

static void destroy_task(void *v) {
    destroy(v);
}

/* The last reference to v went: out of its slot's list, its bytes given
 * back, then freed on the loader thread (or here, without one). */
static void release(attnd_version *v, void *arg) {
    attnd_models *ms = arg;
    pthread_mutex_lock(&ms->mu);
    slot *s = ms->slots[v->slot];
    for (attnd_version **p = &s->held; *p; p = &(*p)->older)
        if (*p == v) {
            *p = v->older;
            break;
        }
    ms->bytes -= (long long)v->info.bytes;
    ms->versions--;
    if (s->state == MODEL_UNLOADING && !s->held) s->state = MODEL_UNAVAILABLE;
    pthread_mutex_unlock(&ms->mu);
    attnd_log(LOG_INFO, "model %s: version %d freed (%zu bytes)", v->name, v->info.version,
              v->info.bytes);
    if (!ms->loader || attnd_loader_post(ms->loader, destroy_task, v) < 0) destroy_task(v);
}

/* ---- loading ---- */

/* s when bf16 products run on the avx512-bf16 kernels (whose form
 * attn_bf16_products names, measured at the first such load), else "". */
static const char *products(const char *s) {
    return *attn_bf16_products() ? s : "";
}

/* An int8 model's line: its kernels, or what it computes in instead and why. */
static void log_int8(const attnd_version *v) {
    const char *attn = v->model.attn16 ? "bf16" : "fp32";
    if (v->model.precision == ATTN_INT8) {
        attnd_log(LOG_INFO, "model %s: precision int8 on %s kernels, attention in %s%s%s", v->name,
                  attn_int8_kernels(), attn, v->model.attn16 ? products("; bf16 products on ") : "",
                  v->model.attn16 ? products(attn_bf16_products()) : "");
        return;
    }
    attnd_log(LOG_WARN, "model %s: precision int8 asked for, but %s: it computes in %s", v->name,
              strcmp(attn_int8_cpu_kernels(), "none") == 0
                  ? "this CPU has none of AVX-VNNI, AVX512-VNNI and AMX-INT8"
              : strcmp(attn_int8_kernels(), "none") == 0
                  ? "workers.int8_kernels is \"none\""
                  : "an input width is past the int8 kernels' 65536",
              attnd_enum_name(&attnd_precisions, v->model.precision));
}

/* The model's line in the log: what it is and what it computes with. */
static void log_loaded(const attnd_version *v, double ms) {
    const attn_hparams *hp = &v->model.hp;
    attnd_log(LOG_INFO,
              "model %s: version %d loaded in %.0f ms: embed_dim=%d num_heads=%d kdim=%d vdim=%d "
              "bias=%s causal=%s precision=%s weights=%s (%zu bytes)",
              v->name, v->info.version, ms, hp->embed_dim, hp->num_heads, hp->kdim, hp->vdim,
              hp->bias ? "true" : "false", hp->causal ? "true" : "false",
              attnd_enum_name(&attnd_precisions, hp->precision),
              v->mc.weights ? v->mc.weights : "embedded default (fixed seed)", v->info.bytes);
    if (hp->precision == ATTN_INT8) {
        log_int8(v);
        return;
    }
    if (hp->precision != ATTN_BF16) return;
    if (v->model.precision == ATTN_BF16)
        attnd_log(LOG_INFO, "model %s: precision bf16 on %s kernels, attention in %s%s%s%s",
                  v->name, attn_bf16_kernels(), v->model.attn16 ? "bf16" : "fp32",
                  v->model.attn16 ? "" : " (its head width has no bf16 attention kernel)",
                  products("; bf16 products on "), products(attn_bf16_products()));
    else
        attnd_log(LOG_WARN, "model %s: precision bf16 asked for, but %s: it computes in fp32",
                  v->name,
                  strcmp(attn_bf16_cpu_kernels(), "none") == 0
                      ? "this CPU has neither AVX512-BF16 nor AMX-BF16"
                      : "workers.bf16_kernels is \"none\"");
}

/* A new version of mc read from its file and packed; NULL with e set. */
static attnd_version *read_version(const attnd_model_config *mc, attnd_error *e) {
    attnd_version *v = calloc(1, sizeof *v);
    char err[sizeof e->msg - ATTND_NAME_MAX - 8];
    if (!v || attnd_model_config_copy(&v->mc, mc) < 0) {
        if (v) attnd_model_config_free(&v->mc);
        free(v);
        attnd_set_error(e, AERR_INTERNAL, "model %s: out of memory", mc->name);
        return NULL;
    }
    attnd_file_identify(mc->weights, &v->file);
    if (attnd_model_load(&v->model, mc, err, sizeof err) < 0) {
        attnd_set_error(e, AERR_BAD_REQUEST, "model %s: %s", mc->name, err);
        destroy(v);
        return NULL;
    }
    snprintf(v->name, sizeof v->name, "%s", mc->name);
    attnd_weights_fingerprint(&v->model, v->fingerprint);
    const attn_model *m = &v->model;
    v->info = (attnd_model_info){.name = v->name,
                                 .hp = m->hp,
                                 .max_positions = mc->max_positions,
                                 .fingerprint = v->fingerprint,
                                 .precision = m->precision,
                                 .kv16 = m->attn16,
                                 .rows_free = attn_model_rows_free(m),
                                 .bytes = attn_model_bytes(m),
                                 .version = 0, /* switch_to numbers it */
                                 .from_file = mc->weights != NULL};
    v->release = release;
    return v;
}

/* 1 when v serves the same entry with the same weights as n. */
static int unchanged(const attnd_version *v, const attnd_version *n) {
    return v && attnd_model_config_equal(&v->mc, &n->mc) &&
           strcmp(v->fingerprint, n->fingerprint) == 0;
}

/* A load failed: counted, and its sentence is the model's reason. */
static int load_failed(attnd_models *ms, slot *s, const attnd_error *e) {
    pthread_mutex_lock(&ms->mu);
    s->loads_failed++;
    snprintf(s->reason, sizeof s->reason, "%s", e->msg);
    if (!s->serving && s->state == MODEL_LOADING) /* old versions may still be held */
        s->state = s->held ? MODEL_UNLOADING : MODEL_UNAVAILABLE;
    int serving = s->serving != NULL;
    pthread_mutex_unlock(&ms->mu);
    attnd_log(LOG_ERROR, "%s%s", e->msg, serving ? " (the version serving keeps serving)" : "");
    return -1;
}

/* Switches s to n (mutex held): n's number given, its bytes counted;
 * returns the version that served before, whose reference is the caller's
 * to drop (outside the mutex: it may be the last). */
static attnd_version *switch_to(attnd_models *ms, slot *s, attnd_version *n) {
    n->slot = slot_index(ms, s);
    n->info.version = ++s->last_version;
    n->release_arg = ms;
    atomic_store(&n->refs, 1); /* the slot's */
    n->older = s->held;
    s->held = n;
    ms->bytes += (long long)n->info.bytes;
    ms->versions++;
    attnd_version *old = s->serving;
    s->serving = n;
    s->state = MODEL_READY;
    s->reason[0] = '\0';
    s->loads_ok++;
    return old;
}

/* The refusal of a load past limits.max_model_bytes (mutex held). */
static int no_room(attnd_models *ms, const attnd_version *n, attnd_error *e) {
    return attnd_set_error(e, AERR_NO_ROOM,
                           "model %s: its %zu bytes of weights would pass limits.max_model_bytes "
                           "(%lld): %lld bytes are held by the versions loaded (old versions "
                           "still in use included); unload a model or raise the limit",
                           n->name, n->info.bytes, ms->max_bytes, ms->bytes);
}

/* Checks n against the bound and switches to it; 0 with *old the version
 * that served before (the caller's reference to drop), 1 when unchanged
 * (LOAD_IF_CHANGED), or -1 with e set. */
static int place(attnd_models *ms, slot *s, attnd_version *n, int flags, int *version,
                 attnd_version **old, attnd_error *e) {
    pthread_mutex_lock(&ms->mu);
    if ((flags & LOAD_IF_CHANGED) && unchanged(s->serving, n)) {
        s->serving->file = n->file; /* the same weights, rewritten: no need to read it again */
        *version = s->serving->info.version;
        pthread_mutex_unlock(&ms->mu);
        return 1;
    }
    if (ms->max_bytes && ms->bytes + (long long)n->info.bytes > ms->max_bytes) {
        no_room(ms, n, e);
        pthread_mutex_unlock(&ms->mu);
        return -1;
    }
    *old = switch_to(ms, s, n);
    *version = n->info.version;
    pthread_mutex_unlock(&ms->mu);
    return 0;
}

int attnd_models_load(attnd_models *ms, const attnd_model_config *mc, int flags, int *version,
                      attnd_error *e) {
    pthread_mutex_lock(&ms->load_mu);
    pthread_mutex_lock(&ms->mu);
    slot *s = add_slot(ms, mc->name);
    if (s && !s->serving) s->state = MODEL_LOADING;
    pthread_mutex_unlock(&ms->mu);
    int rc = -1;
    if (!s) { /* logged as every failed load is */
        attnd_set_error(e, AERR_INTERNAL, "model %s: out of memory", mc->name);
        attnd_log(LOG_ERROR, "%s", e->msg);
        goto done;
    }
    uint64_t t0 = attnd_mono_us();
    attnd_version *n = read_version(mc, e);
    if (!n) {
        load_failed(ms, s, e);
        goto done;
    }
    attnd_version *old = NULL;
    rc = place(ms, s, n, flags, version, &old, e);
    if (rc < 0) {
        destroy(n);
        load_failed(ms, s, e);
    } else if (rc == 1) {
        destroy(n);
        attnd_log(LOG_INFO, "model %s: weights unchanged, version %d keeps serving", mc->name,
                  *version);
        rc = 0;
    } else {
        log_loaded(n, (double)(attnd_mono_us() - t0) / 1000.0);
        attnd_version_unref(old); /* freed once its requests and sessions end */
    }
done:
    pthread_mutex_unlock(&ms->load_mu);
    return rc;
}

void attnd_models_refused(attnd_models *ms, const char *name, const attnd_error *e) {
    size_t n = strlen(name);
    if (n == 0 || n >= ATTND_NAME_MAX ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
        return; /* not a model's name: it could never load */
    pthread_mutex_lock(&ms->mu);
    slot *s = add_slot(ms, name);
    pthread_mutex_unlock(&ms->mu);
    if (s) load_failed(ms, s, e);
}

int attnd_models_unload(attnd_models *ms, const char *name, attnd_error *e) {
    pthread_mutex_lock(&ms->mu);
    slot *s = find_slot(ms, name);
    if (!s) {
        char names[160];
        pthread_mutex_unlock(&ms->mu);
        return attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%.64s' (loaded: %s)", name,
                               attnd_models_names(ms, names, sizeof names));
    }
    attnd_version *old = s->serving;
    if (old) {
        s->serving = NULL;
        s->state = MODEL_UNLOADING; /* until its last version is let go, maybe at once */
        snprintf(s->reason, sizeof s->reason, "unloaded");
        s->unloads_ok++;
    }
    pthread_mutex_unlock(&ms->mu);
    if (old) attnd_log(LOG_INFO, "model %s: unloaded (version %d)", name, old->info.version);
    attnd_version_unref(old);
    return 0;
}

/* ---- lookups ---- */

int attnd_version_check(const attnd_version *v, const char *version, attnd_error *e) {
    char serving[16];
    snprintf(serving, sizeof serving, "%d", v->info.version);
    if (!version || !version[0] || strcmp(version, serving) == 0) return 0;
    return attnd_set_error(e, AERR_NOT_FOUND,
                           "unknown version '%.40s' of model '%s' (version %s serves; a reload "
                           "replaces a version, the repository index lists them: POST "
                           "/v2/repository/index, gRPC RepositoryIndex)",
                           version, v->name, serving);
}

attnd_version *attnd_models_get(attnd_models *ms, const char *name, attnd_error *e) {
    char why[256] = "unloaded"; /* s->reason copied under the mutex: a load rewrites it */
    pthread_mutex_lock(&ms->mu);
    slot *s = find_slot(ms, name);
    attnd_version *v = s ? s->serving : NULL;
    attnd_version_ref(v);
    if (s && !v && s->reason[0]) snprintf(why, sizeof why, "%.200s", s->reason);
    pthread_mutex_unlock(&ms->mu);
    if (v) return v;
    char names[160];
    attnd_models_names(ms, names, sizeof names);
    if (s)
        attnd_set_error(e, AERR_NOT_FOUND, "model '%.64s' is not loaded (%s; loaded: %s)", name,
                        why, names);
    else
        attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%.64s' (loaded: %s)", name, names);
    return NULL;
}

attnd_version *attnd_models_sole(attnd_models *ms) {
    attnd_version *one = NULL;
    int serving = 0;
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; i < ms->n; i++)
        if (ms->slots[i]->serving) {
            one = ms->slots[i]->serving;
            serving++;
        }
    if (serving != 1) one = NULL;
    attnd_version_ref(one);
    pthread_mutex_unlock(&ms->mu);
    return one;
}

/* One more reference on v, unless its last one went (mutex held): such a
 * version is still on its slot's list, its release waiting for the mutex
 * to take it off and free it. 1 when taken. */
static int ref_if_held(attnd_version *v) {
    int n = atomic_load(&v->refs);
    while (n > 0 && !atomic_compare_exchange_weak(&v->refs, &n, n + 1))
        ;
    return n > 0;
}

attnd_version *attnd_models_find(attnd_models *ms, const char *name, const char *fingerprint) {
    attnd_version *hit = NULL;
    pthread_mutex_lock(&ms->mu);
    slot *s = find_slot(ms, name);
    for (attnd_version *v = s ? s->held : NULL; v && !hit; v = v->older)
        if (strcmp(v->fingerprint, fingerprint) == 0 && ref_if_held(v)) hit = v;
    pthread_mutex_unlock(&ms->mu);
    return hit;
}

int attnd_models_slot(attnd_models *ms, const char *name) {
    pthread_mutex_lock(&ms->mu);
    slot *s = find_slot(ms, name);
    int i = s && s->serving ? slot_index(ms, s) : -1;
    pthread_mutex_unlock(&ms->mu);
    return i;
}

int attnd_models_slots(attnd_models *ms) {
    pthread_mutex_lock(&ms->mu);
    int n = ms->n;
    pthread_mutex_unlock(&ms->mu);
    return n;
}

int attnd_models_serving(attnd_models *ms, attnd_version **out, int cap) {
    int k = 0;
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; i < ms->n; i++) {
        attnd_version *v = ms->slots[i]->serving;
        if (!v) continue;
        if (k < cap) {
            attnd_version_ref(v);
            out[k] = v;
        }
        k++;
    }
    pthread_mutex_unlock(&ms->mu);
    return k;
}

const char *attnd_models_names(attnd_models *ms, char *buf, size_t cap) {
    size_t n = 0;
    int first = 1;
    buf[0] = '\0';
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; i < ms->n && n < cap; i++) {
        if (!ms->slots[i]->serving) continue;
        int k = snprintf(buf + n, cap - n, "%s%s", first ? "" : ", ", ms->slots[i]->name);
        n += k > 0 ? (size_t)k : 0;
        first = 0;
    }
    pthread_mutex_unlock(&ms->mu);
    if (n >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
    return buf;
}

/* ---- the loader thread ---- */

typedef struct {
    attnd_models *ms;
    attnd_model_config mc;
    int flags;
    attnd_load_done done;
    void *arg;
} load_task;

static void load_task_run(void *arg) {
    load_task *t = arg;
    attnd_error e = {AOK, ""};
    int version = 0;
    int rc = attnd_models_load(t->ms, &t->mc, t->flags, &version, &e);
    t->done(t->arg, rc, version, &e);
    attnd_model_config_free(&t->mc);
    free(t);
}

int attnd_models_start(attnd_models *ms) {
    ms->loader = attnd_loader_new();
    return ms->loader ? 0 : -1;
}

/* attnd_models_load_async with flags. */
static int post_load(attnd_models *ms, const attnd_model_config *mc, int flags,
                     attnd_load_done done, void *arg, attnd_error *e) {
    load_task *t = calloc(1, sizeof *t);
    if (!t || attnd_model_config_copy(&t->mc, mc) < 0) {
        if (t) attnd_model_config_free(&t->mc);
        free(t);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    t->ms = ms;
    t->flags = flags;
    t->done = done;
    t->arg = arg;
    if (!ms->loader || attnd_loader_post(ms->loader, load_task_run, t) < 0) {
        attnd_model_config_free(&t->mc);
        free(t);
        return attnd_set_error(e, AERR_UNAVAILABLE, "draining");
    }
    return 0;
}

int attnd_models_load_async(attnd_models *ms, const attnd_model_config *mc, attnd_load_done done,
                            void *arg, attnd_error *e) {
    return post_load(ms, mc, 0, done, arg, e);
}

/* A load waited for: its result, and whether it is in. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc, version;
    attnd_error e;
} waiter;

static void wake(void *arg, int rc, int version, const attnd_error *e) {
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->version = version;
    w->e = *e;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int attnd_models_load_wait(attnd_models *ms, const attnd_model_config *mc, int flags, int *version,
                           attnd_error *e) {
    waiter w = {.done = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    int rc = post_load(ms, mc, flags, wake, &w, e);
    if (rc < 0) /* no loader thread (stopping, or never started): here */
        rc = attnd_models_load(ms, mc, flags, version, e);
    else {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        rc = w.rc;
        *version = w.version;
        *e = w.e;
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

void attnd_models_stop(attnd_models *ms) {
    if (ms) attnd_loader_stop(ms->loader);
}

void attnd_models_free(attnd_models *ms) {
    if (!ms) return;
    attnd_models_stop(ms);
    for (int i = 0; i < ms->n; i++) {
        attnd_version *v = ms->slots[i]->serving;
        ms->slots[i]->serving = NULL;
        attnd_version_unref(v); /* the last reference: nothing else holds one now */
    }
    attnd_loader_free(ms->loader);
    for (int i = 0; i < ms->n; i++)
        free(ms->slots[i]);
    free(ms->slots);
    pthread_mutex_destroy(&ms->mu);
    pthread_mutex_destroy(&ms->load_mu);
    free(ms);
}

/* ---- the index and the metrics ---- */

static const char *const STATE_WORDS[] = {
    [MODEL_UNAVAILABLE] = "UNAVAILABLE",
    [MODEL_LOADING] = "LOADING",
    [MODEL_READY] = "READY",
    [MODEL_UNLOADING] = "UNLOADING",
};

static int by_name(const void *a, const void *b) {
    return strcmp((*(slot *const *)a)->name, (*(slot *const *)b)->name);
}

/* One model of the index (mutex held). */
static json_t *index_entry(const slot *s) {
    json_t *j = json_pack("{s:s}", "name", s->name);
    int version = s->serving ? s->serving->info.version : s->last_version;
    if (version) {
        char v[16];
        snprintf(v, sizeof v, "%d", version);
        json_object_set_new(j, "version", json_string(v));
    }
    json_object_set_new(j, "state", json_string(STATE_WORDS[s->state]));
    json_object_set_new(j, "reason", json_string(s->reason));
    return j;
}

char *attnd_models_index(attnd_models *ms, int ready_only, size_t *len) {
    json_t *arr = json_array();
    pthread_mutex_lock(&ms->mu);
    slot **sorted = malloc((size_t)(ms->n ? ms->n : 1) * sizeof *sorted);
    if (sorted) {
        memcpy(sorted, ms->slots, (size_t)ms->n * sizeof *sorted);
        qsort(sorted, (size_t)ms->n, sizeof *sorted, by_name);
        for (int i = 0; i < ms->n; i++)
            if (!ready_only || sorted[i]->state == MODEL_READY)
                json_array_append_new(arr, index_entry(sorted[i]));
    }
    pthread_mutex_unlock(&ms->mu);
    char *body = sorted ? json_dumps(arr, JSON_COMPACT) : NULL;
    free(sorted);
    json_decref(arr);
    *len = body ? strlen(body) : 0;
    return body;
}

void attnd_models_reason_serving(attnd_models *ms, const char *reason) {
    pthread_mutex_lock(&ms->mu);
    const char *failed = ATTND_REASON_RELOAD_FAILED;
    for (int i = 0; i < ms->n; i++) {
        char *now = ms->slots[i]->reason;
        if (ms->slots[i]->serving && (reason[0] || !strncmp(now, failed, strlen(failed))))
            snprintf(now, sizeof ms->slots[i]->reason, "%s", reason);
    }
    pthread_mutex_unlock(&ms->mu);
}

void attnd_models_count_reload(attnd_models *ms, int ok) {
    pthread_mutex_lock(&ms->mu);
    if (ok)
        ms->reloads_ok++;
    else
        ms->reloads_failed++;
    pthread_mutex_unlock(&ms->mu);
}

/* A counter by model and result: every model's ok and failed. */
static void per_model(attnd_models *ms, attnd_sbuf *b, const char *name, const char *help,
                      size_t ok_off, size_t failed_off) {
    attnd_prom_family(b, name, PROM_COUNTER, help);
    for (int i = 0; i < ms->n; i++) {
        const slot *s = ms->slots[i];
        attnd_prom_label l[2] = {{"model", s->name}, {"result", "ok"}};
        attnd_prom_sample(b, name, l, 2, *(const long long *)((const char *)s + ok_off));
        l[1].value = "failed";
        attnd_prom_sample(b, name, l, 2, *(const long long *)((const char *)s + failed_off));
    }
}

void attnd_models_metrics(attnd_models *ms, attnd_sbuf *b) {
    pthread_mutex_lock(&ms->mu);
    per_model(ms, b, "attnd_model_loads_total", "Model loads, by model and result.",
              offsetof(slot, loads_ok), offsetof(slot, loads_failed));
    attnd_prom_family(b, "attnd_model_unloads_total", PROM_COUNTER,
                      "Model unloads, by model and result.");
    for (int i = 0; i < ms->n; i++) {
        attnd_prom_label l[2] = {{"model", ms->slots[i]->name}, {"result", "ok"}};
        attnd_prom_sample(b, "attnd_model_unloads_total", l, 2, ms->slots[i]->unloads_ok);
    }
    attnd_prom_family(b, "attnd_model_version", PROM_GAUGE,
                      "The version of a model serving now (1 for its first load).");
    for (int i = 0; i < ms->n; i++)
        if (ms->slots[i]->serving) {
            attnd_prom_label l = {"model", ms->slots[i]->name};
            attnd_prom_sample(b, "attnd_model_version", &l, 1, ms->slots[i]->serving->info.version);
        }
    attnd_prom_single(b, "attnd_model_weights_bytes", PROM_GAUGE,
                      "Bytes of weights held, every version still in use included.", ms->bytes);
    attnd_prom_single(b, "attnd_model_versions_held", PROM_GAUGE,
                      "Model versions held: those serving and older ones still in use.",
                      ms->versions);
    attnd_prom_family(b, "attnd_config_reloads_total", PROM_COUNTER,
                      "Config file readings on SIGHUP, by result.");
    attnd_prom_label ok = {"result", "ok"}, failed = {"result", "failed"};
    attnd_prom_sample(b, "attnd_config_reloads_total", &ok, 1, ms->reloads_ok);
    attnd_prom_sample(b, "attnd_config_reloads_total", &failed, 1, ms->reloads_failed);
    pthread_mutex_unlock(&ms->mu);
}
