"""The benchmark suite's runner, from the repository root:

    python -m bench list                           every benchmark by kind: what it needs, its newest result
    python -m bench run NAME [--smoke] [-- ARGS]   bench/NAME.py (ARGS passed on), then its results checked
    python -m bench report [--skip-invalid] [--out PATH]   BENCHMARKS.md from bench/results (bench/report.py)

``run`` starts the script in a process of its own, in bench/ (the scripts import their neighbours by plain name),
and afterwards checks every result it wrote as report.py will: a provenance, a boolean verdict for every goal, a
``benchmark`` name the registry gives to NAME. ``--smoke`` sets ENCODERKIT_BENCH_SMOKE=1 (each script shrinks its
sizes to seconds' worth; see bench/common.py), sends the results to a fresh temporary folder (never bench/results)
and the cache there too unless ENCODERKIT_BENCH_CACHE is set, requires a result, and renders it with report.py, so
a smoke run that passes has run the script, its result schema and its section of BENCHMARKS.md end to end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .registry import BENCH, BY_NAME, BY_RESULT, ENTRIES, KINDS, NEEDS, Entry, load_result, missing, results_dir


def list_benchmarks() -> int:
    """Print every benchmark under its kind's heading, with what it needs and its results in bench/results."""
    newest = _newest_results(results_dir())
    for kind, title in KINDS.items():
        print(title)
        for entry in (e for e in ENTRIES if e.kind == kind):
            lacking = set(missing(entry))
            needs = [NEEDS[need] + (" (missing here)" if NEEDS[need] in lacking else "") for need in entry.needs]
            if entry.modules:
                absent = any(text.startswith("the bench extra") for text in lacking)
                needs.append(f"the bench extra ({', '.join(entry.modules)})" + (" (missing here)" if absent else ""))
            found = newest.get(entry.name)
            print(f"  {entry.name:18s} {entry.description}")
            print(f"  {'':18s} needs: {'; '.join(needs) or 'nothing beyond the install'}; "
                  f"result: {found or 'none yet'}")
        print()
    return 0


def _newest_results(folder: Path) -> dict[str, str]:
    """For each entry with results in ``folder``: how many files and the newest one's date."""
    dates: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(folder.glob("*.json")):
        result, _ = load_result(path)
        entry = BY_RESULT.get((result or {}).get("benchmark"))
        if entry is not None:
            made = result.get("provenance") or {}
            dates.setdefault(entry.name, []).append((str(made.get("date") or result.get("date")), path.name))
    return {name: f"{max(found)[1]}, {max(found)[0]}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
            for name, found in dates.items()}


def run(entry: Entry, smoke: bool, extra: list[str]) -> int:
    """Run ``entry``'s script, then check what it wrote; a smoke run in a temporary folder kept only on failure."""
    env = dict(os.environ)
    scratch = Path(tempfile.mkdtemp(prefix=f"bench-{entry.name}-")) if smoke else None
    args = list(extra)
    if scratch is not None:
        env.update(ENCODERKIT_BENCH_SMOKE="1", ENCODERKIT_BENCH_RESULTS=str(scratch / "results"))
        env.setdefault("ENCODERKIT_BENCH_CACHE", str(scratch / "cache"))
        # a smoke run checks that a script runs, not its speed: OpenMP threads that sleep rather than spin keep a
        # loaded machine (the test suite beside it) from paying ten times the CPU for two spinning threads
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        args = [*entry.smoke_args, *extra]
    folder = Path(env["ENCODERKIT_BENCH_RESULTS"]) if env.get("ENCODERKIT_BENCH_RESULTS") else results_dir()
    command = [sys.executable, str(entry.script), *args]
    print(f"bench: {'smoke run of ' if smoke else ''}{' '.join(command[1:])} (in {BENCH})", flush=True)
    started = time.time() - 1  # a coarse file-system clock must not hide a result written in the first second
    code = subprocess.run(command, cwd=BENCH, env=env).returncode
    if code != 0:
        print(f"bench: {entry.name} exited with status {code}" + (f"; its files are in {scratch}" if scratch else ""))
        return code
    written = sorted(p for p in folder.glob("*.json") if p.stat().st_mtime >= started)
    problems = _check_written(entry, written)
    if scratch is not None and not written:
        problems.append(f"it wrote no result to {folder}: a smoke run checks the result too (common.write_result)")
    if scratch is not None and not problems:
        problems += _render(env, scratch)
    if problems:
        print(f"bench: {entry.name}: " + "\n  ".join(["its results are not fit to report:", *problems])
              + (f"\n  (its files are kept in {scratch})" if scratch else ""))
        return 1
    print(f"bench: {entry.name} passed; wrote {', '.join(p.name for p in written) or 'no result'}")
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _check_written(entry: Entry, written: list[Path]) -> list[str]:
    """Problems of the results ``entry`` just wrote: report.py's own, and a ``benchmark`` name not its own."""
    problems = []
    for path in written:
        result, found = load_result(path)
        name = (result or {}).get("benchmark")
        if result is not None and name in BY_RESULT and name not in entry.results:
            found.append(f"its benchmark {name!r} belongs to {BY_RESULT[name].name}, not {entry.name}")
        problems += [f"{path.name}: {problem}" for problem in found]
    return problems


def _render(env: dict[str, str], scratch: Path) -> list[str]:
    """Render the smoke results with report.py, into the scratch folder; its complaint if it fails."""
    out = scratch / "BENCHMARKS.md"
    done = subprocess.run([sys.executable, str(BENCH / "report.py"), "--out", str(out)], cwd=BENCH, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        return [f"report.py could not render it:\n{done.stdout}{done.stderr}"]
    return []


def report(args: list[str]) -> int:
    """bench/report.py with ``args``: BENCHMARKS.md from the results."""
    return subprocess.run([sys.executable, str(BENCH / "report.py"), *args], cwd=BENCH).returncode


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:5]))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every benchmark, by kind")
    running = commands.add_parser("run", help="run one benchmark; arguments after -- go to its script")
    running.add_argument("name", help="a benchmark's name (python -m bench list)")
    running.add_argument("--smoke", action="store_true",
                         help="a few rows, results to a temporary folder: checks that it runs, not how fast")
    reporting = commands.add_parser("report", help="BENCHMARKS.md from the results (bench/report.py)")
    reporting.add_argument("--skip-invalid", action="store_true", help="leave out, with a warning, a result "
                           "without provenance or verdicts, rather than refuse to write")
    reporting.add_argument("--out", help="where to write (default: BENCHMARKS.md at the repository's root)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_benchmarks()
    if args.command == "report":
        return report([*(["--skip-invalid"] if args.skip_invalid else []), *(["--out", args.out] if args.out else []),
                       *extra])
    if args.name not in BY_NAME:
        parser.error(f"no benchmark {args.name!r}; one of: {', '.join(sorted(BY_NAME))}")
    return run(BY_NAME[args.name], args.smoke, extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
