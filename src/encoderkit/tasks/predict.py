"""Predicting a whole file with a fine-tuned model, streamed to JSON Lines (one record per input).

Inputs by task: classification: CSV/TSV/JSONL with a text (and pair) column, or plain text, one per
line; NER: plain text, one text per line, or a CoNLL file (a tag per given word); QA: SQuAD JSON, or
JSONL with "question" and "context". Work goes in chunks; every finished chunk is on disk.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from ..data.readers import detect_format, iter_records
from ..errors import InputError
from .loading import load_pipeline
from .pipeline import TaskPipeline

CHUNK = 512


def _chunks(items: Iterator[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _records(pipeline: TaskPipeline, path: Path, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from .classify import Classifier
    from .ner import EntityRecognizer
    from .qa import QuestionAnswerer

    fmt = detect_format(path)
    if isinstance(pipeline, QuestionAnswerer):
        from ..data.readers import json_objects
        from ..data.tasks import QAExample, read_squad

        if path.suffix.lower() == ".json":
            examples = iter(read_squad(path))
        elif fmt == "jsonl":
            examples = (QAExample(str(obj.get("id", number)), str(obj["question"]), str(obj["context"]), [], [])
                        for number, obj in _checked(json_objects(path), path, ("question", "context")))
        else:
            raise InputError(f"{path}: QA input must be SQuAD JSON (.json) or JSONL with question and context")
        for chunk in _chunks(examples):
            for example, answers in zip(chunk, pipeline.answer(chunk, top_k=options.get("top_k", 1))):
                yield {"id": example.id, "question": example.question, "answers": [asdict(a) for a in answers]}
    elif isinstance(pipeline, EntityRecognizer):
        if fmt == "text" and path.suffix.lower() in (".conll", ".train", ".testa", ".testb", ".iob", ".bio"):
            from ..data.tasks import read_conll

            for chunk in _chunks(iter(read_conll(path))):
                for sentence, tagged in zip(chunk, pipeline.tag_words([s.tokens for s in chunk])):
                    yield {"words": tagged.words, "tags": tagged.tags, "scores": tagged.scores}
        else:
            for chunk in _chunks(iter_records(path, text_field=options.get("text_column"), field_option="--text-column")):
                entities = pipeline([r.text for r in chunk], aggregation=options.get("aggregation"))
                for record, found in zip(chunk, entities):
                    yield {"id": record.id, "text": record.text, "entities": [asdict(e) for e in found]}
    elif isinstance(pipeline, Classifier):
        if fmt == "text":
            examples = ((r.id, r.text, None) for r in iter_records(path))
        else:
            from ..data.tasks import read_classification

            rows = read_classification(path, text_column=options.get("text_column"),
                                       pair_column=options.get("pair_column"), require_label=False)
            examples = ((str(i), r.text, r.pair) for i, r in enumerate(rows))
        for chunk in _chunks(examples):
            pairs = [c[2] or "" for c in chunk] if chunk[0][2] is not None else None
            for (record_id, text, pair), prediction in zip(chunk, pipeline([c[1] for c in chunk], pairs)):
                record = {"id": record_id, "text": text, **({"pair": pair} if pair is not None else {})}
                if isinstance(prediction, dict):  # multi-task: one prediction per head
                    record["predictions"] = {name: asdict(p) for name, p in prediction.items()}
                else:
                    record.update(asdict(prediction))
                yield record
    else:  # pragma: no cover - load_pipeline only returns the three above
        raise InputError(f"cannot predict with a {type(pipeline).__name__}")


def _checked(objects, path: Path, keys: tuple[str, ...]):
    from ..errors import DataError

    for number, obj in objects:
        for key in keys:
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise DataError(f"{path}:{number}: needs a non-empty string field {key!r}")
        yield number, obj


def predict_file(model_dir: str | Path, input_path: str | Path, out_path: str | Path | None = None, *,
                 dtype: str = "fp32", **options: Any) -> Iterator[dict[str, Any]] | int:
    """Predict every record of ``input_path``. With ``out_path``, write JSON Lines (atomically: a
    ``.partial`` file renamed when done) and return the record count; without, yield the records."""
    input_path = Path(input_path)
    if not input_path.is_file():
        raise InputError(f"input file not found: {input_path}")
    pipeline = load_pipeline(model_dir, dtype=dtype)
    records = _records(pipeline, input_path, options)
    if out_path is None:
        return records
    out_path = Path(out_path)
    partial = out_path.with_name(out_path.name + ".partial")
    count = 0
    with open(partial, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    partial.replace(out_path)
    return count
