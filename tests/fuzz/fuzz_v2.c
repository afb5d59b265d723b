/* fuzz_v2.c - libFuzzer target: the bytes are an Open Inference Protocol
 * infer body, all JSON (POST /v2/models/{name}/infer with no
 * Inference-Header-Content-Length), for each of the two small models in the
 * path. Same checks as fuzz_native (fuzz_server.h).
 *   make fuzz-smoke; make fuzz-long
 */
#include "fuzz_server.h"

static void one(const uint8_t *data, size_t size, const char *path_model) {
    attnd_job job;
    attnd_error e;
    memset(&e, 0, sizeof(e));
    if (attnd_parse_v2(fuzz_env(2), path_model, (const char *)data, size, 0, &job, &e) == 0) {
        FUZZ_CHECK(job.api == API_V2);
        fuzz_check_job(&job);
        attnd_job_free(&job);
    } else {
        fuzz_check_refusal(&e, &job);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, "small");
    one(data, size, "cross");
    return 0;
}
