"""Fill-mask: the most probable tokens for each mask token of a text.

The encoder runs on the engine (packed batches, the native kernel for short ones), like every other pipeline, and the
MLM head's vocabulary projection only at the mask positions: a text of 20 tokens with one mask projects one row
onto the vocabulary, not 20."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..tokenizer import Tokenizer


@dataclass
class Prediction:
    token: str
    token_id: int
    score: float  # probability
    sequence: str  # the text with this token in place of the mask


class FillMask:
    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer) -> None:
        if not hasattr(model, "mlm_head"):
            raise InputError("fill-mask needs a model with a masked-language-model head")
        if tokenizer.mask_token_id is None:
            raise InputError("the tokenizer has no mask token")
        from ..engine import engine_for

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.engine = engine_for(model, "fp32")

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, allow_pickle: bool = False) -> "FillMask":
        from ..modeling.models import load_model
        from ..config import EncoderConfig
        from ..io.hub import resolve_model
        from ..modeling.models import task_from_architectures

        resolved = resolve_model(path)
        config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
        task = task_from_architectures(config)
        if task not in ("masked-lm", "pretraining"):
            raise InputError(f"{resolved.root} is a {task} model ({', '.join(config.architectures or ['no architectures'])})"
                             " without a trained MLM head; fill-mask needs a *ForMaskedLM or *ForPreTraining checkpoint,"
                             " e.g. the output of `encoderkit pretrain`")
        return cls(load_model(resolved, task=task, allow_pickle=allow_pickle), Tokenizer.from_pretrained(resolved.tokenizer_dir))

    @torch.inference_mode()
    def __call__(self, texts: str | list[str], top_k: int = 5) -> list[list[list[Prediction]]]:
        """For each text, for each mask in it, the top-k predictions (most probable first)."""
        if isinstance(texts, str):
            texts = [texts]
        if top_k <= 0:
            raise InputError(f"top_k must be positive, found {top_k}")
        mask_id, mask_token = self.tokenizer.mask_token_id, self.tokenizer.mask_token
        # Untruncated: truncation could cut the mask off (and then the error would say there is none).
        batch = self.tokenizer.encode_batch(texts, truncation=False)
        limit = self.model.config.max_sequence_length
        results = []
        for row, text in enumerate(texts):
            length = int(batch.attention_mask[row].sum())
            if length > limit:
                raise InputError(f"text {row} is {length} tokens long, special tokens included; this "
                                 f"{self.model.config.model_type} model reads at most {limit} "
                                 f"(max_position_embeddings): shorten it around its {mask_token}: {text[:80]!r}")
            if mask_id not in batch.input_ids[row].tolist():
                raise InputError(f"text {row} has no {mask_token} token: {text[:80]!r}")
        rows = [batch.input_ids[row][batch.attention_mask[row].bool()].tolist() for row in range(len(texts))]
        types = None if batch.token_type_ids is None else \
            [batch.token_type_ids[row][batch.attention_mask[row].bool()].tolist() for row in range(len(texts))]
        probabilities: list[torch.Tensor] = [torch.empty(0)] * len(texts)  # per text: (its masks, vocab)
        for indices, states, packing in self.engine.run(rows, types):
            starts = packing.cu_seqlens[:-1].tolist()
            picked = [starts[k] + position for k, i in enumerate(indices.tolist())
                      for position, token in enumerate(rows[i]) if token == mask_id]
            logits = self.model.mlm_head(states[picked]).float().softmax(dim=-1)
            counts = [rows[i].count(mask_id) for i in indices.tolist()]
            for i, part in zip(indices.tolist(), logits.split(counts)):
                probabilities[i] = part
        for row in range(len(texts)):
            per_mask = []
            positions = [position for position, token in enumerate(rows[row]) if token == mask_id]
            for position, distribution in zip(positions, probabilities[row]):
                top = distribution.topk(min(top_k, distribution.shape[-1]))
                predictions = []
                for score, token_id in zip(top.values.tolist(), top.indices.tolist()):
                    filled = list(rows[row])
                    filled[position] = token_id
                    predictions.append(Prediction(self.tokenizer.convert_ids_to_tokens([token_id])[0] or "",
                                                  token_id, score, self.tokenizer.decode(filled)))
                per_mask.append(predictions)
            results.append(per_mask)
        return results
