/* version.c - the count of who holds a model version (version.h). */
#include "version.h"

#include <string.h>
#include <sys/stat.h>

void attnd_version_ref(attnd_version *v) {
    if (v) atomic_fetch_add(&v->refs, 1);
}

void attnd_version_unref(attnd_version *v) {
    if (v && atomic_fetch_sub(&v->refs, 1) == 1) v->release(v, v->release_arg);
}

void attnd_file_identify(const char *path, attnd_file_id *id) {
    struct stat st;
    memset(id, 0, sizeof *id);
    if (!path || stat(path, &st) != 0) return;
    *id = (attnd_file_id){st.st_dev, st.st_ino, st.st_size,
                          (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
}

int attnd_file_same(const attnd_file_id *a, const attnd_file_id *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}
