"""Task pipelines on the fast path against transformers: classification logits for every family, NER
entities against transformers' token-classification pipeline, and QA over long contexts."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import EncoderConfig, build_model
from encoderkit.tasks.classify import Classifier
from encoderkit.tasks.ner import EntityRecognizer
from encoderkit.tasks.qa import QuestionAnswerer, best_spans

from helpers import TOKENIZER_FILES

transformers = pytest.importorskip("transformers")

TEXTS = ["A gripping, beautifully shot film.", "Dull.", "Peter Blackburn flew from Reykjavíkurborg to Eyjafjallajökull "
         "with the European Commission on Monday, and nobody noticed anything at all."]
FAMILY_SHAPES = {
    "bert": dict(type_vocab_size=2),
    "roberta": dict(type_vocab_size=1, max_position_embeddings=66),
    "distilbert": dict(type_vocab_size=0),
    "albert": dict(type_vocab_size=2, embedding_size=16, num_hidden_groups=1),
    "electra": dict(type_vocab_size=2, embedding_size=16),
}


def small_model_dir(directory: Path, minilm_dir: Path, family: str, task: str, labels: list[str],
                    **overrides) -> Path:
    """A perturbed 2-layer model of ``family`` with the MiniLM vocabulary and tokenizer, saved."""
    torch.manual_seed(0)
    shape = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=64, pad_token_id=0, hidden_act="gelu")
    config = EncoderConfig(model_type=family, **{**shape, **FAMILY_SHAPES[family], **overrides}).with_labels(labels)
    model = build_model(config, task)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir / name, directory / name)
    return directory


@pytest.mark.parametrize("family", list(FAMILY_SHAPES))
def test_classifier_fast_path_equals_transformers(family, tmp_path, minilm_dir) -> None:
    path = small_model_dir(tmp_path, minilm_dir, family, "sequence-classification", ["neg", "neu", "pos"])
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    classifier = Classifier.from_pretrained(path)
    got = classifier.logits(TEXTS)
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    if FAMILY_SHAPES[family]["type_vocab_size"] < 2:
        inputs.pop("token_type_ids", None)
    with torch.no_grad():
        want = reference.eval()(**inputs).logits.numpy()
    assert np.abs(got - want).max() < 1e-5
    predictions = classifier(TEXTS)
    assert [p.label for p in predictions] == [["neg", "neu", "pos"][i] for i in want.argmax(1)]
    assert all(abs(sum(p.scores.values()) - 1) < 1e-6 for p in predictions)
    bf16 = Classifier.from_pretrained(path, dtype="bf16").logits(TEXTS)
    assert np.abs(bf16 - want).max() < 0.05  # bf16 products, fp32 softmax and norms


def test_pair_classification_equals_transformers(tmp_path, minilm_dir) -> None:
    path = small_model_dir(tmp_path, minilm_dir, "bert", "sequence-classification", ["no", "yes"])
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    pairs = ["Is it good?", "Really?", "Who?"]
    with torch.no_grad():
        want = reference(**tokenizer(TEXTS, pairs, padding=True, return_tensors="pt")).logits.numpy()
    assert np.abs(Classifier.from_pretrained(path).logits(TEXTS, pairs) - want).max() < 1e-5


@pytest.mark.parametrize("aggregation", ["first", "average", "max"])
def test_ner_entities_equal_transformers_pipeline(aggregation, tmp_path, minilm_dir) -> None:
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    path = small_model_dir(tmp_path, minilm_dir, "bert", "token-classification", labels)
    reference = transformers.pipeline("token-classification", model=str(path), aggregation_strategy=aggregation,
                                      device="cpu")
    ours = EntityRecognizer.from_pretrained(path, aggregation=aggregation)
    compared = 0
    for text, found in zip(TEXTS, ours(TEXTS)):
        expected = reference(text)
        assert [(e["entity_group"], e["start"], e["end"]) for e in expected] == [(e.type, e.start, e.end) for e in found]
        for want, got in zip(expected, found):
            assert got.score == pytest.approx(float(want["score"]), abs=1e-5)
            assert got.text == text[got.start:got.end]
        compared += len(found)
    assert compared >= 5  # a random model tags plenty: the comparison is not vacuous


def test_ner_long_text_windows_agree_with_one_pass(tmp_path, minilm_dir) -> None:
    """Read in windows of 24 tokens, a long text tags (almost) as in one pass of 256: each token is scored
    in the window where it has the most context; tokens far from every edge score identically."""
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    path = small_model_dir(tmp_path, minilm_dir, "bert", "token-classification", labels, max_position_embeddings=256)
    text = " ".join(TEXTS * 3)
    whole = EntityRecognizer.from_pretrained(path, max_length=256)
    windowed = EntityRecognizer.from_pretrained(path, max_length=24, stride=10)
    words_whole = whole._words([text], False)[0]
    words_windowed = windowed._words([text], False)[0]
    assert [(w.start, w.end) for w in words_whole] == [(w.start, w.end) for w in words_windowed]
    assert len(words_whole) > 3 * 24  # the text needs many windows
    tags_whole, _ = whole._tags(words_whole, "first")
    tags_windowed, _ = windowed._tags(words_windowed, "first")
    agreement = np.mean([a == b for a, b in zip(tags_whole, tags_windowed)])
    assert agreement > 0.8


def rigged_qa_model(directory: Path, minilm_dir: Path, start_word: str, end_word: str) -> Path:
    """A QA model whose span head points at two given words: the layers pass the embeddings through
    unchanged (output projections zeroed), positions and segments add nothing, and the start/end weights
    are the two words' normalised embeddings. Its right answer is known without training."""
    from encoderkit.tokenizer import Tokenizer

    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=128)
    model = build_model(config, "question-answering")
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    with torch.no_grad():
        for layer in model.encoder.layers:
            for linear in (layer.attention.output, layer.ffn_out):
                linear.weight.zero_()
                linear.bias.zero_()
        model.encoder.embeddings.position.weight.zero_()
        model.encoder.embeddings.token_type.weight.zero_()
        words = model.encoder.embeddings.word.weight
        normed = torch.nn.functional.layer_norm(words, (128,))
        for row, word in enumerate((start_word, end_word)):
            (token,) = tokenizer.convert_tokens_to_ids([word])
            model.span_head.out.weight[row] = normed[token]
        model.span_head.out.bias.zero_()
    model.save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_qa_finds_the_answer_in_any_window_of_a_long_context(where, tmp_path, minilm_dir) -> None:
    path = rigged_qa_model(tmp_path, minilm_dir, "amber", "lighthouse")
    filler = [f"sentence {i} says nothing of interest here." for i in range(50)]
    cut = {"start": 0, "middle": 25, "end": 50}[where]
    context = " ".join(filler[:cut] + ["The amber lighthouse guards the bay."] + filler[cut:])
    qa = QuestionAnswerer.from_pretrained(path, max_length=128, doc_stride=32)
    assert len(qa.tokenizer.encode(context, truncation=False).input_ids) > 3 * 128
    answers = qa("What guards the bay?", context, top_k=3)
    assert answers[0].text == "amber lighthouse"
    assert context[answers[0].start:answers[0].end] == "amber lighthouse"
    assert answers[0].score > answers[1].score and sum(a.score for a in answers) <= 1.0 + 1e-9


def test_best_spans_equal_a_brute_force_search() -> None:
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=30), rng.normal(size=30)
    offsets = [None] * 8 + [(i * 3, i * 3 + 2) for i in range(21)] + [None]  # question tokens, then context
    spans = best_spans(start, end, offsets, n_best=30, max_answer_length=5)
    brute = max(((start[s] + end[e], s, e) for s in range(8, 29) for e in range(s, min(s + 5, 29))))
    best = max(spans, key=lambda c: c.logit)
    assert best.logit == pytest.approx(brute[0]) and (best.start, best.end) == (offsets[brute[1]][0], offsets[brute[2]][1])
    assert all(c.end > c.start for c in spans)  # end >= start, within the context


def test_classifier_features_equal_the_encoder_states(tmp_path, minilm_dir) -> None:
    path = small_model_dir(tmp_path, minilm_dir, "bert", "sequence-classification", ["a", "b"])
    classifier = Classifier.from_pretrained(path)
    logits, features = classifier.logits_and_features(TEXTS, features=("cls", "mean", "pooled"))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    inputs = transformers.AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = reference(**inputs, output_hidden_states=True)
    last, mask = out.hidden_states[-1], inputs["attention_mask"].unsqueeze(-1).float()
    assert np.abs(features["cls"] - last[:, 0].numpy()).max() < 1e-5
    assert np.abs(features["mean"] - ((last * mask).sum(1) / mask.sum(1)).numpy()).max() < 1e-5
    assert np.abs(features["pooled"] - reference.bert.pooler(last).detach().numpy()).max() < 1e-5
    assert np.abs(logits - out.logits.numpy()).max() < 1e-5


def test_a_long_pass_shows_progress_and_a_short_one_does_not(tiny_classifier_dir, capsys) -> None:
    from encoderkit.tasks.pipeline import PROGRESS_MIN_SEQUENCES

    classifier = Classifier.from_pretrained(tiny_classifier_dir)
    few = classifier.logits(["a short text"] * 10)
    assert "Classifier: encoding" not in capsys.readouterr().err
    many = classifier.logits(["a short text"] * PROGRESS_MIN_SEQUENCES)
    err = capsys.readouterr().err
    assert f"Classifier: encoding: {PROGRESS_MIN_SEQUENCES:,} sequences in" in err  # the closing line: count, time, rate
    np.testing.assert_allclose(many[:10], few, atol=1e-6)  # progress changes nothing in the results
    quiet = Classifier.from_pretrained(tiny_classifier_dir, show_progress=False)
    quiet.logits(["a short text"] * PROGRESS_MIN_SEQUENCES)
    assert capsys.readouterr().err == ""
