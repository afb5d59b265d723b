/* test_blas.c - Check suite for core/platform/blas.c: the choice of OpenBLAS's
 * kernels from CPU features.
 *
 *   rule     made-up feature sets map to the kernel sets the rule names, and
 *            kernel names to the instruction sets they need;
 *   machine  on the CPU the suite runs on: with AVX-512 the loaded kernels
 *            are AVX-512 ones, with AVX2 and FMA at least AVX2 ones (never
 *            a generic fallback), unless OPENBLAS_CORETYPE asks otherwise,
 *            in which case the user's choice wins and a weaker one is warned
 *            about; the environment is left as it was found.
 * Facts about kernels, never timings.
 */
#include "../core/attn.h"

#include "check_run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The environment as the process started, read before attn_blas_init. */
static char g_env_core[128];
static int g_env_core_set;
static char g_env_threads[128];
static int g_env_threads_set;

static void remember_env(void) {
    const char *c = getenv("OPENBLAS_CORETYPE"), *t = getenv("OPENBLAS_NUM_THREADS");
    g_env_core_set = c != NULL;
    g_env_threads_set = t != NULL;
    if (c) snprintf(g_env_core, sizeof(g_env_core), "%s", c);
    if (t) snprintf(g_env_threads, sizeof(g_env_threads), "%s", t);
}

static attn_cpu avx512_cpu(int bf16) {
    attn_cpu c = {.avx512f = 1,
                  .avx512cd = 1,
                  .avx512bw = 1,
                  .avx512dq = 1,
                  .avx512vl = 1,
                  .avx512bf16 = bf16,
                  .avx2 = 1,
                  .fma = 1,
                  .avx = 1,
                  .sse4_2 = 1};
    return c;
}

static void expect_core(const attn_cpu *c, const char *want, const char *what) {
    const char *got = attn_blas_core_for(c);
    if (!want) {
        ck_assert_msg(got == NULL, "%s: expected OpenBLAS's own choice, got %s", what, got);
        return;
    }
    ck_assert_msg(got && strcmp(got, want) == 0, "%s: expected %s, got %s", what, want,
                  got ? got : "NULL");
}

START_TEST(test_rule) {
    attn_cpu c = avx512_cpu(0);
    expect_core(&c, "SkylakeX", "AVX-512 F/CD/BW/DQ/VL");
    c = avx512_cpu(1);
    expect_core(&c, "Cooperlake", "AVX-512 with BF16");
    c = avx512_cpu(0);
    c.avx512bw = 0; /* AVX-512F alone (Knights Landing): OpenBLAS's SkylakeX needs BW */
    expect_core(&c, "Haswell", "AVX-512F without BW");
    attn_cpu avx2 = {.avx2 = 1, .fma = 1, .avx = 1, .sse4_2 = 1};
    expect_core(&avx2, "Haswell", "AVX2 + FMA");
    avx2.fma = 0;
    expect_core(&avx2, "Sandybridge", "AVX2 without FMA");
    attn_cpu sse = {.sse4_2 = 1};
    expect_core(&sse, NULL, "SSE4.2 only");
    ck_assert_int_eq(attn_cpu_level(&c), ATTN_ISA_AVX2);
    c = avx512_cpu(1);
    ck_assert_int_eq(attn_cpu_level(&c), ATTN_ISA_AVX512);
    ck_assert_int_eq(attn_cpu_level(&sse), ATTN_ISA_BASE);
}
END_TEST

START_TEST(test_core_levels) {
    ck_assert_int_eq(attn_blas_core_level("SkylakeX"), ATTN_ISA_AVX512);
    ck_assert_int_eq(attn_blas_core_level("COOPERLAKE"), ATTN_ISA_AVX512);
    ck_assert_int_eq(attn_blas_core_level("Haswell"), ATTN_ISA_AVX2);
    ck_assert_int_eq(attn_blas_core_level("Zen"), ATTN_ISA_AVX2);
    ck_assert_int_eq(attn_blas_core_level("Sandybridge"), ATTN_ISA_AVX);
    ck_assert_int_eq(attn_blas_core_level("Prescott"), ATTN_ISA_BASE);
    ck_assert_int_eq(attn_blas_core_level("Nehalem"), ATTN_ISA_BASE);
    ck_assert_int_eq(attn_blas_core_level(NULL), ATTN_ISA_BASE);
}
END_TEST

START_TEST(test_features_string) {
    attn_cpu c = avx512_cpu(1);
    char s[256];
    attn_cpu_features(&c, s, sizeof(s));
    ck_assert_str_eq(s, "avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,avx,"
                        "sse4_2");
    attn_cpu none = {0};
    attn_cpu_features(&none, s, sizeof(s));
    ck_assert_str_eq(s, "");
    attn_cpu_features(&c, s, 9); /* truncated, still a string */
    ck_assert_int_eq((int)strlen(s), 8);
}
END_TEST

/* The rule on the machine the suite runs on. */
START_TEST(test_this_machine) {
    char err[256] = "";
    ck_assert_msg(attn_blas_init(err, sizeof(err)) == 0, "%s", err);
    const attn_blas_info *info = attn_blas_get_info();
    ck_assert_ptr_nonnull(info);
    attn_cpu cpu;
    attn_cpu_detect(&cpu);
    int want = attn_cpu_level(&cpu), got = attn_blas_core_level(info->core);
    char feats[256];
    attn_cpu_features(&cpu, feats, sizeof(feats));
    ck_assert_str_eq(info->features, feats);
    printf("this machine: features %s; kernels %s (%s)\n", feats, info->core,
           info->by_user ? "OPENBLAS_CORETYPE" : "chosen");
    ck_assert_int_eq(info->by_user, g_env_core_set && g_env_core[0]);
    if (info->by_user) {
        /* the user's choice wins; a weaker one is said out loud */
        ck_assert_msg(got >= want || info->warning, "weaker kernels %s without a warning",
                      info->core);
        return;
    }
    ck_assert_msg(got >= want, "kernels %s are weaker than the features %s allow", info->core,
                  feats);
    if (cpu.avx512f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl)
        ck_assert_msg(got == ATTN_ISA_AVX512, "AVX-512 CPU computes with %s", info->core);
    if (cpu.avx2 && cpu.fma)
        ck_assert_msg(got >= ATTN_ISA_AVX2, "AVX2 CPU computes with %s", info->core);
    if (info->chosen) /* the rule's choice is what OpenBLAS loaded */
        ck_assert_str_eq(info->core, info->chosen);
    ck_assert_msg(info->warning == NULL, "unexpected warning: %s", info->warning);
    ck_assert_str_eq(attn_blas_corename(), info->core);
}
END_TEST

/* The variables set for the load are put back as they were. */
START_TEST(test_env_restored) {
    ck_assert_int_eq(attn_blas_init(NULL, 0), 0);
    const char *c = getenv("OPENBLAS_CORETYPE"), *t = getenv("OPENBLAS_NUM_THREADS");
    ck_assert_int_eq(c != NULL, g_env_core_set);
    ck_assert_int_eq(t != NULL, g_env_threads_set);
    if (c) ck_assert_str_eq(c, g_env_core);
    if (t) ck_assert_str_eq(t, g_env_threads);
}
END_TEST

/* The loaded OpenBLAS computes: a 2x2 product through the core's door. */
START_TEST(test_sgemm_door) {
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    float c[4] = {0};
    attn_blas_sgemm(c, a, b, 2, 2, 2);
    ck_assert(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50);
}
END_TEST

static Suite *blas_suite(void) {
    Suite *s = suite_create("blas");
    TCase *t = tcase_create("kernels");
    tcase_add_test(t, test_rule);
    tcase_add_test(t, test_core_levels);
    tcase_add_test(t, test_features_string);
    tcase_add_test(t, test_this_machine);
    tcase_add_test(t, test_env_restored);
    tcase_add_test(t, test_sgemm_door);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    remember_env();
    return check_run(blas_suite());
}
