/* cpus.c - the CPUs this process may use, and the thread counts that
 * default from them. See cpus.h.
 *
 * The quota is rounded up (`--cpus 1.5` gives 2 threads): a thread that
 * gets half a CPU still finishes its share, while one thread too few
 * leaves a CPU's worth of quota unused.
 */
#include "cpus.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_HTTP_THREADS = 64, MAX_POOL_THREADS = 1024 };

/* Reads a small file into buf (NUL-terminated). Returns 0 or -1. */
static int read_small(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

static int ceil_div(long long a, long long b) {
    long long q = (a + b - 1) / b;
    return q > INT_MAX ? INT_MAX : (int)q;
}

/* A positive decimal integer filling s up to white space; -1 otherwise. */
static long long parse_count(const char *s, const char **end) {
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (errno || e == s) return -1;
    if (end) *end = e;
    return v;
}

int attnd_cgroup_v2_cpus(const char *cpu_max) {
    while (*cpu_max == ' ')
        cpu_max++;
    const char *rest;
    if (strncmp(cpu_max, "max", 3) == 0) return 0;
    long long quota = parse_count(cpu_max, &rest);
    long long period = quota > 0 ? parse_count(rest, NULL) : -1;
    if (quota <= 0 || period <= 0) return -1;
    return ceil_div(quota, period);
}

int attnd_cgroup_v1_cpus(const char *quota, const char *period) {
    long long q = parse_count(quota, NULL), p = parse_count(period, NULL);
    if (q == -1 && strncmp(quota, "-1", 2) == 0) return 0; /* no limit */
    if (q <= 0 || p <= 0) return -1;
    return ceil_div(q, p);
}

/* The smaller positive limit; 0 = none. */
static int tighter(int a, int b) {
    if (b <= 0) return a;
    return a <= 0 || b < a ? b : a;
}

/* The limit in dir (v2: cpu.max; v1: cfs files), 0 = none or unreadable. */
static int dir_limit(const char *dir, int v2) {
    char path[PATH_MAX * 2 + 32], a[128], b[128];
    int cpus;
    if (v2) {
        snprintf(path, sizeof path, "%s/cpu.max", dir);
        if (read_small(path, a, sizeof a) < 0) return 0;
        cpus = attnd_cgroup_v2_cpus(a);
    } else {
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (read_small(path, a, sizeof a) < 0) return 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (read_small(path, b, sizeof b) < 0) return 0;
        cpus = attnd_cgroup_v1_cpus(a, b);
    }
    return cpus > 0 ? cpus : 0;
}

/* The tightest limit on mount/cgpath and each ancestor up to mount. */
static int walk_up(const char *mount, const char *cgpath, int v2) {
    char rel[PATH_MAX], dir[PATH_MAX * 2];
    snprintf(rel, sizeof rel, "%s", cgpath);
    int best = 0;
    for (;;) {
        size_t n = strlen(rel);
        while (n > 0 && rel[n - 1] == '/')
            rel[--n] = '\0';
        snprintf(dir, sizeof dir, "%s%s", mount, rel);
        best = tighter(best, dir_limit(dir, v2));
        char *slash = strrchr(rel, '/');
        if (!slash) break;
        *slash = '\0';
    }
    return best;
}

/* 1 when the comma-separated controller list names "cpu". */
static int lists_cpu(const char *list, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && list[j] != ',')
            j++;
        if (j - i == 3 && strncmp(list + i, "cpu", 3) == 0) return 1;
        i = j + 1;
    }
    return 0;
}

/* One line of /proc/self/cgroup: "id:controllers:path". */
static int line_limit(const char *root, const char *line) {
    const char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) return 0;
    const char *path = c2 + 1;
    char mount[PATH_MAX];
    if (c2 == c1 + 1) { /* v2: no controllers listed */
        snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
        return walk_up(mount, path, 1);
    }
    if (!lists_cpu(c1 + 1, (size_t)(c2 - c1 - 1))) return 0;
    static const char *const v1[] = {"cpu,cpuacct", "cpu", "cpuacct,cpu"};
    int best = 0;
    for (size_t i = 0; i < countof(v1); i++) {
        snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/%s", root, v1[i]);
        best = tighter(best, walk_up(mount, path, 0));
    }
    return best;
}

int attnd_cgroup_quota_cpus(const char *root) {
    char path[PATH_MAX], text[16384];
    if (strcmp(root, "/") == 0) root = "";
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    if (read_small(path, text, sizeof text) < 0) { /* no list: the mounts' roots alone */
        snprintf(path, sizeof path, "%s/sys/fs/cgroup", root);
        int v2 = dir_limit(path, 1);
        snprintf(path, sizeof path, "%s/sys/fs/cgroup/cpu,cpuacct", root);
        return tighter(v2, dir_limit(path, 0));
    }
    int best = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        best = tighter(best, line_limit(root, line));
    return best;
}

void attnd_cpus_count(attnd_cpus *out) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int aff = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (aff <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        aff = n > 0 ? (int)n : 1;
    }
    out->affinity = aff;
    out->quota = attnd_cgroup_quota_cpus("/");
    out->n = out->quota > 0 && out->quota < aff ? out->quota : aff;
}

int attnd_cpus_list(int *out, int cap) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &set)) out[n++] = c;
    return n;
}

void attnd_threads_resolve(attnd_config *c, const attnd_cpus *cpus, char *note, size_t notelen) {
    if (notelen) note[0] = '\0';
    c->compute_threads = c->worker_threads > 0 ? c->worker_threads : cpus->n;
    if (c->blas_threads > 0) { /* the old pair: batches at once x threads per batch */
        long long t = (long long)(c->worker_threads > 0 ? c->worker_threads : 1) * c->blas_threads;
        c->compute_threads = t > MAX_POOL_THREADS ? MAX_POOL_THREADS : (int)t;
        snprintf(note, notelen,
                 "workers.blas_threads is obsolete: one compute pool of %d threads "
                 "(workers.threads x workers.blas_threads) serves every batch; leave both out "
                 "to use the %d CPUs this process may use",
                 c->compute_threads, cpus->n);
    }
    c->http_pollers = c->http_threads > 0          ? c->http_threads
                      : cpus->n < MAX_HTTP_THREADS ? cpus->n
                                                   : MAX_HTTP_THREADS;
    int pin = ATTND_PIN_AUTO;
    if (c->pin_threads) attnd_enum_value(&attnd_pins, c->pin_threads, &pin);
    /* auto: the pool owns the affinity mask's CPUs, one thread each, and no
     * quota shares them out more thinly */
    int owns =
        c->compute_threads == cpus->affinity && (cpus->quota == 0 || cpus->quota >= cpus->affinity);
    c->pin = pin == ATTND_PIN_ON || (pin == ATTND_PIN_AUTO && owns);
}
