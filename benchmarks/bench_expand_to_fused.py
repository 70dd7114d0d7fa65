"""The seed's benchmark, re-expressed for cupy_moe: both ops over every manifest
workload, ours against the seed's PyTorch reference (and a sync-free torch
version), with the timing code of ``cupy-moe bench`` (cupy_moe/harness/runner.py).

    python benchmarks/bench_expand_to_fused.py [--op OP] [--quick] [--json PATH]

Without a GPU it times the CPU backend. Prints one line per workload as it
goes, then the table.
"""

from __future__ import annotations

import argparse
import sys

from cupy_moe.harness import report, runner
from cupy_moe.harness.manifest import OP_NAMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["all", *OP_NAMES], default="all")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    ops = list(OP_NAMES) if args.op == "all" else [args.op]
    result = runner.run(ops, None, "auto", args.iters or (10 if args.quick else 50), args.quick)
    for record in result["records"]:
        ours = record["gpu_us"] if record["gpu_us"] is not None else record["cpu_us"]
        print(f"{record['op']:<24} {record['label']:<30} ours {ours} us, "
              f"torch-ref {record['torch_ref_us']} us, status {record['status']}")
    print("\n".join(report.summary_lines(result) + report.table_lines(result)))
    report.write_outputs(result, args.json, None, None)
    return 0 if all(r["status"] == "ok" for r in result["records"]) else 1


if __name__ == "__main__":
    sys.exit(main())
