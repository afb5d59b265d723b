/* select.h - the tasks that give the weights a sequence selects
 * (attn_select, select.c), on the model's attention row.
 */
#ifndef ATTN_SELECT_SELECT_H
#define ATTN_SELECT_SELECT_H

#include <stddef.h>

#include "../ops/ops.h"

/* Scratch floats one select task of s needs. */
size_t attn_select_floats_of(const attn_attend *a, const attn_seq *s);
/* Sequence i's (s) select tasks from tasks[n] (when tasks is not NULL);
 * returns the next n. */
size_t attn_select_tasks(const attn_attend *a, const attn_seq *s, int i, attn_task *tasks,
                         size_t n);
/* One select task: the selected heads' weights of the selected rows of
 * its block, into the sequence's attn (and attn_idx). */
void attn_select_task(const attn_attend *a, const attn_task *tk, float *scratch);

#endif
