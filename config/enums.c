/* enums.c - word <-> value tables and their lookups (enums.h). */
#include "enums.h"

#include <stdio.h>
#include <string.h>

#include "../core/attn.h"

int attnd_enum_value(const attnd_enum *e, const char *name, int *value) {
    for (int i = 0; name && i < e->n; i++)
        if (strcmp(e->rows[i].name, name) == 0) {
            *value = e->rows[i].value;
            return 0;
        }
    return -1;
}

const char *attnd_enum_name(const attnd_enum *e, int value) {
    for (int i = 0; i < e->n; i++)
        if (e->rows[i].value == value) return e->rows[i].name;
    return NULL;
}

/* The words, each between quote and quote, joined by sep and the last by
 * last. */
static const char *join(const attnd_enum *e, const char *quote, const char *sep, const char *last,
                        char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < e->n && n < cap; i++) {
        const char *before = i == 0 ? "" : i == e->n - 1 ? last : sep;
        int k = snprintf(buf + n, cap - n, "%s%s%s%s", before, quote, e->rows[i].name, quote);
        n += k > 0 ? (size_t)k : 0;
    }
    return buf;
}

const char *attnd_enum_list(const attnd_enum *e, const char *last, char *buf, size_t cap) {
    return join(e, "\"", ", ", last, buf, cap);
}

const char *attnd_enum_words(const attnd_enum *e, const char *sep, char *buf, size_t cap) {
    return join(e, "", sep, sep, buf, cap);
}

static const attnd_enum_row LAYOUTS[] = {
    {"torch", ATTND_LAYOUT_TORCH},
    {"bert", ATTND_LAYOUT_BERT},
    {"hf_proj", ATTND_LAYOUT_HF_PROJ},
    {"llama", ATTND_LAYOUT_LLAMA},
};
const attnd_enum attnd_layouts = ATTND_ENUM(LAYOUTS);

static const attnd_enum_row ROPE_STYLES[] = {
    {"half", ATTN_ROPE_HALF},
    {"interleaved", ATTN_ROPE_INTERLEAVED},
};
const attnd_enum attnd_rope_styles = ATTND_ENUM(ROPE_STYLES);

static const attnd_enum_row ROPE_SCALINGS[] = {
    {"linear", ATTN_ROPE_SCALE_LINEAR},
    {"llama3", ATTN_ROPE_SCALE_LLAMA3},
    {"yarn", ATTN_ROPE_SCALE_YARN},
};
const attnd_enum attnd_rope_scalings = ATTND_ENUM(ROPE_SCALINGS);

static const attnd_enum_row PRECISIONS[] = {
    {"fp32", ATTN_FP32},
    {"bf16", ATTN_BF16},
    {"int8", ATTN_INT8},
};
const attnd_enum attnd_precisions = ATTND_ENUM(PRECISIONS);

static const attnd_enum_row BF16_KERNEL_CAPS[] = {
    {"auto", 3},
    {"amx-bf16", 2},
    {"avx512-bf16", 1},
    {"none", 0},
};
const attnd_enum attnd_bf16_kernel_caps = ATTND_ENUM(BF16_KERNEL_CAPS);

static const attnd_enum_row INT8_KERNEL_CAPS[] = {
    {"auto", 4}, {"amx-int8", 3}, {"avx512-vnni", 2}, {"avx-vnni", 1}, {"none", 0},
};
const attnd_enum attnd_int8_kernel_caps = ATTND_ENUM(INT8_KERNEL_CAPS);

static const attnd_enum_row LOG_FORMATS[] = {
    {"text", ATTND_LOG_TEXT},
    {"json", ATTND_LOG_JSON},
};
const attnd_enum attnd_log_formats = ATTND_ENUM(LOG_FORMATS);

static const attnd_enum_row LOG_LEVELS[] = {
    {"debug", LOG_DEBUG},
    {"info", LOG_INFO},
    {"warn", LOG_WARN},
    {"error", LOG_ERROR},
};
const attnd_enum attnd_log_levels = ATTND_ENUM(LOG_LEVELS);

static const attnd_enum_row PINS[] = {
    {"auto", ATTND_PIN_AUTO},
    {"on", ATTND_PIN_ON},
    {"off", ATTND_PIN_OFF},
};
const attnd_enum attnd_pins = ATTND_ENUM(PINS);

static const attnd_enum_row MODEL_CONTROLS[] = {
    {"none", ATTND_CONTROL_NONE},
    {"explicit", ATTND_CONTROL_EXPLICIT},
};
const attnd_enum attnd_model_controls = ATTND_ENUM(MODEL_CONTROLS);
