/* keys.h - the table of config keys, shared inside config/: what a row
 * says (cfg_key), the server and model tables, and the stores that check a
 * value against its row and land it. read.c (the file) and env.c (the
 * ATTND_* variables and the flags) both read values through it.
 * Internal to config/: the server includes config.h alone.
 */
#ifndef ATTND_CONFIG_KEYS_H
#define ATTND_CONFIG_KEYS_H

#include <stddef.h>

#include "config.h"
#include "enums.h"
#include "weights.h"

/* server.cors_origins holds at most this many origins. */
#define CFG_CORS_MAX 64
/* The model table has at most this many rows (keys.c checks it). */
#define CFG_MODEL_KEYS_MAX 32

typedef enum {
    K_STR,     /* char *, length in [min, max] */
    K_INT,     /* int in [min, max] */
    K_LL,      /* long long in [min, max] */
    K_BOOL,    /* int 0/1 from a JSON boolean */
    K_STRLIST, /* char ** plus an int count at off_n; at most max entries */
    K_NAME,    /* char[ATTND_NAME_MAX] in place */
    K_ROLEMAP, /* the "tensors" object: role -> tensor name */
    K_NUM,     /* double in (min, max]: a JSON number, integer or not */
    K_ROPE     /* the "rope" object (decoder.c) */
} key_type;

/* A rule on a string's content beyond its length: NULL when s is fine,
 * else why not, as words that follow the quoted value ("must be ..."). */
typedef const char *(*string_rule)(const char *s);

typedef struct {
    const char *section; /* top-level object; NULL for a model key */
    const char *key;
    key_type type;
    long long min, max;        /* value range for numbers, length range for strings */
    long long def;             /* default number or boolean */
    const char *def_str;       /* default string (NULL = none) */
    const char *def_words;     /* --help's default when it is no value (NULL: def or def_str) */
    size_t off;                /* where it lands in attnd_config / attnd_model_config */
    size_t off_n;              /* K_STRLIST: where the count lands */
    const char *flag;          /* --flag that overrides it, or NULL */
    const char *env;           /* ATTND_* variable that overrides it, or NULL */
    string_rule valid;         /* K_STR, K_NAME: the rule on the content, or NULL */
    const attnd_enum *choices; /* K_STR: the words it may be (enums.h), or NULL */
    int required;              /* models only: REQUIRED = must be given */
    int file_relative;         /* K_STR, a path: a relative value in the config file is
                                  taken from the file's folder (read.c), as weights are */
    const char *help;          /* one line for --help; docs/config.md says the same */
} cfg_key;

enum { OPTIONAL = 0, REQUIRED = 1 };

/* The field of type T at byte offset off of the struct at base (a row's off
 * or off_n). */
#define FIELD(T, base, off) ((T *)((char *)(base) + (off)))

/* The server settings, one row per key of the sections "server" to
 * "sessions" (their base is an attnd_config). */
extern const cfg_key cfg_config_keys[];
extern const int cfg_n_config_keys;

/* One entry of "models" (their base is an attnd_model_config). */
extern const cfg_key cfg_model_keys[];
extern const int cfg_n_model_keys;

/* Replaces the string at *slot with a copy of s. Returns 0 or -1 (memory). */
int cfg_set_str(char **slot, const char *s);

/* Frees a list of strings and zeroes it and its count. */
void cfg_free_strlist(char ***list, int *n);

/* Why s breaks k's rule on its content (words that follow the quoted
 * value, written into buf when they name k's choices), or NULL when it
 * keeps it (or k has none). */
const char *cfg_rule_broken(const cfg_key *k, const char *s, char *buf, size_t cap);

/* The stores: each checks a value against row k and lands it in the struct
 * at base, or refuses it with 0 / -1 and err naming src (where it came
 * from: the file, a variable or a flag), key and the reason. */

/* A string of len bytes (K_STR, K_NAME): its length range and rules. */
int cfg_store_string(void *base, const cfg_key *k, const char *s, size_t len, const char *src,
                     const char *key, char *err, size_t errlen);
/* An integer (K_INT, K_LL) in [min, max]. */
int cfg_store_number(void *base, const cfg_key *k, long long v, const char *src, const char *key,
                     char *err, size_t errlen);
/* A list of strings (K_STRLIST), replacing the old one. items/n are
 * borrowed. */
int cfg_store_strlist(void *base, const cfg_key *k, const char **items, const size_t *lens, int n,
                      const char *src, const char *key, char *err, size_t errlen);
/* A number (K_NUM) in (min, max]. */
int cfg_store_real(void *base, const cfg_key *k, double x, const char *src, const char *key,
                   char *err, size_t errlen);

/* Sets row k's default in the struct at base. Returns 0 or -1 (memory). */
int cfg_set_default(void *base, const cfg_key *k);

/* Frees n model configs and the array (NULL is a no-op). */
void cfg_models_free(attnd_model_config *models, int n);

#endif
