"""Compressed indexes for corpora larger than memory: IVF-PQ, int8 and binary, with float rescoring.

- ``ivfpq``: FAISS IVF (``nlist`` k-means lists, ``nprobe`` of them scanned per query) over product
  quantization codes (``pq_m`` bytes a vector at 8 bits), optionally with an OPQ rotation. Trained on
  a seeded sample (``train_sample`` vectors drawn across all shards), then filled batch by batch.
- ``int8``: sentence-transformers' int8 codes (ranges calibrated on the same sample), scanned in full
  by FAISS's 8-bit scalar quantizer (which decodes a code to its bucket midpoint).
- ``binary``: sign bits, 32x smaller than float32, scanned by Hamming distance.

``rescore_multiplier`` m > 0: the quantized index retrieves k x m candidates and the float32 vectors,
memory-mapped from ``vectors.npy``, rescore them exactly (as sentence-transformers'
``semantic_search_faiss`` does). int8 and binary always keep the float vectors; ivfpq keeps them
when built with m > 0. A saved index is read memory-mapped: the FAISS file (``IO_FLAG_MMAP_IFC``),
the float vectors and the ids (``IdColumn``), so searching needs little more memory than the pages
it touches. Builds stream: a sample for training, then one batch at a time, written straight to disk.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from ..errors import DataError, InputError
from ..extras import faiss_module
from ..tasks.search import VectorIndex, register_index
from .quantization import calibration_ranges, quantize_ubinary, quantize_uint8
from .shards import sample_rows

COMPRESSED_KINDS = ("ivfpq", "int8", "binary")
MIN_POINTS_PER_CENTROID = 39  # FAISS's k-means minimum: fewer training points per centroid give poor centroids
DEFAULT_RESCORE = {"ivfpq": 0, "int8": 4, "binary": 4}


# ----- compact ids on disk ------------------------------------------------------------------------
class _NpyWriter:
    """Write a .npy of known shape a block of rows at a time, with plain writes (no memory map: pages
    written through a map would count in the builder's resident memory until the kernel flushes them)."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path, self.shape, self.dtype, self.rows = path, shape, np.dtype(dtype), 0
        self._file = open(path, "wb")
        np.lib.format.write_array_header_2_0(self._file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                          "fortran_order": False, "shape": shape})

    def write(self, block: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(block, dtype=self.dtype).tobytes())
        self.rows += len(block)

    def close(self) -> None:
        self._file.close()
        if self.rows != self.shape[0]:
            raise DataError(f"{self.path}: wrote {self.rows} rows, expected {self.shape[0]} (the input changed "
                            "while it was read?)")


class IdWriter:
    """Ids to disk: integers as ``ids.npy`` (int64); strings as UTF-8 bytes ``ids.bytes`` with
    ``ids.offsets.npy`` (int64, count + 1 offsets)."""

    def __init__(self, directory: Path, count: int, id_kind: str) -> None:
        self.id_kind = id_kind
        if id_kind == "int":
            self._numbers = _NpyWriter(directory / "ids.npy", (count,), np.int64)
        else:
            self._offsets = _NpyWriter(directory / "ids.offsets.npy", (count + 1,), np.int64)
            self._offsets.write(np.zeros(1, np.int64))
            self._bytes = open(directory / "ids.bytes", "wb")
            self._end = 0

    def write(self, ids: Sequence[Any] | np.ndarray) -> None:
        if self.id_kind == "int":
            self._numbers.write(np.asarray(ids, dtype=np.int64))
            return
        encoded = [str(i).encode("utf-8") for i in ids]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        self._offsets.write(self._end + np.cumsum(lengths))
        self._end += int(lengths.sum())
        self._bytes.write(b"".join(encoded))

    def close(self) -> None:
        if self.id_kind == "int":
            self._numbers.close()
        else:
            self._bytes.close()
            self._offsets.rows -= 1  # the leading 0
            self._offsets.shape = (self._offsets.shape[0] - 1,)
            self._offsets.close()


class IdColumn(Sequence[str]):
    """The ids of a saved compressed index, memory-mapped: ``column[row]`` is the id as a string."""

    def __init__(self, directory: Path) -> None:
        if (directory / "ids.npy").is_file():
            self._numbers: np.ndarray | None = np.load(directory / "ids.npy", mmap_mode="r")
            self._length = len(self._numbers)
        else:
            offsets_path, bytes_path = directory / "ids.offsets.npy", directory / "ids.bytes"
            if not offsets_path.is_file() or not bytes_path.is_file():
                raise DataError(f"{directory}: the ids are missing (ids.npy, or ids.offsets.npy with ids.bytes)")
            self._numbers = None
            self._offsets = np.load(offsets_path, mmap_mode="r")
            self._bytes = (np.memmap(bytes_path, dtype=np.uint8, mode="r") if bytes_path.stat().st_size
                           else np.zeros(0, np.uint8))
            self._length = len(self._offsets) - 1

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(self._length))]
        row = int(row)
        if row < 0:
            row += self._length
        if not 0 <= row < self._length:
            raise IndexError(f"id row {row} out of range for {self._length} ids")
        if self._numbers is not None:
            return str(int(self._numbers[row]))
        return bytes(self._bytes[self._offsets[row]:self._offsets[row + 1]]).decode("utf-8")


# ----- sources -------------------------------------------------------------------------------------
class VectorSource(Protocol):
    """What a streaming build reads: ``EmbeddingShards``, or ``ArraySource`` over a (memory-mapped) array."""

    count: int
    dimension: int
    id_kind: str

    def sample(self, size: int, seed: int = 0) -> np.ndarray: ...
    def iter_batches(self, batch_rows: int = 65536) -> Iterator[tuple[Any, np.ndarray]]: ...


@dataclass
class ArraySource:
    vectors: np.ndarray
    ids: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2:
            raise InputError(f"vectors must be a 2-D array, found shape {self.vectors.shape}")
        if self.ids is not None and len(self.ids) != len(self.vectors):
            raise InputError(f"got {len(self.vectors)} vectors but {len(self.ids)} ids")
        self.count, self.dimension = self.vectors.shape
        self.id_kind = "int" if self.ids is None else "string"

    def sample(self, size: int, seed: int = 0) -> np.ndarray:
        return np.asarray(self.vectors[sample_rows(self.count, size, seed)], dtype=np.float32)

    def iter_batches(self, batch_rows: int = 65536) -> Iterator[tuple[Any, np.ndarray]]:
        for start in range(0, self.count, batch_rows):
            ids = (np.arange(start, min(start + batch_rows, self.count)) if self.ids is None
                   else self.ids[start:start + batch_rows])
            yield ids, np.asarray(self.vectors[start:start + batch_rows], dtype=np.float32)


# ----- the index -----------------------------------------------------------------------------------
def default_nlist(count: int, trainable: int) -> int:
    """A power of two near 4 sqrt(count) (FAISS's guideline is 4 to 16 sqrt(n)), with at least 39
    training vectors per list."""
    cap = min(4 * math.sqrt(count), trainable / MIN_POINTS_PER_CENTROID)
    return 2 ** max(0, int(math.floor(math.log2(max(cap, 1)))))


def default_pq_m(dimension: int) -> int:
    """About 8 dimensions per sub-quantizer (one byte each at 8 bits): the largest divisor of the
    dimension not above dimension / 8."""
    return max(m for m in range(1, max(1, dimension // 8) + 1) if dimension % m == 0)


@dataclass
@register_index("ivfpq", "int8", "binary")
class CompressedIndex(VectorIndex):
    kind: str = "ivfpq"  # type: ignore[assignment]
    nlist: int | None = None  # ivfpq: inverted lists (default: default_nlist)
    pq_m: int | None = None  # ivfpq: sub-quantizers = bytes per code at 8 bits (default: default_pq_m)
    pq_bits: int = 8
    opq: bool = False
    nprobe: int = 32
    rescore_multiplier: int | None = None  # default: DEFAULT_RESCORE[kind]
    train_sample: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in COMPRESSED_KINDS:
            raise InputError(f"compressed index kind must be one of {', '.join(COMPRESSED_KINDS)}, found {self.kind!r}")
        if self.rescore_multiplier is None:
            self.rescore_multiplier = DEFAULT_RESCORE[self.kind]
        self.check_search_settings()
        if self.train_sample < 1:
            raise InputError(f"the training sample must hold at least 1 vector, found {self.train_sample}")
        if self.pq_m is not None and (self.pq_m < 1 or self.dimension % self.pq_m):
            divisors = [m for m in range(1, self.dimension + 1) if self.dimension % m == 0]
            raise InputError(f"--pq-m {self.pq_m} must divide the dimension {self.dimension}; choose one of "
                             f"{', '.join(map(str, divisors))}")
        if not 1 <= self.pq_bits <= 16:
            raise InputError(f"PQ bits must be 1 to 16, found {self.pq_bits}")
        self.keeps_vectors = self.kind != "ivfpq" or self.rescore_multiplier > 0
        self._index: Any = None
        self.ranges: np.ndarray | None = None
        self._vectors: np.ndarray | None = None  # float32 rows (memory-mapped once saved)
        self._pending: list[np.ndarray] = []  # vectors added in memory, not yet concatenated
        self._fill: tuple[np.ndarray, int] | None = None  # a streaming build's presized codes and rows filled

    def train_on_sample(self, vectors: np.ndarray) -> None:
        """Train on a seeded sample of ``train_sample`` rows of all of ``vectors`` (not on the first chunk)."""
        sample = ArraySource(vectors).sample(self.train_sample, self.seed)
        self.train(self._prepare(sample, "vectors"), total=len(vectors))

    def check_search_settings(self) -> None:
        least = 0 if self.kind == "ivfpq" else 1
        if self.rescore_multiplier < least:
            raise InputError(f"the rescore multiplier must be at least {least} for {self.kind}, found "
                             f"{self.rescore_multiplier}")
        if self.nprobe < 1:
            raise InputError(f"nprobe must be at least 1, found {self.nprobe}")

    # ----- training and adding -------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return self._index is not None

    def train(self, sample: np.ndarray, total: int | None = None) -> None:
        """Learn the IVF lists and PQ codebooks (ivfpq) or the int8 ranges from ``sample`` (prepared:
        normalized for cosine); ``total`` (the corpus size) only sizes the default nlist and the messages."""
        faiss = faiss_module()
        total = total or len(sample)
        if self.kind == "binary":
            self._index = faiss.IndexBinaryFlat(self.dimension)
            return
        if self.kind == "int8":
            self.ranges = calibration_ranges(sample)
            self._index = faiss.IndexScalarQuantizer(self.dimension, faiss.ScalarQuantizer.QT_8bit,
                                                     faiss.METRIC_INNER_PRODUCT)
            trained = np.concatenate([self.ranges[0], self.ranges[1] - self.ranges[0]]).astype(np.float32)
            faiss.copy_array_to_vector(trained, self._index.sq.trained)
            self._index.is_trained = True
            return
        if self.nlist is None:
            self.nlist = default_nlist(total, len(sample))
        if self.pq_m is None:
            self.pq_m = default_pq_m(self.dimension)
        need = MIN_POINTS_PER_CENTROID * max(self.nlist, 2 ** self.pq_bits)
        if len(sample) < need:
            lists = max(1, 2 ** int(math.floor(math.log2(max(1, len(sample) // MIN_POINTS_PER_CENTROID)))))
            reason = (f"{self.nlist:,} IVF lists" if self.nlist >= 2 ** self.pq_bits
                      else f"PQ codebooks of {2 ** self.pq_bits} centroids")
            if total >= need:
                fix = f"raise the training sample (--train-sample {need})"
            elif self.nlist >= 2 ** self.pq_bits and len(sample) >= MIN_POINTS_PER_CENTROID * 2 ** self.pq_bits:
                fix = f"use --nlist {lists} or fewer"
            else:
                fix = "use --kind int8, sq8 or exact for so few vectors"
            raise InputError(f"IVF-PQ with {reason} needs at least {need:,} training vectors ({MIN_POINTS_PER_CENTROID} "
                             f"per centroid); {len(sample):,} were available from {total:,}: {fix}")
        description = (f"OPQ{self.pq_m}," if self.opq else "") + f"IVF{self.nlist},PQ{self.pq_m}x{self.pq_bits}"
        index = faiss.index_factory(self.dimension, description, faiss.METRIC_INNER_PRODUCT)
        # polysemous training (Hamming-ordered codes, unused here) is most of the training time: 30 s of 31
        # for 20k 64-d vectors
        faiss.downcast_index(faiss.extract_index_ivf(index)).do_polysemous_training = False
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
        self._index = index

    def _presize(self, count: int) -> None:
        """int8 / binary: allocate the codes of ``count`` vectors once, so that a streaming build fills them in
        place (adding batch by batch grows FAISS's code vector by doubling: up to 2x the codes, plus a copy)."""
        if self.kind == "ivfpq" or self._index.ntotal:
            return
        width = self._index.code_size
        codes = self._index.xb if self.kind == "binary" else self._index.codes
        codes.resize(count * width)
        self._fill = (faiss_module().rev_swig_ptr(codes.data(), count * width).reshape(count, width), 0)

    def _encode_add(self, array: np.ndarray) -> None:
        """Add prepared rows to the FAISS index only (the caller stores ids and float vectors)."""
        if self._fill is not None:
            view, row = self._fill
            if row + len(array) > len(view):
                raise DataError(f"the index was sized for {len(view):,} vectors but more came (the input changed "
                                "while it was read?)")
            view[row:row + len(array)] = (quantize_ubinary(array) if self.kind == "binary"
                                          else quantize_uint8(array, self.ranges))
            self._fill = (view, row + len(array))
            self._index.ntotal = row + len(array)
        elif self.kind == "binary":
            self._index.add(quantize_ubinary(array))
        elif self.kind == "int8":
            self._index.add_sa_codes(quantize_uint8(array, self.ranges))
        else:
            self._index.add(array)

    def _add(self, array: np.ndarray) -> None:
        if not self.is_trained:
            # in memory, the first batch trains (as sq8 does); a streaming build trains on a sample first
            self.train(ArraySource(array).sample(self.train_sample, self.seed), total=len(array))
        self._encode_add(array)
        if self.keeps_vectors:
            self._pending.append(array)

    @property
    def vectors(self) -> np.ndarray | None:
        """The float32 vectors used for rescoring (None for ivfpq built without rescoring)."""
        if self._pending:
            parts = ([] if self._vectors is None else [np.asarray(self._vectors)]) + self._pending
            self._vectors, self._pending = np.concatenate(parts), []
        return self._vectors

    # ----- search ----------------------------------------------------------------------------------
    def _search(self, array: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.check_search_settings()
        vectors = self.vectors
        rescore = self.rescore_multiplier > 0
        if rescore and vectors is None:
            raise InputError("this ivfpq index was built without its float vectors (rescore multiplier 0), so it "
                             "cannot rescore: search with rescore multiplier 0, or rebuild with one above 0")
        fetch = min(len(self), k * self.rescore_multiplier) if rescore else k
        with _threads_for(len(array), self.kind):
            if self.kind == "binary":
                distances, rows = self._index.search(quantize_ubinary(array), fetch)
                scores = (self.dimension - 2 * distances).astype(np.float32)  # the dot product of the +-1 vectors
            else:
                if self.kind == "ivfpq":
                    faiss_module().extract_index_ivf(self._index).nprobe = self.nprobe
                scores, rows = self._index.search(array, fetch)
        if rescore:
            scores, rows = rescore_candidates(array, rows, vectors, k)
        return scores[:, :k], rows[:, :k]

    # ----- persistence -----------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {"nlist": self.nlist, "pq_m": self.pq_m, "pq_bits": self.pq_bits, "opq": self.opq,
                "nprobe": self.nprobe, "rescore_multiplier": self.rescore_multiplier,
                "train_sample": self.train_sample, "seed": self.seed}

    def _save_data(self, directory: Path) -> None:
        if not self.is_trained:
            raise InputError("the index is empty; add vectors before saving it")
        faiss = faiss_module()
        if self.kind == "binary":
            faiss.write_index_binary(self._index, str(directory / "index.faiss"))
        else:
            faiss.write_index(self._index, str(directory / "index.faiss"))
        if self.ranges is not None:
            np.save(directory / "ranges.npy", self.ranges)
        vectors = self.vectors
        if vectors is not None and not (isinstance(vectors, np.memmap)
                                        and Path(vectors.filename).resolve() == (directory / "vectors.npy").resolve()):
            np.save(directory / "vectors.npy", vectors)

    def _load_data(self, directory: Path) -> None:
        faiss = faiss_module()
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP)
        path = str(directory / "index.faiss")
        if not (directory / "index.faiss").is_file():
            raise DataError(f"{directory}: index.faiss is missing")
        self._index = faiss.read_index_binary(path, flags) if self.kind == "binary" else faiss.read_index(path, flags)
        if (directory / "ranges.npy").is_file():
            self.ranges = np.load(directory / "ranges.npy")
        if (directory / "vectors.npy").is_file():
            self._vectors = np.load(directory / "vectors.npy", mmap_mode="r")
        elif self.keeps_vectors:
            raise DataError(f"{directory}: vectors.npy (the float vectors that rescore candidates) is missing")

    def _save_ids(self, directory: Path) -> None:
        writer = IdWriter(directory, len(self.ids), "string")
        writer.write(self.ids)
        writer.close()

    def _load_ids(self, directory: Path) -> Sequence[str]:
        return IdColumn(directory)


FEW_QUERIES = 16


@contextlib.contextmanager
def _threads_for(queries: int, kind: str) -> Iterator[None]:
    """One OpenMP thread for a full scan (int8, binary) of few queries. FAISS splits such a scan by query, so
    more threads add nothing but their wait at the barrier, which on a loaded machine costs more than the scan
    itself (bench/big_index.py). IVF searches keep their threads."""
    faiss = faiss_module()
    if kind == "ivfpq" or queries > FEW_QUERIES or faiss.omp_get_max_threads() == 1:
        yield
        return
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def rescore_candidates(queries: np.ndarray, rows: np.ndarray, vectors: np.ndarray, k: int,
                       chunk_queries: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Re-rank each query's candidate rows (-1: none) by the exact dot product with the float vectors,
    which may be memory-mapped: each chunk reads only its candidates' rows, in file order."""
    out_scores = np.full((len(rows), min(k, rows.shape[1])), -np.inf, dtype=np.float32)
    out_rows = np.full(out_scores.shape, -1, dtype=np.int64)
    for start in range(0, len(rows), chunk_queries):
        block = rows[start:start + chunk_queries]
        unique, inverse = np.unique(np.where(block >= 0, block, 0), return_inverse=True)
        candidates = np.asarray(vectors[unique], dtype=np.float32)[inverse.reshape(block.shape)]
        scores = np.einsum("qd,qcd->qc", queries[start:start + chunk_queries], candidates)
        scores[block < 0] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :out_scores.shape[1]]
        out_scores[start:start + len(block)] = np.take_along_axis(scores, order, 1)
        out_rows[start:start + len(block)] = np.where(np.take_along_axis(block, order, 1) >= 0,
                                                      np.take_along_axis(block, order, 1), -1)
    return out_scores, out_rows


def build_streaming(source: VectorSource, out_dir: str | Path, *, kind: str = "ivfpq", metric: str = "cosine",
                    info: dict[str, Any] | None = None, batch_rows: int = 65536, show_progress: bool = True,
                    **params: Any) -> CompressedIndex:
    """Build a compressed index from ``source`` straight into ``out_dir`` in bounded memory: train on a seeded
    sample, then encode one batch at a time, writing ids and float vectors as they come. Returns the saved
    index, loaded memory-mapped."""
    from ..progress import Progress

    index = CompressedIndex(source.dimension, metric, kind=kind, info=dict(info or {}), **params)
    sample = index._prepare(source.sample(index.train_sample, index.seed), "vectors")
    index.train(sample, total=source.count)
    del sample
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("ids.txt", "ids.npy", "ids.offsets.npy", "ids.bytes", "vectors.npy", "ranges.npy"):
        (out_dir / stale).unlink(missing_ok=True)
    index._presize(source.count)
    ids = IdWriter(out_dir, source.count, source.id_kind)
    vectors = _NpyWriter(out_dir / "vectors.npy", (source.count, source.dimension), np.float32) \
        if index.keeps_vectors else None
    with Progress(source.count, f"indexing ({kind})", "vectors", enabled=show_progress) as progress:
        for batch_ids, batch in source.iter_batches(batch_rows):
            array = index._prepare(batch, "vectors")
            index._encode_add(array)
            ids.write(batch_ids)
            if vectors is not None:
                vectors.write(array)
            progress.advance(len(array))
    ids.close()
    if vectors is not None:
        vectors.close()
    if index._fill is not None and index._fill[1] != source.count:
        raise DataError(f"read {index._fill[1]:,} vectors, expected {source.count:,} (the input changed while it "
                        "was read?)")
    index._fill = None
    index._save_data(out_dir)
    index._write_meta(out_dir, source.count)
    return VectorIndex.load(out_dir)  # type: ignore[return-value]
