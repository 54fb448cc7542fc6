"""Tokenizer parity with transformers' fast tokenizers: ids, type ids, offsets, masks, word ids."""
from __future__ import annotations

import json
import pickle
import shutil
import threading
from pathlib import Path

import pytest
import torch

from encoderkit import Tokenizer, TokenizerError, train_tokenizer

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


LONG_TEXT = " ".join(["word"] * 100)  # 102 tokens untruncated


class ProxyBackend:
    """The real backend, with the calls a test overrides; ``patience``: the longest a call waits for the others."""

    def __init__(self, real, patience: float) -> None:
        self.real, self.patience = real, patience

    def __getattr__(self, name: str):
        return getattr(self.real, name)


class PausingBackend(ProxyBackend):
    """Its first batch call waits for another caller to clear the truncation: the moment where two callers that do
    not take turns would cross."""

    def __init__(self, real, patience: float) -> None:
        super().__init__(real, patience)
        self.inside, self.cleared = threading.Event(), threading.Event()

    def no_truncation(self):
        self.cleared.set()
        return self.real.no_truncation()

    def encode_batch(self, *args, **kwargs):
        if not self.inside.is_set():
            self.inside.set()
            self.cleared.wait(self.patience)
        return self.real.encode_batch(*args, **kwargs)


class MeetingBackend(ProxyBackend):
    """Its batch calls each wait until two are inside at once; ``met`` says, call by call, whether they were."""

    def __init__(self, real, patience: float) -> None:
        super().__init__(real, patience)
        self.lock, self.inside, self.both, self.met = threading.Lock(), 0, threading.Event(), []

    def encode_batch(self, *args, **kwargs):
        with self.lock:
            self.inside += 1
            if self.inside == 2:
                self.both.set()
        self.met.append(self.both.wait(self.patience))
        return self.real.encode_batch(*args, **kwargs)


def run_together(*targets) -> None:
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)


def test_threads_with_different_settings_each_get_their_own(minilm_dir) -> None:
    """Truncation and padding are the backend's state: one thread's batch truncated at 16 tokens must not be encoded
    under another thread's 'no truncation' set while it runs (a server's endpoints, a caller's own threads)."""
    ours = Tokenizer.from_pretrained(minilm_dir)
    ours.backend = PausingBackend(ours.backend, patience=1.0)
    lengths: dict[str, list[int]] = {}

    def truncating() -> None:
        lengths["truncated"] = [len(e.ids) for e in ours.encode_raw([LONG_TEXT, LONG_TEXT], max_length=16)]

    def whole() -> None:
        ours.backend.inside.wait(5.0)
        lengths["whole"] = [len(e.ids) for e in ours.encode_raw([LONG_TEXT, LONG_TEXT], truncation=False)]

    run_together(truncating, whole)
    assert lengths == {"truncated": [16, 16], "whole": [102, 102]}


def test_threads_with_the_same_settings_encode_together(minilm_dir) -> None:
    """Two lanes tokenising their batches with the same settings do not wait for each other (taking turns there
    cost int8 throughput 5% with two lanes, bench/refactor_speed.py)."""
    ours = Tokenizer.from_pretrained(minilm_dir)
    ours.backend = MeetingBackend(ours.backend, patience=2.0)
    lengths: list[list[int]] = []

    def lane() -> None:
        lengths.append([len(e.ids) for e in ours.encode_raw([LONG_TEXT, LONG_TEXT], max_length=16)])

    run_together(lane, lane)
    assert ours.backend.met == [True, True]
    assert lengths == [[16, 16], [16, 16]]


def test_a_pickled_tokenizer_encodes_as_the_original(minilm_dir) -> None:
    ours = Tokenizer.from_pretrained(minilm_dir)
    copied = pickle.loads(pickle.dumps(ours))
    texts = ["a first sentence", "and a second, longer one with more words"]
    assert [e.ids for e in copied.encode_raw(texts, max_length=6)] == [e.ids for e in ours.encode_raw(texts,
                                                                                                       max_length=6)]
    assert copied._turns is not ours._turns



def test_added_tokens_match_transformers_and_wait_for_running_calls(minilm_dir) -> None:
    """``add_tokens`` gives the ids and the encodings transformers' ``add_tokens`` gives, and waits while a call
    encodes under the backend's settings (the backend refuses a change under a running call)."""
    ours = Tokenizer.from_pretrained(minilm_dir)
    reference = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    markers = ["[Q] ", "[D] ", "[unused0]"]  # the last is in the vocabulary already: made an added token too
    ours._begin(16, "longest_first", 0, False, None)  # a call encoding now
    added: list[int] = []
    adder = threading.Thread(target=lambda: added.append(ours.add_tokens(markers)))
    adder.start()
    adder.join(0.3)
    assert adder.is_alive() and ours.vocab_size == reference.vocab_size  # waiting, nothing added yet
    ours._end()
    adder.join(5.0)
    assert added == [reference.add_tokens(markers)] == [3]
    text = "[Q] what is a [D] token? [Q]x [unused0]y"
    assert ours.convert_tokens_to_ids(markers) == reference.convert_tokens_to_ids(markers)
    assert ours.encode(text).input_ids == reference(text)["input_ids"]


# ----- DeBERTa-v3 (SentencePiece Unigram) and ModernBERT (byte-level BPE) tokenizer.json directories -----------
MORE_CASES = [
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n  inside",
    "double  spaces   and    more",
    "Hello [MASK] there and [MASK].",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ ß Œuvre",
    "12:30pm, 2024-01-05; 99.9% (approx.) $1,234.56",
    "Ünïcödé — “smart quotes” … ½ ² ㎏ ＡＢＣ",
    "a",
    ".",
    " ",
    "long text " * 400,  # longer than any max_length below
]


def parity_texts(corpus: Path) -> tuple[list[str], list[str]]:
    texts = corpus.read_text(encoding="utf-8").splitlines()[:200] + HARD_CASES + MORE_CASES
    return texts, texts[11:] + texts[:11]


def pairs_for_only_second(ours: Tokenizer, texts: list[str], pairs: list[str], max_length: int):
    """The pairs whose first text leaves room: only_second cannot shorten the first text."""
    keep = [i for i in range(len(texts)) if len(ours.tokenize(texts[i])) + 3 < max_length]
    assert len(keep) > 100
    return [texts[i] for i in keep], [pairs[i] for i in keep]


def check_parity(ours: Tokenizer, reference, corpus: Path) -> None:
    """Single texts, pairs under every truncation strategy, the model's own limit, and padded batches."""
    texts, pairs = parity_texts(corpus)
    compare(ours, reference, texts, truncation=False)
    compare(ours, reference, texts, pairs, truncation="longest_first", max_length=40)
    compare(ours, reference, *pairs_for_only_second(ours, texts, pairs, 40), truncation="only_second", max_length=40)
    compare(ours, reference, MORE_CASES[-1:], truncation=True)  # the model_max_length limit
    mine = ours.encode_batch(texts[:64], pairs[:64], max_length=96)
    theirs = reference(texts[:64], pairs[:64], truncation=True, max_length=96, padding=True, return_tensors="pt",
                       return_special_tokens_mask=True, return_token_type_ids=True)
    for name in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask"):
        assert torch.equal(getattr(mine, name), theirs[name]), name
    assert [e.word_ids for e in mine.encodings] == [theirs.word_ids(i) for i in range(64)]


def check_special_tokens(ours: Tokenizer, reference) -> None:
    assert ours.mask_token == reference.mask_token and ours.mask_token_id == reference.mask_token_id
    assert ours.pad_token_id == reference.pad_token_id
    for role in ("cls", "sep", "unk"):
        assert ours.token_id(role) == getattr(reference, f"{role}_token_id"), role
    assert ours.vocab_size == len(reference)


def build_deberta_v3_dir(directory: Path, corpus: Path, *, lowercase: bool = False, split_by_punct: bool = False,
                         model_max_length: int = 384) -> Path:
    """A small DeBERTa-v3 tokenizer, trained offline: a Unigram model with DeBERTa-v3's special-token ids
    ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK] added last) and the normalizer, pre-tokenizer, decoder and
    post-processor of transformers' DebertaV2Converter (without the SentencePiece charsmap it cannot build)."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as Backend

    backend = Backend(models.Unigram())
    steps = [normalizers.Lowercase()] if lowercase else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")])
    splits = [pre_tokenizers.Punctuation(behavior="isolated")] if split_by_punct else []
    backend.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.Metaspace("▁", prepend_scheme="always")])
    backend.decoder = decoders.Metaspace("▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]"],
                                      unk_token="[UNK]", show_progress=False)
    backend.train([str(corpus)], trainer)
    backend.add_special_tokens([AddedToken("[MASK]", normalized=False, special=True)])
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    assert [backend.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]")] == [0, 1, 2, 3]
    reference = transformers.DebertaV2TokenizerFast(tokenizer_object=backend, do_lower_case=lowercase,
                                                    split_by_punct=split_by_punct, model_max_length=model_max_length)
    reference.save_pretrained(str(directory))
    return directory


def build_modernbert_dir(directory: Path, corpus: Path) -> Path:
    """A small ModernBERT-style tokenizer, trained offline: OLMo-like byte-level BPE (NFC, no prefix space) with
    [CLS]/[SEP]/[PAD]/[UNK] and an lstrip [MASK] added after the vocabulary, saved as PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as Backend

    backend = Backend(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["|||IP_ADDRESS|||", "<|padding|>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train([str(corpus)], trainer)
    specials = [AddedToken(t, normalized=False, special=True) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]")]
    backend.add_special_tokens(specials + [AddedToken("[MASK]", lstrip=True, normalized=False, special=True)])
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[(t, backend.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token="[MASK]", model_max_length=8192, model_input_names=["input_ids", "attention_mask"],
    )
    reference.save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize("lowercase,split_by_punct", [(False, False), (True, True)])
def test_deberta_v3_unigram_matches_transformers(corpus: Path, tmp_path: Path, lowercase, split_by_punct) -> None:
    directory = build_deberta_v3_dir(tmp_path / "deberta", corpus, lowercase=lowercase, split_by_punct=split_by_punct)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert type(reference).__name__ == "DebertaV2Tokenizer"
    ours = Tokenizer.from_pretrained(directory)
    assert (ours.kind, ours.model_max_length, ours.lowercase) == ("unigram", 384, lowercase)
    check_special_tokens(ours, reference)
    assert ours.mask_token == "[MASK]" and ours.pad_token_id == 0 and ours.mask_token_id == 1500
    check_parity(ours, reference, corpus)
    assert ours.decode(ours.encode("Hello world, again.").input_ids) == reference.decode(
        reference("Hello world, again.")["input_ids"], skip_special_tokens=True)


def test_deberta_v3_saved_by_encoderkit_loads_in_both(corpus: Path, tmp_path: Path) -> None:
    ours = Tokenizer.from_pretrained(build_deberta_v3_dir(tmp_path / "deberta", corpus))
    saved = ours.save(tmp_path / "saved")
    assert not (saved / "unigram.json").exists()
    again = Tokenizer.from_pretrained(saved)
    texts, pairs = parity_texts(corpus)
    assert again.encode_ids(texts, pairs) == ours.encode_ids(texts, pairs)
    assert again.model_max_length == 384 and again.mask_token_id == ours.mask_token_id
    reference = transformers.AutoTokenizer.from_pretrained(str(saved))
    assert type(reference).__name__ == "DebertaV2Tokenizer"
    check_special_tokens(again, reference)
    compare(again, reference, texts, pairs, truncation="longest_first", max_length=40)


def test_deberta_v3_class_from_config_json(corpus: Path, tmp_path: Path) -> None:
    """No tokenizer_class in tokenizer_config.json: both take DebertaV2Tokenizer from config.json's model_type."""
    directory = build_deberta_v3_dir(tmp_path / "deberta", corpus)
    settings = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    del settings["tokenizer_class"]
    (directory / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    (directory / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}), encoding="utf-8")
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert type(reference).__name__ == "DebertaV2Tokenizer"
    ours = Tokenizer.from_pretrained(directory)
    assert ours.tokenizer_class == "DebertaV2Tokenizer"
    compare(ours, reference, HARD_CASES + MORE_CASES, truncation=False)


def test_modernbert_bpe_matches_transformers(corpus: Path, tmp_path: Path) -> None:
    directory = build_modernbert_dir(tmp_path / "modernbert", corpus)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = Tokenizer.from_pretrained(directory)
    assert (ours.kind, ours.model_max_length, reference.model_max_length) == ("bpe", 8192, 8192)
    check_special_tokens(ours, reference)
    assert ours.mask_token == "[MASK]" and ours.pad_token_id == ours.convert_tokens_to_ids(["[PAD]"])[0]
    assert "bos" not in ours.special_tokens and "eos" not in ours.special_tokens
    check_parity(ours, reference, corpus)
    # [MASK] takes the space before it (lstrip), as ModernBERT's fill-mask needs: no lone "Ġ" before it
    masked = ours.encode("Paris is the [MASK] of France")
    assert masked.input_ids == reference("Paris is the [MASK] of France")["input_ids"]
    assert masked.tokens[masked.input_ids.index(ours.mask_token_id) - 1].endswith("the")
    saved = ours.save(tmp_path / "saved")
    texts, pairs = parity_texts(corpus)
    again = Tokenizer.from_pretrained(saved)
    assert again.encode_ids(texts, pairs) == ours.encode_ids(texts, pairs) and again.model_max_length == 8192
    compare(again, transformers.AutoTokenizer.from_pretrained(str(saved)), texts, pairs,
            truncation="longest_first", max_length=40)


@pytest.mark.parametrize("content,found", [
    ('{"version": "1.0", "model": {"type": "SentencePieceBPE", "vocab": {}}}', "unknown model type 'SentencePieceBPE'"),
    ('{"version": "1.0", "added_tokens": []}', "no model section"),
    ('{"version": "1.0", "model": ', "unreadable"),
    (b"\xff\xfe\x00binary", "unreadable"),
])
def test_bad_tokenizer_json_names_file_and_expectation(tmp_path: Path, content, found) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_pretrained(tmp_path)
    message = str(error.value)
    assert str(path) in message and found in message
    assert "expected a `tokenizers` tokenizer.json whose model has a type among BPE, Unigram" in message


# ----- XLM-RoBERTa: SentencePiece Unigram with fairseq's ids, on multilingual text ---------------------------------
MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.", "Le cœur a ses raisons que la raison ne connaît point.",
    "Ich möchte ein Stück Käse, bitte.", "¿Dónde está la biblioteca? ¡Aquí!", "Zażółć gęślą jaźń.",
    "Москва — столица России, и в ней живёт много людей.", "Съешь же ещё этих мягких французских булок.",
    "北京是中华人民共和国的首都。", "東京タワーは日本の電波塔です。", "서울은 대한민국의 수도입니다.",
    "القاهرة هي عاصمة مصر وأكبر مدنها.", "مرحبا بالعالم! كيف حالك؟", "שלום עולם", "नमस्ते दुनिया",
    "Γειά σου κόσμε", "emoji 😀👍🏽 and flags 🇫🇷🇯🇵 mixed with text ❤️", "Ünïcödé — “smart quotes” … ½",
    "mixed 中文 English и русский عربى 123", "  spaces   inside   ", "a", "",
]


def build_xlm_roberta_dir(directory: Path, corpus: Path) -> Path:
    """A small XLM-RoBERTa tokenizer made as the real one was: a SentencePiece Unigram model (NFKC rules, compiled
    into its charsmap; <unk> 0, <s> 1, </s> 2, as XLM-R's sentencepiece.bpe.model) that transformers converts to
    tokenizer.json with fairseq's ids (<s> 0, <pad> 1, </s> 2, <unk> 3, the pieces shifted by one, <mask> last)."""
    spm = pytest.importorskip("sentencepiece")
    source = directory.parent / f"{directory.name}-spm"
    source.mkdir(parents=True)
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(source / "sentencepiece.bpe"),
                                   vocab_size=1200, model_type="unigram", character_coverage=1.0,
                                   normalization_rule_name="nmt_nfkc", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   minloglevel=2)
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                              "model_max_length": 512}), encoding="utf-8")
    transformers.AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(directory))
    written = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    assert written["normalizer"]["type"] == "Precompiled"  # the charsmap, as in real XLM-R files
    assert [piece for piece, _ in written["model"]["vocab"][:4]] == ["<s>", "<pad>", "</s>", "<unk>"]
    return directory


@pytest.fixture(scope="module")
def multilingual_corpus(tmp_path_factory, corpus: Path) -> Path:
    path = tmp_path_factory.mktemp("multilingual") / "corpus.txt"
    lines = corpus.read_text(encoding="utf-8").splitlines()[:1500]
    path.write_text("\n".join(lines + MULTILINGUAL * 20) + "\n", encoding="utf-8")
    return path


def as_hub_files_have_it(directory: Path) -> None:
    """Rewrite tokenizer.json as the files on the hub (converted by transformers 4) have it: the charsmap then a
    runs-of-spaces Replace, Metaspace alone, the template in the file. transformers 5 rebuilds its pipeline around
    the vocabulary either way, and so must encoderkit."""
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "Sequence", "normalizers": [
        data["normalizer"], {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.mark.parametrize("layout", ["transformers-5", "hub"])
def test_xlm_roberta_unigram_matches_transformers_on_multilingual_text(multilingual_corpus, tmp_path,
                                                                       layout) -> None:
    directory = build_xlm_roberta_dir(tmp_path / "xlmr", multilingual_corpus)
    if layout == "hub":
        as_hub_files_have_it(directory)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert type(reference).__name__.startswith("XLMRobertaTokenizer")
    ours = Tokenizer.from_pretrained(directory)
    assert ours.kind == "unigram"
    check_special_tokens(ours, reference)
    assert (ours.token_id("cls"), ours.pad_token_id, ours.token_id("sep"), ours.token_id("unk")) == (0, 1, 2, 3)
    assert ours.mask_token == "<mask>" and ours.mask_token_id == len(reference) - 1
    texts = MULTILINGUAL + HARD_CASES
    pairs = texts[5:] + texts[:5]
    compare(ours, reference, texts, truncation=False)
    compare(ours, reference, texts, pairs, truncation="longest_first", max_length=24)
    mine = ours.encode_batch(texts, pairs, max_length=40)
    theirs = reference(texts, pairs, truncation=True, max_length=40, padding=True, return_tensors="pt",
                       return_token_type_ids=True)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(getattr(mine, name), theirs[name]), name
    assert ours.encode("Paris is the <mask> of France.").input_ids == \
        reference("Paris is the <mask> of France.")["input_ids"]


def test_a_bert_model_with_an_xlm_roberta_tokenizer(multilingual_corpus, tmp_path) -> None:
    """paraphrase-multilingual-MiniLM-L12-v2's layout: a BERT encoder whose tokenizer is XLM-R's; its pad id 1 is
    in config.json. Embeddings equal transformers' on multilingual text."""
    from encoderkit import Embedder

    directory = build_xlm_roberta_dir(tmp_path / "model", multilingual_corpus)
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(reference_tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, pad_token_id=1)
    model = transformers.BertModel(config).eval()
    for parameter in model.parameters():
        parameter.data += 0.05 * torch.randn_like(parameter)
    model.save_pretrained(str(directory))
    embedder = Embedder.from_pretrained(directory, pooling="mean")
    assert embedder.tokenizer.kind == "unigram" and embedder.model.config.model_type == "bert"
    batch = reference_tokenizer(MULTILINGUAL[:-1], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = (states * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(torch.from_numpy(embedder.encode(MULTILINGUAL[:-1])), expected, atol=1e-5, rtol=0)
