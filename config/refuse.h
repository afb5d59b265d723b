/* refuse.h - how every file of config/ refuses what it reads: one sentence
 * into the caller's error buffer (cfg_fail), and, for an unknown name, the
 * known name nearest to it (" (did you mean \"x\"?)").
 * It reads nothing and knows no key: callers pass the candidates.
 */
#ifndef ATTND_CONFIG_REFUSE_H
#define ATTND_CONFIG_REFUSE_H

#include <stddef.h>

/* Writes a sentence into err (when given) and returns -1: the one way the
 * config files report a failure. */
int cfg_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* 1 when a JSON real (16.0, 1e+06, as converters and templates write
 * integers) is a whole number a long long holds exactly (below 2^53): an
 * integer key takes it. */
int cfg_whole(double x);

/* Index of name in names[0..n), or -1. */
int cfg_name_index(const char *name, const char *const *names, int n);

/* The candidate nearest to an unknown name, gathered one candidate at a
 * time when the candidates are not in one array. Start with
 * {.name = name}. */
typedef struct {
    const char *name; /* the unknown name (borrowed) */
    const char *best; /* nearest candidate so far (borrowed); NULL until one is near enough:
                         at most a third of its length, and at most 3 edits */
    int dist;         /* best's edit distance to name */
} cfg_nearest;

void cfg_nearest_try(cfg_nearest *n, const char *cand);
/* " (did you mean \"<prefix><best>\"?)" written into buf, or "" (not buf)
 * when no candidate was near. */
const char *cfg_nearest_hint(const cfg_nearest *n, const char *prefix, char *buf, size_t cap);

/* The same over the n candidates in cands, with no prefix. */
const char *cfg_did_you_mean(const char *name, const char *const *cands, int n, char *buf,
                             size_t cap);

#endif
