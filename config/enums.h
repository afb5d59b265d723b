/* enums.h - the words a config key or a request field may take, as tables
 * that both check and explain: each row is a word and the value it stands
 * for, one lookup goes each way, and a refusal lists the allowed words from
 * the same table (attnd_enum_list), so a row added is a word accepted,
 * refused with the right list, and shown by --help. Also countof, the
 * length of any table. Plain data and lookups: no I/O.
 *
 * The tables of the config's own words live here (layouts, rotary styles
 * and their scaling types, precisions, log formats and levels, model
 * control); a request's words (attention modes, encodings) are
 * server/body/job.h's, with the same type.
 */
#ifndef ATTND_CONFIG_ENUMS_H
#define ATTND_CONFIG_ENUMS_H

#include <stddef.h>

/* Elements of an array (a table), never of a pointer. */
#define countof(a) (sizeof(a) / sizeof((a)[0]))

typedef struct {
    const char *name; /* the word, as a file or a request spells it */
    int value;        /* what it stands for: the C enum's value */
} attnd_enum_row;

typedef struct {
    const attnd_enum_row *rows;
    int n;
} attnd_enum;

/* The table of an array of rows. */
#define ATTND_ENUM(rows_)                                                                          \
    { (rows_), (int)countof(rows_) }

/* The value of word name into *value: 0, or -1 when no row has it (or name
 * is NULL). */
int attnd_enum_value(const attnd_enum *e, const char *name, int *value);
/* The word of value, or NULL when no row has it. */
const char *attnd_enum_name(const attnd_enum *e, int value);
/* Every word quoted, joined by ", " and the last by `last` (" or " in
 * sentences, ", " in lists): "\"a\", \"b\" or \"c\"". Written into buf (cut
 * to fit); returns buf. */
const char *attnd_enum_list(const attnd_enum *e, const char *last, char *buf, size_t cap);
/* The words bare, joined by sep ("a | b | c"), for --help. */
const char *attnd_enum_words(const attnd_enum *e, const char *sep, char *buf, size_t cap);

/* ---- the config's tables ---- */

/* How a weights file names a model's tensors (config/weights.c). */
typedef enum {
    ATTND_LAYOUT_TORCH = 0, /* nn.MultiheadAttention's state_dict */
    ATTND_LAYOUT_BERT,      /* attention.self.{query,key,value}, attention.output.dense */
    ATTND_LAYOUT_HF_PROJ,   /* {q,k,v}_proj, out_proj or o_proj */
    ATTND_LAYOUT_LLAMA      /* {q,k,v,o}_proj, no biases by default, causal */
} attnd_layout;
extern const attnd_enum attnd_layouts;

/* rope.style -> attn_rope_style; rope.scaling.type -> attn_rope_scaling
 * (ATTN_ROPE_SCALE_NONE has no word: no "scaling" object). */
extern const attnd_enum attnd_rope_styles;
extern const attnd_enum attnd_rope_scalings;

/* A model's "precision" -> attn_precision (SPEC section 8). */
extern const attnd_enum attnd_precisions;
/* workers.bf16_kernels: the bf16 kernels bf16 models may use, by the core's
 * names (attn_set_bf16_kernels); "auto" is the best the CPU has. The values
 * only order them. */
extern const attnd_enum attnd_bf16_kernel_caps;
/* workers.int8_kernels: the same for int8 models (attn_set_int8_kernels). */
extern const attnd_enum attnd_int8_kernel_caps;

/* server.log_format and server.log_level (server/obs/log.c). */
typedef enum { ATTND_LOG_TEXT = 0, ATTND_LOG_JSON } attnd_log_format;
extern const attnd_enum attnd_log_formats;
typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } attnd_log_level;
extern const attnd_enum attnd_log_levels;

/* workers.pin_threads: whether the compute threads are pinned, one CPU each
 * (server/base/cpus.c resolves AUTO). */
typedef enum { ATTND_PIN_AUTO = 0, ATTND_PIN_ON, ATTND_PIN_OFF } attnd_pin;
extern const attnd_enum attnd_pins;

/* server.model_control: whether the model repository routes may load and
 * unload models (SPEC section 12; Triton's --model-control-mode). */
typedef enum { ATTND_CONTROL_NONE = 0, ATTND_CONTROL_EXPLICIT } attnd_model_control;
extern const attnd_enum attnd_model_controls;

#endif
