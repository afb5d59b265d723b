/* blas.c - the core's one door to OpenBLAS, and the choice of its kernels.
 *
 * Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernel set once, when it is
 * loaded, from the CPU's model number; on a model it does not know it falls
 * back to generic SSE3 kernels ("Prescott") that run 4-5x slower. It honours
 * OPENBLAS_CORETYPE, read at load time. So attnd does not link OpenBLAS: it
 * reads the CPU's features (CPUID, with the OS's register-state support),
 * names the kernel set they allow, sets OPENBLAS_CORETYPE to it (unless the
 * user set one: that wins) and only then loads OpenBLAS with dlopen.
 * docs/performance.md says why dlopen rather than re-executing the process.
 *
 * Rule (features, never model numbers):
 *   AVX-512 F, CD, BW, DQ and VL  -> SkylakeX (Cooperlake with AVX512-BF16)
 *   AVX2 and FMA                  -> Haswell
 *   AVX                           -> Sandybridge
 *   otherwise                     -> OpenBLAS's own choice
 *
 * The CPU's features come from cpu.c, probed once. It does not compute
 * anything itself; the attention tiles (attend.c) call blas_sgemm.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blas.h"
#include "cpu.h"

__typeof__(cblas_sgemm) *blas_sgemm;

static void (*blas_set_threads)(int);
static char *(*blas_corename)(void);

static const char *const LIBS[] = {"libopenblas.so.0", "libopenblas.so"};

typedef struct {
    const char *name; /* OpenBLAS core name */
    int level;        /* ATTN_ISA_* the kernels need */
} core_level;

/* OpenBLAS 0.3.21's x86-64 kernel sets by the instructions they use. */
static const core_level CORES[] = {
    {"SapphireRapids", ATTN_ISA_AVX512},
    {"Cooperlake", ATTN_ISA_AVX512},
    {"SkylakeX", ATTN_ISA_AVX512},
    {"Haswell", ATTN_ISA_AVX2},
    {"Zen", ATTN_ISA_AVX2},
    {"Sandybridge", ATTN_ISA_AVX},
    {"Bulldozer", ATTN_ISA_AVX},
    {"Piledriver", ATTN_ISA_AVX},
    {"Steamroller", ATTN_ISA_AVX},
    {"Excavator", ATTN_ISA_AVX},
};

static struct {
    pthread_once_t once;
    int ok;
    char err[256];
    char features[160];
    char warning[512];
    char user[64]; /* the user's OPENBLAS_CORETYPE, or "" */
    attn_blas_info info;
} g = {.once = PTHREAD_ONCE_INIT};

int attn_blas_core_level(const char *core) {
    for (size_t i = 0; core && i < sizeof CORES / sizeof CORES[0]; i++)
        if (strcasecmp(core, CORES[i].name) == 0) return CORES[i].level;
    return ATTN_ISA_BASE; /* Prescott, Nehalem, Core2, ...: SSE kernels */
}

const char *attn_blas_core_for(const attn_cpu *c) {
    if (c->avx512f && c->avx512cd && c->avx512bw && c->avx512dq && c->avx512vl)
        return c->avx512bf16 ? "Cooperlake" : "SkylakeX";
    if (c->avx2 && c->fma) return "Haswell";
    if (c->avx) return "Sandybridge";
    return NULL;
}

int attn_cpu_level(const attn_cpu *c) {
    const char *core = attn_blas_core_for(c);
    return core ? attn_blas_core_level(core) : ATTN_ISA_BASE;
}

/* Sets name=value for the load and remembers the old value (NULL: unset). */
static char *env_swap(const char *name, const char *value) {
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    setenv(name, value, 1);
    return saved;
}

static void env_restore(const char *name, char *saved) {
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

static void *open_lib(void) {
    for (size_t i = 0; i < sizeof LIBS / sizeof LIBS[0]; i++) {
        void *h = dlopen(LIBS[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

/* What to warn about once the kernels are loaded: kernels weaker than the
 * CPU allows, or stronger than it runs. */
static void judge(int cpu_level, const char *user) {
    int core_level = attn_blas_core_level(g.info.core);
    const char *want = g.info.chosen ? g.info.chosen : "(OpenBLAS's own choice)";
    if (core_level < cpu_level)
        snprintf(g.warning, sizeof g.warning,
                 "OpenBLAS computes with its %s kernels, weaker than this CPU allows (%s)%s%s%s",
                 g.info.core, want, user ? ": OPENBLAS_CORETYPE=" : "", user ? user : "",
                 user ? " is set; unset it for full speed" : "");
    else if (core_level > cpu_level)
        snprintf(g.warning, sizeof g.warning,
                 "OpenBLAS computes with its %s kernels, which need instructions this CPU's "
                 "features (%s) do not list; expect a crash (OPENBLAS_CORETYPE=%s)",
                 g.info.core, g.features, user ? user : "");
    g.info.warning = g.warning[0] ? g.warning : NULL;
}

static void load(void) {
    const attn_cpu *cpu = attn_cpu_this();
    attn_cpu_features(cpu, g.features, sizeof g.features);
    g.info.features = g.features;
    g.info.chosen = attn_blas_core_for(cpu);
    const char *env = getenv("OPENBLAS_CORETYPE");
    if (env) snprintf(g.user, sizeof g.user, "%s", env);
    const char *user = g.user[0] ? g.user : NULL;
    g.info.by_user = user != NULL;
    /* OpenBLAS starts its own threads at load unless told one: the core
     * owns parallelism (README, "The core"), so it is told one */
    char *old_threads = env_swap("OPENBLAS_NUM_THREADS", "1");
    char *old_core = NULL;
    int set_core = !user && g.info.chosen;
    if (set_core) old_core = env_swap("OPENBLAS_CORETYPE", g.info.chosen);
    void *h = open_lib();
    if (set_core) env_restore("OPENBLAS_CORETYPE", old_core);
    env_restore("OPENBLAS_NUM_THREADS", old_threads);
    if (!h) {
        snprintf(g.err, sizeof g.err, "cannot load OpenBLAS (%s): install libopenblas0-pthread",
                 dlerror());
        return;
    }
    blas_sgemm = (__typeof__(blas_sgemm))dlsym(h, "cblas_sgemm");
    blas_set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    blas_corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
    if (!blas_sgemm || !blas_set_threads || !blas_corename) {
        snprintf(g.err, sizeof g.err,
                 "the loaded libopenblas lacks cblas_sgemm or "
                 "openblas_get_corename: not OpenBLAS?");
        return;
    }
    blas_set_threads(1);
    g.info.core = blas_corename();
    judge(attn_cpu_level(cpu), user);
    g.ok = 1;
}

int attn_blas_init(char *err, size_t errlen) {
    pthread_once(&g.once, load);
    if (g.ok) return 0;
    if (err && errlen) snprintf(err, errlen, "%s", g.err);
    return -1;
}

const attn_blas_info *attn_blas_get_info(void) {
    return attn_blas_init(NULL, 0) == 0 ? &g.info : NULL;
}

const char *attn_blas_corename(void) {
    return attn_blas_init(NULL, 0) == 0 ? g.info.core : "none";
}

void attn_blas_set_threads(int n) {
    if (attn_blas_init(NULL, 0) == 0) blas_set_threads(n < 1 ? 1 : n);
}

void attn_blas_sgemm(float *C, const float *A, const float *B, int M, int N, int K) {
    if (attn_blas_init(NULL, 0) < 0) return;
    // A (M,K) @ B (K,N) -> C (M,N)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
}
