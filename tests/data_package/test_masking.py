"""MLM masking statistics (>= 1M tokens), static vs dynamic, whole-word; MLM/NSP/SOP losses vs transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderkit import Tokenizer, load_model
from encoderkit.data.masking import IGNORE_INDEX, Masker, MaskingConfig

VOCAB, PAD, UNK, CLS, SEP, MASK = 30522, 0, 100, 101, 102, 103
SPECIALS = [PAD, UNK, CLS, SEP, MASK]


def make_masker(**config) -> Masker:
    return Masker(MaskingConfig(**config), vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=SPECIALS, seed=7)


def random_examples(count: int, length: int = 128) -> list[dict]:
    rng = np.random.default_rng(0)
    examples = []
    for index in range(count):
        real = int(rng.integers(length // 2, length + 1))
        ids = rng.integers(1000, VOCAB, real)
        ids[0], ids[-1] = CLS, SEP
        examples.append({"index": index, "input_ids": ids})
    return examples


def test_masking_statistics_over_a_million_tokens() -> None:
    masker = make_masker()
    examples = random_examples(11_000)
    selected = maskable = to_mask = to_random = unchanged = 0
    for start in range(0, len(examples), 500):
        batch = masker.collate(examples[start:start + 500], pad_token_id=PAD)
        ids, labels, attention = batch["input_ids"], batch["labels"], batch["attention_mask"]
        originals = torch.full_like(ids, PAD)
        for row, example in enumerate(examples[start:start + 500]):
            originals[row, :len(example["input_ids"])] = torch.from_numpy(example["input_ids"])
        special = torch.isin(originals, torch.tensor(SPECIALS)) | (attention == 0)
        chosen = labels != IGNORE_INDEX
        assert not (chosen & special).any(), "a special or padding token was selected"
        assert torch.equal(labels[chosen], originals[chosen])
        assert torch.equal(ids[~chosen], originals[~chosen])  # nothing else changes
        maskable += int((~special).sum())
        selected += int(chosen.sum())
        to_mask += int((chosen & (ids == MASK)).sum())
        unchanged += int((chosen & (ids == originals)).sum())
        to_random += int((chosen & (ids != MASK) & (ids != originals)).sum())
        assert not torch.isin(ids[chosen & (ids != MASK) & (ids != originals)], torch.tensor(SPECIALS)).any()
    assert maskable >= 1_000_000
    assert abs(selected / maskable - 0.15) <= 0.003
    assert abs(to_mask / selected - 0.8) <= 0.01
    assert abs(to_random / selected - 0.1) <= 0.01
    assert abs(unchanged / selected - 0.1) <= 0.01


def test_dynamic_masks_change_per_epoch_and_static_ones_do_not() -> None:
    example = random_examples(1)[0]
    dynamic, static = make_masker(dynamic=True), make_masker(dynamic=False)
    first, _ = dynamic.mask(example["input_ids"], 0, epoch=0)
    second, _ = dynamic.mask(example["input_ids"], 0, epoch=1)
    assert not np.array_equal(first, second)
    assert np.array_equal(first, dynamic.mask(example["input_ids"], 0, epoch=0)[0])  # reproducible
    assert np.array_equal(static.mask(example["input_ids"], 0, epoch=0)[0], static.mask(example["input_ids"], 0, epoch=5)[0])
    # A mask depends on the example, not on the batch it is in.
    batch_a = static.collate([example, random_examples(2)[1]])
    batch_b = static.collate([example])
    assert torch.equal(batch_a["labels"][0, :len(example["input_ids"])], batch_b["labels"][0])


def test_whole_word_masking_never_splits_a_word(minilm_dir) -> None:
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    text = ("Pretraining encoders with unbelievably hyperparameterised tokenisation strategies "
            "demonstrates antidisestablishmentarianism in multilingual benchmarks. ") * 4
    encoded = tokenizer.encode(text, "A second segment with subwordification too.")
    masker = Masker(MaskingConfig(whole_word=True, rate=0.3), vocab_size=tokenizer.vocab_size,
                    mask_token_id=tokenizer.mask_token_id, special_token_ids=[tokenizer.token_id(r) for r in
                                                                             ("cls", "sep", "pad", "mask", "unk")])
    split_words = selected_words = 0
    for index in range(300):
        _, labels = masker.mask(encoded.input_ids, index, word_ids=encoded.word_ids)
        chosen = labels != IGNORE_INDEX
        groups: dict[tuple, list[bool]] = {}
        for position, (word, sequence) in enumerate(zip(encoded.word_ids, encoded.sequence_ids)):
            if word is not None:
                groups.setdefault((sequence, word), []).append(bool(chosen[position]))
        split_words += sum(1 for flags in groups.values() if any(flags) and not all(flags))
        selected_words += sum(1 for flags in groups.values() if all(flags))
    assert split_words == 0
    assert selected_words > 0
    assert any(len([w for w in encoded.word_ids if w == word]) > 2 for word in set(encoded.word_ids) - {None})


transformers = pytest.importorskip("transformers")


def hf_pretraining_model(family: str, tmp_path):
    torch.manual_seed(0)
    if family == "bert":
        config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=48)
        model = transformers.BertForPreTraining(config)
    else:
        config = transformers.AlbertConfig(vocab_size=300, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=48)
        model = transformers.AlbertForPreTraining(config)
    model.eval().save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_mlm_and_pair_losses_equal_transformers(family: str, tmp_path) -> None:
    reference = hf_pretraining_model(family, tmp_path)
    ours = load_model(tmp_path)
    masker = Masker(MaskingConfig(), vocab_size=300, mask_token_id=4, special_token_ids=[0, 1, 2, 3, 4])
    rng = np.random.default_rng(1)
    examples = [{"index": i, "input_ids": np.concatenate([[2], rng.integers(5, 300, n), [3]]),
                 "token_type_ids": np.array([0] * (n // 2 + 1) + [1] * (n + 2 - n // 2 - 1)), "pair_label": i % 2}
                for i, n in enumerate([30, 17, 25, 8])]
    batch = masker.collate(examples)
    assert (batch["labels"] != IGNORE_INDEX).sum() > 5
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    pair_key = "next_sentence_label" if family == "bert" else "sentence_order_label"
    with torch.no_grad():
        hf_mlm = transformers.BertForMaskedLM if family == "bert" else transformers.AlbertForMaskedLM
        mlm_reference = hf_mlm.from_pretrained(tmp_path).eval()
        want_mlm = mlm_reference(**inputs, labels=batch["labels"]).loss
        want_total = reference(**inputs, labels=batch["labels"], **{pair_key: batch["pair_labels"]})
        got_sparse = ours(**inputs, labels=batch["labels"], sparse=True)
        got_total = ours(**inputs, labels=batch["labels"], pair_labels=batch["pair_labels"], sparse=True)
    mlm_only = load_model(tmp_path, task="masked-lm")
    with torch.no_grad():
        got_mlm = mlm_only(**inputs, labels=batch["labels"], sparse=True).loss
        got_dense = mlm_only(**inputs, labels=batch["labels"]).loss
    assert abs(got_mlm - want_mlm) <= 1e-5 and abs(got_dense - want_mlm) <= 1e-5
    assert abs(got_total.loss - want_total.loss) <= 1e-5
    pair_logits = want_total.seq_relationship_logits if family == "bert" else want_total.sop_logits
    assert (got_total.pair_logits - pair_logits).abs().max() <= 1e-5
    # The sparse head computed only the masked rows: its logits equal the dense logits there.
    assert got_sparse.logits.shape[0] == int((batch["labels"] != IGNORE_INDEX).sum())
