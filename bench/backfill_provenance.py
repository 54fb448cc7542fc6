"""Provenance for results written before results named their commit (bench/common.provenance).

The commit a number was measured at was not recorded then and cannot be known now, so it is left as None. What
git does know is the commit that recorded the result (the last one to change its file) and that commit's subject,
which usually says what was measured and at which commit; the result's own date, command, CPU, flags and versions
come from the result itself. Each is marked ``recovered`` and rendered as such. Results that already have
provenance are left as they are, so running this again changes nothing.

    python bench/backfill_provenance.py
"""
from __future__ import annotations

import json
import subprocess

from common import RESULTS, ROOT


def recorded_in(path) -> tuple[str, str]:
    """(commit, subject) of the last commit that changed ``path``."""
    done = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H%x09%s", "--", str(path)],
                          capture_output=True, text=True, check=True)
    commit, _, subject = done.stdout.strip().partition("\t")
    return commit, subject


def main() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        if "provenance" in result:
            continue
        commit, subject = recorded_in(path)
        if not commit:
            print(f"{path.name}: not in git, left without provenance")
            continue
        machine = result.get("machine", {})
        result["provenance"] = {
            "commit": None, "dirty": None, "recovered": True, "recorded_in": commit, "recorded_subject": subject,
            "date": result.get("date"), "command": result.get("command"), "cpu": machine.get("cpu"),
            "cpu_flags": sorted(f for f, present in (machine.get("cpu_flags") or {}).items() if present),
            "threads": machine.get("threads"), "versions": result.get("versions", {})}
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"{path.name}: recorded in {commit[:10]} ({subject[:60]})")


if __name__ == "__main__":
    main()
