#!/usr/bin/env python3
"""Turn the raw runs of scripts/bench.sh (CSV) into markdown tables of medians.

usage: report.py RUNS.csv "RTTS" "WORKLOADS" TIMEOUT

RUNS.csv columns: rtt_ms,workload,prog,rep,seconds,status,cpu_s,rss_kib,bytes,ops,scale
  prog is awcp, sshfs or ssh (the one-channel baseline); status is ok, fail or timeout;
  bytes (for MiB/s) and ops (for ms per operation) may be empty; scale says what the
  workload worked on ("256 MiB", "1390 files", "2000 x 4 KiB").
One table per RTT: medians of the ok runs; a cell with failed or timed-out runs says so.
"""

import csv
import statistics
import sys
from collections import defaultdict


def fmt_s(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def cell(runs):
    """Median seconds (string) and the median value, for a list of run dicts."""
    if not runs:
        return "-", None
    ok = [r["seconds"] for r in runs if r["status"] == "ok"]
    bad = [r["status"] for r in runs if r["status"] != "ok"]
    if not ok:
        return f"{bad[0]} ({len(bad)}/{len(runs)})", None
    med = statistics.median(ok)
    s = fmt_s(med)
    if bad:
        s += f" ({len(bad)}/{len(runs)} {bad[0]})"
    return s, med


def median_of(runs, key):
    vals = [r[key] for r in runs if r["status"] == "ok" and r[key] is not None]
    return statistics.median(vals) if vals else None


def main():
    path, rtts, workloads, timeout = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
    runs = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = {
                "seconds": float(row["seconds"]),
                "status": row["status"],
                "cpu_s": float(row["cpu_s"]) if row["cpu_s"] else None,
                "rss_kib": int(row["rss_kib"]) if row["rss_kib"] else None,
                "bytes": int(row["bytes"]) if row["bytes"] else None,
                "ops": int(row["ops"]) if row["ops"] else None,
                "scale": row["scale"],
            }
            if r["status"] == "timeout":
                r["status"] = f"timeout>{timeout}s"
            runs[(row["rtt_ms"], row["workload"], row["prog"])].append(r)

    for rtt in rtts:
        reps = max((len(v) for k, v in runs.items() if k[0] == rtt), default=0)
        print(f"### RTT {rtt} ms" + (" (no relay: direct to sshd)" if rtt == "0" else " (latency relay)"))
        print()
        print(f"Median of {reps} run(s) in seconds, each on a fresh mount with the page cache dropped. "
              "In brackets: what the workload works on; in parentheses: awcp-mount vs sshfs rates.")
        print()
        print("| workload | awcp-mount (s) | sshfs (s) | sshfs / awcp | awcp peak RSS (MiB) "
              "| awcp CPU (s) | sshfs+ssh CPU (s) | sshfs+ssh peak RSS (MiB) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for wl in workloads:
            a = runs.get((rtt, wl, "awcp"), [])
            s = runs.get((rtt, wl, "sshfs"), [])
            if not a and not s:
                continue
            a_txt, a_med = cell(a)
            s_txt, s_med = cell(s)
            ratio = f"{s_med / a_med:.2f}" if a_med and s_med else "-"
            rss = median_of(a, "rss_kib")
            srss = median_of(s, "rss_kib")
            first = (a or s)[0]
            name = f"{wl} [{first['scale']}]" if first["scale"] else wl
            if first["bytes"] and a_med and s_med:
                mib = first["bytes"] / 2**20
                name += f" ({mib / a_med:.0f} vs {mib / s_med:.0f} MiB/s)"
            if first["ops"] and a_med and s_med:
                ops = first["ops"]
                name += f" ({a_med / ops * 1000:.2f} vs {s_med / ops * 1000:.2f} ms each)"
            print(
                f"| {name} | {a_txt} | {s_txt} | {ratio} "
                f"| {fmt_s(rss / 1024) if rss else '-'} "
                f"| {fmt_s(median_of(a, 'cpu_s'))} | {fmt_s(median_of(s, 'cpu_s'))} "
                f"| {fmt_s(srss / 1024) if srss else '-'} |"
            )
        base = runs.get((rtt, "ssh_cat", "ssh"), [])
        if base:
            txt, med = cell(base)
            nbytes = base[0]["bytes"]
            rate = f", {nbytes / 2**20 / med:.0f} MiB/s" if med and nbytes else ""
            setup_txt, setup = cell(runs.get((rtt, "ssh_true", "ssh"), []))
            if med and setup is not None and nbytes and med > setup:
                rate += f" ({nbytes / 2**20 / (med - setup):.0f} MiB/s without the {setup_txt} s that `ssh ... true` takes)"
            print()
            print(f"Baseline, sequential read over one plain SSH channel (`ssh ... cat big > /dev/null`): "
                  f"{txt} s{rate}.")
        print()


if __name__ == "__main__":
    main()
