/* proj.h - the projections of a forward as parallel loops (proj.c): the
 * inputs prepared once where the model's row prepares them, then tiles of
 * rows x output columns of every part, one task each.
 */
#ifndef ATTN_TASKS_PROJ_H
#define ATTN_TASKS_PROJ_H

#include <stddef.h>
#include <stdint.h>

#include "../ops/ops.h"

enum { PROJ_PARTS = 3 }; /* at most Q, K and V at once */

/* Part `which` (0 q, 1 k, 2 v, 3 out) of model m on its projection row
 * ops: outputs C at row stride ldc from M rows of A at stride lda, on m's
 * packed weights (none yet when m is not packed: sizes only). */
proj_part proj_part_of(const attn_proj_ops *ops, const attn_model *m, int which, float *C,
                       size_t ldc, const float *A, size_t lda, size_t M);

/* One projection loop (or two: preparing, then tiles) over some parts. */
typedef struct {
    proj_part *parts;
    int nparts;
    int by_rows;                   /* tile order: 1 band of rows by band, 0 column block by block */
    int rows, panels;              /* tile shape */
    int first[PROJ_PARTS + 1];     /* first tile of each part; first[nparts] = all tiles */
    proj_part *inputs[PROJ_PARTS]; /* parts whose distinct inputs are prepared */
    int ninputs;
    int ifirst[PROJ_PARTS + 1]; /* first preparing task of each; ifirst[ninputs] = all */
} proj_job;

/* 16-bit elements of the prepared inputs of parts (each distinct input once). */
size_t proj_prepared_elems(const proj_part *parts, int nparts);
/* Cuts parts into tiles for nthreads threads (by_rows: each thread's share
 * a band of rows, else a band of columns) and lays the prepared inputs out
 * in a16 (proj_prepared_elems of them; NULL to describe only). */
void proj_job_init(proj_job *j, proj_part *parts, int nparts, int by_rows, int nthreads,
                   uint16_t *a16);
/* The preparing loop: its tasks (0: the row prepares nothing), one task, a task's shape. */
int proj_prepare_tasks(const proj_job *j);
void proj_prepare_task(void *job, int t, int tid);
void proj_prepare_describe(const proj_job *j, int t, attn_plan_task *out);
/* The tiles' loop (loop ATTN_LOOP_PROJ or ATTN_LOOP_OUT). */
int proj_tile_tasks(const proj_job *j);
void proj_tile_task(void *job, int t, int tid);
void proj_tile_describe(const proj_job *j, int t, attn_loop_kind loop, attn_plan_task *out);

#endif
