"""Parity of encoderkit's multi-vector (ColBERT) side with PyLate itself (lightonai/pylate, ``models.ColBERT`` and
``losses.Contrastive``).

PyLate pins sentence-transformers 5.3 and transformers <= 5.3, so it lives in a virtual environment of its own; this
script runs in both, in two steps:

    python3.11 -m venv /tmp/pylate-venv && /tmp/pylate-venv/bin/pip install torch==2.13.0 && \\
        /tmp/pylate-venv/bin/pip install pylate
    .venv/bin/python bench/pylate_parity.py base --out /tmp/pylate-parity
    /tmp/pylate-venv/bin/python bench/pylate_parity.py reference --out /tmp/pylate-parity
    .venv/bin/python bench/pylate_parity.py compare --out /tmp/pylate-parity

``base`` (encoderkit) writes a tiny random BERT (2 layers, hidden 32, MiniLM's vocabulary) and, from it, an
encoderkit ``MultiVectorModel`` saved in PyLate's format. ``reference`` (PyLate) builds a ColBERT model from the
tiny BERT (markers added, a new projection), saves it, and writes to reference.json the token vectors of queries
and documents under three settings (PyLate's defaults, ``attend_to_expansion_tokens=True``,
``do_query_expansion=False``), the Contrastive loss of a batch with a hard-negative column, and the vectors of
encoderkit's saved directory as PyLate reads it. ``compare`` (encoderkit) encodes the same texts from PyLate's
directory with ``MultiVectorEmbedder`` and prints the largest differences: vectors (shapes must be equal), MaxSim
scores, the loss of ``MaxSimMultipleNegativesRankingLoss`` (and of PyLate's rule of scoring a skipped document token 0,
which it differs from where a query token's best real match is negative), and PyLate's reading of encoderkit's
directory. It writes bench/results/pylate_parity.json.

Measured (pylate 1.6.0 with sentence-transformers 5.3.0, transformers 5.3.0 and torch 2.11.0, which pip chose for
it; encoderkit with torch 2.13.0), bench/results/pylate_parity.json: every vector of the same shape as PyLate's, the
largest difference 1.0e-7 (queries without expansion), 4.5e-8 (documents), 0 (queries with expansion, attended or
not); MaxSim scores 1.9e-6; the Contrastive loss 2.1446590 (PyLate) against 2.1446588 (2.4e-7); PyLate's reading of
encoderkit's directory 0 (queries) and 7.5e-8 (documents). transformers 5.3 saves BERT's LayerNorm parameters as
``gamma`` / ``beta``, which encoderkit's loader reads as ``weight`` / ``bias``, as transformers does.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import smoke_training
from common import SMOKE

QUERIES = ["What is the capital of France?", "how do late interaction models score documents",
           "a long query that runs well past the thirty-two tokens of a ColBERT query " * 2, "x"]
DOCUMENTS = ["Paris is the capital of France.", "Berlin, Germany's capital; it's big -- and (old)!",
             "ColBERT scores a document by MaxSim: each query token finds its best document token. " * 3,
             "late interaction", "Tokyo is the capital of Japan.", "Rome: the capital of Italy, since 1871."]
NEGATIVES = ["Madrid is in Spain.", "a completely unrelated sentence about cooking pasta", "dogs bark", "?!"]
SETTINGS = {"default": {}, "attend": {"attend_to_expansion_tokens": True},
            "no-expansion": {"do_query_expansion": False}}
PYLATE_PYTHON = "/tmp/pylate-venv/bin/python"  # PyLate's virtual environment, as made above
DOCUMENT_LENGTH = 100  # the tiny BERT reads 128 positions; PyLate's default of 180 would not fit
SEED = 0


def base(out: Path) -> None:
    """encoderkit: the tiny BERT, and an encoderkit MultiVectorModel from it in PyLate's format."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import tiny_bert_dir

    from encoderkit import default_model_path
    from encoderkit.embeddings.multi_vector import MultiVectorModel

    tiny = tiny_bert_dir(out / "tiny-bert", default_model_path(), hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    MultiVectorModel.from_pretrained(tiny, document_length=DOCUMENT_LENGTH, seed=SEED).save_pretrained(
        out / "encoderkit-colbert")
    print(f"wrote {tiny} and {out / 'encoderkit-colbert'}")


def _pylate_vectors(model, texts, is_query: bool) -> list[list[list[float]]]:
    return [v.tolist() for v in model.encode(texts, is_query=is_query, batch_size=3, convert_to_numpy=True)]


def reference(out: Path) -> None:
    """PyLate: a ColBERT model from the tiny BERT, saved; its vectors and Contrastive loss; encoderkit's directory
    read by PyLate."""
    import pylate
    import torch
    from pylate import losses, models

    torch.manual_seed(SEED)
    model = models.ColBERT(str(out / "tiny-bert"), document_length=DOCUMENT_LENGTH, device="cpu")
    model.save(str(out / "pylate-colbert"))
    result: dict = {"pylate": pylate.__version__, "torch": torch.__version__, "settings": {}}
    for name, overrides in SETTINGS.items():
        loaded = models.ColBERT(str(out / "pylate-colbert"), device="cpu", **overrides)
        result["settings"][name] = {"queries": _pylate_vectors(loaded, QUERIES, True),
                                    "documents": _pylate_vectors(loaded, DOCUMENTS, False)}
    loaded = models.ColBERT(str(out / "pylate-colbert"), device="cpu").eval()
    features = [loaded.tokenize(QUERIES, is_query=True), loaded.tokenize(DOCUMENTS[:4], is_query=False, pad=True),
                loaded.tokenize(NEGATIVES, is_query=False, pad=True)]  # as its collator: one width
    with torch.no_grad():
        result["contrastive_loss"] = float(losses.Contrastive(model=loaded)(features))
    theirs = models.ColBERT(str(out / "encoderkit-colbert"), device="cpu")
    result["encoderkit_dir"] = {"queries": _pylate_vectors(theirs, QUERIES, True),
                                "documents": _pylate_vectors(theirs, DOCUMENTS, False)}
    (out / "reference.json").write_text(json.dumps(result), encoding="utf-8")
    print(f"wrote {out / 'reference.json'}")


def _worst(ours, theirs) -> float:
    """The largest absolute difference of two lists of (tokens, dim) arrays; the shapes must be equal."""
    import numpy as np

    worst = 0.0
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        b = np.asarray(b, dtype=np.float32)
        if a.shape != b.shape:
            raise SystemExit(f"text {index}: encoderkit has {a.shape} vectors, PyLate {b.shape}")
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def compare(out: Path) -> dict:
    """encoderkit on PyLate's directory against reference.json; printed and written to bench/results."""
    import numpy as np
    import torch

    from encoderkit.embeddings.losses import MaxSimMultipleNegativesRankingLoss
    from encoderkit.embeddings.multi_vector import MultiVectorEmbedder, MultiVectorModel, maxsim

    ref = json.loads((out / "reference.json").read_text(encoding="utf-8"))
    report: dict = {"pylate": ref["pylate"], "torch_pylate_side": ref["torch"], "settings": {}}
    pylate_dir = out / "pylate-colbert"
    for name, overrides in SETTINGS.items():
        embedder = MultiVectorEmbedder.from_pretrained(pylate_dir, **overrides)
        queries = embedder.encode(QUERIES, is_query=True)
        documents = embedder.encode(DOCUMENTS, is_query=False)
        theirs = ref["settings"][name]
        scores = maxsim(queries, documents)
        want = maxsim([np.asarray(v, np.float32) for v in theirs["queries"]],
                      [np.asarray(v, np.float32) for v in theirs["documents"]])
        report["settings"][name] = {"query_vectors": _worst(queries, theirs["queries"]),
                                    "document_vectors": _worst(documents, theirs["documents"]),
                                    "maxsim_scores": float(np.abs(scores - want).max())}
    model = MultiVectorModel.from_pretrained(pylate_dir).eval()
    with torch.no_grad():
        columns = [model(**model.tokenize(QUERIES, True)), model(**model.tokenize(DOCUMENTS[:4], False)),
                   model(**model.tokenize(NEGATIVES, False))]
        ours = float(MaxSimMultipleNegativesRankingLoss()(*columns))
        # PyLate's scoring: a document token that does not count scores 0 rather than being left out of the max
        (q, _), docs = columns[0], columns[1:]  # every query token counts (query expansion)
        d = torch.cat([v for v, _ in (_padded(c, max(x[0].shape[1] for x in docs)) for c in docs)])
        zeroed = torch.einsum("qsh,dth->qdst", q, d).max(-1).values.sum(-1)  # vectors are zero where not counting
        as_pylate = float(torch.nn.functional.cross_entropy(zeroed, torch.arange(len(QUERIES))))
    report["contrastive_loss"] = {"pylate": ref["contrastive_loss"], "encoderkit": ours,
                                  "difference": abs(ours - ref["contrastive_loss"]),
                                  "difference_scoring_skipped_tokens_0": abs(as_pylate - ref["contrastive_loss"])}
    embedder = MultiVectorEmbedder.from_pretrained(out / "encoderkit-colbert")
    report["encoderkit_dir_read_by_pylate"] = {
        "query_vectors": _worst(embedder.encode(QUERIES, is_query=True), ref["encoderkit_dir"]["queries"]),
        "document_vectors": _worst(embedder.encode(DOCUMENTS, is_query=False), ref["encoderkit_dir"]["documents"])}
    print(json.dumps(report, indent=2))
    from common import write_result

    write_result("pylate_parity", report)
    return report


def render(r: dict) -> list[str]:
    """BENCHMARKS.md's section: the largest differences against PyLate, per setting."""
    if "settings" not in r:  # a smoke run without PyLate
        return ["## Multi-vector (ColBERT) parity with PyLate (bench/pylate_parity.py)", "",
                "Not compared: " + "; ".join(f"{s['part']}: {s['reason']}" for s in r.get("skipped", [])), ""]
    rows = [f"| {name} | {v['query_vectors']:.1e} | {v['document_vectors']:.1e} | {v['maxsim_scores']:.1e} |"
            for name, v in r["settings"].items()]
    loss = r["contrastive_loss"]
    read = r["encoderkit_dir_read_by_pylate"]
    return ["## Multi-vector (ColBERT) parity with PyLate (bench/pylate_parity.py)", "",
            f"PyLate {r['pylate']} (its own venv, torch {r['torch_pylate_side']}) against encoderkit on a tiny "
            "random BERT ColBERT; largest absolute differences.", "",
            "| setting | query vectors | document vectors | MaxSim scores |", "|---|---|---|---|", *rows, "",
            f"- Contrastive loss: PyLate {loss['pylate']:.7f}, encoderkit {loss['encoderkit']:.7f} "
            f"(difference {loss['difference']:.1e})",
            f"- encoderkit's directory read by PyLate: queries {read['query_vectors']:.1e}, documents "
            f"{read['document_vectors']:.1e}", ""]


def _padded(column, length: int):
    import torch.nn.functional as F

    vectors, mask = column
    return F.pad(vectors, (0, 0, 0, length - vectors.shape[1])), F.pad(mask, (0, length - mask.shape[1]))


def smoke(out: Path) -> None:
    """A smoke run (no step named): every step in turn, ``reference`` in PyLate's virtual environment where it
    exists. Without it only ``base`` runs, and the result says what was skipped and why."""
    import subprocess

    from common import write_result

    base(out)
    if not Path(PYLATE_PYTHON).is_file():
        reason = f"{PYLATE_PYTHON} is missing: make PyLate's virtual environment as this script's docstring says"
        write_result("pylate_parity", {"skipped": [smoke_training.skip("reference and compare", reason)],
                                       "base": sorted(p.name for p in out.iterdir())})
        return
    subprocess.run([PYLATE_PYTHON, str(Path(__file__).resolve()), "reference", "--out", str(out)], check=True)
    compare(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("base", "reference", "compare"), **({"nargs": "?"} if SMOKE else {}))
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="pylate-parity-")) if SMOKE
                        else Path("/tmp/pylate-parity"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    {"base": base, "reference": reference, "compare": compare, None: smoke}[args.step](args.out)


if __name__ == "__main__":
    main()
