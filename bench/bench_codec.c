/* bench_codec.c - what the server spends on text, without HTTP or compute,
 * on one thread. Two tables:
 *  1. numbers: million numbers per second parsed (attnd_parse_f32_row, strtof)
 *     and printed (attnd_sb_floats, snprintf "%.9g") on the comma-separated text
 *     of a 16×512 tensor, all in the same run, so the ratios hold whatever
 *     the machine's load;
 *  2. bodies: a request body read into a job and an answer written, in JSON
 *     (nested arrays, 9 significant digits) and in base64, for a small
 *     request (16×512) and a large one (512×1024).
 * Each figure is the median of 31 timed repetitions. Prints tables;
 * asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/base/buffer.h"
#include "../server/base/clock.h"
#include "../server/body/request.h"
#include "../server/codec/base64.h"
#include "../server/codec/floattext.h"

#define REPS 31

static double now_s(void) {
    return (double)attnd_mono_us() / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

/* Values like attention outputs: uniform in (-2, 2), all 32 bits random. */
static void fill(float *x, size_t n) {
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    }
}

static volatile float sink_f;

/* ---- numbers ---- */

/* The server's own loops against the C library's, on the same text: a
 * row of n numbers "a,b,c" (as attnd_fmt_f32 writes them) read by attnd_parse_f32_row
 * and by strtof, and written by attnd_sb_floats and by snprintf("%.9g"). */
static void numbers(size_t n) {
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    fill(x, n);
    attnd_sbuf row;
    attnd_sb_init(&row);
    attnd_sb_floats(&row, x, n);
    char *out = malloc(n * (F32_TEXT_MAX + 1));
    double tp[REPS], ts[REPS], tf[REPS], tg[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        size_t got = 0;
        attnd_parse_f32_row(row.p, row.len, y, n, &got);
        double t1 = now_s();
        const char *p = row.p;
        for (size_t i = 0; i < n; i++) {
            char *e;
            y[i] = strtof(p, &e);
            p = e + 1; /* the comma */
        }
        double t2 = now_s();
        attnd_sbuf b;
        attnd_sb_init(&b);
        attnd_sb_floats(&b, x, n);
        double t3 = now_s();
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            k += (size_t)snprintf(out + k, F32_TEXT_MAX, "%.9g", (double)x[i]);
            out[k++] = ',';
        }
        double t4 = now_s();
        if (got != n || b.len + 1 != k) {
            fprintf(stderr, "numbers: %zu of %zu read, %zu and %zu bytes written\n", got, n, b.len,
                    k);
            exit(1);
        }
        attnd_sb_free(&b);
        tp[r] = t1 - t0;
        ts[r] = t2 - t1;
        tf[r] = t3 - t2;
        tg[r] = t4 - t3;
    }
    sink_f = y[n - 1];
    double mp = median(tp, REPS), ms = median(ts, REPS), mf = median(tf, REPS),
           mg = median(tg, REPS);
    printf("| parse | attnd_parse_f32_row | %6.1f | strtof           | %6.1f | %5.1f× |\n",
           n / mp / 1e6, n / ms / 1e6, ms / mp);
    printf("| print | attnd_sb_floats     | %6.1f | snprintf(\"%%.9g\") | %6.1f | %5.1f× |\n",
           n / mf / 1e6, n / mg / 1e6, mg / mf);
    attnd_sb_free(&row);
    free(x);
    free(y);
    free(out);
}

/* ---- bodies ---- */

/* A native body with an L×E query, JSON or base64. Caller frees. */
static char *make_body(const float *q, int L, int E, int b64, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"model\":\"m\",\"query\":");
    if (b64) {
        attnd_sb_printf(&b, "{\"shape\":[%d,%d],\"dtype\":\"float32\",\"b64\":\"", L, E);
        attnd_sb_b64(&b, q, (size_t)L * E * sizeof(float));
        attnd_sb_puts(&b, "\"}");
    } else {
        int shape[2] = {L, E};
        attnd_sb_tensor_json(&b, q, 2, shape);
    }
    attnd_sb_puts(&b, "}");
    return attnd_sb_take(&b, len);
}

static void bodies(int L, int E) {
    size_t n = (size_t)L * E;
    float *q = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    fill(q, n);
    for (size_t i = 0; i < n; i++)
        out[i] = q[i] * 0.37f;
    attnd_model_info m = {.name = "m",
                          .hp = {.embed_dim = E, .num_heads = 8, .kdim = E, .vdim = E, .bias = 1}};
    attnd_parse_env env = {&m, 1, 1 << 24, 1LL << 40};
    int reps = n > 100000 ? 3 : 40;
    for (int enc = 0; enc < 2; enc++) {
        size_t blen = 0;
        char *body = make_body(q, L, E, enc, &blen);
        double tp[REPS], tw[REPS];
        size_t olen = 0;
        for (int k = 0; k < REPS; k++) {
            double t0 = now_s();
            for (int r = 0; r < reps; r++) {
                attnd_job job;
                attnd_error e;
                if (attnd_parse_native(&env, NULL, body, blen, &job, &e) < 0) {
                    fprintf(stderr, "parse failed: %s\n", e.msg);
                    exit(1);
                }
                attnd_job_free(&job);
            }
            tp[k] = (now_s() - t0) / reps;
            attnd_job job;
            attnd_error e;
            attnd_parse_native(&env, NULL, body, blen, &job, &e);
            job.enc = enc ? ENC_BASE64 : ENC_JSON;
            attnd_usage u = {.batch_requests = 1};
            t0 = now_s();
            for (int r = 0; r < reps; r++) {
                attnd_sbuf b;
                attnd_sb_init(&b);
                size_t jl;
                attnd_write_answer(&b, &job, &m, out, &u, &jl);
                olen = b.len;
                attnd_sb_free(&b);
            }
            tw[k] = (now_s() - t0) / reps;
            attnd_job_free(&job);
        }
        double p = median(tp, REPS), w = median(tw, REPS);
        printf("| %4d×%-4d | %-6s | %9.2f | %10.3f | %9.1f | %9.2f | %10.3f | %9.1f |\n", L, E,
               enc ? "base64" : "json", (double)blen / 1e6, p * 1e3, (double)n / p / 1e6,
               (double)olen / 1e6, w * 1e3, (double)n / w / 1e6);
        free(body);
    }
    free(q);
    free(out);
}

int main(void) {
    printf("attnd codec costs, one thread, medians of %d runs\n\n", REPS);
    printf("numbers of a 16×512 tensor (M numbers/s)\n\n");
    printf("| what  | attnd         | M/s    | C library        | M/s    | ratio  |\n");
    printf("|-------|---------------|--------|------------------|--------|--------|\n");
    numbers(16 * 512);
    printf("\nbodies: request body -> job, answer -> body (M numbers/s)\n\n");
    printf("| query     | coding | body MB   | parse ms   | M num/s   | answer MB | write ms   | "
           "M num/s   |\n");
    printf("|-----------|--------|-----------|------------|-----------|-----------|------------|---"
           "--------|\n");
    bodies(16, 512);
    bodies(512, 1024);
    return 0;
}
