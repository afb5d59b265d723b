/* loader.c - the background thread of model loads and frees (loader.h). */
#include "loader.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct task {
    void (*fn)(void *arg);
    void *arg;
    struct task *next;
} task;

struct attnd_loader {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *head, *tail; /* FIFO */
    int stop;          /* 1: run what is queued, then exit */
    int joined;
    pthread_t thread;
};

/* Takes the next task, waiting for one; NULL once stopping with none left. */
static task *next_task(attnd_loader *l) {
    pthread_mutex_lock(&l->mu);
    while (!l->head && !l->stop)
        pthread_cond_wait(&l->cv, &l->mu);
    task *t = l->head;
    if (t && !(l->head = t->next)) l->tail = NULL;
    pthread_mutex_unlock(&l->mu);
    return t;
}

static void *run(void *arg) {
    attnd_loader *l = arg;
    /* nice 19 for this thread alone (Linux threads are scheduled one by
     * one): a load under a steady load takes longer, the requests do not */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    for (task *t; (t = next_task(l));) {
        t->fn(t->arg);
        free(t);
    }
    return NULL;
}

attnd_loader *attnd_loader_new(void) {
    attnd_loader *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (pthread_create(&l->thread, NULL, run, l) != 0) {
        free(l);
        return NULL;
    }
    return l;
}

int attnd_loader_post(attnd_loader *l, void (*fn)(void *arg), void *arg) {
    task *t = malloc(sizeof *t);
    if (!t) return -1;
    *t = (task){fn, arg, NULL};
    pthread_mutex_lock(&l->mu);
    int refused = l->stop;
    if (!refused) {
        if (l->tail)
            l->tail->next = t;
        else
            l->head = t;
        l->tail = t;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    if (refused) free(t);
    return refused ? -1 : 0;
}

void attnd_loader_stop(attnd_loader *l) {
    if (!l || l->joined) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->joined = 1;
}

void attnd_loader_free(attnd_loader *l) {
    if (!l) return;
    attnd_loader_stop(l);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}
