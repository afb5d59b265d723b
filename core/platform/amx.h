/* amx.h - the AMX tile configuration every AMX kernel uses: 8 tiles of 16
 * rows x 64 bytes, loaded on the calling thread when a kernel starts and
 * released when it returns, so nothing is kept between calls (amx.c).
 */
#ifndef ATTN_PLATFORM_AMX_H
#define ATTN_PLATFORM_AMX_H

void attn_amx_begin(void);
void attn_amx_end(void);

#endif
