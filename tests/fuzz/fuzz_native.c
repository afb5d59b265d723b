/* fuzz_native.c - libFuzzer target: the bytes are a native request body
 * (POST /v1/attention), read against two small models with no model in the
 * path, and once more with "small" in the path (/v1/models/small/attention).
 * An accepted body must make a job inside every limit whose answer is valid
 * JSON; a refused one a status and a sentence (fuzz_server.h). Nothing may
 * crash, leak or read outside the body (ASan, UBSan).
 *   make fuzz-smoke; make fuzz-long
 */
#include "fuzz_server.h"

static void one(const uint8_t *data, size_t size, const char *path_model) {
    attnd_job job;
    attnd_error e;
    memset(&e, 0, sizeof(e));
    if (attnd_parse_native(fuzz_env(2), path_model, (const char *)data, size, &job, &e) == 0) {
        FUZZ_CHECK(job.api == API_NATIVE);
        fuzz_check_job(&job);
        attnd_job_free(&job);
    } else {
        fuzz_check_refusal(&e, &job);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, NULL);
    one(data, size, "small");
    return 0;
}
