/* cpu.c - what this CPU can run: its features, probed once (CPUID, with the
 * OS's support for the registers) and kept for the process, and the bf16
 * path they allow. Every kernel choice of the core asks here (the
 * projection kernels, the softmax's row kernels, the attention blocks, the
 * OpenBLAS kernel set); it chooses nothing itself.
 *
 * The bf16 path reads CPUID and the OS's enabled register state (XCR0),
 * never a model number: AVX512-BF16 needs AVX-512F/BW/VL and their
 * registers enabled; AMX also needs AMX-TILE, AMX-BF16, the tile state
 * enabled in XCR0, and Linux's permission to use it (ARCH_REQ_XCOMP_PERM),
 * asked once per process when the path is first looked at.
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu.h"

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

/* ---- the bf16 path ---------------------------------------------------------- */

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux's arch_prctl: ask for an XSAVE feature */
#define XFEATURE_XTILEDATA 18      /* the AMX tile data */

static int g_level;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_force = -1; /* attn_bf16_force; -1: the CPU's */

static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* AMX-TILE and AMX-BF16 in CPUID, tile state in XCR0, and the permission. */
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    int tile = d >> 24 & 1, bf16 = d >> 22 & 1;
    __cpuid(1, a, b, c, d);
    if (!tile || !bf16 || !(c >> 27 & 1)) return 0; /* OSXSAVE: xgetbv is there */
    if ((xcr0() & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static void detect(void) {
    const attn_cpu *c = attn_cpu_this(); /* cpu.c: the OS saves the registers too */
    int avx512 = c->avx512f && c->avx512bw && c->avx512vl && c->avx512bf16;
    g_level = !avx512 ? ATTN_BF16_NONE : amx_usable() ? ATTN_BF16_AMX : ATTN_BF16_AVX512;
}

int attn_bf16_level(void) {
    pthread_once(&g_once, detect);
    return g_level;
}

int attn_bf16_force(int level) {
    int was = g_force;
    g_force = level;
    return was;
}

int attn_bf16_path(void) {
    int cpu = attn_bf16_level();
    return g_force >= 0 && g_force < cpu ? g_force : cpu;
}

const char *attn_bf16_name(int level) {
    return level == ATTN_BF16_AMX ? "amx-bf16" : level == ATTN_BF16_AVX512 ? "avx512-bf16" : "none";
}

const char *attn_bf16_kernels(void) {
    return attn_bf16_name(attn_bf16_path());
}

const char *attn_bf16_cpu_kernels(void) {
    return attn_bf16_name(attn_bf16_level());
}

int attn_set_bf16_kernels(const char *name) {
    if (!name || strcmp(name, "auto") == 0) {
        attn_bf16_force(-1);
        return 0;
    }
    for (int level = ATTN_BF16_NONE; level <= ATTN_BF16_AMX; level++)
        if (strcmp(name, attn_bf16_name(level)) == 0) {
            attn_bf16_force(level);
            return 0;
        }
    return -1;
}

/* ---- the int8 path ---------------------------------------------------------- */

/* AVX-VNNI (VEX, 256-bit) needs AVX2 and FMA; AVX512-VNNI needs AVX-512F/BW/
 * VL; AMX-INT8 needs AMX-TILE, the tile state and the permission (as AMX-BF16
 * does), and AVX-512 for the conversions around the tiles. CPUID leaf 7:
 * ECX bit 11 AVX512-VNNI, EDX bit 25 AMX-INT8, EDX bit
 * 24 AMX-TILE; leaf 7 subleaf 1 EAX bit 4 AVX-VNNI. */
static int g_int8_level;
static pthread_once_t g_int8_once = PTHREAD_ONCE_INIT;
static int g_int8_force = -1;
static int g_int8_vex; /* the VEX form of AVX-VNNI */

static int amx_int8_usable(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    int tile = d >> 24 & 1, int8 = d >> 25 & 1;
    __cpuid(1, a, b, c, d);
    if (!tile || !int8 || !(c >> 27 & 1)) return 0;
    if ((xcr0() & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static void detect_int8(void) {
    const attn_cpu *c = attn_cpu_this();
    unsigned a = 0, b = 0, cx = 0, d = 0;
    int vnni512 = 0, vnni256 = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        vnni512 = cx >> 11 & 1;
        unsigned sub = a;
        if (sub >= 1) {
            __cpuid_count(7, 1, a, b, cx, d);
            vnni256 = a >> 4 & 1;
        }
    }
    int avx512 = c->avx512f && c->avx512bw && c->avx512vl;
    vnni512 = vnni512 && avx512;
    vnni256 = vnni256 && c->avx2 && c->fma;
    if (avx512 && vnni512 && amx_int8_usable()) /* the epilogue around the tiles: AVX-512 */
        g_int8_level = ATTN_INT8_AMX;
    else
        g_int8_level = vnni512 ? ATTN_INT8_AVX512 : vnni256 ? ATTN_INT8_AVX : ATTN_INT8_NONE;
    g_int8_vex = vnni256;
}

int attn_int8_level(void) {
    pthread_once(&g_int8_once, detect_int8);
    return g_int8_level;
}

int attn_int8_vex(void) {
    attn_int8_level();
    return g_int8_vex;
}

int attn_int8_force(int level) {
    int was = g_int8_force;
    g_int8_force = level;
    return was;
}

/* A cap below the CPU's best; AVX-VNNI capped on a CPU without the VEX form
 * runs the same 256-bit kernel in its EVEX form (AVX512-VNNI with VL). */
int attn_int8_path(void) {
    int cpu = attn_int8_level();
    return g_int8_force >= 0 && g_int8_force < cpu ? g_int8_force : cpu;
}

const char *attn_int8_name(int level) {
    static const char *const names[] = {"none", "avx-vnni", "avx512-vnni", "amx-int8"};
    return level >= ATTN_INT8_NONE && level <= ATTN_INT8_AMX ? names[level] : "none";
}

const char *attn_int8_kernels(void) {
    return attn_int8_name(attn_int8_path());
}

const char *attn_int8_cpu_kernels(void) {
    return attn_int8_name(attn_int8_level());
}

int attn_set_int8_kernels(const char *name) {
    if (!name || strcmp(name, "auto") == 0) {
        attn_int8_force(-1);
        return 0;
    }
    for (int level = ATTN_INT8_NONE; level <= ATTN_INT8_AMX; level++)
        if (strcmp(name, attn_int8_name(level)) == 0) {
            attn_int8_force(level);
            return 0;
        }
    return -1;
}
