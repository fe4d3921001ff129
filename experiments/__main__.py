"""``python -m experiments list | run NAME | table NAME``: the book's sweeps on Ray.

See experiments/README.md; the runner itself is experiments/runner.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from experiments import runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="each experiment, its number of runs and its CPU estimate")
    run = sub.add_parser("run", help="run an experiment's grid (skipping runs already done)")
    run.add_argument("name")
    run.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the default")
    run.add_argument("--where", nargs="+", default=[], metavar="KEY=VALUE",
                     help="only the runs whose config has these values (setting=base)")
    run.add_argument("--smoke", action="store_true", help="a few runs with tiny budgets")
    run.add_argument("--workers", type=int, help="CPUs of the local cluster (default: all)")
    run.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                     help="a Ray cluster to run on (default: $RAY_ADDRESS, else a local one)")
    run.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    run.add_argument("--gpus-per-run", type=float, default=1.0,
                     help="with --device cuda: the GPU share of each run (0.25: four per GPU)")
    run.add_argument("--threads", type=int, default=1, help="torch threads per run")
    run.add_argument("--sequential", action="store_true", help="in this process, no Ray")
    run.add_argument("--out", type=Path,
                     help="the results file (default: experiments/results/NAME.jsonl)")
    table = sub.add_parser("table", help="derive the chapter's table from the results")
    table.add_argument("name")
    table.add_argument("--results", type=Path, help="default: experiments/results/NAME.jsonl")
    table.add_argument("--out", type=Path, help="default: print it; '-' also prints it")
    table.add_argument("--check", action="store_true",
                       help="compare with the chapter's committed table instead of writing")
    args = parser.parse_args(argv)

    if args.command == "list":
        total = total_rows = 0.0
        print("runs, CPU-h: the default grid (--seeds changes it), one thread a run; "
              "rows, CPU-h: those in the results file")
        print(f"{'experiment':24s} {'runs':>5s} {'CPU-h':>6s} {'rows':>5s} {'CPU-h':>6s}  table")
        for name in runner.EXPERIMENTS:
            module = runner.load(name)
            if not runner.is_experiment(module):
                print(f"{name:24s} {'-':>5s} {'-':>6s} {'-':>5s} {'-':>6s}  (not on the runner yet)")
                continue
            configs = module.grid()
            cpu = sum(module.cpu_seconds(c) for c in configs) / 3600
            rows = runner.header(runner.latest_rows(
                runner.read_results(runner.results_path(name)), name))[1]
            rows_cpu = sum(module.cpu_seconds(r["config"]) for r in rows) / 3600
            total, total_rows = total + cpu, total_rows + rows_cpu
            where = (Path(module.TABLE).relative_to(runner.ROOT) if module.TABLE
                     else "(no table: the runs check the chapter's claims)")
            print(f"{name:24s} {len(configs):5d} {cpu:6.2f} {len(rows):5d} {rows_cpu:6.2f}  {where}")
        print(f"{'all':24s} {'':5s} {total:6.2f} {'':5s} {total_rows:6.2f}")
        return 0
    if args.command == "run":
        counts = runner.execute(args.name, seeds=args.seeds, smoke=args.smoke,
                                workers=args.workers, address=args.address, device=args.device,
                                gpus_per_run=args.gpus_per_run, sequential=args.sequential,
                                out=args.out, threads=args.threads,
                                where=dict(w.split("=", 1) for w in args.where))
        print(json.dumps(counts))
        return 1 if counts["failed"] else 0
    module = runner.load(args.name)
    text = runner.dump_table(module, runner.build_table(args.name, args.results))
    if args.check and module.TABLE is None:
        print(f"{args.name}: no committed table to compare with")
        return 0
    if args.check:
        same = Path(module.TABLE).read_text(encoding="utf-8") == text
        print(f"{args.name}: {'identical to' if same else 'DIFFERS from'} {module.TABLE}")
        return 0 if same else 1
    if args.out and str(args.out) != "-":
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
