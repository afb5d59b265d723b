/* version.h - one loaded version of a served model: its weights packed for
 * the core, what the request readers check bodies against, and the count
 * of who holds it. A version is shared: the model table holds the one
 * serving, every request admitted on it and every KV-cache session opened
 * on it hold it too, so that a reload or an unload never pulls weights
 * from under a request or a session. The last to let go frees it (through
 * the table that made it: registry.c). No HTTP, no threads of its own.
 */
#ifndef ATTND_VERSION_H
#define ATTND_VERSION_H

#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

#include "../../config/config.h"
#include "../../core/attn.h"
#include "../session/state.h"

/* What the request readers need to know about one served model. */
typedef struct {
    const char *name;        /* the model's name (its version's copy) */
    attn_hparams hp;         /* E, H, kdim, vdim, bias, causal default, decoder options */
    int max_positions;       /* rotary positions must stay below it; 0 = 2^24 */
    const char *fingerprint; /* its weights' fingerprint as loaded (session state files,
                                session/state.h); NULL when not computed */
    /* what computes, settled at load (attn_model_pack): */
    attn_precision precision; /* INT8, BF16, or FP32: what it computes in (attn_model.precision) */
    int kv16;                 /* 1: a session's cache is bf16 pages (attn_model.attn16) */
    int rows_free;            /* 1: a row's bits do not depend on the rows beside it
                                 (attn_model_rows_free): a step of n rows is n steps */
    size_t bytes;             /* the model's memory (attn_model_bytes) */
    int version;              /* 1, 2, ...: the loads of this name so far, this one included */
    int from_file;            /* 1: weights from a safetensors file; 0: the embedded default */
} attnd_model_info;

/* Which file a version's weights came from, as stat() saw it at load:
 * what SIGHUP compares to tell an unchanged file from a rewritten one
 * before it reads the file again. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    long long mtime_ns;
} attnd_file_id;

typedef struct attnd_version attnd_version;

struct attnd_version {
    atomic_int refs;
    int slot;                  /* its model's place in the table: the queue it joins */
    attnd_model_info info;     /* name and fingerprint point into this struct */
    char name[ATTND_NAME_MAX]; /* the model's name */
    char fingerprint[ATTND_FINGERPRINT_LEN + 1];
    attn_model model;      /* the weights, packed */
    attnd_model_config mc; /* the entry it was loaded from; owned */
    attnd_file_id file;    /* its weights file at load; zeroed for the embedded default */
    attnd_version *older;  /* the table's list of its model's versions still held */
    void (*release)(attnd_version *v, void *arg); /* the last reference went: free v */
    void *release_arg;
};

/* Takes one more reference on v. NULL is fine. */
void attnd_version_ref(attnd_version *v);
/* Lets one go; the last calls v->release. NULL is fine. */
void attnd_version_unref(attnd_version *v);

/* The identity of the file at path (attnd_file_id), zeroed when path is
 * NULL or cannot be stat'ed. */
void attnd_file_identify(const char *path, attnd_file_id *id);
/* 1 when a and b name the same file, unchanged. */
int attnd_file_same(const attnd_file_id *a, const attnd_file_id *b);

#endif
