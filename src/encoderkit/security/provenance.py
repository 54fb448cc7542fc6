"""Model provenance: is this model directory what it claims to be, and is it safe to load?

``ModelProvenanceChecker(model_dir).check(manifest=...)`` runs four audits without loading a tensor or
unpickling anything, and turns their findings into one verdict:

1. **Integrity**: a SHA-256 manifest (``encoderkit-manifest.json``) lists every file's relative path,
   size and hash, and for safetensors files the hash of each tensor's byte range, so a verification
   can name the tensor whose bytes changed. Verifying reports modified, missing and added files; a
   missing and an added file with the same hash are one rename.
2. **safetensors headers**: the 8-byte little-endian header length, the JSON header, known dtypes,
   ``prod(shape) * itemsize`` equal to each byte range, ranges contiguous, non-overlapping, inside
   the file and with no trailing bytes.
3. **Pickles** (``.bin .pt .pth .ckpt .pkl``, zip-based torch files with ``data.pkl``, legacy torch
   files): ``pickletools.genops`` walks the opcodes and an abstract stack recovers every import
   (GLOBAL, INST, STACK_GLOBAL); imports outside an allow-list of what ``torch.save`` of tensors
   and numpy arrays needs are reported, and well-known code-execution entry points (``os.system``,
   ``builtins.eval``, ``subprocess.*``) make the model unsafe.
4. **Config vs weights**: the tensor shapes in the headers against what config.json implies
   (vocabulary x embedding width, positions, segment types, layers, hidden and intermediate sizes,
   number of labels), using the per-family name tables of ``encoderkit.io.checkpoints``.

Verdict: ``unsafe`` (loading may run code, the weights are damaged, or they differ from the manifest),
``suspicious`` (files added, missing or renamed; unknown imports; config and weights disagree), or
``trusted``. Each finding carries the file and a reason.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, EncoderkitError, InputError
from ..reports import Report, markdown_table
from .config_checks import config_weight_checks, joined_shape  # noqa: F401 (re-exported)
from .pickles import PickleScan, looks_like_pickle, scan_pickle_file

MANIFEST_NAME = "encoderkit-manifest.json"
MANIFEST_FORMAT = "encoderkit-manifest"
MANIFEST_VERSION = 1
CHUNK = 1 << 20
SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers

VERDICTS = ("trusted", "suspicious", "unsafe")
SEVERITIES = ("info", "suspicious", "unsafe")

# Bytes per element of the safetensors dtypes (sub-byte float formats are reported as unknown).
SAFETENSORS_DTYPES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

@dataclass
class Finding:
    """One observation: how bad it is, which audit made it, about which file, and why."""

    severity: str  # "unsafe" | "suspicious" | "info"
    check: str  # "manifest" | "safetensors" | "pickle" | "config"
    path: str  # relative to the model directory ("" for the directory as a whole)
    reason: str


@dataclass
class ManifestDiff:
    """What differs between a manifest and the directory."""

    modified: list[dict[str, Any]] = field(default_factory=list)  # path, recorded/actual size and hash, tensors
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    renamed: list[dict[str, str]] = field(default_factory=list)  # {"from": old, "to": new}

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.added or self.renamed)


@dataclass
class TensorRecord:
    """One tensor of a safetensors header."""

    name: str
    dtype: str
    shape: list[int]
    begin: int  # absolute byte offsets in the file (header included)
    end: int


@dataclass
class ProvenanceReport(Report):
    """Verdict (``trusted`` / ``suspicious`` / ``unsafe``), the reasons for it, and what each audit saw."""

    model_dir: str
    verdict: str
    reasons: list[str]  # the findings that decided the verdict, one line each
    findings: list[Finding]
    files: int
    manifest: str | None  # the manifest verified against (or written), if any
    manifest_written: bool
    manifest_diff: ManifestDiff | None
    safetensors_files: list[str]
    pickle_scans: list[PickleScan]
    config_checks: list[dict[str, Any]]  # {"check", "expected", "found", "ok"}

    @property
    def trusted(self) -> bool:
        return self.verdict == "trusted"

    def markdown(self) -> str:
        lines = [f"# Provenance of `{self.model_dir}`", "", f"**Verdict: {self.verdict}**", ""]
        if self.reasons:
            lines += ["Reasons:", ""] + [f"- {reason}" for reason in self.reasons] + [""]
        integrity = ("manifest written to " if self.manifest_written else "verified against ") + f"`{self.manifest}`" \
            if self.manifest else "no manifest: integrity not checked (write one with --write-manifest)"
        lines += [f"{self.files} files; {integrity}; {len(self.safetensors_files)} safetensors file(s), "
                  f"{len(self.pickle_scans)} pickle stream(s) scanned.", ""]
        if self.findings:
            lines += ["## Findings", "", markdown_table(
                ["severity", "check", "file", "reason"],
                [(f.severity, f.check, f.path or ".", f.reason) for f in self.findings]), ""]
        if self.config_checks:
            lines += ["## Config vs weights", "", markdown_table(
                ["check", "config implies", "weights have", "ok"],
                [(c["check"], c["expected"], c["found"], "yes" if c["ok"] else "NO") for c in self.config_checks]), ""]
        if self.pickle_scans:
            lines += ["## Pickle imports", "", markdown_table(
                ["stream", "imports", "outside the allow-list"],
                [(s.path, ", ".join(s.imports) or "-", ", ".join(s.disallowed) or "-") for s in self.pickle_scans]),
                ""]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Hashing and the manifest
# ---------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_ranges(path: Path, ranges: list[tuple[str, int, int]]) -> dict[str, str]:
    """SHA-256 of each named absolute byte range [begin, end) of a file."""
    hashes = {}
    with open(path, "rb") as handle:
        for name, begin, end in ranges:
            handle.seek(begin)
            digest, left = hashlib.sha256(), end - begin
            while left > 0:
                block = handle.read(min(CHUNK, left))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
            hashes[name] = digest.hexdigest()
    return hashes


def model_files(model_dir: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Every regular file under ``model_dir`` (symlinks followed; VCS folders skipped), sorted."""
    excluded = {p.resolve() for p in exclude}
    found = []
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if any(part in (".git", ".hg", ".svn") for part in relative.parts):
            continue
        if path.is_file() and path.resolve() not in excluded and path.name != MANIFEST_NAME:
            found.append(path)
    return found


def _file_entry(model_dir: Path, path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path.relative_to(model_dir).as_posix(), "size": path.stat().st_size,
                             "sha256": sha256_file(path)}
    if path.suffix == ".safetensors":
        try:
            tensors, header_length = read_safetensors_header(path)
        except CheckpointError:
            return entry  # hashed as a whole only; the header audit reports the damage
        ranges = [("__header__", 0, 8 + header_length)] + [(t.name, t.begin, t.end) for t in tensors]
        entry["tensors"] = sha256_ranges(path, ranges)
    return entry


def create_manifest(model_dir: str | Path, manifest_path: str | Path | None = None) -> Path:
    """Write the SHA-256 manifest of ``model_dir`` (default ``<model_dir>/encoderkit-manifest.json``)."""
    model_dir = _model_directory(model_dir)
    target = Path(manifest_path) if manifest_path else model_dir / MANIFEST_NAME
    entries = [_file_entry(model_dir, path) for path in model_files(model_dir, exclude=(target,))]
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "algorithm": "sha256",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": entries}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return target


def read_manifest(path: str | Path) -> dict[str, dict[str, Any]]:
    """The entries of a manifest by relative path; a malformed manifest is a CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"manifest not found: {path}; write one with --write-manifest (or create_manifest())")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); it is not an encoderkit manifest") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), list):
        raise CheckpointError(f"{path} is not an encoderkit manifest (expected format {MANIFEST_FORMAT!r} "
                              "and a 'files' list)")
    if data.get("algorithm", "sha256") != "sha256":
        raise CheckpointError(f"{path} uses hash algorithm {data.get('algorithm')!r}; only sha256 is supported")
    entries = {}
    for entry in data["files"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("size"), int)):
            raise CheckpointError(f"{path}: malformed file entry {entry!r} (needs path, size, sha256)")
        if Path(entry["path"]).is_absolute() or ".." in Path(entry["path"]).parts:
            raise CheckpointError(f"{path}: entry path {entry['path']!r} leaves the model directory")
        entries[entry["path"]] = entry
    return entries


def verify_manifest(model_dir: str | Path, manifest_path: str | Path) -> ManifestDiff:
    """Compare ``model_dir`` with a manifest: modified (with the changed tensors), missing, added, renamed."""
    model_dir = _model_directory(model_dir)
    recorded = read_manifest(manifest_path)
    present = {p.relative_to(model_dir).as_posix(): p for p in model_files(model_dir, exclude=(Path(manifest_path),))}
    diff = ManifestDiff()
    actual_hash: dict[str, str] = {}
    for relative, path in present.items():
        entry = recorded.get(relative)
        if entry is None:
            continue
        size = path.stat().st_size
        digest = sha256_file(path)
        actual_hash[relative] = digest
        if size == entry["size"] and digest == entry["sha256"]:
            continue
        change: dict[str, Any] = {"path": relative, "recorded_size": entry["size"], "size": size,
                                  "recorded_sha256": entry["sha256"], "sha256": digest}
        if isinstance(entry.get("tensors"), dict):
            change["tensors"] = _changed_tensors(path, entry["tensors"])
        diff.modified.append(change)
    missing = sorted(set(recorded) - set(present))
    added = sorted(set(present) - set(recorded))
    added_hash = {name: sha256_file(present[name]) for name in added}
    for old in list(missing):
        match = next((new for new in added if added_hash[new] == recorded[old]["sha256"]), None)
        if match is not None:
            diff.renamed.append({"from": old, "to": match})
            missing.remove(old)
            added.remove(match)
    diff.missing, diff.added = missing, added
    return diff


def _changed_tensors(path: Path, recorded: dict[str, str]) -> dict[str, list[str]]:
    """Which recorded tensor byte ranges hash differently now (or vanished / appeared)."""
    try:
        tensors, header_length = read_safetensors_header(path)
    except CheckpointError:
        return {"changed": [], "missing": [], "added": [], "header": ["unreadable"]}
    ranges = [("__header__", 0, 8 + header_length)] + [(t.name, t.begin, t.end) for t in tensors]
    now = sha256_ranges(path, ranges)
    return {
        "changed": [name for name in now if name in recorded and now[name] != recorded[name]],
        "missing": sorted(set(recorded) - set(now)),
        "added": sorted(set(now) - set(recorded)),
    }


# ---------------------------------------------------------------------------------------------
# safetensors headers
# ---------------------------------------------------------------------------------------------
def read_safetensors_header(path: Path) -> tuple[list[TensorRecord], int]:
    """The tensors of a safetensors file (absolute byte ranges) and the header length, validated.

    Raises CheckpointError naming the first problem; see ``validate_safetensors`` for all of them."""
    tensors, header_length, problems = _parse_safetensors(path)
    if problems:
        raise CheckpointError(f"{path}: {problems[0]}")
    return tensors, header_length


def validate_safetensors(path: str | Path) -> list[str]:
    """Every problem of a safetensors file's header and layout (empty when it is well formed)."""
    return _parse_safetensors(Path(path))[2]


def _parse_safetensors(path: Path) -> tuple[list[TensorRecord], int, list[str]]:
    size = path.stat().st_size
    if size < 8:
        return [], 0, [f"file is {size} bytes; a safetensors file starts with an 8-byte header length"]
    with open(path, "rb") as handle:
        (header_length,) = struct.unpack("<Q", handle.read(8))
        if header_length > min(size - 8, SAFETENSORS_MAX_HEADER):
            return [], 0, [f"header length {header_length} is impossible for a {size}-byte file "
                           f"(at most {min(size - 8, SAFETENSORS_MAX_HEADER)}); "
                           "the file is truncated or not safetensors"]
        raw = handle.read(header_length)
    if not raw.lstrip().startswith(b"{"):
        return [], header_length, ["the header is not a JSON object"]
    duplicates: list[str] = []

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [], header_length, [f"the header does not parse as JSON ({exc})"]
    problems = [f"the header names {key!r} twice" for key in duplicates]
    data_start, data_size = 8 + header_length, size - 8 - header_length
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        problems.append("__metadata__ must map strings to strings")
    tensors: list[TensorRecord] = []
    for name, spec in header.items():
        if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= set(spec):
            problems.append(f"tensor {name!r}: entry must have dtype, shape and data_offsets")
            continue
        dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            problems.append(f"tensor {name!r}: unknown dtype {dtype!r}")
            continue
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in shape)):
            problems.append(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            problems.append(f"tensor {name!r}: data_offsets {offsets!r} must be [begin, end] with 0 <= begin <= end")
            continue
        expected = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if offsets[1] - offsets[0] != expected:
            problems.append(f"tensor {name!r}: {dtype} {shape} needs {expected} bytes but its byte range "
                            f"{offsets} holds {offsets[1] - offsets[0]}")
        if offsets[1] > data_size:
            problems.append(f"tensor {name!r}: byte range {offsets} ends past the data ({data_size} bytes)")
        tensors.append(TensorRecord(name, dtype, list(shape), data_start + offsets[0], data_start + offsets[1]))
    position = data_start
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.begin < position:
            problems.append(f"tensor {tensor.name!r}: byte range overlaps the previous tensor's")
        elif tensor.begin > position:
            problems.append(f"{tensor.begin - position} unaccounted bytes before tensor {tensor.name!r}")
        position = max(position, tensor.end)
    if position < size:
        problems.append(f"{size - position} trailing bytes after the last tensor")
    return tensors, header_length, problems


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------
def _model_directory(model_dir: str | Path | None) -> Path:
    from ..io.hub import DEFAULT_MODEL_NAMES, default_model_path

    if model_dir is None or str(model_dir).lower() in DEFAULT_MODEL_NAMES:
        return default_model_path()
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise InputError(f"model directory not found: {model_dir}")
    if not path.is_dir():
        raise InputError(f"{model_dir} is a file; name the model directory that holds it")
    return path


class ModelProvenanceChecker:
    """Audit a model directory without loading it: ``ModelProvenanceChecker(dir).check(manifest=...)``."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = _model_directory(model_dir)

    @property
    def default_manifest(self) -> Path:
        return self.model_dir / MANIFEST_NAME

    def write_manifest(self, manifest: str | Path | None = None) -> Path:
        return create_manifest(self.model_dir, manifest or self.default_manifest)

    def check(self, manifest: str | Path | None = None, *, write_manifest: bool = False) -> ProvenanceReport:
        """Run every audit. ``manifest``: the manifest to verify against (default: the directory's own
        ``encoderkit-manifest.json`` when present). ``write_manifest``: record the directory as it is now
        instead of verifying (the other audits still run)."""
        findings: list[Finding] = []
        manifest_path = Path(manifest) if manifest else self.default_manifest
        diff = None
        if write_manifest:
            manifest_path = self.write_manifest(manifest_path)
            findings.append(Finding("info", "manifest", manifest_path.name,
                                    "manifest written: later checks verify against this state"))
        elif manifest_path.is_file():
            diff = verify_manifest(self.model_dir, manifest_path)
            findings += self._manifest_findings(diff)
        elif manifest:
            raise InputError(f"manifest not found: {manifest}; write one with --write-manifest")
        else:
            manifest_path = None
            findings.append(Finding("info", "manifest", "", "no manifest: file integrity not checked"))
        files = model_files(self.model_dir, exclude=(manifest_path,) if manifest_path else ())

        shapes: dict[str, tuple[int, ...]] = {}
        safetensors = [p for p in files if p.suffix == ".safetensors"]
        for path in safetensors:
            relative = path.relative_to(self.model_dir).as_posix()
            tensors, _, problems = _parse_safetensors(path)
            findings += [Finding("unsafe", "safetensors", relative, problem) for problem in problems]
            if path.name != "encoderkit_extra.safetensors":
                shapes.update({t.name: tuple(t.shape) for t in tensors})
        for index in (p for p in files if p.name.endswith(".safetensors.index.json")):
            findings += self._index_findings(index)

        scans: list[PickleScan] = []
        for path in files:
            if path.suffix != ".safetensors" and looks_like_pickle(path):
                relative = path.relative_to(self.model_dir).as_posix()
                for scan in scan_pickle_file(path, relative):
                    scans.append(scan)
                    findings += self._pickle_findings(scan)

        config_checks = self._config_checks(shapes, findings, has_pickled_weights=bool(scans))
        severity = max((SEVERITIES.index(f.severity) for f in findings), default=0)
        verdict = VERDICTS[severity]
        worst_first = sorted(findings, key=lambda f: -SEVERITIES.index(f.severity))
        reasons = [f"{f.path or '.'}: {f.reason}" for f in worst_first if f.severity != "info"]
        return ProvenanceReport(
            model_dir=str(self.model_dir), verdict=verdict, reasons=reasons, findings=findings, files=len(files),
            manifest=str(manifest_path) if manifest_path else None, manifest_written=write_manifest,
            manifest_diff=diff, safetensors_files=[p.relative_to(self.model_dir).as_posix() for p in safetensors],
            pickle_scans=scans, config_checks=config_checks)

    # ----- findings of each audit ----------------------------------------------------------------
    @staticmethod
    def _manifest_findings(diff: ManifestDiff) -> list[Finding]:
        findings = []
        for change in diff.modified:
            reason = (f"content differs from the manifest (sha256 {change['sha256'][:12]}..., recorded "
                      f"{change['recorded_sha256'][:12]}...; size {change['size']}, "
                      f"recorded {change['recorded_size']})")
            tensors = change.get("tensors")
            if tensors:
                parts = []
                if tensors.get("changed"):
                    parts.append("bytes changed in tensor(s) " + ", ".join(tensors["changed"][:8]))
                if tensors.get("missing"):
                    parts.append("tensor(s) gone: " + ", ".join(tensors["missing"][:8]))
                if tensors.get("added"):
                    parts.append("tensor(s) added: " + ", ".join(tensors["added"][:8]))
                if tensors.get("header"):
                    parts.append("header unreadable")
                if parts:
                    reason += "; " + "; ".join(parts)
            findings.append(Finding("unsafe", "manifest", change["path"], reason))
        findings += [Finding("suspicious", "manifest", path, "listed in the manifest but missing")
                     for path in diff.missing]
        findings += [Finding("suspicious", "manifest", path, "not in the manifest (added)") for path in diff.added]
        findings += [Finding("suspicious", "manifest", move["to"],
                             f"renamed from {move['from']} (same sha256 as the manifest's entry)")
                     for move in diff.renamed]
        return findings

    def _index_findings(self, index: Path) -> list[Finding]:
        """A sharded checkpoint's index must name shards that exist and tensors that are in them."""
        relative = index.relative_to(self.model_dir).as_posix()
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            weight_map = exc
        if not isinstance(weight_map, dict):
            return [Finding("suspicious", "safetensors", relative, "not a valid shard index (expected JSON with a "
                            f"'weight_map' object; {weight_map!r})")]
        findings, in_shard = [], {}
        for shard in sorted(set(map(str, weight_map.values()))):
            path = index.parent / shard
            if Path(shard).is_absolute() or ".." in Path(shard).parts or not path.is_file():
                findings.append(Finding("suspicious", "safetensors", relative, f"names shard {shard!r}, which is "
                                        "not a file in the model directory"))
                continue
            in_shard[shard] = {t.name for t in _parse_safetensors(path)[0]}
        absent = [name for name, shard in weight_map.items() if shard in in_shard and name not in in_shard[shard]]
        if absent:
            findings.append(Finding("suspicious", "safetensors", relative, f"{len(absent)} tensor(s) are not in "
                                    f"the shard the index names, e.g. {absent[0]}"))
        return findings

    @staticmethod
    def _pickle_findings(scan: PickleScan) -> list[Finding]:
        if scan.dangerous:
            return [Finding("unsafe", "pickle", scan.path, "imports " + ", ".join(scan.dangerous)
                            + ": loading this pickle can run arbitrary code")]
        findings = []
        if scan.disallowed:
            findings.append(Finding("suspicious", "pickle", scan.path, "imports outside the allow-list: "
                                    + ", ".join(scan.disallowed)))
        if scan.error:
            findings.append(Finding("suspicious", "pickle", scan.path, f"opcodes could not be read: {scan.error}"))
        if not findings:
            findings.append(Finding("info", "pickle", scan.path, "pickle imports only allow-listed tensor rebuilders "
                                    "(load with weights_only=True, or convert to safetensors)"))
        return findings

    def _config_checks(self, shapes: dict[str, tuple[int, ...]], findings: list[Finding],
                       has_pickled_weights: bool) -> list[dict[str, Any]]:
        from ..config import EncoderConfig
        from ..io.hub import resolve_model

        try:
            weights_dir = resolve_model(self.model_dir).weights_dir
            config = EncoderConfig.from_json_file(weights_dir / "config.json")
        except EncoderkitError as exc:
            findings.append(Finding("suspicious", "config", "config.json", f"config not usable: {exc}"))
            return []
        relative = (weights_dir / "config.json").relative_to(self.model_dir).as_posix()
        if not shapes:
            note = "weights are pickled: their shapes are not checked without loading" if has_pickled_weights \
                else "no safetensors weights to check the config against"
            findings.append(Finding("info", "config", relative, note))
            return []
        rows = config_weight_checks(config, shapes)
        for row in rows:
            if not row["ok"]:
                findings.append(Finding("suspicious", "config", relative,
                                        f"{row['check']}: config implies {row['expected']}, weights have {row['found']}"
                                        + (f" ({row['tensor']})" if row.get("tensor") else "")))
        return rows


def check_provenance(model_dir: str | Path, manifest: str | Path | None = None, *,
                     write_manifest: bool = False) -> ProvenanceReport:
    """Shorthand for ``ModelProvenanceChecker(model_dir).check(manifest, write_manifest=...)``."""
    return ModelProvenanceChecker(model_dir).check(manifest, write_manifest=write_manifest)

