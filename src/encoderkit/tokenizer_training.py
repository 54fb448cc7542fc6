"""Training a tokenizer from text files: WordPiece (BERT-style) or byte-level BPE (RoBERTa-style), with the special
tokens and post-processing that transformers' fast tokenizers give those kinds, so that the saved tokenizer loads
back in both."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .errors import InputError
from .tokenizer import _BPE_SPECIALS, _WORDPIECE_SPECIALS, Tokenizer
from .tokenizer_pipelines import add_specials, set_bert_template, set_roberta_processing


def train_tokenizer(files: Sequence[str | Path], *, kind: str = "wordpiece", vocab_size: int = 30522,
                    min_frequency: int = 2, lowercase: bool = True, model_max_length: int = 512,
                    show_progress: bool = False) -> Tokenizer:
    """Train a WordPiece (BERT-style) or byte-level BPE (RoBERTa-style) tokenizer on text files."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    paths = [Path(f) for f in files]
    if not paths:
        raise InputError("no training files given")
    for path in paths:
        if not path.is_file():
            raise InputError(f"training file not found: {path}")
    if vocab_size < 100:
        raise InputError(f"vocab_size {vocab_size} is too small; use at least a few hundred")
    if kind == "wordpiece":
        specials = dict(_WORDPIECE_SPECIALS)
        backend = Backend(models.WordPiece(unk_token=specials["unk"], max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                        strip_accents=None, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
            special_tokens=[specials[r] for r in ("pad", "unk", "cls", "sep", "mask")],
            continuing_subword_prefix="##",
        )
    elif kind == "bpe":
        specials = dict(_BPE_SPECIALS)
        backend = Backend(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
            special_tokens=[specials[r] for r in ("bos", "pad", "eos", "unk", "mask")],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        lowercase = False
    else:
        raise InputError(f"unknown tokenizer kind {kind!r}; choose 'wordpiece' or 'bpe'")
    try:
        backend.train([str(p) for p in paths], trainer)
    except Exception as exc:
        raise InputError(f"tokenizer training failed: {exc} (are the files UTF-8 text?)") from exc
    if kind == "wordpiece":
        add_specials(backend, specials, mask_lstrip=False)
        set_bert_template(backend, specials["cls"], specials["sep"])
    else:
        add_specials(backend, specials, mask_lstrip=True)
        set_roberta_processing(backend, specials, add_prefix_space=False)
    return Tokenizer(backend, kind=kind, model_max_length=model_max_length,
                     lowercase=lowercase if kind == "wordpiece" else None, special_tokens=specials)


__all__ = ["train_tokenizer"]
