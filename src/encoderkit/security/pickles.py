"""Pickle files audited without unpickling: ``pickletools.genops`` walks the opcodes and an abstract stack
recovers every import (GLOBAL, INST, STACK_GLOBAL), which is checked against an allow-list of what
``torch.save`` of tensors and numpy arrays needs. Well-known code-execution entry points (``os.system``,
``builtins.eval``, ``subprocess.*``) are reported as dangerous. Used by ``provenance.py``.
"""
from __future__ import annotations

import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")

# What torch.save of tensors / state dicts and pickled numpy arrays import; nothing here runs code of
# the file's choosing (the rebuild functions only reassemble tensors from storages).
_TORCH_STORAGES = {f"{kind}Storage" for kind in (
    "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
    "ComplexDouble", "QInt8", "QUInt8", "QInt32", "QUInt4x2", "QUInt2x4", "Untyped")}
_TORCH_DTYPES = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                 "complex64", "complex128", "float", "double", "half", "long", "int", "short", "qint8", "quint8",
                 "qint32", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"}
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "collections": {"OrderedDict"},
    "torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                     "_rebuild_parameter_with_state", "_rebuild_sparse_tensor", "_rebuild_device_tensor_from_numpy",
                     "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass", "_rebuild_qtensor",
                     "_rebuild_nested_tensor"},
    "torch._tensor": {"_rebuild_from_type_v2"},
    "torch": _TORCH_STORAGES | _TORCH_DTYPES | {"Size", "device", "Tensor", "strided", "sparse_coo"},
    "torch.storage": {"UntypedStorage", "TypedStorage", "_load_from_bytes"},
    "torch.nn.parameter": {"Parameter"},
    "numpy": {"ndarray", "dtype"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.numeric": {"_frombuffer"},  # protocol 5 arrays
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.dtypes": {f"{kind}DType" for kind in ("Float64", "Float32", "Float16", "Int64", "Int32", "Int16", "Int8",
                                                 "UInt8", "Bool")},
    "_codecs": {"encode"},  # numpy's protocol-2 pickles carry raw bytes as latin-1 text
    "builtins": {"set", "frozenset", "slice", "range", "complex", "bytearray", "bytes", "tuple", "list", "dict"},
    "__builtin__": {"set", "frozenset", "slice", "complex", "bytearray"},
}
# Imports that hand the file a way to run commands or code: their presence makes a model unsafe.
DANGEROUS_MODULES = {"os", "posix", "nt", "subprocess", "sys", "socket", "shutil", "importlib", "runpy", "pty",
                     "webbrowser", "ctypes", "marshal", "pickle", "_pickle", "dill", "code", "codeop", "commands",
                     "multiprocessing", "asyncio", "urllib", "requests", "http", "ftplib", "telnetlib", "smtplib",
                     "types", "platform", "pdb", "bdb", "timeit", "tempfile", "signal", "threading", "_thread",
                     "torch.hub", "torch.jit", "torch._dynamo", "numpy.testing", "pip", "setuptools", "distutils"}
DANGEROUS_BUILTINS = {"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "globals",
                      "locals", "vars", "input", "breakpoint", "execfile", "file", "reload", "apply", "memoryview"}
DANGEROUS_NAMES = {("operator", "attrgetter"), ("operator", "methodcaller"), ("functools", "partial"),
                   ("torch", "load"), ("torch.serialization", "load"), ("numpy", "load"), ("io", "open"),
                   ("pathlib", "Path")}



@dataclass
class PickleScan:
    """The imports found in one pickle stream (a file, or one member of a torch zip archive)."""

    path: str
    imports: list[str]  # "module.name", in order of first appearance
    disallowed: list[str]  # not on the allow-list
    dangerous: list[str]  # known code-execution entry points
    error: str | None = None  # the opcodes could not be walked to the end


# ---------------------------------------------------------------------------------------------
# Pickles: imports from opcodes, never unpickled
# ---------------------------------------------------------------------------------------------
_MARK = object()  # the MARK opcode's entry on the abstract stack
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
               "BINUNICODE8"}


def pickle_imports(data: bytes, start: int = 0) -> tuple[list[tuple[str, str]], int, str | None]:
    """The (module, name) pairs one pickle stream imports, where it ends, and an error if it is malformed.

    GLOBAL and INST carry their import as an argument; STACK_GLOBAL takes module and name from the
    stack, so an abstract stack holding string constants (and the memo, which protocol 4 uses for
    repeated strings) recovers them. A STACK_GLOBAL whose operands are not constants, and the
    extension-registry opcodes, are reported as ``("?", description)``."""
    import io

    stream = io.BytesIO(data)
    stream.seek(start)
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    found: list[tuple[str, str]] = []
    end = start
    try:
        for opcode, arg, position in pickletools.genops(stream):
            end = stream.tell()
            name = opcode.name
            top = stack[-1] if stack else None
            if name in ("GLOBAL", "INST"):
                module, _, attribute = str(arg).partition(" ")
                found.append((module, attribute))
            elif name == "STACK_GLOBAL":
                if len(stack) >= 2 and isinstance(stack[-2], str) and isinstance(stack[-1], str):
                    found.append((stack[-2], stack[-1]))
                else:
                    found.append(("?", "STACK_GLOBAL with non-constant operands"))
            elif name in ("EXT1", "EXT2", "EXT4"):
                found.append(("?", f"extension registry code {arg}"))
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = top
            elif name == "MEMOIZE":
                memo[len(memo)] = top
                continue  # it leaves the stack as it is (pickletools lists it as popping and pushing the top)
            # Stack effect, as pickletools.dis computes it.
            before, after = opcode.stack_before, opcode.stack_after
            pop = len(before)
            if pickletools.markobject in before or (name == "POP" and stack and stack[-1] is _MARK):
                while stack and stack[-1] is not _MARK:
                    stack.pop()
                if not stack:
                    raise ValueError(f"{name} at byte {position} without a MARK")
                stack.pop()
                pop = before.index(pickletools.markobject) if pickletools.markobject in before else 0
            if pop:
                if len(stack) < pop:
                    raise ValueError(f"{name} at byte {position} pops from an empty stack")
                del stack[-pop:]
            if name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else None)
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg))
            else:
                stack.extend(_MARK if item is pickletools.markobject else None for item in after)
            if name == "STOP":
                break
        else:
            return found, end, "the stream ends without a STOP opcode"
    except Exception as exc:  # pickletools raises ValueError (and others) on malformed streams
        return found, end, f"malformed pickle: {exc}"
    return found, end, None


def classify_import(module: str, name: str) -> str:
    """"allowed", "dangerous" or "unknown" for one import."""
    if name in ALLOWED_IMPORTS.get(module, ()):
        return "allowed"
    root = module.split(".")[0]
    if (module in DANGEROUS_MODULES or root in DANGEROUS_MODULES or (module, name) in DANGEROUS_NAMES
            or (root in ("builtins", "__builtin__") and name in DANGEROUS_BUILTINS) or module == "?"):
        return "dangerous"
    return "unknown"


def scan_pickle_bytes(data: bytes, label: str, *, max_streams: int = 5) -> PickleScan:
    """Imports of the pickle stream(s) at the start of ``data``.

    Legacy (non-zip) ``torch.save`` files hold several pickles back to back (magic number, protocol,
    system info, the object, storage keys) before the raw storage bytes, so consecutive streams are
    walked until one fails to parse after the first."""
    imports: list[tuple[str, str]] = []
    start, error = 0, None
    for index in range(max_streams):
        if start >= len(data):
            break
        found, end, problem = pickle_imports(data, start)
        if problem is not None:
            if index == 0:
                imports += found
                error = problem
            break  # after the first stream, what follows may be raw tensor bytes
        imports += found
        start = end
    names = list(dict.fromkeys(f"{m}.{n}" if m != "?" else n for m, n in imports))
    kinds = {f"{m}.{n}" if m != "?" else n: classify_import(m, n) for m, n in imports}
    return PickleScan(path=label, imports=names, disallowed=[n for n in names if kinds[n] != "allowed"],
                      dangerous=[n for n in names if kinds[n] == "dangerous"], error=error)


def scan_pickle_file(path: Path, label: str) -> list[PickleScan]:
    """Scan a pickle file: a torch zip archive (every ``.pkl`` member), or a raw pickle stream."""
    if zipfile.is_zipfile(path):
        scans = []
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            for member in members:
                if member.endswith(".pkl"):
                    scans.append(scan_pickle_bytes(archive.read(member), f"{label}:{member}"))
            code = [m for m in members if "/code/" in f"/{m}" and m.endswith(".py")]
            if code:  # TorchScript archives carry Python source that torch.jit.load compiles and runs
                scans.append(PickleScan(f"{label}:code/", [], ["TorchScript code"], ["TorchScript code"]))
        if not scans:
            scans.append(PickleScan(label, [], [], [], error="a zip archive with no .pkl member"))
        return scans
    return [scan_pickle_bytes(path.read_bytes(), label)]


def looks_like_pickle(path: Path) -> bool:
    """A pickle by name (.bin/.pt/.pth/.ckpt/.pkl/...), or a zip holding ``data.pkl``, or a file that starts
    with the PROTO opcode of protocol 2-5."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                return any(m.endswith("data.pkl") for m in archive.namelist())
        except (zipfile.BadZipFile, OSError):
            return False
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
