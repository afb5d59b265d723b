/* rope.c - rotary position embeddings (attn.h, attn_rope) on projected rows:
 * the frequency of each rotated pair, scaling applied, and the rotation of
 * one row's heads at its position, angles in double from the integer
 * position so that large positions lose nothing. attn.c calls it on the
 * queries and keys of self-attention rows before attending, and says which
 * position a row has; this file knows nothing of sequences or caches. The
 * reference (ref.c) has its own plain copy of the formulas.
 */
#include <math.h>

#include "rope.h"

void attn_rope_freqs(const attn_rope *r, double *inv) {
    for (int i = 0; i < r->dim / 2; i++) {
        double f = pow(r->theta, -2.0 * i / r->dim);
        if (r->scaling == ATTN_ROPE_SCALE_LINEAR) f /= r->factor;
        if (r->scaling == ATTN_ROPE_SCALE_LLAMA3) {
            double wavelen = 2 * M_PI / f, orig = r->original_max_position;
            if (wavelen > orig / r->low_freq_factor) {
                f /= r->factor;
            } else if (wavelen >= orig / r->high_freq_factor) {
                double s = (orig / wavelen - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                f = (1 - s) * f / r->factor + s * f;
            }
        }
        inv[i] = f;
    }
}

void attn_rope_row(float *x, int heads, int D, const attn_rope *r, const double *inv, double pos) {
    int half = r->dim / 2;
    int il = r->style == ATTN_ROPE_INTERLEAVED;
    for (int j = 0; j < half; j++) {
        double a = pos * inv[j];
        float c = (float)cos(a), s = (float)sin(a);
        int a0 = il ? 2 * j : j, a1 = il ? 2 * j + 1 : j + half;
        for (int h = 0; h < heads; h++) {
            float *head = x + (size_t)h * D;
            float x0 = head[a0], x1 = head[a1];
            head[a0] = x0 * c - x1 * s;
            head[a1] = x1 * c + x0 * s;
        }
    }
}
