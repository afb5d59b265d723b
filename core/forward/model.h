/* model.h - what the forward asks of a model beyond attn.h (model.c). */
#ifndef ATTN_FORWARD_MODEL_H
#define ATTN_FORWARD_MODEL_H

#include "../ops/ops.h"

/* The model's rows of the precision tables: those it was packed with, or
 * those attn_model_pack would choose (sizing an unpacked model's forward). */
void attn_model_rows(const attn_model *m, const attn_proj_ops **proj,
                     const attn_attend_ops **attend);

#endif
