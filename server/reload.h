/* reload.h - SIGHUP (SPEC section 12): the config file read again and its
 * models applied to the model table: entries added load, entries removed
 * unload, entries changed (any key, or the weights file's content) load a
 * new version, the rest keep theirs. The other sections are left as they
 * are, each changed key logged as needing a restart. A file that does not
 * read changes nothing: it is logged, counted, and every model serving
 * shows it as its reason. main.c calls it, through server.c.
 */
#ifndef ATTND_RELOAD_H
#define ATTND_RELOAD_H

#include "../config/config.h"
#include "models/registry.h"

/* The models of the config file as last applied: what "removed" is
 * measured against. */
typedef struct {
    attnd_model_config *models; /* (n) owned */
    int n;
} attnd_applied;

/* applied made a copy of the models of c (as started). 0, or -1 when out
 * of memory. */
int attnd_applied_init(attnd_applied *a, const attnd_config *c);
void attnd_applied_free(attnd_applied *a);

/* Reads running's config file again and applies its models to ms; applied
 * becomes them. Logs what it did. */
void attnd_reload(const attnd_config *running, attnd_models *ms, attnd_applied *applied);

#endif
