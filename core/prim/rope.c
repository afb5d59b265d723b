/* rope.c - rotary position embeddings (attn.h, attn_rope) on projected rows:
 * the frequency of each rotated pair, scaling applied, and the rotation of
 * one row's heads at its position, angles in double from the integer
 * position so that large positions lose nothing, and YaRN's attention
 * factor on cos and sin. attn.c calls it on the
 * queries and keys of self-attention rows before attending, and says which
 * position a row has; this file knows nothing of sequences or caches. The
 * reference (ref.c) has its own plain copy of the formulas.
 */
#include <math.h>

#include "rope.h"

/* Llama 3.1's rule for the frequency f (attn.h). */
static double llama3(const attn_rope *r, double f) {
    double wavelen = 2 * M_PI / f, orig = r->original_max_position;
    if (wavelen > orig / r->low_freq_factor) return f / r->factor;
    if (wavelen < orig / r->high_freq_factor) return f;
    double s = (orig / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - s) * f / r->factor + s * f;
}

/* The pair (fractional) that turns `turns` times over the trained context:
 * YaRN's bound between the pairs kept and the pairs divided. */
static double yarn_pair(const attn_rope *r, double turns) {
    return r->dim * log(r->original_max_position / (turns * 2 * M_PI)) / (2 * log(r->theta));
}

/* YaRN's rule for the frequency f of pair i (attn.h): divided by factor as
 * the ramp from the beta_fast bound to the beta_slow bound goes to 1. */
static double yarn(const attn_rope *r, int i, double f) {
    double lo = yarn_pair(r, r->beta_fast > 0 ? r->beta_fast : 32);
    double hi = yarn_pair(r, r->beta_slow > 0 ? r->beta_slow : 1);
    if (!r->exact_range) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = fmax(lo, 0);
    hi = fmin(hi, r->dim - 1);
    if (lo == hi) hi += 0.001; /* as Hugging Face: a step, not a division by 0 */
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
    return f / r->factor * ramp + f * (1 - ramp);
}

void attn_rope_freqs(const attn_rope *r, double *inv) {
    for (int i = 0; i < r->dim / 2; i++) {
        double f = pow(r->theta, -2.0 * i / r->dim);
        if (r->scaling == ATTN_ROPE_SCALE_LINEAR) f /= r->factor;
        if (r->scaling == ATTN_ROPE_SCALE_LLAMA3) f = llama3(r, f);
        if (r->scaling == ATTN_ROPE_SCALE_YARN) f = yarn(r, i, f);
        inv[i] = f;
    }
}

/* YaRN's 0.1 m ln(factor) + 1, and 1 for a factor of at most 1. */
static double yarn_mscale(double factor, double m) {
    return factor <= 1 ? 1 : 0.1 * m * log(factor) + 1;
}

double attn_rope_attention_factor(const attn_rope *r) {
    if (r->scaling != ATTN_ROPE_SCALE_YARN) return 1;
    if (r->attention_factor > 0) return r->attention_factor;
    if (r->mscale > 0 && r->mscale_all_dim > 0)
        return yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
    return yarn_mscale(r->factor, 1);
}

void attn_rope_row(float *x, int heads, int D, const attn_rope *r, const double *inv, double pos) {
    int half = r->dim / 2;
    int il = r->style == ATTN_ROPE_INTERLEAVED;
    double af = attn_rope_attention_factor(r);
    for (int j = 0; j < half; j++) {
        double a = pos * inv[j];
        float c = (float)(cos(a) * af), s = (float)(sin(a) * af);
        int a0 = il ? 2 * j : j, a1 = il ? 2 * j + 1 : j + half;
        for (int h = 0; h < heads; h++) {
            float *head = x + (size_t)h * D;
            float x0 = head[a0], x1 = head[a1];
            head[a0] = x0 * c - x1 * s;
            head[a1] = x1 * c + x0 * s;
        }
    }
}
