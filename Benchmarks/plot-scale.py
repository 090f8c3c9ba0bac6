"""Plots `profile scale` output: rebuild (verify) time and heap against log length.

    swift run -c release --package-path Benchmarks profile scale /tmp > scale.csv
    python3 Benchmarks/plot-scale.py scale.csv Benchmarks/rebuild-scale.png   # needs matplotlib
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

source, target = sys.argv[1], sys.argv[2]
with open(source) as f:
    rows = [r for r in csv.DictReader(line for line in f if "," in line)]
ops = [int(r["operations"]) for r in rows]
seconds = [float(r["seconds"]) for r in rows]
heap = [float(r["heap_mib"]) for r in rows]
live = [int(r["rows"]) for r in rows]

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
a.loglog(ops, seconds, "o-")
a.set_xlabel("operations in the log")
a.set_ylabel("rebuild + check (verify), seconds")
a.set_title("Time: 1.3 µs/op to 1M operations, 3.1 µs/op at 10M\n(passes over the rows, rows read back from the store)", fontsize=10)
for x, y in zip(ops, seconds):
    a.annotate(f"{y:.2f} s", (x, y), textcoords="offset points", xytext=(5, -12))
b.semilogx(ops, heap, "o-", label="heap growth: fold + LMDB dirty pages")
b.axhline(256, color="gray", linestyle="--", label="foldMemoryLimit (256 MiB)")
b.set_xlabel("operations in the log")
b.set_ylabel("MiB")
b.set_title("Heap: the fold (limited) plus the transaction's dirty pages,\nwhich LMDB keeps in memory up to 512 MiB, growing with the rows", fontsize=10)
for x, y, n in zip(ops, heap, live):
    b.annotate(f"{y:.0f} MiB, {n:,} rows", (x, y), textcoords="offset points", xytext=(-110, 8))
b.legend(loc="upper left")
b.set_ylim(0, max(max(heap), 256) * 1.3)
fig.suptitle("Strata rebuild against log length (reference workload; 2 cores, Swift 6.3.1)")
fig.tight_layout()
fig.savefig(target, dpi=110)
