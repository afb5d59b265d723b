/* attend.h - the attention tasks of a forward: how a batch is cut into
 * them, and the one function the pool runs for each (attend.c).
 */
#ifndef ATTN_TASKS_ATTEND_H
#define ATTN_TASKS_ATTEND_H

#include <stddef.h>

#include "../ops/ops.h"

/* Sets a's cut_rows for batch b on nthreads threads (a's row prepared):
 * the row's block of rows a task, fewer while the batch gives fewer tasks
 * than threads, where the row allows (its fewer_lanes). Call before
 * attn_attend_tasks. */
void attn_attend_cut(attn_attend *a, const attn_batch *b, int nthreads);
/* Scratch floats one thread needs for sequence s. */
size_t attn_attend_floats(const attn_attend *a, const attn_seq *s);
/* Fills tasks (when not NULL) with the batch's attention tasks; returns
 * their count. The first *nselect of them (ATTN_TASK_SELECT; nselect may be
 * NULL) read the queries that the others overwrite with head outputs: they
 * run first, in a loop of their own. */
size_t attn_attend_tasks(const attn_attend *a, const attn_batch *b, attn_task *tasks,
                         size_t *nselect);
/* Runs task t of a (an attn_attend) on thread tid: for attn_pool_run. */
void attn_attend_task(void *a, int t, int tid);

#endif
