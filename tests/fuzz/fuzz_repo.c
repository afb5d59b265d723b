/* fuzz_repo.c - libFuzzer target: the model repository routes' bodies
 * (server/body/repo.c) and the path confinement under them
 * (attnd_path_confine). The first byte picks the reader, the rest is its
 * input:
 *   0  the index's body            1  an unload's body
 *   2  a load's body, model folder a temporary one holding a weights file,
 *      a folder and symbolic links in and out (made once, at start)
 *   3  a load's body, model folder /nonexistent
 *   4  a path confined to that temporary folder
 * Nothing may crash or leak. A refusal is a 400 with a message and leaves
 * no entry behind; an accepted load's entry has the route's name, weights
 * inside the folder, and copies and compares equal; a confined path has no
 * ".." and resolves inside the folder.
 *   make fuzz-smoke FUZZ_SECONDS=600
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../server/body/repo.h"
#include "fuzz_check.h"

static char g_dir[64] = "/tmp/attnd-fuzz-repo-XXXXXX"; /* the model folder */
static char g_real[4096];                              /* its realpath */
static char g_outside[96];                             /* a file beside it, outside */

static void path_in(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_file(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) abort();
}

static void remove_all(void) {
    static const char *const names[] = {
        "w.safetensors", "sub/x.safetensors", "sub", "in", "out.safetensors", "up"};
    char p[160];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(names[i], p, sizeof p);
        if (unlink(p) != 0) rmdir(p);
    }
    unlink(g_outside);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* a safetensors file with no tensors: 8 bytes of header length, "{}" */
    static const unsigned char empty_st[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    char p[160];
    if (!mkdtemp(g_dir) || !realpath(g_dir, g_real)) abort();
    snprintf(g_outside, sizeof g_outside, "%s.outside", g_dir);
    write_file(g_outside, empty_st, sizeof empty_st);
    path_in("w.safetensors", p, sizeof p);
    write_file(p, empty_st, sizeof empty_st);
    path_in("sub", p, sizeof p);
    if (mkdir(p, 0700) != 0) abort();
    path_in("sub/x.safetensors", p, sizeof p);
    write_file(p, empty_st, sizeof empty_st);
    path_in("in", p, sizeof p);
    if (symlink("w.safetensors", p) != 0) abort();
    path_in("out.safetensors", p, sizeof p);
    if (symlink(g_outside, p) != 0) abort();
    path_in("up", p, sizeof p);
    if (symlink("..", p) != 0) abort();
    atexit(remove_all);
    return 0;
}

static int is_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static int in_folder(const char *path) {
    size_t n = strlen(g_real);
    return strncmp(path, g_real, n) == 0 && path[n] == '/' && path[n + 1];
}

static void refused(int rc, const attnd_error *e) {
    FUZZ_CHECK(rc == -1 && e->code == AERR_BAD_REQUEST && e->msg[0]);
}

static void load(const char *body, size_t len, const char *dir) {
    attnd_model_config mc, copy;
    attnd_error e = {0};
    int given = -1;
    memset(&mc, 0, sizeof mc);
    int rc = attnd_repo_parse_load(body, len, "enc", dir, &mc, &given, &e);
    if (rc != 0 || !given) {
        if (rc != 0) refused(rc, &e);
        /* given 1 on a refusal: a sound entry whose weights file alone failed */
        FUZZ_CHECK((given == 0 || (rc != 0 && given == 1)) && is_zero(&mc, sizeof mc));
        return;
    }
    FUZZ_CHECK(rc == 0 && given == 1 && strcmp(mc.name, "enc") == 0);
    FUZZ_CHECK(mc.weights && in_folder(mc.weights) && mc.prefix && mc.layout);
    const attn_hparams *hp = &mc.hp;
    FUZZ_CHECK(hp->embed_dim >= 1 && hp->num_heads >= 1 && hp->kdim >= 1 && hp->vdim >= 1);
    FUZZ_CHECK(hp->head_dim || hp->embed_dim % hp->num_heads == 0);
    FUZZ_CHECK(attnd_model_config_copy(&copy, &mc) == 0);
    FUZZ_CHECK(attnd_model_config_equal(&copy, &mc) && attnd_model_config_equal(&mc, &copy));
    attnd_model_config_free(&copy);
    attnd_model_config_free(&mc);
}

/* 1 when one of path's components is "..". */
static int has_dotdot(const char *path) {
    for (const char *p = path; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == path || p[-1] == '/') && (!p[2] || p[2] == '/'))
            return 1;
    return 0;
}

static void confine(const char *bytes, size_t len) {
    char err[512], *res = (char *)1;
    char *path = strndup(bytes, len); /* a path ends at its first NUL */
    if (!path) return;
    err[0] = '\0';
    if (attnd_path_confine(g_dir, path, &res, err, sizeof err) == 0) {
        FUZZ_CHECK(in_folder(res) && !has_dotdot(res) && !has_dotdot(path));
        struct stat st;
        FUZZ_CHECK(stat(res, &st) == 0);
        free(res);
    } else {
        FUZZ_CHECK(res == NULL && err[0]);
    }
    free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    attnd_error e = {0};
    int ready = -1;
    switch (data[0] % 5) {
    case 0: {
        int rc = attnd_repo_parse_index(body, len, &ready, &e);
        if (rc == 0)
            FUZZ_CHECK(ready == 0 || ready == 1);
        else
            refused(rc, &e);
        break;
    }
    case 1: {
        int rc = attnd_repo_parse_unload(body, len, &e);
        if (rc != 0) refused(rc, &e);
        break;
    }
    case 2:
        load(body, len, g_dir);
        break;
    case 3:
        load(body, len, "/nonexistent");
        break;
    default:
        confine(body, len);
    }
    return 0;
}
