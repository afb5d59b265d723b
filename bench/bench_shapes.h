/* bench_shapes.h - the six shapes the core's benchmarks run (bench_core,
 * bench_scale; bench_torch.py, bench_ort.py and bench_openvino.py repeat
 * them): B sequences of L tokens, width E, H heads, self-attention. */
#ifndef ATTND_BENCH_SHAPES_H
#define ATTND_BENCH_SHAPES_H

typedef struct {
    int B, L, E, H;
} shape;

static const shape g_shapes[] = {
    {1, 128, 512, 8},  {1, 512, 1024, 16},  {8, 128, 512, 8},
    {32, 64, 768, 12}, {1, 2048, 1024, 16}, {1, 4096, 512, 8},
};
#define NSHAPES ((int)(sizeof(g_shapes) / sizeof(g_shapes[0])))

#endif
