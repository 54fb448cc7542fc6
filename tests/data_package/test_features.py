"""Fine-tuning features: NER labels on words' first sub-tokens, QA windows over long contexts, batching,
and the label checks that name the file and line."""
from __future__ import annotations

import pytest
import torch

from encoderkit import DataError, Tokenizer
from encoderkit.data.features import (IGNORE_INDEX, answer_tokens, check_known_labels, check_label_types, collate,
                                      label_list, ner_features, qa_features)
from encoderkit.data.tasks import ClassificationExample, QAExample, TaggedSentence


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_dir)


def test_ner_labels_sit_on_each_words_first_subtoken(tokenizer) -> None:
    words = ["Eyjafjallajökull", "erupted", "near", "Reykjavíkurborg", "in", "2010", "."]
    tags = ["B-LOC", "O", "O", "B-LOC", "O", "O", "O"]
    labels = ["O", "B-LOC", "I-LOC"]
    feature = ner_features(tokenizer, [TaggedSentence(words, tags)], labels, max_length=64)[0]
    word_ids = feature["word_ids"]
    assert word_ids.count(0) >= 6 and word_ids.count(3) >= 3  # both names split into many sub-tokens
    for word in range(len(words)):
        positions = [p for p, w in enumerate(word_ids) if w == word]
        assert feature["labels"][positions[0]] == labels.index(tags[word])
        assert all(feature["labels"][p] == IGNORE_INDEX for p in positions[1:])
    assert feature["labels"][0] == feature["labels"][-1] == IGNORE_INDEX  # [CLS], [SEP]
    # Every sub-token labelled: B- becomes I- after the first sub-token.
    every = ner_features(tokenizer, [TaggedSentence(words, tags)], labels, max_length=64, label_all_subtokens=True)[0]
    first = [p for p, w in enumerate(word_ids) if w == 0]
    assert every["labels"][first[0]] == 1 and all(every["labels"][p] == 2 for p in first[1:])


def test_ner_words_past_max_length_are_counted(tokenizer, caplog) -> None:
    sentence = TaggedSentence([f"word{i}" for i in range(40)], ["O"] * 40)
    feature = ner_features(tokenizer, [sentence], ["O"], max_length=16)[0]
    assert len(feature["input_ids"]) == 16 and "lost their labels" in caplog.text


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_qa_windows_find_the_answer_in_a_context_three_times_max_length(tokenizer, where) -> None:
    filler = " ".join(f"sentence {i} says nothing of interest here." for i in range(60))
    answer = "the amber lighthouse of Tarvik"
    position = {"start": 0, "middle": len(filler) // 2, "end": len(filler)}[where]
    cut = filler.rfind(" ", 0, position) + 1 if where == "middle" else position
    context = filler[:cut] + answer + " " + filler[cut:]
    start = context.index(answer)
    example = QAExample("q", "What stands at the harbour?", context, [answer], [start])
    features = qa_features(tokenizer, [example], max_length=128, stride=32)
    assert len(tokenizer.encode(context, truncation=False).input_ids) > 3 * 128
    assert len(features) >= 4 and all(len(f["input_ids"]) <= 128 for f in features)
    hits = [f for f in features if f["start_positions"] != 0]
    assert hits, "no window holds the answer"
    for feature in hits:
        s, e = feature["start_positions"], feature["end_positions"]
        assert context[feature["offsets"][s][0]:feature["offsets"][e][1]] == answer
    for feature in features:  # every window carries the whole question
        assert feature["token_type_ids"].count(0) == features[0]["token_type_ids"].count(0)


def test_answer_tokens_by_hand() -> None:
    offsets = [None, None, None, (0, 5), (6, 11), (12, 17), None]  # [CLS] q [SEP] hello world again [SEP]
    assert answer_tokens(offsets, 6, 11) == (4, 4)
    assert answer_tokens(offsets, 0, 17) == (3, 5)
    assert answer_tokens(offsets, 7, 9) == (4, 4)  # inside one token
    assert answer_tokens(offsets, 12, 30) == (0, 0)  # runs past this window: [CLS]
    assert answer_tokens([None, None], 0, 1) == (0, 0)


def test_qa_stride_that_leaves_no_room_is_refused(tokenizer) -> None:
    example = QAExample("q", "what " * 40, "some context", ["some"], [0])
    with pytest.raises(Exception, match="context tokens per window"):
        qa_features(tokenizer, [example], max_length=64, stride=32)


def test_collate_pads_dynamically() -> None:
    features = [{"input_ids": [1, 2, 3], "token_type_ids": [0, 0, 1], "labels": [-100, 4, -100]},
                {"input_ids": [1, 2], "token_type_ids": [0, 0], "labels": [-100, 2]}]
    batch = collate(features, pad_token_id=9)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [1, 2, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 4, -100], [-100, 2, -100]]
    multi = collate([{"input_ids": [1], "token_type_ids": [0], "labels": [1.0, 0.0]}], 0, pad_to_multiple_of=8)
    assert multi["labels"].dtype == torch.float32 and multi["input_ids"].shape == (1, 8)
    single = collate([{"input_ids": [1], "token_type_ids": [0], "labels": 3, "start_positions": 0,
                       "end_positions": 0}], 0)
    assert single["labels"].tolist() == [3] and single["start_positions"].tolist() == [0]


def test_label_order_and_checks() -> None:
    assert label_list(["10", "2", "1"]) == ["1", "2", "10"]
    assert label_list([["sport", "news"], ["art"]]) == ["art", "news", "sport"]
    rows = [ClassificationExample("a", None, "1", 2), ClassificationExample("b", None, "positive", 3)]
    with pytest.raises(DataError, match=r"train.csv:3: the label column mixes integer ids and names"):
        check_label_types(rows, "train.csv")
    rows = [ClassificationExample("a", None, ["x"], 2), ClassificationExample("b", None, "y", 5)]
    with pytest.raises(DataError, match=r"t.jsonl:5: the label column mixes label lists and single labels"):
        check_label_types(rows, "t.jsonl")
    with pytest.raises(DataError, match=r"valid.tsv:7: label 'neutral' does not occur in the training data"):
        check_known_labels([ClassificationExample("a", None, "neutral", 7)], ["neg", "pos"], "valid.tsv")
