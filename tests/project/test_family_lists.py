"""The places that list the supported families say every family the registry has: the package docstring,
`encoderkit --help` and pyproject's description (they went stale once, naming five of seven)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import encoderkit
from encoderkit.cli import cli
from encoderkit.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]


def named(text: str) -> set[str]:
    words = set(re.findall(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", text.lower()))
    # nomic_bert as NomicBERT, jina_embeddings_v3 as jina-embeddings-v3
    return {name for name in FAMILIES if {name, name.replace("_", ""), name.replace("_", "-")} & words}


@pytest.mark.parametrize("place", ["docstring", "help", "pyproject"])
def test_every_family_is_listed(place: str) -> None:
    text = {"docstring": lambda: encoderkit.__doc__,
            "help": lambda: CliRunner().invoke(cli, ["--help"]).output,
            "pyproject": lambda: re.search(r'^description = "(.*)"$', (ROOT / "pyproject.toml").read_text(),
                                           re.M).group(1)}[place]()
    assert named(text) == set(FAMILIES), f"{place} leaves out {sorted(set(FAMILIES) - named(text))}"
