/* test_fused_few.c - the fp32 AVX-512 block's few-lane path (block.c,
 * tile_few: blocks of at most 4 lanes, a KV-cache step's rows x query
 * heads) against its many-lane path, bit for bit.
 *
 * A step of `rows` rows after n - rows cached keys is one attn_fused_block
 * call of rows * R lanes over S = n keys, causal (as the forward sends a
 * session step). The same rows computed among 32 rows of a whole causal
 * sequence (32 * R lanes: the many-lane path) must give the same floats,
 * memcmp: the scores' fma chains, the max, e^x, the sum of each tile in key
 * order and the AV products are the same operations. Cache lengths that are
 * not multiples of 16 or of the key tile (128), R = 1 and 4, D = 16, 64, 128;
 * also one row with causal 0 (no mask at all: the unmasked branch).
 *
 * Needs AVX-512F; on a CPU without it the suite says so and checks nothing
 * else (the fused block is not used there).
 */
#include "../core/attn.h"
#include "../core/kernels/block.h"

#include "check_run.h"
#include "test_rand.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WIDE = 32 }; /* rows of the whole sequence's block */

static const int LENS[] = {1, 15, 17, 129, 1000, 4500}; /* n, keys the step's last row sees */
static const int DS[] = {16, 64, 128};

typedef struct {
    int n, rows, R, D, causal;
} few_case;

/* The rows [n - rows, n) at R heads each, through a call of those rows
 * alone (few lanes) and among WIDE rows from n - rows on (many lanes). */
static void check_case(const few_case *c) {
    const int R = c->R, D = c->D, p0 = c->n - c->rows, total = p0 + WIDE;
    const size_t ldq = (size_t)R * D, ldkv = 2 * (size_t)D;
    float *kv = rand_floats((size_t)total * ldkv, RAND_UNIT);
    float *q = rand_floats((size_t)WIDE * ldq, RAND_UNIT);
    float *wide = xcalloc((size_t)WIDE * ldq, sizeof(float));
    float *step = xcalloc((size_t)c->rows * ldq, sizeof(float));
    float *scratch = xcalloc(attn_fused_floats(D), sizeof(float));
    float scale = 1.0f / sqrtf((float)D);
    memcpy(wide, q, sizeof(float) * WIDE * ldq);
    memcpy(step, q, sizeof(float) * c->rows * ldq);
    attn_seq whole = {.L = total, .S = total, .causal = 1};
    attn_fused_block(wide, ldq, R, kv, kv + D, ldkv, &whole, p0, WIDE, D, scale, scratch);
    attn_seq st = {.L = c->rows, .S = c->n, .causal = c->causal};
    attn_fused_block(step, ldq, R, kv, kv + D, ldkv, &st, p0, c->rows, D, scale, scratch);
    for (size_t i = 0; i < (size_t)c->rows * ldq; i++)
        ck_assert_msg(memcmp(&step[i], &wide[i], sizeof(float)) == 0,
                      "n %d, %d rows, R %d, D %d, causal %d: row %zu head %zu column %zu: %.9g "
                      "in a step, %.9g in the whole sequence",
                      c->n, c->rows, R, D, c->causal, i / ldq, i % ldq / D, i % D, step[i],
                      wide[i]);
    free(kv);
    free(q);
    free(wide);
    free(step);
    free(scratch);
}

/* Loop index _i: a cache length and a head width; every lane count of up
 * to 4 lanes (R = 1: 1 to 4 rows; R = 4: 1 row). */
START_TEST(test_steps_equal_whole) {
    if (!attn_fused_supported(16)) {
        printf("fused few lanes: skipped, the CPU has no AVX-512F (or the block is off)\n");
        return;
    }
    const int n = LENS[_i % 6], D = DS[_i / 6];
    g_rng = 1000 + (uint64_t)_i;
    for (int rows = 1; rows <= 4 && rows <= n; rows++)
        check_case(&(few_case){.n = n, .rows = rows, .R = 1, .D = D, .causal = 1});
    check_case(&(few_case){.n = n, .rows = 1, .R = 4, .D = D, .causal = 1});
    check_case(&(few_case){.n = n, .rows = 1, .R = 1, .D = D, .causal = 0});
    check_case(&(few_case){.n = n, .rows = 1, .R = 4, .D = D, .causal = 0});
}
END_TEST

static Suite *few_suite(void) {
    Suite *s = suite_create("fused_few");
    TCase *t = tcase_create("bits");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_steps_equal_whole, 0, 18);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(few_suite());
}
