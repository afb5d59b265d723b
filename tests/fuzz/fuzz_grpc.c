/* fuzz_grpc.c - libFuzzer target: the bytes are a gRPC ModelInferRequest
 * message (protobuf), read into a job as the gRPC side reads one
 * (server/grpc/wire.c: the message as the v2 body it equals, then the v2
 * reader), with no socket and no gRPC library. The models are those of
 * fuzz_server.h ("small", "cross"), named by the message's model_name. Same
 * checks as fuzz_v2 (fuzz_server.h). The same bytes then go through a
 * stream's merging of steps sent ahead (server/grpc/merge.c): as two
 * messages alike, and cut in two; a merge's plan then splits the bytes
 * read as an answer.
 *   make fuzz-smoke; make fuzz-long
 */
#include "../../server/grpc/merge.h"
#include "../../server/grpc/wire.h"
#include "fuzz_server.h"

/* Two messages through the merge: one or both go; a merged request of
 * both reads back as a job like any, and its plan splits any answer or
 * refuses it. */
static void fuzz_merge(const grpc_slice *msgs) {
    uint8_t *merged = NULL, *outs[ATTND_GRPC_MERGE_MAX];
    size_t len = 0, lens[ATTND_GRPC_MERGE_MAX];
    attnd_grpc_merge plan;
    memset(&plan, 0, sizeof plan);
    int k = attnd_grpc_merge_steps(msgs, 2, 1 << 20, &merged, &len, &plan);
    FUZZ_CHECK(k == 1 || k == 2);
    if (k == 1) return;
    FUZZ_CHECK(merged && plan.n == 2 && plan.rows[0] >= 1 && plan.rows[1] >= 1);
    attnd_job job;
    attnd_error e;
    attnd_grpc_target t;
    memset(&e, 0, sizeof(e));
    if (attnd_grpc_parse_infer(fuzz_env(2), merged, len, &t, &job, &e) == 0) {
        FUZZ_CHECK(job.L == plan.rows[0] + plan.rows[1]);
        attnd_job_free(&job);
    }
    if (attnd_grpc_merge_split(GRPC_SLICE_START_PTR(msgs[0]), GRPC_SLICE_LENGTH(msgs[0]), &plan,
                               outs, lens) == 0)
        for (int i = 0; i < plan.n; i++)
            free(outs[i]);
    free(merged);
    attnd_grpc_merge_free(&plan);
}

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
    grpc_slice twice[2] = {grpc_slice_from_copied_buffer((const char *)data, size),
                           grpc_slice_from_copied_buffer((const char *)data, size)};
    grpc_slice cut[2] = {
        grpc_slice_from_copied_buffer((const char *)data, size / 2),
        grpc_slice_from_copied_buffer((const char *)data + size / 2, size - size / 2)};
    fuzz_merge(twice);
    fuzz_merge(cut);
    for (int i = 0; i < 2; i++) {
        grpc_slice_unref(twice[i]);
        grpc_slice_unref(cut[i]);
    }
    return 0;
}
