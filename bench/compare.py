"""compare.py - one table from the JSON lines bench_core, bench_ort.py and
bench_torch.py wrote (make bench): per shape and thread count, each
implementation's median ms and attnd's speed-up over the others (their ms
over attnd's: above 1 means attnd is faster). Numbers only.

    python3 bench/compare.py FILE
"""
import json
import sys


def main(path):
    cells = {}
    for line in open(path):
        r = json.loads(line)
        cells[(r["impl"], tuple(r["shape"]), r["threads"])] = r["ms"]
    shapes = sorted({k[1] for k in cells}, key=lambda s: [tuple(x[1]) for x in cells].index(s))
    threads = sorted({k[2] for k in cells})
    impls = [i for i in ("attnd", "onnxruntime", "torch") if any(k[0] == i for k in cells)]
    print("median ms; x = the other's ms over attnd's (above 1: attnd faster)")
    head = "%-18s %3s" % ("B, L, E, H", "t") + "".join(" %12s" % i for i in impls)
    head += "".join(" %10s" % ("x " + i[:8]) for i in impls[1:])
    print(head)
    for s in shapes:
        for t in threads:
            ms = [cells.get((i, s, t)) for i in impls]
            if ms[0] is None:
                continue
            line = "%-18s %3d" % (", ".join(map(str, s)), t)
            line += "".join(" %12s" % ("%.2f" % m if m else "-") for m in ms)
            line += "".join(" %10s" % ("%.2f" % (m / ms[0]) if m else "-") for m in ms[1:])
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
