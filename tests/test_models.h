/* test_models.h - real model tables (server/models/registry.h) for the
 * Check suites and the fuzz targets, in place of model descriptions made
 * by hand: a model entry as the config file gives one, loaded by the
 * registry, so that every version a test uses was made the daemon's way.
 *   test_model_entry    an entry: name, hyper-parameters, weights file (NULL:
 *                       the embedded default, config/default_model.c, drawn
 *                       for any plain shape: num_kv_heads H, head_dim E / H)
 *   test_weights_write  a model's fp32 floats as a safetensors file in
 *                       layout hf_proj (one tensor a role: any shape, decoder
 *                       ones too), which test_model_entry names for a file
 *   test_weights_temp   the same into a new file under /tmp; its path
 *   test_models_add     loads an entry into a table: the version serving
 *                       after it, held for the caller (attnd_version_unref)
 *   test_version_hold, test_version_drop  a session table's hooks, as the
 *                       daemon sets them (server.c)
 * They assert nothing: a failure returns -1 or NULL with err set, so that
 * the fuzz targets, which have no Check, use them too.
 */
#ifndef ATTND_TESTS_TEST_MODELS_H
#define ATTND_TESTS_TEST_MODELS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config/config.h"
#include "../core/attn.h"
#include "../server/models/registry.h"

/* The entry of model name: hp as given (what attnd_model_check would
 * settle, the tests set themselves), weights from the file at weights
 * (layout hf_proj, test_weights_write's), or the embedded default when
 * NULL. Its strings are the caller's or static: never
 * attnd_model_config_free it (the registry keeps its own copy). */
static inline attnd_model_config test_model_entry(const char *name, const attn_hparams *hp,
                                                  const char *weights) {
    attnd_model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.name, sizeof mc.name, "%s", name);
    mc.hp = *hp;
    mc.weights = (char *)weights;
    mc.prefix = (char *)"";
    mc.layout = (char *)(weights ? "hf_proj" : "torch");
    mc.precision = (char *)"fp32";
    return mc;
}

/* m's floats (an fp32 model: attn_model_init, filled, packed or not) as a
 * safetensors file at path, one F32 tensor a role under layout hf_proj's
 * names, in mem's order. 0, or -1 with err set. */
static inline int test_weights_write(const char *path, const attn_model *m, char *err,
                                     size_t errlen) {
    const attn_hparams *hp = &m->hp;
    long long E = hp->embed_dim, QD = (long long)hp->num_heads * hp->head_dim;
    long long KVD = (long long)hp->num_kv_heads * hp->head_dim;
    const struct {
        const char *name;
        const float *at;
        long long rows, cols; /* cols 0: a bias */
    } t[8] = {{"q_proj.weight", m->q_w, QD, E},         {"k_proj.weight", m->k_w, KVD, hp->kdim},
              {"v_proj.weight", m->v_w, KVD, hp->vdim}, {"q_proj.bias", m->q_b, QD, 0},
              {"k_proj.bias", m->k_b, KVD, 0},          {"v_proj.bias", m->v_b, KVD, 0},
              {"out_proj.weight", m->out_w, E, QD},     {"out_proj.bias", m->out_b, E, 0}};
    if (!m->q_w) {
        snprintf(err, errlen, "%s: the model holds no fp32 weights to write", path);
        return -1;
    }
    char h[2048];
    size_t at = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < 8; i++) {
        long long begin = (t[i].at - m->mem) * 4, n = t[i].rows * (t[i].cols ? t[i].cols : 1);
        char shape[64];
        if (t[i].cols)
            snprintf(shape, sizeof shape, "[%lld,%lld]", t[i].rows, t[i].cols);
        else
            snprintf(shape, sizeof shape, "[%lld]", t[i].rows);
        at += (size_t)snprintf(h + at, sizeof h - at,
                               ",\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%lld,"
                               "%lld]}",
                               t[i].name, shape, begin, begin + n * 4);
    }
    at += (size_t)snprintf(h + at, sizeof h - at, "}");
    while (at % 8 && at + 1 < sizeof h) /* the data starts 8-aligned: spaces pad the header */
        h[at++] = ' ';
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)at >> (8 * i));
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(len, 1, 8, f) == 8 && fwrite(h, 1, at, f) == at &&
             fwrite(m->mem, sizeof(float), m->n_floats, f) == m->n_floats;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) snprintf(err, errlen, "%s: cannot write the weights", path);
    return ok ? 0 : -1;
}

/* test_weights_write into a new file under /tmp, whose path goes to path
 * (cap bytes; the caller unlinks it). 0, or -1 with err set. */
static inline int test_weights_temp(const attn_model *m, char *path, size_t cap, char *err,
                                    size_t errlen) {
    snprintf(path, cap, "/tmp/attnd-test-weights-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot make a temporary file", path);
        return -1;
    }
    close(fd);
    return test_weights_write(path, m, err, errlen);
}

/* A session table's hooks (attnd_sessions_hooks) as the daemon sets them:
 * a session holds the version it was opened on. */
static inline void test_version_hold(void *v) {
    attnd_version_ref(v);
}

static inline void test_version_drop(void *v) {
    attnd_version_unref(v);
}

/* Loads mc into ms (attnd_models_load) and returns the version serving
 * then, with a reference for the caller; NULL with err set when the load
 * fails. */
static inline attnd_version *test_models_add(attnd_models *ms, const attnd_model_config *mc,
                                             char *err, size_t errlen) {
    attnd_error e = {AOK, ""};
    int version = 0;
    if (attnd_models_load(ms, mc, 0, &version, &e) < 0) {
        snprintf(err, errlen, "%s", e.msg);
        return NULL;
    }
    attnd_version *v = attnd_models_get(ms, mc->name, &e);
    if (!v) snprintf(err, errlen, "%s", e.msg);
    return v;
}

#endif
