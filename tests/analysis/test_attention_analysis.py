"""Attention analysis: probabilities against transformers, head statistics by hand, figures, the
pronoun-antecedent finder on a constructed case, the causal mask, and the `attention` command."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import InputError, load_model
from encoderkit.analysis import (
    CATEGORIES,
    AttentionAnalyzer,
    CoreferenceExample,
    attention_entropy,
    attention_shares,
    find_antecedent_heads,
    head_statistics,
    key_categories,
    rank_antecedent_heads,
    read_coreference_examples,
    resolve_span,
)
from encoderkit.analysis.plots import thinned_labels
from encoderkit.cli import main
from encoderkit.modeling.attention import causal_bias

from helpers import TOKENIZER_FILES, tiny_bert_dir

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TROPHY = "The trophy did not fit in the suitcase because it was too big."
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> AttentionAnalyzer:
    return AttentionAnalyzer.from_pretrained(minilm_dir)


def assert_png(path: Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 2000, f"{path} is not a real PNG ({len(data)} bytes)"


# ---------------------------------------------------------------------------------------------
# Probabilities equal transformers' output_attentions
# ---------------------------------------------------------------------------------------------
def test_minilm_pair_attentions_equal_transformers(minilm: AttentionAnalyzer, minilm_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    pair = "It was far too large for it."
    inputs = hf_tokenizer(TROPHY, pair, return_tensors="pt")
    maps = minilm.attend(TROPHY, pair)

    assert maps.tokens == hf_tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    assert maps.token_type_ids == inputs["token_type_ids"][0].tolist() and 1 in maps.token_type_ids
    assert maps.cls_position == 0 and maps.sep_positions == [15, len(maps.tokens) - 1]
    with torch.no_grad():
        expected = torch.stack(reference(**inputs, output_attentions=True).attentions)[:, 0].numpy()
    assert maps.probabilities.shape == expected.shape == (6, 12, len(maps.tokens), len(maps.tokens))
    assert maps.probabilities.dtype == np.float32
    assert np.abs(maps.probabilities - expected).max() <= 1e-5


def _perturb(model: torch.nn.Module) -> None:
    """Move every weight off its initial value, so no LayerNorm or bias is trivially equal."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)


def _random_family_dir(family: str, directory: Path, minilm_dir: Path) -> tuple[Path, torch.nn.Module]:
    """A small random transformers model of ``family`` with a real tokenizer, saved to ``directory``."""
    transformers = pytest.importorskip("transformers")
    if family == "roberta":
        from encoderkit import train_tokenizer

        corpus = directory.parent / "corpus.txt"
        corpus.write_text("\n".join(["the trophy did not fit in the suitcase because it was too big",
                                     "it was far too large for the case", "a man and his son lifted the box"] * 20))
        tokenizer = train_tokenizer([corpus], kind="bpe", vocab_size=300, min_frequency=1)
        tokenizer.save(directory)
        config = transformers.RobertaConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=66, type_vocab_size=1, pad_token_id=tokenizer.pad_token_id,
            layer_norm_eps=1e-5)
        reference = transformers.RobertaModel._from_config(config, attn_implementation="eager")
    else:  # with the default model's WordPiece vocabulary
        directory.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            shutil.copy(minilm_dir / name, directory / name)
        if family == "distilbert":  # no token type embeddings at all
            config = transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                                   max_position_embeddings=64)
        elif family == "modernbert":  # layer 1 is local: a 4-token window
            config = transformers.ModernBertConfig(
                vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                global_attn_every_n_layers=2, local_attention=4, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                cls_token_id=101, sep_token_id=102)
        else:  # DeBERTa-v3's switches
            config = transformers.DebertaV2Config(
                vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                relative_attention=True, pos_att_type="p2c|c2p", position_buckets=16, norm_rel_ebd="layer_norm",
                share_att_key=True, position_biased_input=False, type_vocab_size=0)
        reference = transformers.AutoModel.from_config(config, attn_implementation="eager")
    torch.manual_seed(0)
    _perturb(reference)
    reference.eval().save_pretrained(directory)
    return directory, reference


@pytest.mark.parametrize("family", ["roberta", "distilbert", "modernbert", "deberta-v2"])
def test_other_families_equal_transformers(family: str, tmp_path: Path, minilm_dir: Path) -> None:
    directory, reference = _random_family_dir(family, tmp_path / family, minilm_dir)
    analyzer = AttentionAnalyzer.from_pretrained(directory)
    texts = ["the trophy did not fit in the suitcase", "a man lifted the box"]
    pairs = ["it was too big", "his son"]
    batch = analyzer.attend_many(texts, pairs)  # padded together: the shorter one is cut back to its length
    for text, pair, maps in zip(texts, pairs, batch):
        ids = torch.tensor([maps.input_ids])
        with torch.no_grad():
            expected = torch.stack(reference(input_ids=ids, output_attentions=True).attentions)[:, 0].numpy()
        assert maps.probabilities.shape == expected.shape
        assert np.abs(maps.probabilities - expected).max() <= 1e-5, family
        single = analyzer.attend(text, pair)
        # A padded batch and a single run multiply matrices of other shapes, so fp32 sums run in another order:
        # 1.2e-6 apart on an AVX512-BF16 CPU. The project's fp32 tolerance (as against transformers) is 1e-5.
        assert single.tokens == maps.tokens and np.abs(single.probabilities - maps.probabilities).max() <= 1e-5
    maps = batch[0]
    if family == "modernbert":  # the local layer's window shows: nothing beyond 2 tokens either side
        distance = np.abs(np.arange(maps.length)[:, None] - np.arange(maps.length)[None, :])
        assert maps.probabilities[1][:, distance > 2].max() == 0 and maps.probabilities[0][:, distance > 2].min() > 0
    if family == "roberta":
        assert maps.tokens[0] == "<s>" and maps.cls_position == 0
        assert [maps.tokens[p] for p in maps.sep_positions] == ["</s>"] * 3  # <s> A </s></s> B </s>
    else:
        assert maps.tokens[0] == "[CLS]" and [maps.tokens[p] for p in maps.sep_positions] == ["[SEP]", "[SEP]"]


def test_analyzer_uses_the_encoder_of_a_task_model(tmp_path: Path, minilm_dir: Path) -> None:
    directory = tiny_bert_dir(tmp_path / "mlm", minilm_dir, task="masked-lm")
    from encoderkit import Tokenizer

    via_task = AttentionAnalyzer(load_model(directory), Tokenizer.from_pretrained(directory)).attend("a short text")
    via_base = AttentionAnalyzer.from_pretrained(directory).attend("a short text")
    assert np.array_equal(via_task.probabilities, via_base.probabilities)
    with pytest.raises(InputError, match="needs an encoderkit model"):
        AttentionAnalyzer(torch.nn.Linear(2, 2), Tokenizer.from_pretrained(directory))


# ---------------------------------------------------------------------------------------------
# Head statistics
# ---------------------------------------------------------------------------------------------
def test_key_categories_follow_the_documented_precedence() -> None:
    # [CLS] a , b [SEP]: position 2 is punctuation, 4 is [SEP].
    got = key_categories(5, cls_position=0, sep_positions=[4], punctuation_positions=[2])
    c, s, me, p, n, pu, o = range(len(CATEGORIES))
    expected = np.array([
        # keys: [CLS] a   ,   b   [SEP]
        [c, n, pu, o, s],   # [CLS]: itself counts as cls
        [c, me, n, o, s],   # a: its previous token is [CLS] -> cls; its next is "," -> next beats punctuation
        [c, p, me, n, s],   # ,: attending to itself is self, not punctuation
        [c, o, p, me, s],   # b: its next token is [SEP] -> sep
        [c, o, pu, p, s],   # [SEP]: itself counts as sep
    ])
    assert CATEGORIES == ("cls", "sep", "self", "previous", "next", "punctuation", "other")
    assert np.array_equal(got, expected)


def test_shares_of_a_hand_made_head() -> None:
    probs = np.array([
        [0.5, 0.5, 0.0, 0.0, 0.0],
        [0.6, 0.1, 0.2, 0.1, 0.0],
        [0.0, 0.3, 0.3, 0.3, 0.1],
        [0.2, 0.2, 0.0, 0.1, 0.5],
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ])
    categories = key_categories(5, 0, [4], [2])
    shares = attention_shares(probs[None, None], categories)[0, 0]  # (categories, queries)
    by_name = dict(zip(CATEGORIES, shares))
    assert np.allclose(by_name["cls"], [0.5, 0.6, 0.0, 0.2, 0.0])
    assert np.allclose(by_name["sep"], [0.0, 0.0, 0.1, 0.5, 1.0])
    assert np.allclose(by_name["self"], [0.0, 0.1, 0.3, 0.1, 0.0])
    assert np.allclose(by_name["previous"], [0.0, 0.0, 0.3, 0.0, 0.0])
    assert np.allclose(by_name["next"], [0.5, 0.2, 0.3, 0.0, 0.0])
    assert np.allclose(by_name["punctuation"], [0.0, 0.0, 0.0, 0.0, 0.0])
    assert np.allclose(by_name["other"], [0.0, 0.1, 0.0, 0.2, 0.0])
    # The entropy of row 1 by hand: -(0.6 ln 0.6 + 2 * 0.1 ln 0.1 + 0.2 ln 0.2); 0 ln 0 counts as 0.
    entropy = attention_entropy(probs)
    assert entropy[1] == pytest.approx(-(0.6 * math.log(0.6) + 2 * 0.1 * math.log(0.1) + 0.2 * math.log(0.2)))
    assert entropy[0] == pytest.approx(math.log(2)) and entropy[4] == 0.0


def test_shares_sum_to_one_and_entropy_matches_the_formula_on_random_maps() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(9, 0.3), size=(3, 4, 9)).astype(np.float32)  # (layers, heads, q, k)
    shares = attention_shares(probs, key_categories(9, 0, [5, 8], [3, 6]))
    assert shares.shape == (3, 4, len(CATEGORIES), 9)
    assert np.abs(shares.sum(axis=2) - 1.0).max() <= 1e-6
    layer, head, query = 2, 1, 4
    row = probs[layer, head, query].astype(np.float64)
    by_hand = -sum(p * math.log(p) for p in row if p > 0)
    assert attention_entropy(probs)[layer, head, query] == pytest.approx(by_hand, abs=1e-9)


def test_corpus_statistics_average_tokens_then_texts(minilm: AttentionAnalyzer) -> None:
    texts = [TROPHY, "Short one.", "A third, rather longer sentence about heads, tokens and attention."]
    maps = minilm.attend_many(texts)
    stats = minilm.head_statistics(texts)
    assert stats.num_texts == 3 and stats.categories == list(CATEGORIES)
    total = sum(stats.shares[name] for name in stats.categories)
    assert total.shape == (6, 12) and np.abs(total - 1.0).max() <= 1e-6
    singles = [m.statistics() for m in maps]
    for name in CATEGORIES:
        assert np.allclose(stats.shares[name], np.mean([s.shares[name] for s in singles], axis=0), atol=1e-12)
    assert np.allclose(stats.entropy, np.mean([s.entropy for s in singles], axis=0), atol=1e-12)
    assert stats.uniform_entropy == pytest.approx(np.mean([math.log(m.length) for m in maps]))
    # A per-text mean over tokens, checked for one head against a direct loop over its rows.
    first = maps[0]
    probs, sep = first.probabilities[4, 7], first.sep_positions[0]
    assert singles[0].shares["sep"][4, 7] == pytest.approx(probs[:, sep].mean(), abs=1e-6)
    # Without punctuation the category folds into "other"; the sums stay 1.
    folded = head_statistics(maps, punctuation=False)
    assert "punctuation" not in folded.shares
    assert np.allclose(folded.shares["other"], stats.shares["other"] + stats.shares["punctuation"], atol=1e-12)
    assert "| layer | head | cls |" in stats.markdown()


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def test_figures_are_written(minilm: AttentionAnalyzer, tmp_path: Path) -> None:
    maps = minilm.attend(TROPHY, "It was big.")
    assert_png(maps.heatmap(3, 1, tmp_path / "head.png"))
    assert_png(maps.grid(tmp_path / "layer.png", layer=2, highlight_head=5))
    written = maps.statistics().write(tmp_path / "stats")
    assert_png(written["head_statistics"])
    assert json.loads(written["json"].read_text())["num_layers"] == 6
    comparison = minilm.compare_masks(TROPHY, layer=1, head=8)
    assert_png(comparison.write(tmp_path / "masks")["mask_comparison"])
    with pytest.raises(InputError, match="layer must be between 0 and 5"):
        maps.heatmap(6, 0, tmp_path / "bad.png")
    with pytest.raises(InputError, match="head must be between 0 and 11"):
        maps.heatmap(0, 12, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_long_inputs_get_thinned_labels() -> None:
    tokens = [f"t{i}" for i in range(130)]
    positions, labels = thinned_labels(tokens, max_labels=60)
    assert positions == list(range(0, 130, 3)) and labels[1] == "t3" and len(labels) <= 60
    assert thinned_labels(tokens[:20], 60) == (list(range(20)), tokens[:20])
    assert thinned_labels(["a" * 30], 60)[1] == ["a" * 13 + "…"]


# ---------------------------------------------------------------------------------------------
# Pronoun -> antecedent finder
# ---------------------------------------------------------------------------------------------
CONTROLLED = "the zorblax hit the vase because it was old, and it fell."


def test_finder_ranks_a_constructed_head_first(minilm: AttentionAnalyzer) -> None:
    maps = minilm.attend(CONTROLLED)
    tokens = maps.tokens
    zorblax = [2, 3, 4, 5]
    assert tokens[1:7] == ["the", "z", "##or", "##bla", "##x", "hit"]  # the antecedent is four sub-tokens
    first_it, second_it = [p for p, t in enumerate(tokens) if t == "it"]
    vase = tokens.index("vase")
    probs = np.zeros_like(maps.probabilities)
    probs[..., 0] = 1.0  # every head: a no-op head that only looks at [CLS]
    probs[1, 2, second_it] = 0.0
    probs[1, 2, second_it, zorblax] = 0.2  # 0.8 in all on the antecedent's sub-tokens
    probs[1, 2, second_it, 0] = 0.2
    probs[0, 3, second_it] = 0.0
    probs[0, 3, second_it, vase], probs[0, 3, second_it, 0] = 0.7, 0.3  # looks at the distractor
    probs[2, 0, first_it] = 0.0
    probs[2, 0, first_it, zorblax] = 0.25  # the *first* "it" -> zorblax
    controlled = dataclasses.replace(maps, probabilities=probs)

    example = CoreferenceExample(CONTROLLED, "it", "zorblax", distractors=("vase",), pronoun_occurrence=2)
    result = rank_antecedent_heads([controlled], [example], top_k=3)
    best = result.top[0]
    assert (best.layer, best.head) == (1, 2)
    assert best.accuracy == 1.0 and best.candidate_accuracy == 1.0
    assert best.mean_attention == pytest.approx(0.8)
    assert best.attention_lift == pytest.approx(0.8 / (4 / len(tokens)))  # chance: 4 of the tokens
    assert result.accuracy.sum() == 1.0  # no other head's favourite word is the antecedent
    assert result.candidate_accuracy[0, 3] == 0.0 and result.mean_attention[0, 3] == 0.0
    assert result.best_head_predictions[0]["predicted"] == "zorblax"
    assert result.nearest_candidate_accuracy == 0.0  # "vase" is nearer to the pronoun

    # The first occurrence of "it" is another pronoun: now the head built for it wins.
    first = dataclasses.replace(example, pronoun_occurrence=1)
    assert (rank_antecedent_heads([controlled], [first]).top[0].layer,
            rank_antecedent_heads([controlled], [first]).top[0].head) == (2, 0)
    # A two-token pronoun span ("it was"): its attention is the mean of its tokens' rows.
    start = CONTROLLED.index("it was old")
    span = dataclasses.replace(example, pronoun=(start, start + len("it was")), pronoun_occurrence=1)
    swapped = probs.copy()
    swapped[1, 2, first_it + 1] = 0.0
    swapped[1, 2, first_it + 1, zorblax] = 0.1  # "was" gives 0.4, "it" 0 -> 0.2
    two_token = rank_antecedent_heads([dataclasses.replace(maps, probabilities=swapped)], [span])
    assert two_token.mean_attention[1, 2] == pytest.approx(0.2)
    # Over two examples the head right on one of them has accuracy 1/2.
    both = rank_antecedent_heads([controlled, controlled], [example, first])
    assert both.accuracy[1, 2] == 0.5 and both.accuracy[2, 0] == 0.5 and both.num_examples == 2


def test_mentions_resolve_to_the_right_characters() -> None:
    sentence = "It said that it was old, and it fell."
    assert resolve_span(sentence, "it") == (13, 15)  # case-sensitive matches first
    assert resolve_span(sentence, "it", occurrence=2) == (29, 31)
    assert resolve_span(sentence, "IT") == (0, 2)  # no exact match: case is ignored
    assert resolve_span(sentence, 17) == (16, 19)  # an offset inside "was"
    assert resolve_span(sentence, (20, 23)) == (20, 23)
    with pytest.raises(InputError, match="occurs only 2 time"):
        resolve_span(sentence, "it", occurrence=3)
    with pytest.raises(InputError, match="not at all"):
        resolve_span(sentence, "i")  # whole words only: "i" inside "it" does not count
    with pytest.raises(InputError, match="not inside a word"):
        resolve_span(sentence, 2)


def test_finder_runs_on_the_fixture_examples(minilm: AttentionAnalyzer, tmp_path: Path) -> None:
    examples = read_coreference_examples(DATA / "pronoun_antecedents.jsonl")
    assert len(examples) == 24 and all(e.distractors for e in examples)
    result = find_antecedent_heads(minilm, examples, top_k=5, rank_by="candidate_accuracy")
    assert len(result.top) == 5 and result.candidate_chance == pytest.approx(0.5)
    scores = [s.candidate_accuracy for s in result.top]
    assert scores == sorted(scores, reverse=True) and scores[0] == result.candidate_accuracy.max()
    assert 0.0 < result.chance_accuracy < 0.5 and 0.0 < result.chance_attention < 0.2
    written = result.write(tmp_path)
    assert_png(written["antecedent_heads"])
    assert "Pronoun-antecedent heads" in written["markdown"].read_text()
    with pytest.raises(InputError, match="occurs not at all"):
        find_antecedent_heads(minilm, [(TROPHY, "she", "trophy")])


# ---------------------------------------------------------------------------------------------
# Causal mask
# ---------------------------------------------------------------------------------------------
def test_causal_mask_hides_later_tokens(minilm: AttentionAnalyzer) -> None:
    maps = minilm.attend(TROPHY, mask="causal")
    above = np.triu(np.ones((maps.length, maps.length), dtype=bool), 1)
    assert np.all(maps.probabilities[..., above] == 0.0)  # exactly zero, not just small
    assert np.abs(maps.probabilities.sum(-1) - 1).max() < 1e-5
    assert np.all(maps.probabilities[:, :, 0, 0] == 1.0)  # the first token sees only itself
    comparison = minilm.compare_masks(TROPHY, layer=2, head=3)
    assert comparison.causal_mass_above_diagonal == 0.0
    assert np.array_equal(comparison.causal, maps.probabilities[2, 3])
    assert comparison.mean_pooled_cosine < 0.999  # the mask changes the representations


def test_causal_states_do_not_depend_on_later_tokens(minilm: AttentionAnalyzer) -> None:
    """Under a causal mask, cutting the input after token i leaves every state up to i unchanged; a lone first
    token sees only itself, so its states equal those of a one-token run without any mask."""
    ids = torch.tensor([minilm.tokenizer.encode(TROPHY).input_ids])
    length = ids.shape[1]
    with torch.inference_mode():
        full = minilm.encoder(ids, attention_bias=causal_bias(length, torch.float32)).last_hidden_state[0]
        for end in (3, 9):
            prefix = minilm.encoder(ids[:, :end], attention_bias=causal_bias(end, torch.float32)).last_hidden_state[0]
            assert (full[:end] - prefix).abs().max() <= 1e-5
        alone = minilm.encoder(ids[:, :1]).last_hidden_state[0, 0]
        bidirectional = minilm.encoder(ids).last_hidden_state[0]
    assert (full[0] - alone).abs().max() <= 1e-5
    assert (full[0] - bidirectional[0]).abs().max() > 1e-2  # a real change: [CLS] no longer sees the sentence


def test_causal_mask_with_padding_equals_single_runs(minilm: AttentionAnalyzer) -> None:
    texts = [TROPHY, "Tiny."]
    batch = minilm.attend_many(texts, mask="causal")
    for text, maps in zip(texts, batch):
        # Other matrix shapes than the single run: fp32 sums in another order (see the batch test above).
        assert np.abs(maps.probabilities - minilm.attend(text, mask="causal").probabilities).max() <= 1e-5


def test_attention_bias_is_checked_and_optional(minilm: AttentionAnalyzer) -> None:
    ids = torch.tensor([minilm.tokenizer.encode("a b c").input_ids])
    with pytest.raises(InputError, match="attention_bias must have shape"):
        minilm.encoder(ids, attention_bias=torch.zeros(1, 1, 3, 3))
    with torch.inference_mode():
        zero = minilm.encoder(ids, attention_bias=torch.zeros(1, 12, 5, 5)).last_hidden_state
        plain = minilm.encoder(ids).last_hidden_state
    assert torch.equal(zero, plain) or (zero - plain).abs().max() <= 1e-6


def test_bad_inputs_raise_input_errors(minilm: AttentionAnalyzer) -> None:
    with pytest.raises(InputError, match="text is empty"):
        minilm.attend("   ")
    with pytest.raises(InputError, match="pair is empty"):
        minilm.attend("fine", "")
    with pytest.raises(InputError, match="mask must be one of"):
        minilm.attend("fine", mask="sideways")
    with pytest.raises(InputError, match="for one text use attend"):
        minilm.attend_many("not a list")


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def test_cli_writes_the_map_and_the_statistics(tmp_path: Path, minilm_dir: Path, capsys) -> None:
    model = tiny_bert_dir(tmp_path / "tiny", minilm_dir)  # 2 layers, 4 heads
    out, stats = tmp_path / "maps" / "map.png", tmp_path / "stats.json"
    assert main(["attention", str(model), "The cat sat.", "--pair", "It was tired.", "--layer", "1", "--head", "3",
                 "--out", str(out), "--stats", str(stats)]) == 0
    assert_png(out)
    assert "layer 1, head 3" in capsys.readouterr().out
    written = json.loads(stats.read_text())
    total = sum(np.array(written["shares"][name]) for name in written["categories"])
    assert total.shape == (2, 4) and np.abs(total - 1).max() <= 1e-6
    assert main(["attention", str(model), "The cat sat.", "--layer", "0", "--grid",
                 "--out", str(tmp_path / "g.png")]) == 0
    assert_png(tmp_path / "g.png")
    assert main(["attention", str(model), "The cat sat.", "--layer", "0", "--head", "1", "--mask", "compare",
                 "--out", str(tmp_path / "c.png")]) == 0
    assert_png(tmp_path / "c.png")


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "2", "--head", "0"], "layer must be between 0 and 1 (the model has 2 layers"),
    (["--layer", "0", "--head", "4"], "head must be between 0 and 3"),
    (["--layer", "0"], "give --head H"),
    (["--layer", "0", "--head", "0", "--out", "x.jpg"], "--out must name a .png file"),
])
def test_cli_errors_cleanly(args: list[str], message: str, tmp_path: Path, minilm_dir: Path, capsys) -> None:
    model = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    out = ["--out", str(tmp_path / "map.png")] if "--out" not in args else []
    assert main(["attention", str(model), "The cat sat.", *args, *out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("encoderkit: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "map.png").exists()


def test_cli_rejects_empty_text(tmp_path: Path, minilm_dir: Path, capsys) -> None:
    model = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    assert main(["attention", str(model), " ", "--layer", "0", "--head", "0", "--out", str(tmp_path / "m.png")]) == 2
    assert "text is empty" in capsys.readouterr().err


def test_deberta_score_parts_are_its_disentangled_terms(tmp_path: Path, minilm_dir: Path) -> None:
    """DeBERTa's maps carry c2c, c2p and p2c: c2c is the scaled content product of transformers' own projections,
    and the three terms, summed and softmaxed, give the probabilities (= transformers' output_attentions)."""
    directory, reference = _random_family_dir("deberta-v2", tmp_path / "deberta", minilm_dir)
    maps = AttentionAnalyzer.from_pretrained(directory).attend("the trophy did not fit in the suitcase")
    assert set(maps.score_parts) == {"c2c", "c2p", "p2c"}
    total = sum(maps.score_parts.values())
    softmaxed = np.exp(total - total.max(-1, keepdims=True))
    assert np.abs(softmaxed / softmaxed.sum(-1, keepdims=True) - maps.probabilities).max() <= 1e-5
    ids = torch.tensor([maps.input_ids])
    with torch.no_grad():
        embedded = reference(input_ids=ids, output_hidden_states=True).hidden_states[0][0]
        attention = reference.encoder.layer[0].attention.self
        heads, size = 4, 8
        q = attention.query_proj(embedded).view(-1, heads, size).transpose(0, 1)
        k = attention.key_proj(embedded).view(-1, heads, size).transpose(0, 1)
        want = (q @ k.transpose(-1, -2) / math.sqrt(size * 3)).numpy()  # scale sqrt(d * (1 + 2 position terms))
    assert np.abs(maps.score_parts["c2c"][0] - want).max() <= 1e-5
    out = tmp_path / "c2p.png"
    assert main(["attention", str(directory), "the trophy", "--layer", "1", "--head", "0", "--part", "c2p",
                 "--out", str(out)]) == 0
    assert_png(out)


def test_score_parts_refused_for_content_only_models(minilm_dir: Path, tmp_path: Path, capsys) -> None:
    code = main(["attention", str(minilm_dir), "a text", "--layer", "0", "--head", "0", "--part", "c2p",
                 "--out", str(tmp_path / "x.png")])
    assert code == 2 and "no 'c2p' score part" in capsys.readouterr().err
