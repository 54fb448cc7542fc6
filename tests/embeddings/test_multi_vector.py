"""Multi-vector (ColBERT) embeddings: a tiny random BERT with a projection, saved in PyLate's directory format by
``MultiVectorModel.save_pretrained``, encodes queries and documents as sentence-transformers 6's
``MultiVectorEncoder`` does (which reads PyLate's format), token by token to 1e-5, under each query-expansion
setting; its tokens are the tokenizer's with PyLate's markers and [MASK] padding; MaxSim and the MaxSim ranking loss
equal loops written out by hand; the trainable model's vectors equal the embedder's and carry gradients; bad input
is refused with errors that say what to do. bench/pylate_parity.py compares with PyLate itself."""
from __future__ import annotations

import json
import math
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import InputError
from encoderkit.embeddings.losses import MaxSimMultipleNegativesRankingLoss, text_ids
from encoderkit.embeddings.multi_vector import (
    MultiVectorEmbedder,
    MultiVectorModel,
    MultiVectorSettings,
    maxsim,
    maxsim_scores,
)
from encoderkit.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

QUERIES = ["What is the capital of France?", "  short  ", "a long query that runs past the query length " * 4, ""]
DOCUMENTS = ["Paris is the capital of France.", "Berlin, Germany's capital; it's big!", "word " * 80,
             "[unused5] odd tokens ... and (brackets)"]
SETTINGS = {"default": {}, "attend": {"attend_to_expansion_tokens": True},
            "no-expansion": {"do_query_expansion": False}}


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory, minilm_dir) -> Path:
    from helpers import tiny_bert_dir

    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-plain"), minilm_dir, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def model(plain_dir) -> MultiVectorModel:
    # 64 tokens: the tiny model reads 128 positions, PyLate's default of 180 would not fit
    return MultiVectorModel.from_pretrained(plain_dir, document_length=64)


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory) -> dict[str, Path]:
    """The model saved under each query-expansion setting."""
    from dataclasses import replace

    out = {}
    for name, changes in SETTINGS.items():
        directory = tmp_path_factory.mktemp(f"colbert-{name}")
        original = model.settings
        model.settings = replace(original, **changes)
        try:
            model.save_pretrained(directory)
        finally:
            model.settings = original
        out[name] = directory
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_equals_sentence_transformers_multi_vector_encoder(saved, setting: str) -> None:
    from sentence_transformers import MultiVectorEncoder

    directory = saved[setting]
    embedder = MultiVectorEmbedder.from_pretrained(directory)
    reference = MultiVectorEncoder(str(directory), device="cpu")
    for is_query, texts in ((True, QUERIES), (False, DOCUMENTS)):
        ours = embedder.encode(texts, is_query=is_query, batch_size=3)
        theirs = (reference.encode_query if is_query else reference.encode_document)(texts, convert_to_numpy=True)
        for text, a, b in zip(texts, ours, theirs):
            assert a.dtype == np.float32 and a.shape == b.shape, (setting, text, a.shape, b.shape)
            assert np.abs(a - b).max() < 1e-5, (setting, text)
    if setting == "default":
        queries, documents = embedder.encode(QUERIES, is_query=True), embedder.encode(DOCUMENTS, is_query=False)
        want = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(DOCUMENTS)).numpy()
        assert np.abs(maxsim(queries, documents) - want).max() < 1e-4


def test_tokens_are_pylates_layout(saved) -> None:
    """[CLS] [Q] text [SEP] then [MASK] to 32 tokens; documents [CLS] [D] text [SEP] to 64; punctuation skipped."""
    from transformers import AutoTokenizer

    directory = saved["default"]
    hf = AutoTokenizer.from_pretrained(str(directory))
    embedder = MultiVectorEmbedder.from_pretrained(directory)
    q_id, d_id = hf.convert_tokens_to_ids("[Q] "), hf.convert_tokens_to_ids("[D] ")
    assert (q_id, d_id) == (hf.vocab_size, hf.vocab_size + 1)  # added after the vocabulary, as PyLate adds them
    assert all(np.array_equal(a, b) for a, b in zip(embedder.encode_query(QUERIES[:2]),
                                                    embedder.encode(QUERIES[:2], is_query=True)))
    queries = embedder.tokenize(QUERIES[:3], is_query=True)
    for text, ids, attended in zip(QUERIES, queries.ids, queries.attended):
        plain = hf(text.strip(), truncation=True, max_length=31)["input_ids"]
        assert ids == plain[:1] + [q_id] + plain[1:] + [hf.mask_token_id] * (31 - len(plain))
        assert attended == len(plain) + 1
    documents = embedder.tokenize(DOCUMENTS, is_query=False)
    vectors = embedder.encode(DOCUMENTS, is_query=False)
    punctuation = set(hf.convert_tokens_to_ids(list(string.punctuation)))
    for text, ids, rows in zip(DOCUMENTS, documents.ids, vectors):
        plain = hf(text.strip(), truncation=True, max_length=63)["input_ids"]
        assert ids == plain[:1] + [d_id] + plain[1:]
        assert len(rows) == sum(token not in punctuation for token in ids)
        assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_model_forward_equals_embedder_and_trains(model, saved) -> None:
    embedder = MultiVectorEmbedder.from_pretrained(saved["default"])
    model.eval()
    for is_query, texts in ((True, QUERIES), (False, DOCUMENTS)):
        batch = model.tokenize(texts, is_query=is_query)
        with torch.no_grad():
            vectors, mask = model(**batch)  # queries or documents told apart by their marker
        for row, want in enumerate(embedder.encode(texts, is_query=is_query)):
            got = vectors[row][mask[row]].numpy()
            assert got.shape == want.shape and np.abs(got - want).max() < 1e-5
            assert float(vectors[row][~mask[row]].abs().sum()) == 0.0
        padded, present = embedder.encode(texts, is_query=is_query, padded=True)
        for row, want in enumerate(embedder.encode(texts, is_query=is_query, convert_to="torch")):
            assert torch.equal(padded[row][present[row]], want) and int(present[row].sum()) == len(want)
    model.train()
    loss = MaxSimMultipleNegativesRankingLoss()
    value = loss(model(**model.tokenize(QUERIES[:3], True)), model(**model.tokenize(DOCUMENTS[:3], False)))
    value.backward()
    for parameter in (model.projection[0].weight, model.encoder.embeddings.word.weight, model.encoder.layers[0]
                      .attention.qkv.weight if hasattr(model.encoder.layers[0].attention, "qkv") else None):
        if parameter is not None:
            assert parameter.grad is not None and float(parameter.grad.abs().max()) > 0
    model.zero_grad()


def test_round_trip_and_new_projection(model, saved, plain_dir) -> None:
    directory = saved["default"]
    config = json.loads((directory / "config_sentence_transformers.json").read_text())
    assert config["query_prefix"] == "[Q] " and config["document_prefix"] == "[D] " and config["query_length"] == 32
    assert config["document_length"] == 64 and config["skiplist_words"] == list(string.punctuation)
    assert config["attend_to_expansion_tokens"] is False and config["do_query_expansion"] is True
    assert [m["type"] for m in json.loads((directory / "modules.json").read_text())] == [
        "sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    loaded = MultiVectorModel.from_pretrained(directory)
    assert loaded.settings == model.settings
    assert torch.equal(loaded.projection[0].weight, model.projection[0].weight)
    assert torch.equal(loaded.encoder.embeddings.word.weight, model.encoder.embeddings.word.weight)
    # a plain encoder: the marker rows are the mean of the others, the projection is seeded, nn.Linear's init
    again = MultiVectorModel.from_pretrained(plain_dir)
    other = MultiVectorModel.from_pretrained(plain_dir, seed=1, dimension=16)
    words = again.encoder.embeddings.word.weight
    assert words.shape[0] == 30524 and torch.allclose(words[-2:], words[:-2].mean(0).expand(2, -1), atol=1e-6)
    weight = again.projection[0].weight.detach()
    assert torch.equal(weight, model.projection[0].weight) and again.projection[0].bias is None
    assert other.projection[0].weight.shape == (16, 32) and not torch.equal(other.projection[0].weight[:16],
                                                                             weight[:16])
    bound = 1 / math.sqrt(32)
    assert float(weight.abs().max()) <= bound and float(weight.abs().max()) > 0.9 * bound


def test_maxsim_equals_a_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    queries = [torch.randn(n, 8, generator=generator) for n in (3, 5)]
    documents = [torch.randn(n, 8, generator=generator) for n in (4, 1, 7)]

    def by_hand(q, d) -> float:
        return sum(max(float(q[i] @ d[j]) for j in range(len(d))) for i in range(len(q)))

    matrix = maxsim([q.numpy() for q in queries], [d.numpy() for d in documents])
    assert matrix.shape == (2, 3) and matrix.dtype == np.float32
    for i, q in enumerate(queries):
        for j, d in enumerate(documents):
            assert abs(matrix[i, j] - by_hand(q, d)) < 1e-4
            assert abs(maxsim(q, d) - by_hand(q, d)) < 1e-4
    with pytest.raises(InputError, match="one query's vectors and one document's, or a list of each"):
        maxsim(queries, documents[0])
    with pytest.raises(InputError, match="8 dimensions, document vectors 4"):
        maxsim(queries[0], torch.randn(3, 4))


def _random_columns(generator, batch: int, lengths: list[int], dim: int = 6):
    """(vectors, mask) per column, unit vectors zeroed where the mask is off, each row with a token that counts."""
    columns = []
    for length in lengths:
        vectors = torch.nn.functional.normalize(torch.randn(batch, length, dim, generator=generator), dim=-1)
        mask = torch.rand(batch, length, generator=generator) > 0.3
        mask[:, 0] = True
        columns.append((vectors * mask[..., None], mask))
    return columns


def _loss_by_hand(columns, scale: float, masked: set[tuple[int, int]] = frozenset()) -> float:
    """Mean over the queries of -log softmax of the right candidate, MaxSim written as loops over the tokens."""
    (queries, query_mask), candidates = columns[0], columns[1:]
    docs = [(v[b], m[b]) for v, m in candidates for b in range(v.shape[0])]
    total = 0.0
    for i in range(queries.shape[0]):
        scores = []
        for c, (d, d_mask) in enumerate(docs):
            if (i, c) in masked:
                continue
            score = 0.0
            for t in range(queries.shape[1]):
                if query_mask[i, t]:
                    score += max(float(queries[i, t] @ d[u]) for u in range(d.shape[0]) if d_mask[u])
            scores.append((c, scale * score))
        top = max(s for _, s in scores)
        log_sum = top + math.log(sum(math.exp(s - top) for _, s in scores))
        total += log_sum - dict(scores)[i]
    return total / queries.shape[0]


def test_maxsim_loss_equals_a_hand_computation() -> None:
    generator = torch.Generator().manual_seed(1)
    columns = _random_columns(generator, 3, [5, 4, 7])  # queries, positives, one hard-negative column
    assert abs(float(MaxSimMultipleNegativesRankingLoss()(*columns)) - _loss_by_hand(columns, 1.0)) < 1e-5
    assert abs(float(MaxSimMultipleNegativesRankingLoss(scale=5.0)(*columns)) - _loss_by_hand(columns, 5.0)) < 1e-4
    # query 2 repeats query 0, so positive 2 is a right answer of query 0 (and the reverse): not a negative
    duplicates = text_ids([["q0", "q1", "q0"], ["p0", "p1", "p2"], ["n0", "n1", "n2"]])
    value = MaxSimMultipleNegativesRankingLoss()(*columns, duplicates=duplicates)
    assert abs(float(value) - _loss_by_hand(columns, 1.0, masked={(0, 2), (2, 0)})) < 1e-5
    # gradients reach every column
    leaves = [(v.clone().requires_grad_(), m) for v, m in columns]
    MaxSimMultipleNegativesRankingLoss()(*leaves).backward()
    assert all(v.grad is not None and float(v.grad.abs().max()) > 0 for v, _ in leaves)


def test_maxsim_scores_leave_out_tokens_that_do_not_count() -> None:
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    d = torch.tensor([[[-1.0, 0.0], [0.5, 0.5], [9.0, 9.0]]])
    # the padded third token would win both maxima; PyLate's 0 for it would beat the first query token's -1 too
    assert torch.allclose(maxsim_scores(q, d, document_mask=torch.tensor([[True, True, False]])), torch.tensor([[1.0]]))
    assert torch.allclose(maxsim_scores(q, d, torch.tensor([[True, False]]), torch.tensor([[True, False, False]])),
                          torch.tensor([[-1.0]]))


def test_bad_input_is_refused_with_what_to_do(saved, plain_dir, tmp_path) -> None:
    embedder = MultiVectorEmbedder.from_pretrained(saved["default"])
    with pytest.raises(InputError, match="is_query must be True"):
        embedder.encode(["text"], is_query=None)
    with pytest.raises(InputError, match=r"texts\[1\] must be a string, found int"):
        embedder.encode(["text", 3], is_query=False)
    with pytest.raises(InputError, match="texts must be a string or a list of strings, found int"):
        embedder.encode(5, is_query=True)
    with pytest.raises(InputError, match="at least one text"):
        embedder.encode([], is_query=True)
    with pytest.raises(InputError, match="query_length 200 is longer than this model reads"):
        MultiVectorEmbedder.from_pretrained(saved["default"], query_length=200).encode(["x"], is_query=True)
    with pytest.raises(InputError, match=r"not a multi-vector .*\(path\) adds a new projection"):
        MultiVectorEmbedder.from_pretrained(plain_dir)
    with pytest.raises(InputError, match="query_length must be an integer of at least 3"):
        MultiVectorSettings(query_length=2)
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in saved["default"].iterdir():
        (broken / item.name).symlink_to(item)
    (broken / "config_sentence_transformers.json").unlink()
    (broken / "config_sentence_transformers.json").write_text(json.dumps({"query_length": "32"}))
    with pytest.raises(ConfigError, match="config_sentence_transformers.json: query_length must be an integer"):
        MultiVectorEmbedder.from_pretrained(broken)
    loss = MaxSimMultipleNegativesRankingLoss()
    vectors, mask = torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(InputError, match="positives must be the \\(vectors, mask\\) pair"):
        loss((vectors, mask), vectors)
    with pytest.raises(InputError, match="positives holds 3 texts .* every column needs one row per example"):
        loss((vectors, mask), (torch.zeros(3, 3, 4), torch.ones(3, 3)))
    with pytest.raises(InputError, match="duplicates must be integer text ids of shape"):
        loss((vectors, mask), (vectors, mask), duplicates=torch.zeros(3, 2, dtype=torch.long))
    model = MultiVectorModel.from_pretrained(saved["default"])
    batch = model.tokenize(["a", "b"], is_query=True)
    batch["input_ids"][0, 1] = 5
    with pytest.raises(InputError, match="cannot tell queries from documents .* pass is_query"):
        model(**batch)


def _gathered_worker(rank: int, results: str) -> None:
    """One of two processes: its half of the batch (process 1's positives one token narrower), texts repeated
    across the halves; rank 0 saves the mean loss and each process's input gradients."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{results}.rendezvous", rank=rank, world_size=2)
    rows = slice(rank * 4, rank * 4 + 4)
    local = []
    for index, (vectors, mask) in enumerate(_random_columns(torch.Generator().manual_seed(2), 8, [5, 4, 7])):
        width = 3 if index == 1 and rank == 1 else vectors.shape[1]
        local.append((vectors[rows, :width].clone().requires_grad_(), mask[rows, :width]))
    loss = MaxSimMultipleNegativesRankingLoss(gather_across_processes=True)(*local, duplicates=GATHER_IDS[:, rows])
    loss.backward()
    mean = loss.detach().reshape(1).clone()
    dist.all_reduce(mean)
    gradients = [None, None]
    dist.all_gather_object(gradients, [vectors.grad for vectors, _ in local])
    if rank == 0:
        torch.save((float(mean) / 2, gradients), results)
    dist.destroy_process_group()


GATHER_IDS = text_ids([[f"q{i % 5}" for i in range(8)], [f"p{i % 6}" for i in range(8)], [f"n{i}" for i in range(8)]])


@pytest.mark.slow
def test_gathered_loss_equals_one_process(tmp_path) -> None:
    """Two processes (gloo): the mean of their losses is the loss of the whole batch in one process, and their
    input gradients, divided by the world size as DDP does, are its gradients."""
    results = tmp_path / "ranks.pt"
    torch.multiprocessing.spawn(_gathered_worker, args=(str(results),), nprocs=2)
    mean, gradients = torch.load(results, weights_only=False)
    columns = _random_columns(torch.Generator().manual_seed(2), 8, [5, 4, 7])
    vectors, mask = columns[1]
    mask = mask.clone()
    mask[4:, 3:] = False  # process 1's positives end after 3 tokens
    columns[1] = (vectors * mask[..., None], mask)
    leaves = [(v.clone().requires_grad_(), m) for v, m in columns]
    reference = MaxSimMultipleNegativesRankingLoss()(*leaves, duplicates=GATHER_IDS)
    reference.backward()
    assert abs(mean - float(reference)) < 1e-5
    for rank in range(2):
        for (leaf, _), got in zip(leaves, gradients[rank]):
            want = leaf.grad[rank * 4:rank * 4 + 4, :got.shape[1]]
            assert float((got / 2 - want).abs().max()) < 1e-5
    alone = MaxSimMultipleNegativesRankingLoss()(*[(v[:4], m[:4]) for v, m in columns], duplicates=GATHER_IDS[:, :4])
    assert abs(float(alone) - float(reference)) > 1e-2


def test_train_embedder_kind_multi_vector(tmp_path, plain_dir, capsys) -> None:
    """A few MaxSim-MNRL steps through the command: the loss of the training set falls, validation scores nDCG by
    MaxSim, and final/ is a PyLate directory that sentence-transformers encodes as encoderkit does, with the
    trained query prompt."""
    import json

    from sentence_transformers import MultiVectorEncoder

    from encoderkit.cli.app import main
    from encoderkit.embeddings.losses import MaxSimMultipleNegativesRankingLoss

    pairs = [("What is the capital of France?", "Paris is the capital of France."),
             ("Which city is Germany's capital?", "Berlin is the capital of Germany."),
             ("what do bees make", "Bees make honey from nectar."),
             ("who wrote hamlet", "Hamlet was written by William Shakespeare."),
             ("how tall is mount everest", "Mount Everest is 8,849 metres tall."),
             ("what is water made of", "Water is hydrogen and oxygen.")]
    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{q}\t{d}\n" for q, d in pairs), encoding="utf-8")

    def loss_of(model):
        model.eval()
        with torch.no_grad():
            queries = model(**model.tokenize(["query: " + q for q, _ in pairs], True))
            documents = model(**model.tokenize([d for _, d in pairs], False))
            return float(MaxSimMultipleNegativesRankingLoss()(queries, documents))

    before = loss_of(MultiVectorModel.from_pretrained(plain_dir, document_length=64, dimension=16))
    out = tmp_path / "out"
    code = main(["train-embedder", "--model", str(plain_dir), "--kind", "multi-vector", "--dimension", "16",
                 "--train", str(train), "--valid", str(train), "--epochs", "4", "--batch-size", "3", "--lr", "1e-3",
                 "--max-length", "64", "--query-prompt", "query: ", "--seed", "0", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert loss_of(MultiVectorModel.from_pretrained(out / "final")) < before
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(0.0 <= r.get("eval_ndcg_at_10", -1) <= 1.0 for r in records)
    reference = MultiVectorEncoder(str(out / "final"), device="cpu")
    embedder = MultiVectorEmbedder.from_pretrained(out / "final")
    assert embedder.settings.prompts == {"query": "query: "} and embedder.dimension == 16
    theirs = reference.encode_document([d for _, d in pairs], convert_to_numpy=True)
    for a, b in zip(embedder.encode([d for _, d in pairs], is_query=False), theirs):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5
