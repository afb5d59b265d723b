/* fuzz_grpc.c - libFuzzer target: the bytes are a gRPC ModelInferRequest
 * message (protobuf), read into a job as the gRPC side reads one
 * (server/grpc/wire.c: the message as the v2 body it equals, then the v2
 * reader), with no socket and no gRPC library. The models are those of
 * fuzz_server.h ("small", "cross"), named by the message's model_name. Same
 * checks as fuzz_v2 (fuzz_server.h).
 *   make fuzz-smoke; make fuzz-long
 */
#include "../../server/grpc/wire.h"
#include "fuzz_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    attnd_job job;
    attnd_error e;
    attnd_grpc_target t;
    memset(&e, 0, sizeof(e));
    if (attnd_grpc_parse_infer(fuzz_env(2), data, size, &t, &job, &e) == 0) {
        FUZZ_CHECK(job.api == API_V2);
        FUZZ_CHECK(job.ver && strcmp(job.ver->name, t.model) == 0);
        if (!job.session_close || job.query) fuzz_check_job(&job);
        attnd_job_free(&job);
    } else {
        fuzz_check_refusal(&e, &job);
        FUZZ_CHECK(attnd_grpc_code(e.code) != 0);
    }
    return 0;
}
