"""compare.py - one table from the JSON lines bench_core, bench_ort.py,
bench_openvino.py and bench_torch.py wrote (make bench): per shape and thread count, each
implementation's median ms and attnd's speed-up over the others (their ms
over attnd's: above 1 means attnd is faster). Then, from `bench_core
--pauses` and bench_lone.py, a lone forward after each pause (the core
alone, and a request's compute_us through the daemon) over bench_core's
back-to-back forward of the same shape and threads. Numbers only.

    python3 bench/compare.py FILE [FILE ...]

With several files (the cells.json of several make bench runs, copied
aside), each cell is the median of its runs, and the ratios are those
medians' (docs/performance.md quotes medians of three runs).
"""
import json
import statistics
import sys


def main(paths):
    runs, paused_runs = {}, {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if "pause_ms" in r:
                paused_runs.setdefault((r["impl"], tuple(r["shape"]), r["threads"],
                                        r["pause_ms"]), []).append(r)
            else:
                runs.setdefault((r["impl"], tuple(r["shape"]), r["threads"]), []).append(r["ms"])
    cells = {k: statistics.median(v) for k, v in runs.items()}
    paused = {k: {f: statistics.median(r[f] for r in v) for f in ("ms", "total_ms")
                  if all(f in r for r in v)} for k, v in paused_runs.items()}
    if len(paths) > 1:
        print("medians of %d runs (%s)" % (len(paths), ", ".join(paths)))
    shapes = sorted({k[1] for k in cells}, key=lambda s: [tuple(x[1]) for x in cells].index(s))
    threads = sorted({k[2] for k in cells})
    impls = [i for i in ("attnd", "attnd-bf16", "attnd-int8", "onnxruntime", "onnxruntime-int8",
                         "openvino-f32", "openvino-bf16", "torch")
             if any(k[0] == i for k in cells)]
    ours = ("attnd-bf16", "attnd-int8")
    # bf16 against bf16: OpenVINO's bf16 and attnd's fp32 over attnd's bf16; int8 against
    # int8: onnxruntime's quantized graph and attnd's bf16 over attnd's int8
    bf16, int8 = "attnd-bf16" in impls, "attnd-int8" in impls
    extra = [("openvino-bf16", "attnd-bf16", "x ov-bf16/bf16"),
             ("attnd", "attnd-bf16", "x fp32/bf16")] if bf16 else []
    extra += [("onnxruntime-int8", "attnd-int8", "x ort-int8/int8"),
              ("attnd-bf16", "attnd-int8", "x bf16/int8")] if int8 else []
    print("median ms; x = the other's ms over attnd's (above 1: attnd faster)" +
          ("; the last columns over attnd-bf16's and attnd-int8's, as named" if extra else ""))
    head = "%-18s %3s" % ("B, L, E, H", "t") + "".join(" %13s" % i for i in impls)
    head += "".join(" %15s" % ("x " + i) for i in impls[1:]
                    if i not in ours and i != "onnxruntime-int8")
    head += "".join(" %15s" % h for _, _, h in extra)
    print(head)
    for s in shapes:
        for t in threads:
            ms = [cells.get((i, s, t)) for i in impls]
            if ms[0] is None:
                continue
            line = "%-18s %3d" % (", ".join(map(str, s)), t)
            line += "".join(" %13s" % ("%.2f" % m if m else "-") for m in ms)
            line += "".join(" %15s" % ("%.2f" % (m / ms[0]) if m else "-")
                            for i, m in zip(impls[1:], ms[1:])
                            if i not in ours and i != "onnxruntime-int8")
            for impl, over, _ in extra:
                m, b = cells.get((impl, s, t)), cells.get((over, s, t))
                line += " %15s" % ("%.2f" % (m / b) if m and b else "-")
            print(line)
    if paused:
        print_paused(cells, paused)


def print_paused(cells, paused):
    """One row per shape, threads and pause: the back-to-back forward, the
    core's lone forward after the pause and the daemon's lone request's
    compute (and its server total), the last two over the first."""
    print()
    print("a lone forward after a pause, median ms; x = over attnd's back-to-back forward "
          "(the lone request's target: at most 1.10)")
    print("%-18s %3s %9s %13s %13s %9s %13s %9s %13s" %
          ("B, L, E, H", "t", "pause ms", "back to back", "core alone", "x", "request",
           "x", "server total"))
    for s, t, pause in sorted({k[1:] for k in paused}):
        b2b = cells.get(("attnd", s, t))
        core = paused.get(("attnd-core-paused", s, t, pause), {}).get("ms")
        req = paused.get(("attnd-lone", s, t, pause), {})
        cols = ["%.2f" % b2b if b2b else "-"]
        for m in (core, req.get("ms")):
            cols += ["%.2f" % m if m else "-", "%.2f" % (m / b2b) if m and b2b else "-"]
        cols.append("%.2f" % req["total_ms"] if "total_ms" in req else "-")
        print("%-18s %3d %9g %13s %13s %9s %13s %9s %13s" %
              ((", ".join(map(str, s)), t, pause) + tuple(cols)))


if __name__ == "__main__":
    main(sys.argv[1:])
