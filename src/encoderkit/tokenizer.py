"""Tokenizer over the `tokenizers` library: WordPiece (BERT family), byte-level BPE (RoBERTa, ModernBERT)
and SentencePiece Unigram (DeBERTa-v2/v3).

Loads tokenizer.json, or vocab.txt, or vocab.json + merges.txt, the way transformers' fast
tokenizers build them, so ids, type ids and offsets are the same; encodes single texts and pairs
with truncation, padding, attention masks, special-token masks, offsets and word ids; trains new
tokenizers from text files and saves them so transformers loads them back.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from .errors import InputError, TokenizerError
from .tokenizer_pipelines import (add_specials, deberta_v2_unk_id, set_bert_template, set_deberta_v2_pipeline,
                                  set_roberta_processing, set_xlm_roberta_pipeline)

log = logging.getLogger(__name__)

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES = ("longest", "max_length")
_HUGE_LENGTH = 10**12  # transformers writes ~1e30 for "no limit"

_WORDPIECE_SPECIALS = dict(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]")
_BPE_SPECIALS = dict(bos="<s>", pad="<pad>", eos="</s>", unk="<unk>", mask="<mask>", cls="<s>", sep="</s>")
_MODEL_TYPES = ("BPE", "Unigram", "WordLevel", "WordPiece")  # the models the `tokenizers` library reads
_CLASS_OF_KIND = {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer"}  # for the tokenizers encoderkit builds
# transformers' DeBERTa-v2/v3 tokenizer builds its own pipeline around tokenizer.json's vocabulary; transformers
# takes it from config.json's model_type when tokenizer_config.json names no class.
_DEBERTA_V2_CLASSES = ("DebertaV2Tokenizer", "DebertaV2TokenizerFast")
_XLM_ROBERTA_CLASSES = ("XLMRobertaTokenizer", "XLMRobertaTokenizerFast")
_XLM_ROBERTA_UNK_ID = 3  # fairseq's ids: <s> 0, <pad> 1, </s> 2, <unk> 3
_CLASS_OF_MODEL_TYPE = {"deberta-v2": "DebertaV2Tokenizer", "xlm-roberta": "XLMRobertaTokenizer"}


@dataclass
class Encoded:
    """One tokenised text or pair (lists, unpadded unless padding was asked for)."""

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    special_tokens_mask: list[int]
    offsets: list[tuple[int, int]]  # character spans in the text the token came from; (0, 0) for specials
    word_ids: list[int | None]  # index of the word within its sequence; None for special tokens
    sequence_ids: list[int | None]  # 0 for the first text, 1 for the pair, None for special tokens
    tokens: list[str]
    overflowing: list["Encoded"] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def from_backend(cls, enc: Any, with_overflow: bool = False) -> "Encoded":
        return cls(
            input_ids=list(enc.ids), token_type_ids=list(enc.type_ids), attention_mask=list(enc.attention_mask),
            special_tokens_mask=list(enc.special_tokens_mask), offsets=[tuple(o) for o in enc.offsets],
            word_ids=list(enc.word_ids), sequence_ids=list(enc.sequence_ids), tokens=list(enc.tokens),
            overflowing=[cls.from_backend(o) for o in enc.overflowing] if with_overflow else None,
        )


@dataclass
class BatchEncoding:
    """A padded batch as tensors, plus the per-text details for span work (offsets, word ids)."""

    input_ids: torch.Tensor  # (batch, length) int64
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    special_tokens_mask: torch.Tensor
    encodings: list[Encoded]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "token_type_ids": self.token_type_ids}

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class _Turns:
    """How many calls are encoding under the backend's present settings, and how many wait (``_begin``)."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.running = 0
        self.waiting = 0

    def wait(self, joinable: Callable[[], bool] = lambda: False) -> None:
        """With ``condition`` held: wait until no call is encoding, or until ``joinable()`` (the running calls'
        settings are the caller's) while nobody waits before it."""
        while self.running and not (joinable() and not self.waiting):
            self.waiting += 1
            self.condition.wait()
            self.waiting -= 1

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Holds ``condition`` once no call is encoding: for a change to the shared backend."""
        with self.condition:
            self.wait()
            yield

    def leave(self) -> None:
        with self.condition:
            self.running -= 1
            if not self.running:
                self.condition.notify_all()


class Tokenizer:
    def __init__(self, backend: Any, *, kind: str, model_max_length: int = 512, lowercase: bool | None = None,
                 special_tokens: dict[str, str] | None = None, tokenizer_class: str | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.backend.no_truncation()
        self.backend.no_padding()
        self._configured: tuple | None = None  # the settings ``_configure`` last gave the backend
        self._turns = _Turns()  # who may use those settings now (``_begin``)
        self.kind = kind  # "wordpiece" | "bpe" | "unigram" | other model type name
        self.model_max_length = model_max_length
        self.lowercase = lowercase
        # transformers' class for save(); None: the class of the kind (BertTokenizer, RobertaTokenizer)
        self.tokenizer_class = tokenizer_class
        self.options = dict(options or {})  # other tokenizer_config.json settings save() writes back
        # RoBERTa's <s>/</s> names where the vocabulary has them, else BERT's [CLS]/[SEP] names
        # (DeBERTa-v3 and ModernBERT use those with Unigram and BPE models).
        defaults = _BPE_SPECIALS if kind != "wordpiece" and backend.token_to_id(_BPE_SPECIALS["cls"]) is not None \
            else _WORDPIECE_SPECIALS
        self.special_tokens = {k: v for k, v in {**defaults, **(special_tokens or {})}.items()
                               if v is not None and backend.token_to_id(v) is not None}

    # ----- construction -----------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, *, model_max_length: int | None = None) -> "Tokenizer":
        """Load from a directory (tokenizer.json, vocab.txt, or vocab.json + merges.txt) or a tokenizer.json file."""
        path = Path(path)
        if path.is_file() and path.name.endswith(".json"):
            directory, tokenizer_json = path.parent, path
        else:
            directory, tokenizer_json = path, path / "tokenizer.json"
        if not directory.is_dir():
            raise TokenizerError(f"tokenizer directory not found: {directory}")
        settings = _read_settings(directory)
        max_length = model_max_length or settings.get("model_max_length") or 512
        if max_length >= _HUGE_LENGTH:
            max_length = 512
        specials = settings.get("special_tokens", {})
        lowercase = settings.get("do_lower_case")
        if tokenizer_json.is_file():
            return cls._from_tokenizer_json(tokenizer_json, settings, max_length)
        if (directory / "vocab.txt").is_file():
            return cls.from_wordpiece_vocab(directory / "vocab.txt", lowercase=lowercase, model_max_length=max_length,
                                            special_tokens=specials,
                                            strip_accents=settings.get("strip_accents"),
                                            handle_chinese_chars=settings.get("tokenize_chinese_chars", True))
        if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            return cls.from_bpe_files(directory / "vocab.json", directory / "merges.txt", model_max_length=max_length,
                                      special_tokens=specials,
                                      add_prefix_space=bool(settings.get("add_prefix_space", False)))
        present = sorted(p.name for p in directory.iterdir())
        hint = ("; a SentencePiece model (.model) is not read: save it as tokenizer.json with transformers "
                "(AutoTokenizer.from_pretrained(dir).save_pretrained(dir))"
                if any(name.endswith(".model") for name in present) else "")
        raise TokenizerError(
            f"no tokenizer files in {directory}: expected tokenizer.json, vocab.txt (WordPiece) or "
            f"vocab.json + merges.txt (byte-level BPE); found {present or 'nothing'}{hint}"
        )

    @classmethod
    def _from_tokenizer_json(cls, path: Path, settings: dict[str, Any], max_length: int) -> "Tokenizer":
        """A tokenizer.json as transformers loads it: as written, except for the classes transformers
        rebuilds from the vocabulary (DeBERTa-v2/v3: see ``set_deberta_v2_pipeline``)."""
        from tokenizers import Tokenizer as Backend

        expected = f"a `tokenizers` tokenizer.json whose model has a type among {', '.join(_MODEL_TYPES)}"
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"{path} is unreadable ({exc}); expected {expected}") from exc
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, dict):
            raise TokenizerError(f"{path} has no model section; expected {expected}")
        model_type = model.get("type")
        if model_type is not None and model_type not in _MODEL_TYPES:
            raise TokenizerError(f"{path}: unknown model type {model_type!r}; expected {expected}")
        specials = settings.get("special_tokens", {})
        tokenizer_class = settings.get("tokenizer_class")
        deberta = tokenizer_class in _DEBERTA_V2_CLASSES
        xlm_roberta = tokenizer_class in _XLM_ROBERTA_CLASSES
        if xlm_roberta:
            if model_type not in (None, "Unigram"):
                raise TokenizerError(f"{path} has a {model_type} model, but its tokenizer class {tokenizer_class} "
                                     f"needs a Unigram (SentencePiece) model")
            if (model.get("unk_id"), model.get("byte_fallback")) != (_XLM_ROBERTA_UNK_ID, False):
                model.update(unk_id=_XLM_ROBERTA_UNK_ID, byte_fallback=False)
                text = json.dumps(data, ensure_ascii=False)
        if deberta:
            if model_type not in (None, "Unigram"):
                raise TokenizerError(f"{path} has a {model_type} model, but its tokenizer class {tokenizer_class} "
                                     f"needs a Unigram (SentencePiece) model")
            unk_id = deberta_v2_unk_id(model.get("vocab") or [], specials.get("unk", "[UNK]"), settings.get("unk_id"))
            if (model.get("unk_id"), model.get("byte_fallback")) != (unk_id, False):
                model.update(unk_id=unk_id, byte_fallback=False)
                text = json.dumps(data, ensure_ascii=False)
        try:
            backend = Backend.from_str(text)
        except Exception as exc:
            raise TokenizerError(f"{path} is not a valid tokenizer file ({exc}); expected {expected}") from exc
        kind = (model_type or json.loads(backend.to_str())["model"]["type"]).lower()
        lowercase = settings.get("do_lower_case")
        options: dict[str, Any] = {}
        if deberta:
            named = {**_WORDPIECE_SPECIALS, **specials}
            for role in ("cls", "sep"):
                if backend.token_to_id(named[role]) is None:
                    raise TokenizerError(f"{path} lacks the {role} token {named[role]!r} of {tokenizer_class}")
            lowercase = bool(lowercase)
            options = {"split_by_punct": bool(settings.get("split_by_punct", False)),
                       "add_prefix_space": bool(settings.get("add_prefix_space", True))}
            set_deberta_v2_pipeline(backend, named, lowercase=lowercase, **options)
            options["unk_id"] = unk_id
        if xlm_roberta:
            options = {"add_prefix_space": bool(settings.get("add_prefix_space", True))}
            set_xlm_roberta_pipeline(backend, data.get("normalizer"), {"bos": "<s>", "eos": "</s>", **specials},
                                      **options)
        return cls(backend, kind=kind, model_max_length=max_length, lowercase=lowercase, special_tokens=specials,
                   tokenizer_class=tokenizer_class or "PreTrainedTokenizerFast", options=options)

    @classmethod
    def from_wordpiece_vocab(cls, vocab_file: str | Path, *, lowercase: bool | None = None,
                             model_max_length: int = 512, special_tokens: dict[str, str] | None = None,
                             strip_accents: bool | None = None, handle_chinese_chars: bool = True) -> "Tokenizer":
        """A BERT WordPiece tokenizer from vocab.txt, built as transformers' BertTokenizerFast builds it.

        ``lowercase=None`` reads the vocabulary: uncased vocabularies have no upper-case entries.
        """
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, normalizers, pre_tokenizers

        vocab = _read_wordpiece_vocab(Path(vocab_file))
        specials = {**_WORDPIECE_SPECIALS, **(special_tokens or {})}
        for role in ("unk", "cls", "sep", "pad", "mask"):
            if specials[role] not in vocab:
                raise TokenizerError(f"{vocab_file} lacks the {role} token {specials[role]!r}")
        if lowercase is None:
            lowercase = not any(tok != tok.lower() for tok in vocab if not tok.startswith("["))
            log.info("%s: %s vocabulary detected", vocab_file, "uncased" if lowercase else "cased")
        backend = Backend(models.WordPiece(vocab, unk_token=specials["unk"], max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=handle_chinese_chars,
                                                        strip_accents=strip_accents, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        add_specials(backend, specials, mask_lstrip=False)
        set_bert_template(backend, specials["cls"], specials["sep"])
        return cls(backend, kind="wordpiece", model_max_length=model_max_length, lowercase=lowercase,
                   special_tokens=specials)

    @classmethod
    def from_bpe_files(cls, vocab_file: str | Path, merges_file: str | Path, *, model_max_length: int = 512,
                       special_tokens: dict[str, str] | None = None, add_prefix_space: bool = False) -> "Tokenizer":
        """A RoBERTa byte-level BPE tokenizer from vocab.json + merges.txt (as RobertaTokenizerFast builds it)."""
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, pre_tokenizers

        try:
            bpe = models.BPE.from_file(str(vocab_file), str(merges_file))
        except Exception as exc:
            raise TokenizerError(f"cannot read BPE files {vocab_file} / {merges_file}: {exc}") from exc
        specials = {**_BPE_SPECIALS, **(special_tokens or {})}
        backend = Backend(bpe)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        backend.decoder = decoders.ByteLevel()
        for role in ("cls", "sep"):
            if backend.token_to_id(specials[role]) is None:
                raise TokenizerError(f"{vocab_file} lacks the {role} token {specials[role]!r}")
        add_specials(backend, specials, mask_lstrip=True)
        set_roberta_processing(backend, specials, add_prefix_space)
        return cls(backend, kind="bpe", model_max_length=model_max_length, special_tokens=specials)

    # ----- properties -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def add_tokens(self, tokens: Sequence[Any]) -> int:
        """Add ``tokens`` (``tokenizers.AddedToken``s, or strings: not special, normalised like the text, as
        transformers' ``add_tokens`` takes them) to the vocabulary; returns how many were new. The backend is
        shared state: this waits until no call is encoding (a change under a running call is refused by it)."""
        from tokenizers import AddedToken

        added = [t if isinstance(t, AddedToken) else AddedToken(str(t), normalized=True, special=False)
                 for t in tokens]
        with self._turns.alone():
            return self.backend.add_tokens(added)

    def token_id(self, role: str) -> int | None:
        """Id of a special token by role: "cls", "sep", "pad", "mask", "unk", "bos", "eos"."""
        token = self.special_tokens.get(role)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def pad_token_id(self) -> int:
        pad = self.token_id("pad")
        return 0 if pad is None else pad

    @property
    def mask_token(self) -> str | None:
        return self.special_tokens.get("mask")

    @property
    def mask_token_id(self) -> int | None:
        return self.token_id("mask")

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int | None]:
        return [self.backend.token_to_id(t) for t in tokens]

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (e.g. into a DataLoader's worker processes): the turns stay behind, each copy gets its own."""
        state = dict(self.__dict__)
        del state["_turns"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._turns = _Turns()

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def tokenize(self, text: str) -> list[str]:
        return self.encode(text, add_special_tokens=False, truncation=False).tokens

    # ----- encoding ---------------------------------------------------------------------------
    def _configure(self, max_length: int | None, truncation: str | bool | None, stride: int,
                   padding: str | bool, pad_to_multiple_of: int | None) -> None:
        """The backend's truncation and padding set for the next call; nothing is sent to it where they are those
        of the last call (a served text's tokenisation calls this each time)."""
        key = (max_length, truncation, stride, padding, pad_to_multiple_of)
        if key == self._configured:
            return
        self._configured = None  # until the backend has taken all of them
        if truncation is True:
            truncation = "longest_first"
        if truncation:
            if truncation not in TRUNCATION_STRATEGIES:
                raise InputError(f"truncation must be one of {TRUNCATION_STRATEGIES} or False, found {truncation!r}")
            length = max_length or self.model_max_length
            if length <= 0:
                raise InputError(f"max_length must be positive, found {length}")
            self.backend.enable_truncation(length, stride=stride, strategy=truncation)
        else:
            self.backend.no_truncation()
        if padding is True:
            padding = "longest"
        if padding:
            if padding not in PADDING_STRATEGIES:
                raise InputError(f"padding must be one of {PADDING_STRATEGIES} or False, found {padding!r}")
            self.backend.enable_padding(
                pad_id=self.pad_token_id, pad_type_id=0, pad_token=self.special_tokens.get("pad", "[PAD]"),
                length=(max_length or self.model_max_length) if padding == "max_length" else None,
                pad_to_multiple_of=pad_to_multiple_of,
            )
        else:
            self.backend.no_padding()
        self._configured = key

    def _begin(self, max_length: int | None, truncation: str | bool | None, stride: int, padding: str | bool,
               pad_to_multiple_of: int | None) -> None:
        """The backend set to these truncation and padding settings for a call, until its ``_end``. They are the
        backend's state, shared by every caller, so callers take turns: calls with the settings it has run together
        (two lanes tokenising their batches), and a call with other settings waits until those have finished, then
        sets its own. Otherwise a thread could encode under settings another had just set (a batch asked for at 16
        tokens came back at 102)."""
        key = (max_length, truncation, stride, padding, pad_to_multiple_of)
        turns = self._turns
        with turns.condition:
            turns.wait(lambda: key == self._configured)
            self._configure(*key)
            turns.running += 1

    def _end(self) -> None:
        self._turns.leave()

    def encode(self, text: str, pair: str | None = None, *, max_length: int | None = None,
               truncation: str | bool = "longest_first", padding: str | bool = False, stride: int = 0,
               add_special_tokens: bool = True, return_overflowing: bool = False) -> Encoded:
        """Tokenise one text (or a text pair). Truncates to ``max_length`` (default: the model's maximum)."""
        _check_text(text, "text")
        if pair is not None:
            _check_text(pair, "pair")
        self._begin(max_length, truncation, stride, padding, None)
        try:
            enc = self.backend.encode(text, pair, add_special_tokens=add_special_tokens)
        except Exception as exc:
            raise InputError(f"cannot tokenise this input: {exc}") from exc
        finally:
            self._end()
        return Encoded.from_backend(enc, with_overflow=return_overflowing)

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                     max_length: int | None = None, truncation: str | bool = "longest_first",
                     padding: str | bool = "longest", pad_to_multiple_of: int | None = None,
                     add_special_tokens: bool = True) -> BatchEncoding:
        """Tokenise many texts (in parallel) into a padded batch of tensors."""
        inputs = _batch_inputs(texts, pairs)
        if not inputs:
            raise InputError("encode_batch got no texts")
        # Tensors need one length, so padding=False still pads to the longest (unpadded ids: encode_ids).
        self._begin(max_length, truncation, 0, padding or "longest", pad_to_multiple_of)
        try:
            encs = self._run_batch(inputs, add_special_tokens)
        finally:
            self._end()

        def tensor(attr: str) -> torch.Tensor:
            return torch.from_numpy(np.asarray([getattr(e, attr) for e in encs], dtype=np.int64))

        return BatchEncoding(
            input_ids=tensor("ids"), attention_mask=tensor("attention_mask"), token_type_ids=tensor("type_ids"),
            special_tokens_mask=tensor("special_tokens_mask"), encodings=[Encoded.from_backend(e) for e in encs],
        )

    def encode_ids(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, max_length: int | None = None,
                   truncation: str | bool = "longest_first") -> tuple[list[list[int]], list[list[int]]]:
        """Token ids and type ids of many texts, unpadded: the input of the packed fast path."""
        encodings = self.encode_raw(texts, pairs, max_length=max_length, truncation=truncation)
        return [e.ids for e in encodings], [e.type_ids for e in encodings]

    def encode_raw(self, texts: Sequence[str] | Sequence[Sequence[str]], pairs: Sequence[str] | None = None, *,
                   max_length: int | None = None, truncation: str | bool = "longest_first", stride: int = 0,
                   add_special_tokens: bool = True, is_pretokenized: bool = False) -> list[Any]:
        """The `tokenizers` library's own Encoding objects, unpadded (with ``overflowing`` windows of
        ``stride`` overlapping tokens when truncating): for callers that need speed over convenience.

        ``is_pretokenized``: each text is a list of words (e.g. a CoNLL sentence); word ids then index
        those words, and offsets are relative to each word."""
        inputs = _batch_inputs(texts, pairs, is_pretokenized)
        self._begin(max_length, truncation, stride, False, None)
        try:
            return self._run_batch(inputs, add_special_tokens, is_pretokenized, unpadded=True)
        finally:
            self._end()

    def _run_batch(self, inputs: list[Any], add_special_tokens: bool, is_pretokenized: bool = False, *,
                   unpadded: bool = False) -> list[Any]:
        """The backend's Encodings of ``inputs``. One ``unpadded`` input (a served text) is encoded by itself: the
        same Encoding, without the backend's thread pool (a padded batch of one keeps the batch call, whose padding
        rules, ``pad_to_multiple_of`` included, the single call does not apply)."""
        alone = unpadded and len(inputs) == 1
        try:
            if alone:
                text, pair = inputs[0] if isinstance(inputs[0], tuple) else (inputs[0], None)
                return [self.backend.encode(text, pair, is_pretokenized=is_pretokenized,
                                            add_special_tokens=add_special_tokens)]
            return self.backend.encode_batch(inputs, is_pretokenized=is_pretokenized,
                                             add_special_tokens=add_special_tokens)
        except Exception as exc:
            raise InputError(f"cannot tokenise this {'text' if alone else 'batch'}: {exc}") from exc

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None,
                 **kwargs: Any) -> BatchEncoding:
        if isinstance(texts, str):
            texts = [texts]
            pairs = [pairs] if isinstance(pairs, str) else pairs
        return self.encode_batch(texts, pairs, **kwargs)

    # ----- saving -----------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json, the vocabulary files and tokenizer_config.json (loadable by transformers)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._turns.alone():  # no call may be encoding under the settings cleared here
            self.backend.no_truncation()
            self.backend.no_padding()
            self._configured = None
            self.backend.save(str(directory / "tokenizer.json"))
        if self.kind in ("wordpiece", "bpe"):
            self.backend.model.save(str(directory))  # vocab.txt, or vocab.json + merges.txt
        specials = {f"{role}_token": token for role, token in self.special_tokens.items()}
        tokenizer_class = self.tokenizer_class or _CLASS_OF_KIND.get(self.kind)
        settings: dict[str, Any] = {"model_max_length": self.model_max_length, **specials, **self.options}
        if tokenizer_class:
            settings["tokenizer_class"] = tokenizer_class
        if self.lowercase is not None:
            settings["do_lower_case"] = self.lowercase
        (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")
        return directory


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _batch_inputs(texts: Sequence[Any], pairs: Sequence[str] | None, is_pretokenized: bool = False) -> list[Any]:
    """Checked inputs for the backend's batch call: texts (or word lists), or (text, pair) tuples."""
    if isinstance(texts, str):
        raise InputError("expected a list of texts; for one text use encode()")
    for index, text in enumerate(texts):
        if is_pretokenized:
            if isinstance(text, str) or not all(isinstance(word, str) for word in text):
                raise InputError(f"texts[{index}] must be a list of words (strings) when is_pretokenized=True")
            if not text:
                raise InputError(f"texts[{index}] is an empty list of words")
        else:
            _check_text(text, f"texts[{index}]")
    if pairs is None:
        return list(texts)
    if len(pairs) != len(texts):
        raise InputError(f"got {len(texts)} texts but {len(pairs)} pairs; they must be the same length")
    for index, text in enumerate(pairs):
        _check_text(text, f"pairs[{index}]")
    return list(zip(texts, pairs))


def _check_text(text: Any, what: str) -> None:
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, found {type(text).__name__}")


def _read_wordpiece_vocab(path: Path) -> dict[str, int]:
    if not path.is_file():
        raise TokenizerError(f"vocabulary file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{path} is not UTF-8 text: {exc}") from exc
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {token.rstrip("\r"): index for index, token in enumerate(lines)}  # a repeated token keeps its last id
    if not vocab:
        raise TokenizerError(f"{path} is empty")
    return vocab


def _read_settings(directory: Path) -> dict[str, Any]:
    """tokenizer_config.json and special_tokens_map.json, flattened to what encoderkit uses; the tokenizer
    class is the one tokenizer_config.json names, else the one transformers takes from config.json's model_type."""
    settings: dict[str, Any] = {}
    specials: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
        for key, value in data.items():
            if key.endswith("_token") and key[:-6] in ("cls", "sep", "pad", "unk", "mask", "bos", "eos"):
                if isinstance(value, dict):
                    value = value.get("content")
                if isinstance(value, str):
                    specials[key[:-6]] = value
            elif key in ("model_max_length", "do_lower_case", "strip_accents", "tokenize_chinese_chars",
                         "add_prefix_space", "split_by_punct", "unk_id", "tokenizer_class"):
                settings[key] = value
    if not isinstance(settings.get("tokenizer_class"), str):
        settings.pop("tokenizer_class", None)
    if "tokenizer_class" not in settings and (directory / "config.json").is_file():
        try:
            model_type = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            model_type = None  # the model loader reports a broken config.json
        if model_type in _CLASS_OF_MODEL_TYPE:
            settings["tokenizer_class"] = _CLASS_OF_MODEL_TYPE[model_type]
    if isinstance(settings.get("model_max_length"), float):
        settings["model_max_length"] = int(min(settings["model_max_length"], _HUGE_LENGTH))
    settings["special_tokens"] = specials
    return settings
