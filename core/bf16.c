/* bf16.c - what the bf16 kernels stand on (bf16.h): which path this CPU
 * runs, fp32 <-> bf16 conversions, the projection weights packed once in
 * bf16, the page layout of bf16 keys and values, and the AMX tile
 * configuration. The kernels themselves are in bf16_gemm.c (projections)
 * and bf16_attn.c (the attention block).
 *
 * Detection reads CPUID and the OS's enabled register state (XCR0), never a
 * model number: AVX512-BF16 needs AVX-512F/BW/VL and their registers
 * enabled (the core's one probe, cpu.c); AMX also needs AMX-TILE,
 * AMX-BF16, the tile state enabled in XCR0, and Linux's permission to use
 * it (ARCH_REQ_XCOMP_PERM), asked once per process when the path is first
 * looked at.
 * Legend: see attn.h.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bf16.h"
#include "internal.h"

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux's arch_prctl: ask for an XSAVE feature */
#define XFEATURE_XTILEDATA 18      /* the AMX tile data */

/* ---- paths ------------------------------------------------------------------ */

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

/* ---- conversions -------------------------------------------------------------- */

/* fp32 bits -> bf16 bits, branch-free so that loops of it vectorise. */
static inline attn_bf16 round_bits(uint32_t u) {
    uint32_t r = (u + 0x7fffu + (u >> 16 & 1u)) >> 16; /* to nearest, ties to even */
    uint32_t nan = u >> 16 | 0x40u;                    /* quiet, sign and payload top kept */
    uint32_t zero = u >> 16 & 0x8000u;                 /* zero or subnormal: signed zero */
    r = (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
    r = (u & 0x7f800000u) == 0 ? zero : r;
    return (attn_bf16)r;
}

attn_bf16 attn_bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return round_bits(u);
}

void attn_bf16_round_portable(attn_bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        dst[i] = round_bits(u);
    }
}

#define BF16VEC __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BF16VEC static void round_avx512(attn_bf16 *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512(dst + i, (__m512i)b);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)b);
    }
}

void attn_bf16_round(attn_bf16 *dst, const float *src, size_t n) {
    if (attn_bf16_path() >= ATTN_BF16_AVX512)
        round_avx512(dst, src, n);
    else
        attn_bf16_round_portable(dst, src, n);
}

void attn_bf16_widen(float *dst, const attn_bf16 *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = attn_bf16_to_f32(src[i]);
}

/* ---- projection weights ---------------------------------------------------------- */

int attn_packed_bf16_init(attn_packed_bf16 *pw, const float *W, const float *bias, int N, int K) {
    memset(pw, 0, sizeof *pw);
    int panels = (N + ATTN_PANEL - 1) / ATTN_PANEL;
    int kp = (K + ATTN_BF16_KSTEP - 1) / ATTN_BF16_KSTEP * ATTN_BF16_KSTEP / 2;
    size_t n = (size_t)panels * kp * 2 * ATTN_PANEL; /* bf16 elements, a multiple of 32 */
    char *mem = attn_alloc_big(n * sizeof(attn_bf16) + (size_t)panels * ATTN_PANEL * sizeof(float) +
                               64); /* never 0 bytes, whatever N and K */
    if (!mem) return -1;
    attn_bf16 *p = (attn_bf16 *)mem;
    for (int j = 0; j < panels; j++)
        for (int kk = 0; kk < kp; kk++)
            for (int c = 0; c < ATTN_PANEL; c++)
                for (int e = 0; e < 2; e++) {
                    int col = j * ATTN_PANEL + c, k = 2 * kk + e;
                    float w = col < N && k < K ? W[(size_t)col * K + k] : 0.0f;
                    p[(((size_t)j * kp + kk) * ATTN_PANEL + c) * 2 + e] = attn_bf16_of(w);
                }
    pw->bias16 = (float *)(mem + n * sizeof(attn_bf16));
    for (int c = 0; c < panels * ATTN_PANEL; c++)
        pw->bias16[c] = c < N ? bias[c] : 0.0f;
    pw->p = p;
    pw->bias = bias;
    pw->N = N;
    pw->K = K;
    pw->panels = panels;
    pw->kp = kp;
    return 0;
}

void attn_packed_bf16_free(attn_packed_bf16 *pw) {
    if (!pw) return;
    free(pw->p);
    memset(pw, 0, sizeof *pw);
}

/* ---- keys and values in pages ------------------------------------------------------ */

size_t attn_kv_bf16_elems(size_t tokens, int G, int D) {
    size_t pages = (tokens + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
    return pages * (size_t)G * 64 * (size_t)D;
}

/* Offsets, inside a head's part of a page, of token slot t's key d and value d. */
static inline size_t key_at(int D, int t, int d) {
    return ((size_t)((t / 16) * (D / 2) + d / 2) * 16 + (size_t)(t % 16)) * 2 + (size_t)(d % 2);
}
static inline size_t value_at(int D, int t, int d) {
    return 32 * (size_t)D + ((size_t)(t / 2) * D + (size_t)d) * 2 + (size_t)(t % 2);
}

void attn_kv_bf16_put(attn_bf16 *kv, int G, int D, size_t t, const float *k, const float *v) {
    attn_bf16 *page = kv + t / ATTN_KV_PAGE * attn_kv_bf16_elems(ATTN_KV_PAGE, G, D);
    int slot = (int)(t % ATTN_KV_PAGE);
    for (int g = 0; g < G; g++) {
        attn_bf16 *h = page + (size_t)g * 64 * D;
        for (int d = 0; d < D; d++) {
            h[key_at(D, slot, d)] = attn_bf16_of(k[(size_t)g * D + d]);
            h[value_at(D, slot, d)] = attn_bf16_of(v[(size_t)g * D + d]);
        }
    }
}

void attn_kv_bf16_get(const attn_bf16 *kv, int G, int D, size_t t, float *k, float *v) {
    const attn_bf16 *page = kv + t / ATTN_KV_PAGE * attn_kv_bf16_elems(ATTN_KV_PAGE, G, D);
    int slot = (int)(t % ATTN_KV_PAGE);
    for (int g = 0; g < G; g++) {
        const attn_bf16 *h = page + (size_t)g * 64 * D;
        for (int d = 0; d < D; d++) {
            k[(size_t)g * D + d] = attn_bf16_to_f32(h[key_at(D, slot, d)]);
            v[(size_t)g * D + d] = attn_bf16_to_f32(h[value_at(D, slot, d)]);
        }
    }
}

/* Where token t's part of a page starts: the page's first element, and t's slot in it. */
static inline size_t kv_page_of(int G, int D, size_t t, int *slot) {
    *slot = (int)(t % ATTN_KV_PAGE);
    return t / ATTN_KV_PAGE * attn_kv_bf16_elems(ATTN_KV_PAGE, G, D);
}

void attn_kv16_to_rows(const uint16_t *kv16, int G, int D, size_t tokens, uint16_t *rows) {
    size_t gd = (size_t)G * D;
    for (size_t t = 0; t < tokens; t++) {
        int slot;
        const attn_bf16 *page = kv16 + kv_page_of(G, D, t, &slot);
        uint16_t *k = rows + t * 2 * gd, *v = k + gd; /* row t: keys (G,D), values (G,D) */
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) {
                k[(size_t)g * D + d] = page[(size_t)g * 64 * D + key_at(D, slot, d)];
                v[(size_t)g * D + d] = page[(size_t)g * 64 * D + value_at(D, slot, d)];
            }
    }
}

void attn_kv16_from_rows(uint16_t *kv16, int G, int D, size_t tokens, const uint16_t *rows) {
    size_t gd = (size_t)G * D, page_elems = attn_kv_bf16_elems(ATTN_KV_PAGE, G, D);
    if (tokens % ATTN_KV_PAGE) /* the last page: zeros in the slots past tokens */
        memset(kv16 + tokens / ATTN_KV_PAGE * page_elems, 0, sizeof(attn_bf16) * page_elems);
    for (size_t t = 0; t < tokens; t++) {
        int slot;
        attn_bf16 *page = kv16 + kv_page_of(G, D, t, &slot);
        const uint16_t *k = rows + t * 2 * gd, *v = k + gd;
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) {
                page[(size_t)g * 64 * D + key_at(D, slot, d)] = k[(size_t)g * D + d];
                page[(size_t)g * 64 * D + value_at(D, slot, d)] = v[(size_t)g * D + d];
            }
    }
}

/* 16 widths of a row, from d: bf16 in the low halves of 16 32-bit lanes
 * (zeros for a row past the sequence: NULL). */
BF16VEC static inline __m512i widths16(const float *row, int d) {
    if (!row) return _mm512_setzero_si512();
    return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + d)));
}

/* One head's keys in one page: per block of 16 tokens and 32 widths, each
 * token's 16 pairs of widths scattered to the 16 rows of 64 bytes. */
BF16VEC static void pack_keys(attn_bf16 *h, int D, const float *const *rows) {
    const __m512i rows16 =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(16));
    for (int t = 0; t < ATTN_KV_PAGE; t++)
        for (int d = 0; d < D; d += 32) {
            __m512bh b = rows[t] ? _mm512_cvtne2ps_pbh(_mm512_loadu_ps(rows[t] + d + 16),
                                                       _mm512_loadu_ps(rows[t] + d))
                                 : (__m512bh)_mm512_setzero_si512();
            attn_bf16 *at = h + key_at(D, t, d);
            _mm512_i32scatter_epi32(at, rows16, (__m512i)b, 4);
        }
}

/* One head's values in one page: token pairs, the two tokens' widths
 * interleaved. */
BF16VEC static void pack_values(attn_bf16 *h, int D, const float *const *rows) {
    for (int u = 0; u < ATTN_KV_PAGE / 2; u++)
        for (int d = 0; d < D; d += 16) {
            __m512i lo = widths16(rows[2 * u], d), hi = widths16(rows[2 * u + 1], d);
            _mm512_storeu_si512(h + value_at(D, 2 * u, d),
                                _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

void attn_kv_bf16_pack(attn_bf16 *kv, int G, int D, size_t S, const float *k, size_t ldk,
                       const float *v, size_t ldv) {
    size_t full = S / ATTN_KV_PAGE * ATTN_KV_PAGE, page = attn_kv_bf16_elems(ATTN_KV_PAGE, G, D);
    if (attn_bf16_path() == ATTN_BF16_NONE || D % 32) {
        if (full < S) /* the last page: zeros in the slots past S */
            memset(kv + full / ATTN_KV_PAGE * page, 0, sizeof(attn_bf16) * page);
        for (size_t t = 0; t < S; t++)
            attn_kv_bf16_put(kv, G, D, t, k + t * ldk, v + t * ldv);
        return;
    }
    for (size_t p = 0; p * ATTN_KV_PAGE < S; p++)
        for (int g = 0; g < G; g++) {
            const float *kr[ATTN_KV_PAGE], *vr[ATTN_KV_PAGE];
            for (size_t t = 0, at = p * ATTN_KV_PAGE; t < ATTN_KV_PAGE; t++, at++) {
                kr[t] = at < S ? k + at * ldk + (size_t)g * D : NULL;
                vr[t] = at < S ? v + at * ldv + (size_t)g * D : NULL;
            }
            attn_bf16 *h = kv + p * page + (size_t)g * 64 * D;
            pack_keys(h, D, kr);
            pack_values(h, D, vr);
        }
}

/* ---- AMX tile configuration ------------------------------------------------------------ */

/* The 64-byte operand of LDTILECFG (palette 1). */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
} __attribute__((aligned(64))) amx_config;

/* Eight tiles of 16 rows x 64 bytes. Static: GCC 12's _tile_loadconfig does
 * not tell the compiler that it reads the bytes, so stores into a local
 * configuration just before it may be dropped. */
static const amx_config g_amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

__attribute__((target("amx-tile"))) void attn_amx_begin(void) {
    _tile_loadconfig(&g_amx_config);
}

__attribute__((target("amx-tile"))) void attn_amx_end(void) {
    _tile_release();
}
