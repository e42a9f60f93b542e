"""The fast test tier's cost and reach.

    python benchmarks/bench_tests.py [--coverage] [--one-thread] [--json] [-- PYTEST_ARGS...]

Runs the README's fast tier, ``python -m pytest -m "not slow" -q -p no:cacheprovider`` (plus any
PYTEST_ARGS after ``--``), once, in a child process from the checkout, and reports its test count, its
wall time, the CPU seconds of it and every process it started (user + sys), and the load average before
and after. Targets: at least 400 tests within 240 s on the 2-core machine (see README.md, Run the tests).
On a shared machine neither is the quiet machine's figure: the wall grows with the load, and torch's two
threads spin while they wait for each other, which adds CPU seconds. ``--one-thread`` runs torch on one
thread (the tier's own processes and the commands it starts): its CPU seconds are then the tier's work,
steady under load, and about the wall it takes on a quiet core (the two cores of a quiet machine take less).

``--coverage`` runs the tier under ``coverage run --source vit_demo`` (the ``coverage`` package must be
importable, e.g. ``pip install --target DIR coverage`` and DIR on PYTHONPATH; it is no dependency of
the project) and lists every module of vit_demo/ with the share of its lines the fast tier ran, and
the share of its function bodies' lines. A module none of whose function bodies ran (only what its
import runs) is untouched: the script then exits with status 1 and names it. Modules without a
function are exempt.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vit_demo"
FAST = ["-m", "not slow", "-q", "-p", "no:cacheprovider"]


def body_lines(path: Path) -> set[int]:
    """The lines inside the bodies of ``path``'s functions and methods (what an import alone never runs)."""
    out: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                out.update(range(stmt.lineno, stmt.end_lineno + 1))
    return out


ONE_THREAD = """def pytest_sessionstart(session):  # after tests/conftest.py chose the thread count
    import torch

    torch.set_num_threads(1)
"""


def run_tier(pytest_args: list[str], data_file: Path | None, one_thread: Path | None = None) -> dict:
    """The fast tier in a child process: its summary line, test count, wall and CPU seconds, loads.
    ``one_thread``: a folder to write the plugin that puts torch on one thread in."""
    cmd = [sys.executable, "-m", "pytest", *FAST, *pytest_args]
    if data_file is not None:
        cmd[1:2] = ["-m", "coverage", "run", "--source", "vit_demo", "--data-file", str(data_file), "-m"]
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if one_thread is not None:
        (one_thread / "bench_tests_one_thread.py").write_text(ONE_THREAD)
        path.append(str(one_thread))
        cmd += ["-p", "bench_tests_one_thread"]
        env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(path)
    load_before = os.getloadavg()
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    return {"command": " ".join(cmd[1:]), "returncode": r.returncode, "summary": summary.strip("= "),
            "passed": int(passed.group(1)) if passed else 0, "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "cores": os.cpu_count(), "tail": r.stdout[-3000:] if r.returncode else ""}


def module_coverage(data_file: Path) -> list[dict]:
    """Per module of vit_demo/: its lines run by the tier, of its statements, and of its function bodies' statements."""
    import coverage

    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    ran_by_file = {Path(f).resolve(): set(cov.get_data().lines(f) or ()) for f in cov.get_data().measured_files()}
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        statements = set(cov.analysis2(str(path))[1])
        ran = ran_by_file.get(path.resolve(), set()) & statements
        body = body_lines(path) & statements
        rows.append({"module": str(path.relative_to(ROOT)), "statements": len(statements),
                     "percent": round(100 * len(ran) / max(len(statements), 1), 1),
                     "body_percent": round(100 * len(ran & body) / len(body), 1) if body else None,
                     "untouched": bool(body) and not ran & body})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coverage", action="store_true", help="line coverage per module of vit_demo/ (needs `coverage`)")
    p.add_argument("--one-thread", action="store_true", help="torch on one thread: CPU seconds steady under load")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data_file = Path(tmp) / ".coverage" if args.coverage else None
        if data_file is not None:
            import coverage  # noqa: F401 - fail here, before a run of minutes, when it is missing
        report = run_tier(args.pytest_args, data_file, Path(tmp) if args.one_thread else None)
        rows = module_coverage(data_file) if data_file is not None and data_file.exists() else []
    report["untouched"] = [r["module"] for r in rows if r["untouched"]]
    if args.json:
        print(json.dumps({**report, "modules": rows}, indent=1))
    else:
        for r in rows:
            body = "-" if r["body_percent"] is None else f"{r['body_percent']:5.1f}%"
            print(f"{r['percent']:5.1f}%  bodies {body:>6}  {r['module']}{'  UNTOUCHED' if r['untouched'] else ''}")
        print(f"{report['summary']}\n{report['passed']} passed, wall {report['wall_s']} s, CPU {report['cpu_s']} s "
              f"(it and its children), {report['cores']} cores, load {report['load_before']} -> {report['load_after']}")
        if report["untouched"]:
            print("no fast test runs a function of: " + ", ".join(report["untouched"]))
        print(report["tail"], end="")
    return 1 if report["returncode"] or report["untouched"] else 0


if __name__ == "__main__":
    sys.exit(main())
