"""Plots the first-sync benchmark (Server/Scripts/sync-bench.sh): rows/s and the phone's memory
against the number of rows, with the limits measured in the same run.

    python3 Benchmarks/plot-first-sync.py Benchmarks/first-sync.csv Benchmarks/first-sync.png   # needs matplotlib

The CSV's columns are the benchmark's tables, copied by hand: one line per row count.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

source, target = sys.argv[1], sys.argv[2]
with open(source) as f:
    rows = list(csv.DictReader(f))
n = [int(r["rows"]) for r in rows]


def column(name):
    return [float(r[name]) for r in rows]


fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 5))
for name, label, style in [
    ("in_process_rows_per_s", "first sync in-process (SyncClient + HTTPSyncTransport)", "o-"),
    ("cli_rows_per_s", "first sync with `strata sync`", "s-"),
    ("server_alone_rows_per_s", "limit: the server alone (pages fetched, discarded)", "^--"),
    ("merge_alone_rows_per_s", "limit: Strata's merge alone", "v:"),
]:
    speed.semilogx(n, column(name), style, label=label)
speed.axhline(100_000, color="grey", linewidth=0.8)
speed.annotate("target: 100,000 rows/s", (n[0], 100_000), textcoords="offset points", xytext=(0, 4), fontsize=8, color="grey")
speed.set_xlabel("rows on the server")
speed.set_ylabel("rows/s")
speed.set_ylim(bottom=0)
speed.set_title("First sync speed")
speed.legend(fontsize=8, loc="lower right")

for name, label, style in [
    ("in_process_anon_mib", "in-process: the phone's own memory (anon)", "o-"),
    ("cli_anon_mib", "`strata sync`: its own memory (anon)", "s-"),
    ("in_process_resident_mib", "in-process: resident (anon + the store file's mapped pages)", "o:"),
]:
    memory.semilogx(n, column(name), style, label=label)
memory.axhline(64, color="grey", linewidth=0.8)
memory.annotate("target: 64 MiB", (n[0], 64), textcoords="offset points", xytext=(0, 4), fontsize=8, color="grey")
memory.set_xlabel("rows on the server")
memory.set_ylabel("peak MiB")
memory.set_ylim(bottom=0)
memory.set_title("The phone's peak memory")
memory.legend(fontsize=8, loc="upper left")

fig.suptitle("Strata first sync from strata-server on PostgreSQL, all on one 2-core machine", fontsize=11)
fig.tight_layout()
fig.savefig(target, dpi=110)
