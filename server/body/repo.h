/* repo.h - the bodies of the model repository routes (SPEC section 12;
 * KServe v2's repository extension, as Triton serves it): POST
 * /v2/repository/index, /v2/repository/models/{name}/load and .../unload,
 * read into plain values. Every refusal is a 400 naming the field. It
 * loads no model and knows no registry: the routes' handlers do.
 */
#ifndef ATTND_REPO_H
#define ATTND_REPO_H

#include <stddef.h>

#include "../../config/config.h"
#include "../base/reply.h"

/* The index's body: empty (or white space) or {"ready": bool}. *ready_only
 * is 1 when it asks only for the models ready to serve. Returns 0, or -1
 * with e set (400). */
int attnd_repo_parse_index(const char *body, size_t len, int *ready_only, attnd_error *e);

/* A load's body for the model called name (the route's {name}): empty, {}
 * or {"parameters": {}} set *given to 0 (the caller takes the entry of
 * that name in the config file); {"parameters": {"config": "<one model
 * entry as JSON text>"}} sets *given to 1 and fills mc (zeroed by the
 * caller; attnd_model_entry_parse, its weights confined to model_dir).
 * Returns 0, or -1 with e set (400, a weights path that leaves model_dir
 * too) and mc holding nothing; *given is then 1 when the entry was sound
 * but its weights file, inside model_dir, cannot be read (a load that
 * failed), else 0. */
int attnd_repo_parse_load(const char *body, size_t len, const char *name, const char *model_dir,
                          attnd_model_config *mc, int *given, attnd_error *e);

/* An unload's body: empty, {} or {"parameters": {"unload_dependents":
 * bool}} (Triton's parameter: accepted, and meaningless here, since no
 * model depends on another). Returns 0, or -1 with e set (400). */
int attnd_repo_parse_unload(const char *body, size_t len, attnd_error *e);

/* The entry called name in the config file of running as it is now on
 * disk (attnd_config_reread), copied into mc. Returns 0, or -1 with the 400
 * of a file that does not read or the 404 of no such entry. */
int attnd_repo_file_entry(const attnd_config *running, const char *name, attnd_model_config *mc,
                          attnd_error *e);

#endif
