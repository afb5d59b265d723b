/* fuzz_safetensors.c - libFuzzer target: the bytes are a whole .safetensors
 * file. They go through the header parser (st_header_parse), the dtype
 * conversion of every tensor, and the full model loader from memory under
 * each layout and a kdim != vdim model. Nothing may crash, leak, read out of
 * bounds, or fail without a message.
 *   make fuzz-smoke FUZZ_SECONDS=600
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/safetensors.h"
#include "../../config/weights.h"

static void convert_all(const st_header *h, const uint8_t *data) {
    for (int i = 0; i < h->n; i++) {
        const st_tensor *t = &h->tensors[i];
        if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16) continue;
        if (t->numel > 4096) continue;
        float buf[4096];
        st_to_f32(buf, data + h->data_start + t->begin, t->dtype, (size_t)t->numel);
    }
}

static void load(const uint8_t *data, size_t size, const char *layout, int E, int H, int kd, int vd,
                 int bias, const char *prefix) {
    attnd_model_config mc;
    attn_model m;
    char err[512];
    memset(&mc, 0, sizeof mc);
    strcpy(mc.name, "fuzz");
    mc.hp = (attn_hparams){.embed_dim = E, .num_heads = H, .kdim = kd, .vdim = vd, .bias = bias};
    mc.weights = "fuzz.safetensors";
    mc.prefix = (char *)prefix;
    mc.layout = (char *)layout;
    err[0] = '\0';
    if (attnd_model_load_mem(&m, &mc, data, size, mc.weights, err, sizeof err) == 0)
        attn_model_free(&m);
    else if (!err[0] || m.mem)
        abort(); /* every refusal says why and holds nothing */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_header h;
    char err[512];
    err[0] = '\0';
    if (st_header_parse(&h, data, size, size, "fuzz.safetensors", err, sizeof err) == 0) {
        convert_all(&h, data);
        st_header_free(&h);
    } else if (!err[0]) {
        abort();
    }
    load(data, size, "torch", 4, 2, 4, 4, 1, "");
    load(data, size, "torch", 4, 2, 2, 3, 1, "");
    load(data, size, "bert", 4, 1, 4, 4, 1, "");
    load(data, size, "hf_proj", 4, 2, 4, 4, 0, "");
    load(data, size, "hf_proj", 4, 2, 4, 4, 1, "l.0.");
    return 0;
}
