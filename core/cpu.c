/* cpu.c - what this CPU can run: its features, probed once (CPUID, with the
 * OS's support for the registers) and kept for the process. Every kernel
 * choice of the core asks here: the projection kernel (gemm.c), the
 * softmax's row kernels (softmax.c), the fused attention (fused.c) and the
 * OpenBLAS kernel set (blas.c). It chooses nothing itself.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "internal.h"

void attn_cpu_detect(attn_cpu *c) {
    memset(c, 0, sizeof *c);
    __builtin_cpu_init();
    /* __builtin_cpu_supports also checks that the OS saves the registers */
    c->avx512f = __builtin_cpu_supports("avx512f");
    c->avx512cd = __builtin_cpu_supports("avx512cd");
    c->avx512bw = __builtin_cpu_supports("avx512bw");
    c->avx512dq = __builtin_cpu_supports("avx512dq");
    c->avx512vl = __builtin_cpu_supports("avx512vl");
    c->avx512bf16 = __builtin_cpu_supports("avx512bf16");
    c->avx2 = __builtin_cpu_supports("avx2");
    c->fma = __builtin_cpu_supports("fma");
    c->avx = __builtin_cpu_supports("avx");
    c->sse4_2 = __builtin_cpu_supports("sse4.2");
}

void attn_cpu_features(const attn_cpu *c, char *out, size_t n) {
    const struct {
        int on;
        const char *name;
    } f[] = {{c->avx512f, "avx512f"},   {c->avx512cd, "avx512cd"}, {c->avx512bw, "avx512bw"},
             {c->avx512dq, "avx512dq"}, {c->avx512vl, "avx512vl"}, {c->avx512bf16, "avx512bf16"},
             {c->avx2, "avx2"},         {c->fma, "fma"},           {c->avx, "avx"},
             {c->sse4_2, "sse4_2"}};
    size_t used = 0;
    if (n) out[0] = '\0';
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].on) continue;
        int w = snprintf(out + used, n > used ? n - used : 0, "%s%s", used ? "," : "", f[i].name);
        if (w > 0) used += (size_t)w;
    }
}

static attn_cpu g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void probe(void) {
    attn_cpu_detect(&g_cpu);
}

const attn_cpu *attn_cpu_this(void) {
    pthread_once(&g_cpu_once, probe);
    return &g_cpu;
}

int attn_isa(void) {
    const attn_cpu *c = attn_cpu_this();
    return c->avx512f ? ATTN_ISA_AVX512 : c->avx2 && c->fma ? ATTN_ISA_AVX2 : ATTN_ISA_BASE;
}
