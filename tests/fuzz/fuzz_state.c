/* fuzz_state.c - libFuzzer target: session state files (server/batch/
 * state.c). The bytes are read as a whole file: a refusal must say why and
 * hold nothing, an accepted file must write back and read again to the
 * same state bit for bit, and its rewrite must be the same bytes. The same
 * bytes also make a cache (the first four choose the precision and the
 * shape, the rest its bits) that is written and read back: bit for bit
 * when every value is finite, refused naming NaN or Inf otherwise.
 *   make fuzz-long FUZZ_TARGETS=fuzz_state
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/session/state.h"
#include "fuzz_check.h"

static const attnd_state_limits LIMITS = {1 << 20, 4096};

static size_t cache_bytes(const attnd_state *s) {
    return (size_t)s->len * 2 * (size_t)s->G * (size_t)s->D *
           (s->precision == ATTND_STATE_BF16 ? 2 : 4);
}

static void same_state(const attnd_state *a, const attnd_state *b) {
    FUZZ_CHECK(strcmp(a->model, b->model) == 0);
    FUZZ_CHECK(strcmp(a->fingerprint, b->fingerprint) == 0);
    FUZZ_CHECK(a->precision == b->precision && a->len == b->len);
    FUZZ_CHECK(a->G == b->G && a->D == b->D);
    FUZZ_CHECK(a->len == 0 || memcmp(a->kv, b->kv, cache_bytes(a)) == 0);
    for (int t = 0; t < a->len; t++)
        FUZZ_CHECK(b->positions[t] == t);
}

/* Writes st; returns the bytes (caller frees). */
static char *write_state(const attnd_state *st, size_t *n) {
    attnd_sbuf sb;
    char err[256] = "";
    attnd_sb_init(&sb);
    FUZZ_CHECK(attnd_state_write(&sb, st, err, sizeof err) == 0);
    char *p = attnd_sb_take(&sb, n);
    FUZZ_CHECK(p != NULL);
    return p;
}

static void read_back(const uint8_t *data, size_t size) {
    attnd_state a, b;
    char err[512] = "";
    if (attnd_state_read(data, size, &LIMITS, &a, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] && !a.model && !a.kv && !a.positions);
        return;
    }
    size_t n1, n2;
    char *w1 = write_state(&a, &n1);
    FUZZ_CHECK(attnd_state_read((unsigned char *)w1, n1, &LIMITS, &b, err, sizeof err) == 0);
    same_state(&a, &b);
    char *w2 = write_state(&b, &n2);
    FUZZ_CHECK(n1 == n2 && memcmp(w1, w2, n1) == 0);
    free(w1);
    free(w2);
    attnd_state_free(&a);
    attnd_state_free(&b);
}

static int finite(const unsigned char *kv, size_t n, int bf16) {
    for (size_t i = 0; i < n; i += bf16 ? 2 : 4) {
        unsigned hi = kv[i + (bf16 ? 1 : 3)], next = kv[i + (bf16 ? 0 : 2)];
        if ((hi & 0x7f) == 0x7f && (next & 0x80)) return 0; /* exponent all ones */
    }
    return 1;
}

static void write_then_read(const uint8_t *data, size_t size) {
    if (size < 4) return;
    attnd_state s = {.model = "fuzz", .fingerprint = "fnv1a64:0123456789abcdef"};
    s.precision = data[0] & 1 ? ATTND_STATE_BF16 : ATTND_STATE_FP32;
    s.G = 1 + data[1] % 4;
    s.D = 1 + data[2] % 8;
    s.len = data[3] % 16;
    size_t need = cache_bytes(&s);
    unsigned char *kv = calloc(need ? need : 1, 1);
    FUZZ_CHECK(kv != NULL);
    memcpy(kv, data + 4, size - 4 < need ? size - 4 : need);
    s.kv = kv;
    size_t n;
    char *w = write_state(&s, &n);
    attnd_state r;
    char err[512] = "";
    int rc = attnd_state_read((unsigned char *)w, n, &LIMITS, &r, err, sizeof err);
    if (finite(kv, need, s.precision == ATTND_STATE_BF16)) {
        FUZZ_CHECK(rc == 0);
        same_state(&s, &r);
        attnd_state_free(&r);
    } else {
        FUZZ_CHECK(rc == -1 && (strstr(err, "NaN") || strstr(err, "Inf")));
    }
    free(w);
    free(kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_back(data, size);
    write_then_read(data, size);
    return 0;
}
