/* fuzz_v2_binary.c - libFuzzer target: the Open Inference Protocol binary
 * data extension. The bytes up to the first NUL are the JSON header (JSON
 * text holds no raw NUL), the bytes after it the binary part; the body
 * handed to the parser is header + binary with Inference-Header-Content-
 * Length set to the header's length, and then once more with a length one
 * byte too long and one too short. Same checks as fuzz_native.
 *   make fuzz-smoke; make fuzz-long
 */
#include "fuzz_server.h"

static void one(const char *body, size_t len, size_t json_len) {
    attnd_job job;
    attnd_error e;
    memset(&e, 0, sizeof(e));
    if (attnd_parse_v2(fuzz_env(2), "small", body, len, json_len, &job, &e) == 0) {
        FUZZ_CHECK(job.api == API_V2);
        fuzz_check_job(&job);
        attnd_job_free(&job);
    } else {
        fuzz_check_refusal(&e, &job);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    /* an exact copy, so ASan sees the end of the body */
    char *body = malloc(size ? size - (nul ? 1 : 0) : 1);
    if (!body) return 0;
    memcpy(body, data, json_len);
    if (nul) memcpy(body + json_len, nul + 1, size - json_len - 1);
    size_t len = size - (nul ? 1 : 0);
    if (json_len) one(body, len, json_len);
    if (json_len + 1 <= len) one(body, len, json_len + 1);
    if (json_len > 1) one(body, len, json_len - 1);
    free(body);
    return 0;
}
