/* fwd.h - one forward as the forward (forward.c) and its description
 * (plan.c) share it: the plan of its scratch, where its rows are once
 * bound to scratch, and the list of its parallel loops. Both build the
 * list with fwd_loops, so the loops a forward runs are the loops
 * attn_plan_describe describes.
 */
#ifndef ATTN_FORWARD_FWD_H
#define ATTN_FORWARD_FWD_H

#include <stddef.h>

#include "../platform/ctx.h"
#include "../tasks/attend.h"
#include "../tasks/proj.h"

enum { FWD_LOOPS = 8 };

/* One parallel loop: its kind, tasks, and the function that runs one. */
typedef struct {
    attn_loop_kind kind;
    int ntasks;
    attn_task_fn run;
    void *arg;
} fwd_loop;

/* One forward: its plan, then where its projections are. */
typedef struct {
    const attn_model *m;
    const attn_proj_ops *proj; /* the model's rows (attn_model_rows) */
    const attn_batch *b;
    int nthreads;
    size_t T, U;
    int QW, KW, W;     /* widths: H*D, G*D, H*D + 2*G*D */
    attn_attend at;    /* the attention: shape, then q and the tasks */
    attn_ws_size need; /* scratch */
    int prep;          /* 1: rotary positions or steps: a loop over rows */
    size_t pages;      /* bf16 pages of whole sequences' keys and values (a row with pages) */
    /* bound to scratch (fwd_bind): */
    const float *k, *v; /* (U or T, G*D) at row stride ldkv: whole sequences' */
    size_t ldkv;        /* keys and values */
    attn_seq_at *seqs;  /* (B) */
    double *freqs;      /* (rope.dim / 2) */
    attn_bf16 *kv16;    /* (pages) whole sequences' keys and values */
    attn_task *tasks;   /* the attention tasks, the selections' first */
    size_t ntasks, nselect;
    proj_part in[PROJ_PARTS], out; /* the projections */
    proj_job in_job, out_job;
    attn_attend sel; /* the selections' loop: at with its tasks */
} fwd;

/* Plans the forward of b on m with nthreads threads: shapes and scratch
 * sizes (f->need). m is packed; b's tensors are not read. */
void fwd_plan(fwd *f, const attn_model *m, const attn_batch *b, size_t T, size_t U, int nthreads);
/* Binds f to its scratch ws: projections, rows, tasks. */
void fwd_bind(fwd *f, const attn_ws *ws);
/* The loops f runs, in order, into loops (FWD_LOOPS); returns how many. A
 * loop of no task is left out. */
int fwd_loops(fwd *f, fwd_loop *loops);
/* Query and key tokens of a batch, unchecked. */
void fwd_tokens(const attn_batch *b, size_t *T, size_t *U);

/* Rows per task of the loop over rows (rotary positions and cache rows). */
enum { FWD_PREP_ROWS = 32 };

#endif
