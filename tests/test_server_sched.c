/* test_server_sched.c - the scheduler without HTTP: requests of different
 * kinds packed into one batch answer what each answers alone (naive
 * reference), a full queue refuses with 429, a request still queued at its
 * deadline is answered 504 without compute (its own deadline before an
 * older request's), a lone request on idle compute
 * is taken at once, requests that arrive while a batch computes form the
 * next batch together, a request whose client left (the departed
 * callback, the HTTP side's answer) is dropped without compute, and a
 * batch never mixes two versions of a model (a reload while it queues).
 * The model is loaded into a real table (server/models/) from weights
 * drawn here; each request holds the version it computes on. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/attn.h"
#include "../server/base/clock.h"
#include "../server/batch/sched.h"
#include "../server/body/request.h"
#include "../server/http/status.h"
#include "check_run.h"
#include "test_models.h"

/* A request as the HTTP side would hold it, plus a "done" flag. */
typedef struct {
    attnd_req r;
    int done;  /* guarded by mu */
    int leave; /* 1: the departed callback says its client left; set before submit */
} treq;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void treq_free(attnd_req *r) {
    attnd_req_clear(r);
    free(r);
}

/* A request whose answer, once handed over, holds the batcher (its
 * finish callback waits for g_release): a batch that computes for as long
 * as a test needs. Guarded by mu. */
static treq *g_hold;
static int g_held, g_release;

static void on_done(attnd_req *r, void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    ((treq *)r)->done = 1;
    pthread_cond_broadcast(&cv);
    if ((treq *)r == g_hold) {
        g_held = 1;
        while (!g_release)
            pthread_cond_wait(&cv, &mu);
    }
    pthread_mutex_unlock(&mu);
}

static void wait_done(treq *t) {
    pthread_mutex_lock(&mu);
    while (!t->done)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* The model's version every request here computes on unless a test says
 * otherwise (set_version), held by the test. */
static attnd_models *models;
static attnd_version *ver;

/* t's job on version v: its queue (v's slot) and a reference of its own. */
static void set_version(treq *t, attnd_version *v) {
    attnd_version_ref(v);
    attnd_version_unref(t->r.job.ver);
    t->r.job.ver = v;
    t->r.job.model = v->slot;
}

static treq *treq_new(void) {
    treq *t = calloc(1, sizeof(*t));
    attnd_req_init(&t->r, treq_free);
    set_version(t, ver);
    return t;
}

static unsigned seed = 7;
static float rnd(void) {
    seed = seed * 1103515245u + 12345u;
    return ((float)(seed >> 8) / 16777216.0f - 0.5f);
}

static float *rnd_floats(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = rnd();
    return x;
}

/* A version of model "m" (E 8, H 2) on weights drawn here, written to a
 * safetensors file and loaded into the table as the daemon loads a model:
 * each call the next version, on weights of its own. */
static attnd_version *load_drawn(void) {
    attn_hparams hp = {.embed_dim = 8, .num_heads = 2, .kdim = 8, .vdim = 8, .bias = 1};
    attn_model drawn;
    char err[512], path[64];
    ck_assert_msg(attn_model_init(&drawn, &hp, err, sizeof(err)) == 0, "%s", err);
    for (size_t i = 0; i < drawn.n_floats; i++)
        drawn.mem[i] = rnd();
    ck_assert_msg(test_weights_temp(&drawn, path, sizeof path, err, sizeof err) == 0, "%s", err);
    attnd_model_config mc = test_model_entry("m", &hp, path);
    attnd_version *v = test_models_add(models, &mc, err, sizeof err);
    unlink(path);
    ck_assert_msg(v != NULL, "%s", err);
    ck_assert(memcmp(v->model.mem, drawn.mem, drawn.n_floats * sizeof(float)) == 0);
    attn_model_free(&drawn);
    return v;
}

static void setup_model(void) {
    models = attnd_models_new(0);
    ck_assert(models != NULL);
    ver = load_drawn();
}

/* After the requests and the scheduler: nothing else holds a version. */
static void free_model(void) {
    attnd_version_unref(ver);
    attnd_models_free(models);
    ver = NULL;
    models = NULL;
}

static void config(attnd_config *c, int batch_requests, int delay_us, int queue, int timeout_ms) {
    ck_assert_int_eq(attnd_config_defaults(c), 0);
    c->max_batch_requests = batch_requests;
    c->max_batch_tokens = 1 << 20;
    c->max_queue_delay_us = delay_us;
    c->max_queue_requests = queue;
    c->request_timeout_ms = timeout_ms;
    c->compute_threads = 1;
}

static attnd_sched *sched_of(const attnd_config *c, attnd_metrics *mt) {
    attnd_metrics_init(mt, (const char *[]){"test"}, 1);
    attnd_sched_opts o = {c, mt, on_done, NULL, NULL, NULL};
    char err[256];
    attnd_sched *s = attnd_sched_new(&o, err, sizeof(err));
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

/* The answer's "output" (and "attention" when asked) against the naive
 * reference of this one request alone, on the version it was admitted on. */
static void check_against_reference(treq *t, const float *q, const float *k, const float *v) {
    attnd_job *j = &t->r.job;
    const attn_model *model = &j->ver->model;
    ck_assert_int_eq(attnd_kind_status(t->r.reply.kind), 200);
    json_error_t je;
    json_t *root = json_loads(t->r.reply.body, 0, &je);
    ck_assert_msg(root != NULL, "answer is not JSON: %s", je.text);
    int E = model->hp.embed_dim, H = model->hp.num_heads;
    size_t nout = (size_t)j->B * j->L * E;
    float *ref = calloc(nout, sizeof(float));
    size_t na = j->weights == ATTN_WEIGHTS_NONE
                    ? 0
                    : (size_t)j->B * j->L * j->S * (j->weights == ATTN_WEIGHTS_HEADS ? H : 1);
    float *refa = calloc(na ? na : 1, sizeof(float));
    attn_seq *seqs = calloc((size_t)j->B, sizeof(attn_seq));
    for (int b = 0; b < j->B; b++) {
        seqs[b].L = j->L;
        seqs[b].S = j->S;
        seqs[b].causal = j->causal;
        seqs[b].weights = j->weights;
        if (j->kpm) seqs[b].key_padding_mask = j->kpm + (size_t)b * j->S;
        if (j->mask_bool) seqs[b].attn_mask_bool = j->mask_bool;
        if (j->weights != ATTN_WEIGHTS_NONE) seqs[b].attn = refa + (size_t)b * (na / j->B);
    }
    attn_batch bt = {j->B, seqs, q, k, v, ref};
    char err[256];
    ck_assert_int_eq(attn_forward_ref(model, &bt, err, sizeof(err)), 0);
    /* flatten the nested answer */
    json_t *out = json_object_get(root, "output");
    size_t got = 0;
    double worst = 0;
    json_t *stack[4] = {out};
    size_t idx[4] = {0};
    int depth = 0;
    while (depth >= 0) {
        json_t *a = stack[depth];
        if (idx[depth] >= json_array_size(a)) {
            depth--;
            if (depth >= 0) idx[depth]++;
            continue;
        }
        json_t *x = json_array_get(a, idx[depth]);
        if (json_is_array(x)) {
            stack[++depth] = x;
            idx[depth] = 0;
            continue;
        }
        ck_assert_uint_lt(got, nout);
        double d = fabs(json_number_value(x) - ref[got]);
        if (d > worst) worst = d;
        got++;
        idx[depth]++;
    }
    ck_assert_uint_eq(got, nout);
    ck_assert_msg(worst < 1e-5, "output differs from the reference by %g", worst);
    if (na) {
        json_t *at = json_object_get(root, "attention");
        ck_assert_ptr_nonnull(at);
        ck_assert_ptr_nonnull(j->attn);
        double wa = 0;
        for (size_t i = 0; i < na; i++)
            wa = fmax(wa, fabs(j->attn[i] - refa[i]));
        ck_assert_msg(wa < 1e-5, "attention differs from the reference by %g", wa);
    }
    free(seqs);
    free(ref);
    free(refa);
    json_decref(root);
}

START_TEST(test_mixed_batch_matches_reference) {
    setup_model();
    attnd_config c;
    config(&c, 3, 10000000, 16, 60000); /* the batch leaves when all 3 are queued */
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    /* A: self-attention, L=3, causal */
    treq *a = treq_new();
    a->r.job.B = 1, a->r.job.L = 3, a->r.job.S = 3, a->r.job.self = 1, a->r.job.causal = 1;
    a->r.job.query = rnd_floats(3 * 8);
    float *aq = malloc(3 * 8 * sizeof(float));
    memcpy(aq, a->r.job.query, 3 * 8 * sizeof(float));
    /* B: cross-attention, L=2 over S=4, value given, key padding, mean attention */
    treq *b = treq_new();
    b->r.job.B = 1, b->r.job.L = 2, b->r.job.S = 4, b->r.job.weights = ATTN_WEIGHTS_MEAN;
    b->r.job.query = rnd_floats(2 * 8);
    b->r.job.key = rnd_floats(4 * 8);
    b->r.job.value = rnd_floats(4 * 8);
    b->r.job.kpm = calloc(4, 1);
    b->r.job.kpm[3] = 1;
    float *bq = malloc(16 * 4), *bk = malloc(32 * 4), *bv = malloc(32 * 4);
    memcpy(bq, b->r.job.query, 16 * 4);
    memcpy(bk, b->r.job.key, 32 * 4);
    memcpy(bv, b->r.job.value, 32 * 4);
    /* C: self-attention, B=2 sequences of L=2, per-head attention, a bool mask */
    treq *cr = treq_new();
    cr->r.job.B = 2, cr->r.job.L = 2, cr->r.job.S = 2, cr->r.job.self = 1, cr->r.job.rank3 = 1;
    cr->r.job.weights = ATTN_WEIGHTS_HEADS;
    cr->r.job.query = rnd_floats(4 * 8);
    cr->r.job.mask_bool = calloc(4, 1);
    cr->r.job.mask_bool[1] = 1;
    float *cq = malloc(32 * 4);
    memcpy(cq, cr->r.job.query, 32 * 4);
    treq *all[3] = {a, b, cr};
    for (int i = 0; i < 3; i++) {
        attnd_error e;
        all[i]->r.tokens = attnd_job_tokens(&all[i]->r.job);
        ck_assert_int_eq(attnd_sched_submit(s, &all[i]->r, &e), 0);
    }
    for (int i = 0; i < 3; i++)
        wait_done(all[i]);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(all[i]->r.batch_requests, 3);
    check_against_reference(a, aq, NULL, NULL);
    check_against_reference(b, bq, bk, bv);
    check_against_reference(cr, cq, NULL, NULL);
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[1]), 0); /* not in le=1 */
    attnd_sched_free(s);
    for (int i = 0; i < 3; i++)
        attnd_req_unref(&all[i]->r);
    free(aq);
    free(bq);
    free(bk);
    free(bv);
    free(cq);
    free_model();
    attnd_config_free(&c);
}
END_TEST

START_TEST(test_full_queue_429_and_deadline_504) {
    setup_model();
    attnd_config c;
    /* nothing leaves on its own: a huge batch, a long delay, a 100 ms deadline */
    config(&c, 64, 10000000, 2, 100);
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    treq *t[3];
    uint64_t t0 = attnd_mono_us();
    for (int i = 0; i < 3; i++) {
        t[i] = treq_new();
        t[i]->r.job.B = 1, t[i]->r.job.L = 2, t[i]->r.job.S = 2, t[i]->r.job.self = 1;
        t[i]->r.job.query = rnd_floats(16);
        t[i]->r.tokens = 4;
        attnd_error e = {AOK, ""};
        int rc = attnd_sched_submit(s, &t[i]->r, &e);
        if (i < 2) {
            ck_assert_int_eq(rc, 0);
        } else {
            ck_assert_int_eq(rc, -1);
            ck_assert_int_eq(e.code, AERR_QUEUE_FULL);
            ck_assert_int_eq(attnd_kind_status(e.code), 429);
            ck_assert_ptr_nonnull(strstr(e.msg, "full"));
        }
    }
    int depth = attnd_sched_depth(s, ver->slot);
    ck_assert_int_eq(depth, 2);
    for (int i = 0; i < 2; i++) {
        wait_done(t[i]);
        ck_assert_int_eq(attnd_kind_status(t[i]->r.reply.kind), 504);
        ck_assert_int_eq(t[i]->r.reply.kind, AERR_TIMEOUT);
        ck_assert_uint_eq(t[i]->r.t_start_us, 0); /* never computed */
        ck_assert_ptr_nonnull(strstr(t[i]->r.reply.body, "\"error\""));
    }
    /* answered by the timer, not at shutdown (which is 10 s away) */
    ck_assert_uint_lt(attnd_mono_us() - t0, 5000000);
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), 0);
    attnd_sched_free(s);
    for (int i = 0; i < 3; i++)
        attnd_req_unref(&t[i]->r);
    free_model();
    attnd_config_free(&c);
}
END_TEST

/* A request's own deadline (the body's timeout_ms, the Request-Timeout-Ms
 * header; the smallest holds) ends it while an older request with the
 * server's longer one stays queued: every queued request is looked at, not
 * only the oldest. */
START_TEST(test_own_deadline_ends_before_older) {
    setup_model();
    attnd_config c;
    config(&c, 64, 10000000, 8, 600000); /* nothing leaves on its own; the server: 10 min */
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    treq *t[4];
    const int body_ms[4] = {0, 100, 5000, 5000}, header_ms[4] = {0, 0, 150, 200};
    for (int i = 0; i < 4; i++) {
        t[i] = treq_new();
        t[i]->r.job.B = 1, t[i]->r.job.L = 2, t[i]->r.job.S = 2, t[i]->r.job.self = 1;
        t[i]->r.job.query = rnd_floats(16);
        t[i]->r.job.timeout_ms = body_ms[i];
        t[i]->r.asked_timeout_ms = header_ms[i];
        t[i]->r.proto = i == 3 ? ATTND_PROTO_GRPC : ATTND_PROTO_HTTP; /* its call's deadline */
        t[i]->r.tokens = 4;
        attnd_error e = {AOK, ""};
        ck_assert_int_eq(attnd_sched_submit(s, &t[i]->r, &e), 0);
    }
    ck_assert_int_eq(t[0]->r.timeout_ms, 600000);
    ck_assert_int_eq(t[1]->r.timeout_ms, 100);
    ck_assert_int_eq(t[2]->r.timeout_ms, 150);
    ck_assert_int_eq(t[3]->r.timeout_ms, 200);
    const char *from[4] = {NULL, "(timeout_ms)", "(Request-Timeout-Ms)",
                           "(the call's grpc-timeout)"};
    for (int i = 1; i < 4; i++) {
        wait_done(t[i]);
        ck_assert_int_eq(t[i]->r.reply.kind, AERR_TIMEOUT);
        ck_assert_uint_eq(t[i]->r.t_start_us, 0); /* never computed */
        ck_assert_msg(strstr(t[i]->r.reply.body, from[i]) != NULL, "%s", t[i]->r.reply.body);
    }
    int depth = attnd_sched_depth(s, ver->slot);
    ck_assert_int_eq(depth, 1); /* the oldest, with the server's deadline, waits on */
    pthread_mutex_lock(&mu);
    ck_assert_int_eq(t[0]->done, 0);
    pthread_mutex_unlock(&mu);
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), 0);
    attnd_sched_free(s); /* the batcher empties the queues before it stops */
    ck_assert_int_eq(t[0]->r.reply.kind, AOK);
    for (int i = 0; i < 4; i++)
        attnd_req_unref(&t[i]->r);
    free_model();
    attnd_config_free(&c);
}
END_TEST

START_TEST(test_cancel_drops_queued_work) {
    setup_model();
    attnd_config c;
    config(&c, 64, 10000000, 8, 60000);
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    treq *t = treq_new();
    t->r.job.B = 1, t->r.job.L = 2, t->r.job.S = 2, t->r.job.self = 1;
    t->r.job.query = rnd_floats(16);
    t->r.tokens = 4;
    attnd_error e;
    ck_assert_int_eq(attnd_sched_submit(s, &t->r, &e), 0);
    ck_assert_int_eq(atomic_load(&t->r.refs), 2);
    attnd_sched_cancel(s, &t->r); /* the connection closed */
    ck_assert_int_eq(atomic_load(&t->r.refs), 1);
    ck_assert_int_eq(attnd_sched_pending(s), 0);
    attnd_sched_free(s);
    ck_assert_int_eq(t->done, 0); /* never finished, never computed */
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), 0);
    attnd_req_unref(&t->r);
    free_model();
    attnd_config_free(&c);
}
END_TEST

/* A self-attention request of 2 rows on version v, submitted (after
 * *slot = it, when slot is given: the callback may run before this
 * returns). */
static treq *small_req_on(attnd_sched *s, attnd_version *v, treq **slot) {
    treq *t = treq_new();
    set_version(t, v);
    t->r.job.B = 1, t->r.job.L = 2, t->r.job.S = 2, t->r.job.self = 1;
    t->r.job.query = rnd_floats(16);
    t->r.tokens = 4;
    if (slot) {
        pthread_mutex_lock(&mu);
        *slot = t;
        pthread_mutex_unlock(&mu);
    }
    attnd_error e;
    ck_assert_int_eq(attnd_sched_submit(s, &t->r, &e), 0);
    return t;
}

/* small_req_on the version of every test. */
static treq *small_req(attnd_sched *s, treq **slot) {
    return small_req_on(s, ver, slot);
}

/* The scheduler's question to the HTTP side, answered from the requests'
 * leave flags. */
static void departed(attnd_req *const *rs, int n, char *left, void *arg) {
    (void)arg;
    for (int i = 0; i < n; i++)
        left[i] = (char)((const treq *)rs[i])->leave;
}

/* A request whose client left (the departed callback says so) is finished
 * with no reply and never computed; the next one is answered as usual. */
START_TEST(test_departed_client_dropped_without_compute) {
    setup_model();
    attnd_config c;
    config(&c, 64, 0, 16, 60000);
    attnd_metrics mt;
    attnd_metrics_init(&mt, (const char *[]){"test"}, 1);
    attnd_sched_opts o = {&c, &mt, on_done, NULL, departed, NULL};
    char err[256];
    attnd_sched *s = attnd_sched_new(&o, err, sizeof(err));
    ck_assert_msg(s != NULL, "%s", err);
    treq *t[2];
    for (int i = 0; i < 2; i++) {
        t[i] = treq_new();
        t[i]->r.job.B = 1, t[i]->r.job.L = 2, t[i]->r.job.S = 2, t[i]->r.job.self = 1;
        t[i]->r.job.query = rnd_floats(16);
        t[i]->r.tokens = 4;
        t[i]->leave = i == 0;
        attnd_error e;
        ck_assert_int_eq(attnd_sched_submit(s, &t[i]->r, &e), 0);
        wait_done(t[i]);
    }
    ck_assert_ptr_null(t[0]->r.reply.body);
    ck_assert_uint_eq(t[0]->r.t_start_us, 0);
    ck_assert_int_eq(attnd_kind_status(t[1]->r.reply.kind), 200);
    ck_assert_ptr_nonnull(t[1]->r.reply.body);
    ck_assert_uint_ne(t[1]->r.t_start_us, 0);
    ck_assert_uint_eq(atomic_load(&mt.tokens), 4); /* the second request's alone */
    attnd_sched_free(s);
    for (int i = 0; i < 2; i++)
        attnd_req_unref(&t[i]->r);
    free_model();
    attnd_config_free(&c);
}
END_TEST

/* The default max_queue_delay_us. */
static int default_delay(void) {
    attnd_config d;
    ck_assert_int_eq(attnd_config_defaults(&d), 0);
    int v = d.max_queue_delay_us;
    attnd_config_free(&d);
    return v;
}

/* Lone requests, each waited for: how many the scheduler's own record
 * (admission to compute start, which feeds attnd_queue_seconds) has within
 * 100 us, and the longest wait in us. Each must be a batch of one. */
static int lone_requests(attnd_sched *s, int runs, uint64_t *longest) {
    int within = 0;
    *longest = 0;
    for (int i = 0; i < runs; i++) {
        treq *t = small_req(s, NULL);
        wait_done(t);
        ck_assert_int_eq(attnd_kind_status(t->r.reply.kind), 200);
        ck_assert_int_eq(t->r.batch_requests, 1);
        ck_assert_uint_ge(t->r.t_start_us, t->r.t_admit_us);
        uint64_t wait = t->r.t_start_us - t->r.t_admit_us;
        within += wait <= 100;
        if (wait > *longest) *longest = wait;
        attnd_req_unref(&t->r);
    }
    return within;
}

/* At the defaults a request that finds compute idle waits for no company:
 * max_queue_delay_us defaults to 0, and no lone request of 20 waits a
 * tenth of the hold that a scheduler told to wait for company (300 ms)
 * gives each one; the old default waited 1 ms every time. Facts, not
 * timings of this machine: a busy or sanitized build may take a wake-up
 * of a millisecond, never 30. The waits are the scheduler's own record,
 * counted by the attnd_queue_seconds histogram. */
START_TEST(test_lone_request_starts_at_once) {
    enum { RUNS = 20, HOLD_US = 300000 };
    setup_model();
    ck_assert_int_eq(default_delay(), 0);
    attnd_config c;
    config(&c, 64, default_delay(), 16, 60000);
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    ck_assert_double_eq(mt.queue_seconds.bounds[0], 0.0001);
    uint64_t longest;
    int within = lone_requests(s, RUNS, &longest);
    printf("lone requests: %d of %d taken within 100 us of admission, the longest wait %llu us\n",
           within, RUNS, (unsigned long long)longest);
    ck_assert_uint_eq(atomic_load(&mt.queue_seconds.count[0]), (uint64_t)within); /* its record */
    ck_assert_msg(longest < HOLD_US / 10, "a lone request waited %llu us at the defaults",
                  (unsigned long long)longest);
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), RUNS); /* every batch of one */
    attnd_sched_free(s);
    attnd_config_free(&c);
    /* the same lone requests, held for company: the record shows the hold */
    config(&c, 64, HOLD_US, 16, 60000);
    s = sched_of(&c, &mt);
    for (int i = 0; i < 2; i++) {
        uint64_t held;
        lone_requests(s, 1, &held);
        ck_assert_msg(held >= HOLD_US * 9 / 10, "held for company, a lone request waited %llu us",
                      (unsigned long long)held);
    }
    attnd_sched_free(s);
    free_model();
    attnd_config_free(&c);
}
END_TEST

/* Requests that arrive while a batch computes wait for it, then leave
 * together as the next batch (continuous batching), at the default delay. */
START_TEST(test_requests_during_a_batch_form_the_next) {
    setup_model();
    attnd_config c;
    config(&c, 16, default_delay(), 32, 60000);
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    pthread_mutex_lock(&mu);
    g_held = g_release = 0;
    pthread_mutex_unlock(&mu);
    small_req(s, &g_hold);
    pthread_mutex_lock(&mu); /* the batcher is inside the first batch, held there */
    while (!g_held)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    enum { N = 5 };
    treq *t[N];
    for (int i = 0; i < N; i++)
        t[i] = small_req(s, NULL);
    int depth = attnd_sched_depth(s, ver->slot);
    ck_assert_int_eq(depth, N); /* all queued behind the running batch */
    ck_assert_int_eq(attnd_sched_pending(s), N + 1);
    pthread_mutex_lock(&mu);
    g_release = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < N; i++) {
        wait_done(t[i]);
        ck_assert_int_eq(attnd_kind_status(t[i]->r.reply.kind), 200);
        ck_assert_int_eq(t[i]->r.batch_requests, N);
    }
    ck_assert_int_eq(g_hold->r.batch_requests, 1);
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), 1); /* le=1: the held one */
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[3]), 1); /* le=8: the five */
    attnd_sched_free(s);
    attnd_req_unref(&g_hold->r);
    pthread_mutex_lock(&mu);
    g_hold = NULL;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < N; i++)
        attnd_req_unref(&t[i]->r);
    free_model();
    attnd_config_free(&c);
}
END_TEST

/* The "model_version" of a native answer's usage. */
static int answer_version(const treq *t) {
    json_t *root = json_loads(t->r.reply.body, 0, NULL);
    ck_assert_ptr_nonnull(root);
    json_t *u = json_object_get(root, "usage");
    ck_assert_msg(json_is_integer(json_object_get(u, "model_version")), "%s", t->r.reply.body);
    int v = (int)json_integer_value(json_object_get(u, "model_version"));
    json_decref(root);
    return v;
}

/* A model reloaded while its queue holds requests: those admitted on the
 * old version and those on the new one wait in the one queue of its slot,
 * and a batch never mixes them. Queued A A B B A behind a running batch,
 * with room for 8 in a batch, they leave as A A, then B B, then A, each
 * answered on its own version's weights and saying which. */
START_TEST(test_batch_never_mixes_versions) {
    setup_model();
    attnd_version *a = ver, *b = load_drawn(); /* versions 1 and 2 of "m" */
    ck_assert_int_eq(a->info.version, 1);
    ck_assert_int_eq(b->info.version, 2);
    ck_assert_int_eq(a->slot, b->slot); /* one queue */
    ck_assert_str_ne(a->fingerprint, b->fingerprint);
    attnd_config c;
    config(&c, 8, default_delay(), 32, 60000);
    attnd_metrics mt;
    attnd_sched *s = sched_of(&c, &mt);
    pthread_mutex_lock(&mu);
    g_held = g_release = 0;
    pthread_mutex_unlock(&mu);
    small_req(s, &g_hold);
    pthread_mutex_lock(&mu); /* the batcher is inside the first batch, held there */
    while (!g_held)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    enum { N = 5 };
    attnd_version *on[N] = {a, a, b, b, a};
    const int batch[N] = {2, 2, 2, 2, 1};
    treq *t[N];
    float *q[N];
    for (int i = 0; i < N; i++) {
        t[i] = small_req_on(s, on[i], NULL);
        q[i] = malloc(16 * sizeof(float));
        memcpy(q[i], t[i]->r.job.query, 16 * sizeof(float));
    }
    ck_assert_int_eq(attnd_sched_depth(s, a->slot), N); /* all queued behind the running batch */
    pthread_mutex_lock(&mu);
    g_release = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < N; i++) {
        wait_done(t[i]);
        ck_assert_msg(t[i]->r.batch_requests == batch[i], "request %d: a batch of %d, wanted %d", i,
                      t[i]->r.batch_requests, batch[i]);
        ck_assert_int_eq(answer_version(t[i]), on[i]->info.version);
        check_against_reference(t[i], q[i], NULL, NULL);
    }
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[0]), 2); /* le=1: the held one, the last A */
    ck_assert_uint_eq(atomic_load(&mt.batch_size.count[1]), 2); /* le=2: A A, then B B */
    attnd_sched_free(s);
    attnd_req_unref(&g_hold->r);
    pthread_mutex_lock(&mu);
    g_hold = NULL;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < N; i++) {
        attnd_req_unref(&t[i]->r);
        free(q[i]);
    }
    attnd_version_unref(b);
    free_model();
    attnd_config_free(&c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_sched");
    TCase *tc = tcase_create("sched");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_mixed_batch_matches_reference);
    tcase_add_test(tc, test_full_queue_429_and_deadline_504);
    tcase_add_test(tc, test_own_deadline_ends_before_older);
    tcase_add_test(tc, test_cancel_drops_queued_work);
    tcase_add_test(tc, test_departed_client_dropped_without_compute);
    tcase_add_test(tc, test_lone_request_starts_at_once);
    tcase_add_test(tc, test_requests_during_a_batch_form_the_next);
    tcase_add_test(tc, test_batch_never_mixes_versions);
    suite_add_tcase(s, tc);
    return check_run(s);
}
