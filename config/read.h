/* read.h - what env.c needs of read.c beyond config.h: loading the config
 * file without opening the weights files, and opening them afterwards,
 * once the variables and flags have had their say.
 * Internal to config/: the server includes config.h alone.
 */
#ifndef ATTND_CONFIG_READ_H
#define ATTND_CONFIG_READ_H

#include <stddef.h>

#include "config.h"

/* Reads the config file at path over c (attnd_config_load_file's
 * contract); check_files = 0 leaves the weights files unopened. */
int cfg_load_file(attnd_config *c, const char *path, int check_files, char *err, size_t errlen);

/* Checks that every model's weights file can be opened and is a regular
 * file; config_file names where the models came from. 0 or -1. */
int cfg_models_readable(const attnd_config *c, const char *config_file, char *err, size_t errlen);

/* The folder part of path with a trailing '/', or "" when it has none
 * (malloc'd; NULL when out of memory). */
char *cfg_folder_of(const char *path);

#endif
