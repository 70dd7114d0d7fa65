"""Print an ncu report's kernel duration and its SASS instructions with the
most warp-stall samples (from ``ncu --page source --csv --print-source sass``).

    python benchmarks/ncu_top_sass.py REPORT.ncu-rep [N]
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys


def main() -> int:
    report, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    details = subprocess.run(["ncu", "--import", report, "--page", "details", "--csv"],
                             capture_output=True, text=True).stdout
    for row in csv.reader(io.StringIO(details)):
        if len(row) > 14 and row[12] in ("Duration", "Registers Per Thread", "Block Size",
                                          "Grid Size", "Achieved Occupancy", "DRAM Throughput",
                                          "Memory Throughput", "Issue Slots Busy",
                                          "Executed Ipc Active", "Executed Instructions",
                                          "Theoretical Occupancy",
                                          "Warp Cycles Per Issued Instruction"):
            print(f"{row[4][:40]:40s} {row[12]:28s} {row[14]} {row[13]}")
    source = subprocess.run(["ncu", "--import", report, "--page", "source", "--csv",
                             "--print-source", "sass"], capture_output=True, text=True).stdout
    rows = list(csv.reader(io.StringIO(source)))
    header = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if header is None:
        print(source[:2000])
        return 1
    names = rows[header]
    src = names.index("Source")
    stall = next(i for i, n in enumerate(names) if n.startswith("Warp Stall Sampling (All"))
    body = [r for r in rows[header + 1:] if len(r) > stall]

    def samples(r):
        try:
            return float(r[stall])
        except ValueError:
            return 0.0

    total = sum(samples(r) for r in body) or 1.0
    print(f"stall samples: {total:.0f}")
    for r in sorted(body, key=samples, reverse=True)[:top]:
        print(f"{100 * samples(r) / total:5.1f}%  {r[0]:>6}  {r[src][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
