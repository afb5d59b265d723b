/* cpu.h - what this CPU runs, probed once (cpu.c): its instruction-set
 * level for the core's own kernels, and the bf16 path (AVX512-BF16, AMX).
 * Every kernel choice of the core asks here; nothing here computes.
 */
#ifndef ATTN_PLATFORM_CPU_H
#define ATTN_PLATFORM_CPU_H

#include "../attn.h"

const attn_cpu *attn_cpu_this(void); /* attn_cpu_detect's answer, kept */
/* ATTN_ISA_* of the core's own kernels: AVX512 (AVX-512F), AVX2 (AVX2 and
 * FMA), else BASE. The OpenBLAS kernel set has its own rule (blas.c). */
int attn_isa(void);

/* The bf16 paths, weakest first: NONE (plain loops; a forward uses fp32
 * instead), AVX512 (AVX512-BF16 on AVX-512F/BW/VL), AMX (AMX-BF16 tiles,
 * with AVX512-BF16 for conversions; the OS's permission for tile data is
 * asked once per process). */
enum { ATTN_BF16_NONE = 0, ATTN_BF16_AVX512 = 1, ATTN_BF16_AMX = 2 };

int attn_bf16_level(void);             /* the best path this CPU and OS run */
int attn_bf16_force(int level);        /* tests, benches: -1 = the CPU's; returns the previous;
                                          a level above the CPU's runs as the CPU's */
int attn_bf16_path(void);              /* the path the kernels take now */
const char *attn_bf16_name(int level); /* "amx-bf16", "avx512-bf16" or "none" */

/* The int8 paths (SPEC section 8), weakest first: NONE (no int8 kernels; an
 * int8 model computes in bf16 or fp32 instead), AVX (AVX-VNNI: VPDPBUSD on
 * 256-bit registers), AVX512 (AVX512-VNNI), AMX (AMX-INT8 tiles, with
 * AVX-512 around them). Every path sums the same int32 products exactly and
 * scales them back by the same fp32 steps: they give the same bits. */
enum { ATTN_INT8_NONE = 0, ATTN_INT8_AVX = 1, ATTN_INT8_AVX512 = 2, ATTN_INT8_AMX = 3 };

int attn_int8_level(void);             /* the best path this CPU and OS run */
int attn_int8_vex(void);               /* 1: the CPU has AVX-VNNI's VEX form */
int attn_int8_force(int level);        /* tests, benches: -1 = the CPU's; returns the previous */
int attn_int8_path(void);              /* the path the kernels take now */
const char *attn_int8_name(int level); /* "amx-int8", "avx512-vnni", "avx-vnni" or "none" */

#endif
