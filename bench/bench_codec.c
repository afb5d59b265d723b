/* bench_codec.c - what the server spends on text, without HTTP or compute:
 * reading a request body into a job and writing an answer, in JSON (nested
 * arrays, 9 significant digits) and in base64, for a small request (16×512)
 * and a large one (512×1024). Prints a table; asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/codec.h"
#include "../server/request.h"

/* A native body with an L×E query, JSON or base64. Caller frees. */
static char *make_body(const float *q, int L, int E, int b64, size_t *len) {
    sbuf b;
    sb_init(&b);
    sb_puts(&b, "{\"model\":\"m\",\"query\":");
    if (b64) {
        sb_printf(&b, "{\"shape\":[%d,%d],\"dtype\":\"float32\",\"b64\":\"", L, E);
        sb_b64(&b, q, (size_t)L * E * sizeof(float));
        sb_puts(&b, "\"}");
    } else {
        int shape[2] = {L, E};
        sb_tensor_json(&b, q, 2, shape);
    }
    sb_puts(&b, "}");
    return sb_take(&b, len);
}

static double now_s(void) {
    return (double)mono_us() / 1e6;
}

static void bench(int L, int E) {
    size_t n = (size_t)L * E;
    float *q = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        q[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
        out[i] = q[i] * 0.37f;
    }
    attnd_model_info m = {"m", {E, 8, E, E, 1, 0}};
    attnd_parse_env env = {&m, 1, 1 << 24, 1LL << 40};
    for (int enc = 0; enc < 2; enc++) {
        size_t blen = 0;
        char *body = make_body(q, L, E, enc, &blen);
        int reps = n > 100000 ? 5 : 200;
        /* parse */
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
        double tp = (now_s() - t0) / reps;
        /* write */
        attnd_job job;
        attnd_error e;
        attnd_parse_native(&env, NULL, body, blen, &job, &e);
        job.enc = enc ? ENC_BASE64 : ENC_JSON;
        attnd_usage u = {1, 0, 0};
        size_t olen = 0;
        t0 = now_s();
        for (int r = 0; r < reps; r++) {
            sbuf b;
            sb_init(&b);
            size_t jl;
            attnd_write_answer(&b, &job, &m, out, &u, &jl);
            olen = b.len;
            sb_free(&b);
        }
        double tw = (now_s() - t0) / reps;
        attnd_job_free(&job);
        printf("| %4d×%-4d | %-6s | %9.2f | %10.3f | %8.1f | %9.2f | %10.3f | %8.1f |\n", L, E,
               enc ? "base64" : "json", (double)blen / 1e6, tp * 1e3, (double)n / tp / 1e6,
               (double)olen / 1e6, tw * 1e3, (double)n / tw / 1e6);
        free(body);
    }
    free(q);
    free(out);
}

int main(void) {
    printf("attnd codec costs (one thread): request body -> job, answer -> body\n\n");
    printf("| query     | coding | body MB   | parse ms   | Mfloat/s | answer MB | write ms   | "
           "Mfloat/s |\n");
    printf("|-----------|--------|-----------|------------|----------|-----------|------------|----"
           "------|\n");
    bench(16, 512);
    bench(512, 1024);
    return 0;
}
