"""Plots `profile scale` output: rebuild (verify) time and heap against log length, and, when the
CSV has them (`--peers`), the SQLite peers' replay of the same edits on the same axes.

    swift run -c release --package-path Benchmarks profile scale /tmp --peers > scale.csv
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
peers = [(column, label, marker) for column, label, marker in
         [("trigger_seconds", "SQLite trigger peer: replay the change log + check", "s--"),
          ("session_seconds", "SQLite session peer: apply the changesets + check", "^:")]
         if rows and column in rows[0] and rows[0][column]]

fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5.5))
a.loglog(ops, seconds, "o-", label="Strata: verify (fold the log + compare)")
# Labels: Strata's below its points, each peer's above, the slower peer higher, so none overlap.
for x, y in zip(ops, seconds):
    a.annotate(f"{y:.2f} s", (x, y), textcoords="offset points", xytext=(6, -14), fontsize=8, color="C0")
# A length may lack the peers (`scale` run without --peers): those points are left out.
peer_values = [[float(r[column]) if r.get(column) else None for r in rows] for column, _, _ in peers]
for i, (column, label, marker) in enumerate(peers):
    points = [(x, y, s) for x, y, s in zip(ops, peer_values[i], seconds) if y is not None]
    a.loglog([p[0] for p in points], [p[1] for p in points], marker, label=label, color=f"C{i + 1}")
    for x, y, s in points:
        # Left of the point; at each length the slower peer's label above, the faster's below.
        j = ops.index(x)
        higher = all(other[j] is None or y >= other[j] for other in peer_values)
        a.annotate(f"{y:.2f} s ({y / s:.1f}×)", (x, y), textcoords="offset points", xytext=(-8, 4 if higher else -11),
                   ha="right", fontsize=8, color=f"C{i + 1}")
a.set_xlabel("operations in the log")
a.set_ylabel("seconds")
a.set_title("Time: rebuild + check against the peers' replay\n(ratio: the peer's time over Strata's)", fontsize=10)
a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8)
a.set_xlim(min(ops) / 6, max(ops) * 3)
top = max([max(seconds)] + [float(r[c]) for c, _, _ in peers for r in rows if r.get(c)])
a.set_ylim(min(seconds) / 3, top * 3)
b.semilogx(ops, heap, "o-", label="heap growth: fold + LMDB dirty pages")
b.axhline(256, color="gray", linestyle="--", label="foldMemoryLimit (256 MiB)")
b.set_xlabel("operations in the log")
b.set_ylabel("MiB")
b.set_title("Heap: the fold (limited) plus the scratch store's\ndirty pages (LMDB keeps up to 512 MiB in memory)", fontsize=10)
for j, (x, y, n) in enumerate(zip(ops, heap, live)):
    # The first label to the right of its point, the last to the left, so none leaves the axes.
    ha = "left" if j == 0 else "right" if j == len(ops) - 1 else "center"
    b.annotate(f"{y:.0f} MiB\n{n:,} rows", (x, y), textcoords="offset points", xytext=(0, 8), ha=ha, fontsize=8)
b.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8)
b.set_ylim(0, max(max(heap), 256) * 1.35)
fig.suptitle("Strata rebuild against log length (reference workload; 2 cores, Swift 6.3.1)")
fig.tight_layout()
fig.savefig(target, dpi=110)
