/* fuzz_config.c - libFuzzer target: the bytes are a config file. They go
 * through attnd_config_load_mem over the defaults (weights files are not
 * opened). Nothing may crash or leak; a refusal must say why, and an
 * accepted config must hold only values inside the table's ranges.
 *   make fuzz-smoke FUZZ_SECONDS=600
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    attnd_config c;
    char err[512];
    if (attnd_config_defaults(&c) != 0) return 0;
    err[0] = '\0';
    int rc = attnd_config_load_mem(&c, (const char *)data, size, "/fuzz/conf/attnd.json", 0, err,
                                   sizeof err);
    if (rc != 0 && !err[0]) abort();
    if (rc == 0) {
        if (c.port < 0 || c.port > 65535 || c.worker_threads < 0 || !c.host || !c.api_key_env)
            abort();
        for (int i = 0; i < c.n_models; i++) {
            const attnd_model_config *m = &c.models[i];
            const attn_hparams *hp = &m->hp; /* H divides E unless head_dim is given */
            if ((!hp->head_dim && hp->embed_dim % hp->num_heads) ||
                (hp->num_kv_heads && hp->num_heads % hp->num_kv_heads) || hp->kdim < 1 ||
                hp->vdim < 1 || !m->weights || !m->prefix || !m->layout || !m->name[0])
                abort();
            for (int j = 0; j < i; j++)
                if (!strcmp(c.models[j].name, m->name)) abort();
        }
    }
    attnd_config_free(&c);
    return 0;
}
