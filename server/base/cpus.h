/* cpus.h - how many CPUs this process may use: its affinity mask
 * (sched_getaffinity: taskset, cpusets, Kubernetes' static CPU manager) and
 * its cgroup CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us:
 * `docker run --cpus 4`, Kubernetes CPU limits), the smaller of the two.
 * The thread counts that default from it are resolved here too.
 * It reads /proc and /sys; it never starts threads.
 */
#ifndef ATTND_CPUS_H
#define ATTND_CPUS_H

#include <stddef.h>

#include "../../config/config.h"

typedef struct {
    int n;        /* CPUs the process may use: min(affinity, quota), >= 1 */
    int affinity; /* CPUs in the affinity mask */
    int quota;    /* CPUs the cgroup quota allows, rounded up; 0 = no quota */
} attnd_cpus;

/* Counts for this process. Never fails: what cannot be read does not limit. */
void attnd_cpus_count(attnd_cpus *out);

/* The cgroup quota, in CPUs rounded up (0 = none), read under `root` ("/"
 * for the real system; tests give a folder of fixture files): every
 * cgroup listed in root/proc/self/cgroup and each of its ancestors, v2
 * (root/sys/fs/cgroup/<path>/cpu.max) and v1 (root/sys/fs/cgroup/cpu,cpuacct
 * or .../cpu, <path>/cpu.cfs_quota_us and cpu.cfs_period_us); the smallest
 * limit wins. A container sees its own cgroup at the mount's root, so the
 * mount's root is read too. */
int attnd_cgroup_quota_cpus(const char *root);

/* One file's text to CPUs, rounded up; 0 = no limit, -1 = unparsable.
 * v2: "max 100000" or "150000 100000". v1: quota "-1" or "400000", period
 * "100000". */
int attnd_cgroup_v2_cpus(const char *cpu_max);
int attnd_cgroup_v1_cpus(const char *quota, const char *period);

/* The CPUs of this process's affinity mask, lowest first, at most cap of
 * them into out: their count (0 when the mask cannot be read). */
int attnd_cpus_list(int *out, int cap);

/* Fills the resolved thread counts of c from its keys, which it leaves as
 * read: c->compute_threads = workers.threads, or the CPUs when 0 (times
 * workers.blas_threads's old meaning when that is set, see
 * docs/config.md); c->http_pollers = server.http_threads, or the CPUs
 * capped at 64 when 0; and c->pin from workers.pin_threads (auto: pinned
 * when the pool has one thread per CPU of the affinity mask and no smaller
 * quota). Writes a warning sentence into note (or "") when an obsolete key
 * was used. */
void attnd_threads_resolve(attnd_config *c, const attnd_cpus *cpus, char *note, size_t notelen);

#endif
