/* fuzz_tensor.c - libFuzzer target: the bytes are one tensor value, nested
 * arrays or a base64 tensor object, read as floats (rank <= 3), booleans
 * (rank <= 2, a key_padding_mask) and either (rank <= 4, -inf allowed, an
 * attn_mask or v2 data). An accepted tensor must hold exactly the product
 * of its shape, finite floats (or -inf where allowed) or 0/1 booleans.
 *   make fuzz-smoke; make fuzz-long
 */
#include <math.h>

#include "../../server/codec/tensor.h"
#include "fuzz_server.h"

static void one(const uint8_t *data, size_t size, attnd_tensor_kind kind, int max_rank,
                int neg_inf_ok) {
    jin *j = attnd_jin_new((const char *)data, size);
    attnd_tensor t;
    attnd_error e;
    memset(&e, 0, sizeof(e));
    int rc = attnd_tensor_read(j, "x", kind, max_rank, neg_inf_ok, &t, &e);
    attnd_jin_free(j);
    if (rc < 0) {
        FUZZ_CHECK(e.code == AERR_BAD_REQUEST || e.code == AERR_TOO_LARGE ||
                   e.code == AERR_INTERNAL);
        FUZZ_CHECK(e.msg[0] == 'x'); /* every message names the tensor */
        FUZZ_CHECK(t.f == NULL && t.u == NULL);
        return;
    }
    FUZZ_CHECK(t.rank >= 1 && t.rank <= max_rank);
    size_t n = 1;
    for (int d = 0; d < t.rank; d++) {
        FUZZ_CHECK(t.shape[d] >= 1);
        n *= (size_t)t.shape[d];
    }
    FUZZ_CHECK(n == t.n);
    FUZZ_CHECK(kind != TK_BOOL || t.is_bool);
    FUZZ_CHECK(kind != TK_FLOAT || !t.is_bool);
    if (t.is_bool) {
        FUZZ_CHECK(t.u && !t.f);
        for (size_t k = 0; k < n; k++)
            FUZZ_CHECK(t.u[k] <= 1);
    } else {
        FUZZ_CHECK(t.f && !t.u);
        for (size_t k = 0; k < n; k++)
            FUZZ_CHECK(isfinite(t.f[k]) || (neg_inf_ok && t.f[k] == -INFINITY));
    }
    attnd_tensor_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, TK_FLOAT, 3, 0);
    one(data, size, TK_BOOL, 2, 0);
    one(data, size, TK_ANY, 4, 1);
    return 0;
}
