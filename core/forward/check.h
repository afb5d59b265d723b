/* check.h - the checks of a batch against its model (check.c). */
#ifndef ATTN_FORWARD_CHECK_H
#define ATTN_FORWARD_CHECK_H

#include <stddef.h>

#include "../attn.h"

/* Checks shapes and options of a batch; fills T (query tokens) and U (key
 * tokens). Returns 0, or -1 with a sentence in err. */
int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen);
/* 0 when m's weights are packed (attn_model_pack), which attn_forward
 * needs; else -1 with a sentence in err. */
int attn_check_packed(const attn_model *m, char *err, size_t errlen);

#endif
