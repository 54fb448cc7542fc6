"""The pipelines of the tokenizer classes transformers builds around a tokenizer.json (or a vocabulary): the
special tokens and templates of BERT and RoBERTa, and the classes that keep only the file's vocabulary (DeBERTa-v2/v3,
XLM-RoBERTa), so that ``encoderkit.tokenizer.Tokenizer`` tokenises as transformers' tokenizer of the same class."""
from __future__ import annotations

from typing import Any


def add_specials(backend: Any, specials: dict[str, str], mask_lstrip: bool) -> None:
    from tokenizers import AddedToken

    seen = []
    for role, token in specials.items():
        if token in seen or backend.token_to_id(token) is None:
            continue
        seen.append(token)
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False,
                                               lstrip=mask_lstrip and role == "mask")])


def set_bert_template(backend: Any, cls_token: str, sep_token: str) -> None:
    from tokenizers import processors

    cls_id, sep_id = backend.token_to_id(cls_token), backend.token_to_id(sep_token)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, cls_id), (sep_token, sep_id)],
    )


def set_roberta_processing(backend: Any, specials: dict[str, str], add_prefix_space: bool) -> None:
    from tokenizers import processors

    backend.post_processor = processors.RobertaProcessing(
        (specials["sep"], backend.token_to_id(specials["sep"])),
        (specials["cls"], backend.token_to_id(specials["cls"])),
        trim_offsets=True, add_prefix_space=add_prefix_space,
    )


def set_deberta_v2_pipeline(backend: Any, specials: dict[str, str], *, lowercase: bool, split_by_punct: bool,
                             add_prefix_space: bool) -> None:
    """The normalizer, pre-tokenizer, decoder and [CLS]/[SEP] template that transformers' DebertaV2Tokenizer
    builds itself: it keeps only the vocabulary of tokenizer.json (transformers 5 replaces the SentencePiece
    normalizer, Strip + Precompiled charsmap + Replace, with whitespace clean-up, NFC and a right strip)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    steps = [normalizers.Lowercase()] if lowercase else []
    steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
              normalizers.Strip(left=False, right=True)]
    backend.normalizer = normalizers.Sequence(steps)
    scheme = "always" if add_prefix_space else "first"
    splits = [pre_tokenizers.Punctuation(behavior="isolated")] if split_by_punct else []
    backend.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.Metaspace(replacement="▁",
                                                                                        prepend_scheme=scheme)])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    set_bert_template(backend, specials["cls"], specials["sep"])


def set_xlm_roberta_pipeline(backend: Any, normalizer: Any, specials: dict[str, str], *,
                              add_prefix_space: bool) -> None:
    """The pipeline transformers' XLMRobertaTokenizer builds itself around tokenizer.json's vocabulary: the
    SentencePiece charsmap (the Precompiled step of tokenizer.json's normalizer, if any) as the only normalizer,
    whitespace splitting then Metaspace, and <s> A </s> (</s> B </s>) with every type id 0. Whitespace splitting
    drops what the file's own pre-tokenizer kept: runs of spaces, and a trailing space's "▁" token."""
    import base64

    from tokenizers import decoders, normalizers, pre_tokenizers, processors

    steps = normalizer.get("normalizers", []) if isinstance(normalizer, dict) and \
        normalizer.get("type") == "Sequence" else [normalizer]
    charsmap = next((step["precompiled_charsmap"] for step in steps if isinstance(step, dict)
                     and step.get("type") == "Precompiled" and step.get("precompiled_charsmap")), None)
    backend.normalizer = normalizers.Precompiled(base64.b64decode(charsmap)) if charsmap else None
    scheme = "always" if add_prefix_space else "never"
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    bos, eos = specials["bos"], specials["eos"]
    backend.post_processor = processors.TemplateProcessing(
        single=[bos, "$A", eos], pair=[bos, "$A", eos, eos, "$B", eos],
        special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])


def deberta_v2_unk_id(vocab: list[Any], unk_token: str, configured: Any) -> int:
    """The unknown token's id as DebertaV2Tokenizer finds it: the entry (unk_token, 0.0), else the
    configured unk_id, else 1."""
    for index, entry in enumerate(vocab):
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == unk_token and entry[1] == 0.0:
            return index
    return configured if isinstance(configured, int) else 1
