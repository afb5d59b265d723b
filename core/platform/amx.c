/* amx.c - the AMX tile configuration (amx.h): one for every AMX kernel,
 * loaded on the calling thread and released when the kernel returns.
 */
#include <immintrin.h>
#include <stdint.h>

#include "amx.h"

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
