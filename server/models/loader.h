/* loader.h - one background thread that runs tasks in the order given, at
 * the lowest CPU priority: the model loads and frees (registry.c), which
 * read and pack megabytes of weights, so that the compute threads keep the
 * CPUs while a model changes. It knows nothing of models.
 */
#ifndef ATTND_LOADER_H
#define ATTND_LOADER_H

typedef struct attnd_loader attnd_loader;

/* Starts the thread; NULL when it cannot. */
attnd_loader *attnd_loader_new(void);
/* Queues fn(arg). 0, or -1 once stopping or out of memory (fn never runs:
 * the caller runs it, or refuses). */
int attnd_loader_post(attnd_loader *l, void (*fn)(void *arg), void *arg);
/* Runs what is queued, then joins the thread; later posts are refused.
 * Later calls do nothing. */
void attnd_loader_stop(attnd_loader *l);
/* Stops, then frees. NULL is fine. */
void attnd_loader_free(attnd_loader *l);

#endif
