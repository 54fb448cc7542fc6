"""Every pipeline on every family added for issue 42 (MPNet, XLM-RoBERTa, NomicBERT, GTE, EuroBERT,
jina-embeddings-v3), each against an independent reference: tiny random transformers models (weights perturbed)
with the MiniLM tokenizer go through embed, index + search, eval-sts, finetune (classify, NER, QA where
transformers has the head), MLM pre-training, train-embedder, train-reranker, the server, int8 and attention
maps; what encoderkit writes is loaded back by transformers or sentence-transformers with the same outputs.
The README's family table names these tests (ONNX export: tests/core/test_export.py; parity of every head:
tests/parity/test_new_families.py). Marked ``families``: `make test-families` runs them (CI does, after the default
suite)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import perturbed_model_dir
from test_finetune import write_conll, write_squad
from test_modern_tasks import hf_and_ours, write_tsv

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.families]

TOL = 1e-5
SHAPE = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=130, pad_token_id=0)  # the MiniLM tokenizer: [PAD] 0, [CLS] 101, [SEP] 102
ROPE = {"rope_type": "default", "rope_theta": 10_000.0}
CONFIGS = {
    "mpnet": ("MPNet", lambda: transformers.MPNetConfig(**SHAPE, bos_token_id=101, eos_token_id=102)),
    "xlm-roberta": ("XLMRoberta", lambda: transformers.XLMRobertaConfig(**SHAPE, bos_token_id=101,
                                                                         eos_token_id=102)),
    "nomic_bert": ("NomicBert", lambda: transformers.NomicBertConfig(**SHAPE, rope_parameters=ROPE)),
    "gte": ("Gte", lambda: transformers.GteConfig(**SHAPE, rope_parameters=ROPE, type_vocab_size=2)),
    "eurobert": ("EuroBert", lambda: transformers.EuroBertConfig(**SHAPE, num_key_value_heads=2,
                                                                  rope_parameters=ROPE, bos_token_id=101,
                                                                  eos_token_id=102, mask_token_id=103)),
    "jina_embeddings_v3": ("JinaEmbeddingsV3", lambda: transformers.JinaEmbeddingsV3Config(
        **SHAPE, rope_parameters=ROPE, bos_token_id=101, eos_token_id=102)),
}
WITH_QA = ("mpnet", "xlm-roberta", "jina_embeddings_v3")  # the families whose transformers class has a QA head
TEXTS = ["the film was great", "dull", "Two dogs run across a snowy field while their owner throws a red ball.",
         "A man is playing a guitar on the stage tonight."]
FAMILIES = list(CONFIGS)


def family_dir(directory: Path, minilm_dir: Path, family: str, suffix: str = "Model") -> Path:
    stem, make = CONFIGS[family]
    return perturbed_model_dir(directory, minilm_dir, getattr(transformers, stem + suffix), make())


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory, minilm_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: family_dir(root / family, minilm_dir, family) for family in FAMILIES}


def mean_pooled_reference(directory: Path, texts) -> torch.Tensor:
    stem = CONFIGS[json.loads((directory / "config.json").read_text())["model_type"]][0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    inputs = tokenizer(list(texts), padding=True, return_tensors="pt")
    model = getattr(transformers, stem + "Model").from_pretrained(str(directory), attn_implementation="eager").eval()
    with torch.no_grad():
        states = model(**{k: v for k, v in inputs.items() if k != "token_type_ids"
                          or getattr(model.config, "type_vocab_size", 0) > 1}).last_hidden_state
    mask = inputs["attention_mask"][..., None].float()
    return (states * mask).sum(1) / mask.sum(1)


@pytest.mark.parametrize("family", FAMILIES)
def test_embed_index_search_and_eval_sts(family, base_dirs) -> None:
    from encoderkit import Embedder
    from encoderkit.embeddings.evaluation import sts_spearman
    from encoderkit.tasks.search import build_index
    from encoderkit.tasks.sts import spearman

    embedder = Embedder.from_pretrained(base_dirs[family], pooling="mean")
    vectors = embedder.encode(TEXTS)
    expected = mean_pooled_reference(base_dirs[family], TEXTS)
    torch.testing.assert_close(torch.from_numpy(vectors), expected, atol=TOL, rtol=0)
    index = build_index(vectors, [f"t{i}" for i in range(len(TEXTS))])
    assert [ids[0] for ids in index.search(vectors, k=1).ids] == [f"t{i}" for i in range(len(TEXTS))]
    pairs = [(TEXTS[i], TEXTS[j], float(i + j)) for i in range(4) for j in range(i + 1, 4)]
    a = torch.nn.functional.normalize(mean_pooled_reference(base_dirs[family], [p[0] for p in pairs]), dim=1)
    b = torch.nn.functional.normalize(mean_pooled_reference(base_dirs[family], [p[1] for p in pairs]), dim=1)
    want = spearman(np.array([p[2] for p in pairs]), (a * b).sum(1).double().numpy())
    assert sts_spearman(embedder, pairs) == pytest.approx(want, abs=1e-9)
    int8 = Embedder.from_pretrained(base_dirs[family], pooling="mean", dtype="int8").encode(TEXTS)
    cosine = (int8 * vectors).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(vectors, axis=1)
    assert cosine.min() > 0.99


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_maps_equal_transformers(family, base_dirs) -> None:
    from encoderkit.analysis import AttentionAnalyzer

    maps = AttentionAnalyzer.from_pretrained(base_dirs[family]).attend(TEXTS[2])
    stem = CONFIGS[family][0]
    model = getattr(transformers, stem + "Model").from_pretrained(str(base_dirs[family]),
                                                                  attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([maps.input_ids]), output_attentions=True)
    want = torch.stack([layer[0] for layer in out.attentions]).numpy()
    np.testing.assert_allclose(maps.probabilities, want, atol=TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_each_head_loads_in_transformers(family, base_dirs, tmp_path) -> None:
    from encoderkit.training.finetune import Recipe, finetune

    fast = dict(epochs=1, batch_size=8, learning_rate=1e-3, show_progress=False, seed=0)
    stem = CONFIGS[family][0]
    finetune("classify", write_tsv(tmp_path / "train.tsv", 24), tmp_path / "cls", model=base_dirs[family],
             recipe=Recipe(**fast))
    want, got, _ = hf_and_ours(tmp_path / "cls", getattr(transformers, f"{stem}ForSequenceClassification"), TEXTS)
    assert (want.logits - got.logits).abs().max() <= TOL
    finetune("ner", write_conll(tmp_path / "train.conll", 24), tmp_path / "ner", model=base_dirs[family],
             recipe=Recipe(**fast))
    want, got, real = hf_and_ours(tmp_path / "ner", getattr(transformers, f"{stem}ForTokenClassification"),
                                  ["Anna Smith visited Oslo .", "Jo Lee visited New York and then Reykjavik ."])
    assert (want.logits - got.logits)[real].abs().max() <= TOL
    if family in WITH_QA:
        finetune("qa", write_squad(tmp_path / "train.json", 16), tmp_path / "qa", model=base_dirs[family],
                 recipe=Recipe(**{**fast, "max_length": 48, "doc_stride": 16}))
        want, got, real = hf_and_ours(tmp_path / "qa", getattr(transformers, f"{stem}ForQuestionAnswering"),
                                      ["Where was it?", "Where was the meeting?"],
                                      ["It was in Lima, a city in Peru.", "The meeting took place in Oslo."])
        assert (want.start_logits - got.start_logits)[real].abs().max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_mlm_pretraining_continues_and_loads_in_transformers(family, base_dirs, tmp_path) -> None:
    from encoderkit.training.pretrain import pretrain

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 8) + "\n", encoding="utf-8")
    pretrain(corpus, tmp_path / "run", config=base_dirs[family], max_steps=2, batch_size=4, max_length=32,
             show_progress=False)
    stem = CONFIGS[family][0]
    want, got, real = hf_and_ours(tmp_path / "run" / "final", getattr(transformers, f"{stem}ForMaskedLM"), TEXTS)
    assert (want.logits - got.logits)[real].abs().max() <= 1e-4 * max(1.0, float(want.logits.abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_train_embedder_and_reranker_load_in_their_peers(family, base_dirs, tmp_path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from encoderkit import Embedder
    from encoderkit.training.reranker import train_reranker
    from encoderkit.training.sentence import EmbedderRecipe, train_embedder

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(f"q{i} {t}\t{t}\n" for i, t in enumerate(TEXTS * 2)),
                     encoding="utf-8")
    result = train_embedder(base_dirs[family], pairs, tmp_path / "emb",
                            EmbedderRecipe(batch_size=4, max_steps=2, show_progress=False))
    reference = st.SentenceTransformer(str(result.final_dir), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(Embedder.from_pretrained(result.final_dir).encode(TEXTS), reference, atol=TOL)
    labelled = tmp_path / "rerank.tsv"
    labelled.write_text("query\tpassage\tlabel\n" + "".join(f"q {t}\t{t}\t{i % 2}\n" for i, t in enumerate(TEXTS * 2)),
                        encoding="utf-8")
    train_reranker(base_dirs[family], labelled, tmp_path / "rr", epochs=1, batch_size=4, show_progress=False)
    stem = CONFIGS[family][0]
    want, got, _ = hf_and_ours(tmp_path / "rr", getattr(transformers, f"{stem}ForSequenceClassification"),
                               ["q dull", "q the film was great"], ["dull", "a man is playing"])
    assert (want.logits - got.logits).abs().max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_served_embeddings_equal_the_embedder(family, base_dirs) -> None:
    pytest.importorskip("fastapi")
    from encoderkit import Embedder
    from encoderkit.server import ModelRegistry, ServerSettings, create_app
    from serving import client_of

    registry = ModelRegistry.load([(family, base_dirs[family])])

    async def go():
        async with client_of(create_app(registry, ServerSettings())) as client:
            return await client.post("/embed", json={"inputs": TEXTS, "normalize": False})

    response = asyncio.run(go())
    assert response.status_code == 200
    np.testing.assert_allclose(np.array(response.json()), Embedder.from_pretrained(base_dirs[family]).encode(TEXTS),
                               atol=1e-6)
