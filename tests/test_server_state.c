/* test_server_state.c - session state files (server/session/state.c): write
 * then read, bit for bit, in fp32 and bf16 and with no tokens; the file's
 * header as the format and docs/api.md describe it; every refusal of the
 * reader, each made by changing one thing of a good file (its header
 * through Jansson, or its bytes); and the weights' fingerprint.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/session/state.h"
#include "check_run.h"

enum { LEN = 5, G = 2, D = 3, GD = G * D };
static const attnd_state_limits LIM = {1 << 20, 1000};

/* A cache of LEN tokens whose floats are all distinct and include the odd
 * ones: -0, subnormals, the largest float. */
static void fill_f32(float kv[LEN][2 * GD]) {
    for (int t = 0; t < LEN; t++)
        for (int c = 0; c < 2 * GD; c++)
            kv[t][c] = (float)(t * 100 + c) * 0.37f - 3.0f;
    kv[0][0] = -0.0f;
    kv[1][2] = 1e-45f;
    kv[2][GD] = -1.17549421e-38f;
    kv[4][2 * GD - 1] = 3.40282347e38f;
}

static attnd_state state_f32(float kv[LEN][2 * GD]) {
    return (attnd_state){.model = "small",
                         .fingerprint = "fnv1a64:00112233445566ff",
                         .precision = ATTND_STATE_FP32,
                         .len = LEN,
                         .G = G,
                         .D = D,
                         .kv = kv};
}

static unsigned char *write_file(const attnd_state *st, size_t *n) {
    attnd_sbuf sb;
    char err[256] = "";
    attnd_sb_init(&sb);
    ck_assert_msg(attnd_state_write(&sb, st, err, sizeof err) == 0, "%s", err);
    unsigned char *p = (unsigned char *)attnd_sb_take(&sb, n);
    ck_assert(p != NULL);
    return p;
}

/* A good fp32 file of LEN tokens. */
static unsigned char *good_file(size_t *n) {
    static float kv[LEN][2 * GD];
    fill_f32(kv);
    attnd_state st = state_f32(kv);
    return write_file(&st, n);
}

static void refused(const unsigned char *p, size_t n, const attnd_state_limits *lim,
                    const char *why) {
    attnd_state st;
    char err[512] = "";
    ck_assert_msg(attnd_state_read(p, n, lim, &st, err, sizeof err) == -1, "accepted (wanted: %s)",
                  why);
    ck_assert_msg(strstr(err, why) != NULL, "error \"%s\" lacks \"%s\"", err, why);
    ck_assert(st.model == NULL && st.kv == NULL && st.positions == NULL && st.len == 0);
}

START_TEST(test_round_trip_f32) {
    float kv[LEN][2 * GD];
    fill_f32(kv);
    int32_t pos[LEN] = {0, 1, 2, 3, 4};
    attnd_state in = state_f32(kv), out;
    in.positions = pos;
    size_t n;
    unsigned char *p = write_file(&in, &n);
    char err[256] = "";
    ck_assert_msg(attnd_state_read(p, n, &LIM, &out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out.model, "small");
    ck_assert_str_eq(out.fingerprint, "fnv1a64:00112233445566ff");
    ck_assert_int_eq(out.precision, ATTND_STATE_FP32);
    ck_assert_int_eq(out.len, LEN);
    ck_assert_int_eq(out.G, G);
    ck_assert_int_eq(out.D, D);
    ck_assert(memcmp(out.kv, kv, sizeof kv) == 0); /* bits: -0 and subnormals too */
    ck_assert(signbit(((float *)out.kv)[0]));
    for (int t = 0; t < LEN; t++)
        ck_assert_int_eq(out.positions[t], t);
    /* Written again, the same bytes. */
    size_t n2;
    unsigned char *p2 = write_file(&out, &n2);
    ck_assert(n2 == n && memcmp(p, p2, n) == 0);
    attnd_state_free(&out);
    attnd_state_free(&out); /* twice is safe */
    free(p);
    free(p2);
}
END_TEST

START_TEST(test_round_trip_bf16_and_empty) {
    uint16_t kv[3][2 * 4];
    for (int i = 0; i < 3 * 8; i++)
        kv[i / 8][i % 8] = (uint16_t)(0x3f80 + 37 * i); /* finite bf16 bits */
    kv[0][1] = 0x8000;                                  /* -0 */
    kv[2][7] = 0x0001;                                  /* subnormal */
    attnd_state in = {.model = "m-1.b_f",
                      .fingerprint = "x",
                      .precision = ATTND_STATE_BF16,
                      .len = 3,
                      .G = 1,
                      .D = 4,
                      .kv = kv};
    attnd_state out;
    size_t n;
    unsigned char *p = write_file(&in, &n);
    ck_assert_int_eq(attnd_state_read(p, n, &LIM, &out, NULL, 0), 0);
    ck_assert_int_eq(out.precision, ATTND_STATE_BF16);
    ck_assert(memcmp(out.kv, kv, sizeof kv) == 0);
    attnd_state_free(&out);
    free(p);
    /* A session with no token yet: its shapes are (0, G, D). */
    attnd_state none = {.model = "small", .fingerprint = "f", .len = 0, .G = 2, .D = 8};
    p = write_file(&none, &n);
    ck_assert_int_eq(attnd_state_read(p, n, &LIM, &out, NULL, 0), 0);
    ck_assert_int_eq(out.len, 0);
    ck_assert_int_eq(out.G, 2);
    ck_assert_int_eq(out.D, 8);
    ck_assert(out.kv == NULL);
    attnd_state_free(&out);
    free(p);
}
END_TEST

static uint64_t hlen(const unsigned char *p) {
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = h << 8 | p[i];
    return h;
}

static void set_hlen(unsigned char *p, uint64_t h) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(h >> (8 * i));
}

/* The file split into its header (parsed) and its data, and put back. */
typedef struct {
    json_t *hdr;
    const unsigned char *data;
    size_t ndata;
} parts;

static parts split(const unsigned char *p, size_t n) {
    uint64_t h = hlen(p);
    parts s = {json_loadb((const char *)p + 8, (size_t)h, 0, NULL), p + 8 + h, n - 8 - h};
    ck_assert(s.hdr != NULL);
    return s;
}

static unsigned char *join(const parts *s, size_t *n) {
    char *text = json_dumps(s->hdr, JSON_COMPACT);
    size_t h = strlen(text);
    *n = 8 + h + s->ndata;
    unsigned char *p = malloc(*n);
    set_hlen(p, h);
    memcpy(p + 8, text, h);
    memcpy(p + 8 + h, s->data, s->ndata);
    free(text);
    return p;
}

START_TEST(test_header_as_documented) {
    size_t n;
    unsigned char *p = good_file(&n);
    ck_assert_int_eq((int)(hlen(p) % 8), 0); /* padded: the data starts 8-aligned */
    parts s = split(p, n);
    json_t *meta = json_object_get(s.hdr, "__metadata__");
    const char *want[][2] = {{"format", "attnd-session-state"},
                             {"format_version", "1"},
                             {"model", "small"},
                             {"fingerprint", "fnv1a64:00112233445566ff"},
                             {"length", "5"},
                             {"precision", "fp32"}};
    ck_assert_int_eq((int)json_object_size(meta), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_str_eq(json_string_value(json_object_get(meta, want[i][0])), want[i][1]);
    json_t *k = json_object_get(s.hdr, "keys"), *v = json_object_get(s.hdr, "values"),
           *pos = json_object_get(s.hdr, "positions");
    ck_assert_str_eq(json_string_value(json_object_get(k, "dtype")), "F32");
    ck_assert_str_eq(json_string_value(json_object_get(pos, "dtype")), "I32");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(v, "shape"), 2)), D);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0)),
                     LEN * GD * 4);
    ck_assert_int_eq(s.ndata, (size_t)LEN * GD * 4 * 2 + LEN * 4);
    /* keys hold every token's first G*D floats, values the rest. */
    float kv[LEN][2 * GD], f;
    fill_f32(kv);
    memcpy(&f, s.data + (1 * GD + 2) * 4, 4);
    ck_assert(f == kv[1][2]);
    memcpy(&f, s.data + (LEN * GD + 4 * GD + 5) * 4, 4);
    ck_assert(f == kv[4][GD + 5]);
    json_decref(s.hdr);
    free(p);
}
END_TEST

/* Changes one thing in the header of a good file and expects `why`. */
typedef void (*header_edit)(json_t *hdr);

static void refused_edit(header_edit edit, const char *why) {
    size_t n, n2;
    unsigned char *p = good_file(&n);
    parts s = split(p, n);
    edit(s.hdr);
    unsigned char *q = join(&s, &n2);
    refused(q, n2, &LIM, why);
    json_decref(s.hdr);
    free(p);
    free(q);
}

static json_t *meta(json_t *h) {
    return json_object_get(h, "__metadata__");
}
static void no_format(json_t *h) {
    json_object_del(meta(h), "format");
}
static void no_fingerprint(json_t *h) {
    json_object_del(meta(h), "fingerprint");
}
static void no_length(json_t *h) {
    json_object_del(meta(h), "length");
}
static void no_meta(json_t *h) {
    json_object_del(h, "__metadata__");
}
static void meta_array(json_t *h) {
    json_object_set_new(h, "__metadata__", json_array());
}
static void meta_number(json_t *h) {
    json_object_set_new(meta(h), "length", json_integer(5));
}
static void meta_extra_number(json_t *h) {
    json_object_set_new(meta(h), "note", json_true());
}
static void other_format(json_t *h) {
    json_object_set_new(meta(h), "format", json_string("pytorch"));
}
static void other_version(json_t *h) {
    json_object_set_new(meta(h), "format_version", json_string("2"));
}
static void length_lies(json_t *h) {
    json_object_set_new(meta(h), "length", json_string("4"));
}
static void length_signed(json_t *h) {
    json_object_set_new(meta(h), "length", json_string("+5"));
}
static void length_leading_zero(json_t *h) {
    json_object_set_new(meta(h), "length", json_string("05"));
}
static void precision_bf16(json_t *h) {
    json_object_set_new(meta(h), "precision", json_string("bf16"));
}
static void precision_other(json_t *h) {
    json_object_set_new(meta(h), "precision", json_string("fp16"));
}
static void model_empty(json_t *h) {
    json_object_set_new(meta(h), "model", json_string(""));
}
static void dtype(json_t *h, const char *t, const char *d) {
    json_object_set_new(json_object_get(h, t), "dtype", json_string(d));
}
static void keys_f16(json_t *h) {
    dtype(h, "keys", "F16"); /* half the bytes: the parser refuses the span first */
}
static void keys_i32(json_t *h) {
    dtype(h, "keys", "I32");
}
static void keys_unknown(json_t *h) {
    dtype(h, "keys", "Q7");
}
static void positions_f32(json_t *h) {
    dtype(h, "positions", "F32");
}
static void shape(json_t *h, const char *t, int a, int b, int c) {
    json_object_set_new(json_object_get(h, t), "shape",
                        c ? json_pack("[i,i,i]", a, b, c) : json_pack("[i,i]", a, b));
}
static void values_transposed(json_t *h) {
    shape(h, "values", LEN, D, G);
}
static void keys_2d(json_t *h) {
    shape(h, "keys", LEN, GD, 0);
}
static void positions_short(json_t *h) {
    json_object_set_new(json_object_get(h, "positions"), "shape", json_pack("[i]", LEN - 1));
}
static void offsets(json_t *h, const char *t, long long a, long long b) {
    json_object_set_new(json_object_get(h, t), "data_offsets", json_pack("[I,I]", a, b));
}
static void keys_past_end(json_t *h) {
    offsets(h, "keys", 1000000, 1000000 + LEN * GD * 4);
}
static void values_overlap_keys(json_t *h) {
    offsets(h, "values", 4, 4 + LEN * GD * 4);
}
static void keys_reversed(json_t *h) {
    offsets(h, "keys", LEN * GD * 4, 0);
}
static void extra_tensor(json_t *h) {
    json_object_set_new(
        h, "extra",
        json_pack("{s:s,s:[i],s:[i,i]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0));
}
static void no_positions(json_t *h) {
    json_object_del(h, "positions");
}
static void no_keys(json_t *h) {
    json_object_del(h, "keys");
}

START_TEST(test_refuses_metadata) {
    refused_edit(no_format, "has no \"format\"");
    refused_edit(no_fingerprint, "has no \"fingerprint\"");
    refused_edit(no_length, "has no \"length\"");
    refused_edit(no_meta, "has no \"format\"");
    refused_edit(meta_array, "__metadata__ is not an object");
    refused_edit(meta_number, "\"length\" is not a string");
    refused_edit(meta_extra_number, "\"note\" is not a string");
    refused_edit(other_format, "format is \"pytorch\"");
    refused_edit(other_version, "format_version \"2\"");
    refused_edit(length_lies, "keys hold 5 tokens and positions 5, but length is 4");
    refused_edit(length_signed, "not a whole number");
    refused_edit(length_leading_zero, "not a whole number");
    refused_edit(precision_bf16, "tensor \"keys\" is F32, but precision bf16 is BF16");
    refused_edit(precision_other, "precision \"fp16\"");
    refused_edit(model_empty, "model name of 0 bytes");
}
END_TEST

START_TEST(test_refuses_tensors) {
    refused_edit(keys_f16, "data_offsets span");
    refused_edit(keys_i32, "tensor \"keys\" is I32, but precision fp32 is F32");
    refused_edit(keys_unknown, "unknown dtype \"Q7\"");
    refused_edit(positions_f32, "tensor \"positions\" is F32");
    refused_edit(values_transposed, "keys (5, 2, 3) and values differ");
    refused_edit(keys_2d, "\"keys\" has 2 dimensions, not 3");
    refused_edit(positions_short, "data_offsets span");
    refused_edit(keys_past_end, "run past the end");
    refused_edit(values_overlap_keys, "overlap");
    refused_edit(keys_reversed, "reversed");
    refused_edit(extra_tensor, "unknown tensor \"extra\"");
    refused_edit(no_positions, "no tensor \"positions\"");
    refused_edit(no_keys, "no tensor \"keys\"");
}
END_TEST

START_TEST(test_refuses_shapes_and_heads) {
    /* positions agree with their bytes but not with the keys' length */
    attnd_state none = {.model = "small", .fingerprint = "f", .len = 0, .G = 2, .D = 3};
    size_t n, n2;
    unsigned char *p = write_file(&none, &n);
    parts s = split(p, n);
    shape(s.hdr, "keys", 0, 0, 3);
    shape(s.hdr, "values", 0, 0, 3);
    unsigned char *q = join(&s, &n2);
    refused(q, n2, &LIM, "heads 0 and width 3 must be 1 to 65536");
    free(q);
    shape(s.hdr, "keys", 0, 2, 70000);
    shape(s.hdr, "values", 0, 2, 70000);
    q = join(&s, &n2);
    refused(q, n2, &LIM, "heads 2 and width 70000");
    json_decref(s.hdr);
    free(p);
    free(q);
}
END_TEST

START_TEST(test_refuses_bytes) {
    size_t n;
    unsigned char *p = good_file(&n);
    /* Truncated anywhere: refused, never read past the end. */
    for (size_t cut = 0; cut < n; cut++) {
        attnd_state st;
        char err[512] = "";
        unsigned char *q = malloc(cut ? cut : 1);
        memcpy(q, p, cut);
        ck_assert_msg(attnd_state_read(q, cut, &LIM, &st, err, sizeof err) == -1, "cut %zu", cut);
        ck_assert(err[0]);
        free(q);
    }
    refused(p, 7, &LIM, "too short");
    refused(p, n - 1, &LIM, "run past the end");
    /* The header's length lies: past the file, or short of its JSON. */
    unsigned char *q = malloc(n + 8);
    memcpy(q, p, n);
    set_hlen(q, n - 4);
    refused(q, n, &LIM, "runs past the end of the file");
    set_hlen(q, (uint64_t)1 << 40);
    refused(q, n, &LIM, "absurd header length");
    memcpy(q, p, n);
    set_hlen(q, hlen(p) - 8);
    refused(q, n, &LIM, "not valid JSON");
    /* A byte more than the tensors use. */
    memcpy(q, p, n);
    q[n] = 0;
    refused(q, n + 1, &LIM, "the format leaves no bytes unused");
    /* The caller's limits. */
    attnd_state_limits small = {n - 1, 1000}, few = {1 << 20, LEN - 1};
    refused(p, n, &small, "over the limit of");
    refused(p, n, &few, "length 5 is over the limit of 4 tokens");
    free(q);
    free(p);
}
END_TEST

START_TEST(test_refuses_positions_and_values) {
    float kv[LEN][2 * GD];
    int32_t pos[LEN] = {0, 1, 2, 4, 4};
    fill_f32(kv);
    attnd_state st = state_f32(kv);
    st.positions = pos;
    size_t n;
    unsigned char *p = write_file(&st, &n);
    refused(p, n, &LIM, "positions[3] is 4, not 3");
    free(p);
    st.positions = NULL;
    kv[3][4] = NAN;
    p = write_file(&st, &n);
    refused(p, n, &LIM, "keys[3][1][1] is NaN");
    free(p);
    kv[3][4] = 0;
    kv[2][GD + 5] = -INFINITY;
    p = write_file(&st, &n);
    refused(p, n, &LIM, "values[2][1][2] is Inf");
    free(p);
    uint16_t b[1][2] = {{0x3f80, 0x7fc0}}; /* 1.0, NaN */
    attnd_state bf = {.model = "m",
                      .fingerprint = "f",
                      .precision = ATTND_STATE_BF16,
                      .len = 1,
                      .G = 1,
                      .D = 1,
                      .kv = b};
    p = write_file(&bf, &n);
    refused(p, n, &LIM, "values[0][0][0] is NaN");
    free(p);
    b[0][1] = 0xff80; /* -Inf */
    p = write_file(&bf, &n);
    refused(p, n, &LIM, "values[0][0][0] is Inf");
    free(p);
}
END_TEST

START_TEST(test_writer_refuses) {
    attnd_sbuf sb;
    char err[256] = "";
    float kv[2] = {0};
    attnd_sb_init(&sb);
    attnd_state st = {.model = "", .fingerprint = "f", .len = 1, .G = 1, .D = 1, .kv = kv};
    ck_assert_int_eq(attnd_state_write(&sb, &st, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "model name"));
    st.model = "m";
    st.G = 0;
    ck_assert_int_eq(attnd_state_write(&sb, &st, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "G 0"));
    st.G = 1;
    st.model = "caf\xe9"; /* not UTF-8 */
    ck_assert_int_eq(attnd_state_write(&sb, &st, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "UTF-8"));
    ck_assert_int_eq((int)sb.len, 0);
    attnd_sb_free(&sb);
}
END_TEST

static attn_model model(double theta) {
    attn_hparams hp = {.embed_dim = 8,
                       .num_heads = 2,
                       .kdim = 8,
                       .vdim = 8,
                       .num_kv_heads = 1,
                       .rope.dim = 4,
                       .rope.theta = theta};
    attn_model m;
    char err[256];
    ck_assert_msg(attn_model_init(&m, &hp, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < m.n_floats; i++)
        m.mem[i] = (float)i * 0.01f;
    return m;
}

START_TEST(test_fingerprint) {
    char a[ATTND_FINGERPRINT_LEN + 1], b[ATTND_FINGERPRINT_LEN + 1];
    attn_model m = model(10000), m2 = model(10000), m3 = model(500000);
    attnd_weights_fingerprint(&m, a);
    ck_assert_int_eq((int)strlen(a), ATTND_FINGERPRINT_LEN);
    ck_assert_msg(strncmp(a, "fnv1a64:", 8) == 0 && strspn(a + 8, "0123456789abcdef") == 16, "%s",
                  a);
    attnd_weights_fingerprint(&m2, b);
    ck_assert_str_eq(a, b); /* the same weights: the same fingerprint */
    m2.hp.causal = 1;       /* a request default, not the model */
    attnd_weights_fingerprint(&m2, b);
    ck_assert_str_eq(a, b);
    uint32_t bits;
    memcpy(&bits, &m2.mem[m2.n_floats - 1], 4);
    bits ^= 1; /* one bit of the last weight */
    memcpy(&m2.mem[m2.n_floats - 1], &bits, 4);
    attnd_weights_fingerprint(&m2, b);
    ck_assert_str_ne(a, b);
    attnd_weights_fingerprint(&m3, b); /* another rope theta */
    ck_assert_str_ne(a, b);
    attn_model_free(&m);
    attn_model_free(&m2);
    attn_model_free(&m3);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("state");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, test_round_trip_f32);
    tcase_add_test(tc, test_round_trip_bf16_and_empty);
    tcase_add_test(tc, test_header_as_documented);
    tcase_add_test(tc, test_refuses_metadata);
    tcase_add_test(tc, test_refuses_tensors);
    tcase_add_test(tc, test_refuses_shapes_and_heads);
    tcase_add_test(tc, test_refuses_bytes);
    tcase_add_test(tc, test_refuses_positions_and_values);
    tcase_add_test(tc, test_writer_refuses);
    tcase_add_test(tc, test_fingerprint);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return check_run(suite());
}
