"""Tokenizer parity with transformers' fast tokenizers: ids, type ids, offsets, masks, word ids."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from encoderkit import Tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

HARD_CASES = [
    "Café naïve résumé Ångström façade",
    "北京欢迎你，東京タワー와 서울",
    "emoji 😀👍🏽 and flags 🇫🇷 in text",
    "control\x00chars\x07and\u200bzero\ufeffwidth\x1b[0m",
    "x" * 150,  # longer than WordPiece's 100-character word limit
    "antidisestablishmentarianism" * 3,
    "",
    "   \t\n  ",
    "non\u00a0breaking\u2003spaces",
    "ﬁnance ligatures and e\u0301 combining accents",
    "Line one\r\nline two\rline three",
    "URLs like https://example.com/a?b=c&d=e#frag and e-mail a.b@c.org",
    "Numbers 3.14159, 1,000,000 and -42%",
    "UPPER lower MiXeD",
    "[CLS] [SEP] [MASK] literal special tokens",
    "don't won't y'all — “quotes” «guillemets»",
]


def sample(sentences: list[str]) -> list[str]:
    return sentences[:500] + HARD_CASES


def compare(ours: Tokenizer, reference, texts: list[str], pairs: list[str] | None = None, **kwargs) -> None:
    """Encode one by one with both and compare every field, text by text."""
    hf_kwargs = {"truncation": kwargs.get("truncation", False), "max_length": kwargs.get("max_length")}
    for index, text in enumerate(texts):
        pair = pairs[index] if pairs is not None else None
        mine = ours.encode(text, pair, **kwargs)
        # transformers' batch call: its single-text call drops an empty second text of a pair ("a", "")
        # and returns [CLS] a [SEP], while its batch call (and the tokenizers library) keeps the pair.
        theirs = reference([text], [pair] if pair is not None else None, return_offsets_mapping=True,
                           return_special_tokens_mask=True, return_token_type_ids=True,
                           return_attention_mask=True, **hf_kwargs)
        label = f"text {index}: {text[:60]!r}"
        assert mine.input_ids == theirs["input_ids"][0], label
        assert mine.token_type_ids == theirs["token_type_ids"][0], label
        assert mine.attention_mask == theirs["attention_mask"][0], label
        assert mine.special_tokens_mask == theirs["special_tokens_mask"][0], label
        assert mine.offsets == [tuple(o) for o in theirs["offset_mapping"][0]], label
        assert mine.word_ids == theirs.word_ids(0), label


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir):
    return transformers.AutoTokenizer.from_pretrained(str(minilm_dir))


@pytest.mark.data
def test_minilm_single_texts(minilm_dir, minilm_reference, bench_sentences) -> None:
    ours = Tokenizer.from_pretrained(minilm_dir)
    compare(ours, minilm_reference, sample(bench_sentences), truncation=False)


@pytest.mark.data
@pytest.mark.parametrize("strategy", ["longest_first", "only_second", "only_first"])
def test_minilm_pairs_with_truncation(minilm_dir, minilm_reference, bench_sentences, strategy) -> None:
    ours = Tokenizer.from_pretrained(minilm_dir)
    texts = sample(bench_sentences)
    pairs = texts[1:] + texts[:1]
    if strategy != "longest_first":  # only_* cannot shorten a side that is already too short for the limit
        first = 0 if strategy == "only_second" else 1
        keep = [i for i in range(len(texts))
                if len(ours.tokenize((texts[i], pairs[i])[first])) + 3 < 40]
        texts, pairs = [texts[i] for i in keep], [pairs[i] for i in keep]
        assert len(texts) > 100
    compare(ours, minilm_reference, texts, pairs, truncation=strategy, max_length=40)


@pytest.mark.data
def test_batch_padding_matches(minilm_dir, minilm_reference, bench_sentences) -> None:
    ours = Tokenizer.from_pretrained(minilm_dir)
    texts = bench_sentences[:64]
    pairs = bench_sentences[64:128]
    mine = ours.encode_batch(texts, pairs, max_length=128)
    theirs = minilm_reference(texts, pairs, truncation=True, max_length=128, padding=True, return_tensors="pt",
                              return_special_tokens_mask=True)
    for name in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
        assert torch.equal(getattr(mine, name), theirs[name]), name


@pytest.mark.data
@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_from_vocab_txt(minilm_dir, bench_sentences, lowercase, tmp_path) -> None:
    """vocab.txt alone (no tokenizer.json): built as transformers builds it from vocab.txt, cased and uncased."""
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    ours = Tokenizer.from_wordpiece_vocab(tmp_path / "vocab.txt", lowercase=lowercase)
    reference = transformers.BertTokenizerFast.from_pretrained(str(tmp_path), do_lower_case=lowercase)
    texts = sample(bench_sentences)
    compare(ours, reference, texts, texts[3:] + texts[:3], truncation="longest_first", max_length=64)


def test_uncased_vocab_is_detected(minilm_dir) -> None:
    assert Tokenizer.from_wordpiece_vocab(minilm_dir / "vocab.txt").lowercase is True


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    source = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "sentences.txt"
    if source.exists():
        lines = source.read_text(encoding="utf-8").splitlines()
    else:  # still a real test without ../shared: a generated corpus with varied words
        import random

        rng = random.Random(0)
        words = ["token", "model", "encoder", "attention", "layer", "train", "data", "vector", "search", "bert"]
        lines = [" ".join(rng.choice(words) + rng.choice(["", "s", "ing", "ed"]) for _ in range(12))
                 for _ in range(2000)]
    path.write_text("\n".join(lines + HARD_CASES) + "\n", encoding="utf-8")
    return path


def test_trained_bpe_matches_roberta_tokenizer(corpus: Path, tmp_path: Path) -> None:
    trained = train_tokenizer([corpus], kind="bpe", vocab_size=2000, min_frequency=2)
    trained.save(tmp_path)
    assert (tmp_path / "vocab.json").is_file() and (tmp_path / "merges.txt").is_file()
    texts = corpus.read_text(encoding="utf-8").splitlines()[:300] + HARD_CASES
    pairs = texts[5:] + texts[:5]
    only_files = tmp_path / "only-vocab-and-merges"
    only_files.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tmp_path / name, only_files / name)
    reference = transformers.RobertaTokenizerFast.from_pretrained(str(only_files))
    from_files = Tokenizer.from_bpe_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    from_json = Tokenizer.from_pretrained(tmp_path)
    for ours in (from_files, from_json, trained):
        compare(ours, reference, texts, truncation=False)
        compare(ours, reference, texts, pairs, truncation="longest_first", max_length=48)
    # transformers' auto loader reads the saved directory too.
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    compare(from_json, auto, texts, pairs, truncation="longest_first", max_length=48)


def test_trained_wordpiece_loads_in_transformers(corpus: Path, tmp_path: Path) -> None:
    trained = train_tokenizer([corpus], kind="wordpiece", vocab_size=1500, lowercase=True)
    trained.save(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    from_vocab = Tokenizer.from_wordpiece_vocab(tmp_path / "vocab.txt", lowercase=True)
    texts = corpus.read_text(encoding="utf-8").splitlines()[:300] + HARD_CASES
    for ours in (trained, Tokenizer.from_pretrained(tmp_path), from_vocab):
        compare(ours, reference, texts, texts[7:] + texts[:7], truncation="longest_first", max_length=32)
    assert trained.vocab_size <= 1500 and trained.token_id("mask") is not None


def test_word_ids_and_offsets_point_into_the_text(minilm_dir) -> None:
    ours = Tokenizer.from_pretrained(minilm_dir)
    text = "Tokenization handles unbelievably long words"
    enc = ours.encode(text)
    words = text.split()
    for token, word_id, (start, end) in zip(enc.tokens, enc.word_ids, enc.offsets):
        if word_id is None:
            assert (start, end) == (0, 0)
            continue
        piece = text[start:end].lower()
        assert piece == token.removeprefix("##")
        assert piece in words[word_id].lower()
