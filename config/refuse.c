/* refuse.c - the error sentence every file of config/ writes (cfg_fail),
 * and the "did you mean" hint for an unknown name: the known name at the
 * smallest edit distance, when it is near enough to be a typo; and which
 * real numbers an integer key takes (cfg_whole).
 */
#include "refuse.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int cfg_whole(double x) {
    return x == floor(x) && fabs(x) < 9007199254740992.0;
}

int cfg_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int cfg_name_index(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

/* Edit distance between a and b (insertions, deletions, substitutions and
 * swaps of neighbours, case-insensitive); names past 64 bytes are never
 * near anything. */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1 << 20;
    int d[65][65];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            char x = (char)tolower((unsigned char)a[i - 1]),
                 y = (char)tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (x != y);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == y && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[n][m];
}

void cfg_nearest_try(cfg_nearest *n, const char *cand) {
    int limit = (int)strlen(cand) / 3;
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    int d = edit_distance(n->name, cand);
    if (d <= limit && (!n->best || d < n->dist)) {
        n->best = cand;
        n->dist = d;
    }
}

const char *cfg_nearest_hint(const cfg_nearest *n, const char *prefix, char *buf, size_t cap) {
    if (!n->best) return "";
    snprintf(buf, cap, " (did you mean \"%s%s\"?)", prefix, n->best);
    return buf;
}

const char *cfg_did_you_mean(const char *name, const char *const *cands, int n, char *buf,
                             size_t cap) {
    cfg_nearest near = {.name = name};
    for (int i = 0; i < n; i++)
        cfg_nearest_try(&near, cands[i]);
    return cfg_nearest_hint(&near, "", buf, cap);
}
