"""Fill-mask: the most probable tokens for each mask token of a text."""
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
        self.model = model.eval()
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, allow_pickle: bool = False) -> "FillMask":
        from ..modeling.models import load_model
        from ..config import EncoderConfig
        from ..hub import resolve_model
        from ..modeling.models import task_from_architectures

        resolved = resolve_model(path)
        config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
        task = task_from_architectures(config)
        if task not in ("masked-lm", "pretraining"):
            raise InputError(f"{resolved.root} is a {task} model ({', '.join(config.architectures or ['no architectures'])})"
                             " without a trained MLM head; fill-mask needs a *ForMaskedLM or *ForPreTraining checkpoint,"
                             " e.g. the output of `encoderkit pretrain`")
        return cls(load_model(resolved.root, task=task, allow_pickle=allow_pickle), Tokenizer.from_pretrained(resolved.tokenizer_dir))

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
        output = self.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        probabilities = output.logits.float().softmax(dim=-1)
        for row in range(len(texts)):
            per_mask = []
            for position in (batch.input_ids[row] == mask_id).nonzero().flatten().tolist():
                top = probabilities[row, position].topk(min(top_k, probabilities.shape[-1]))
                predictions = []
                for score, token_id in zip(top.values.tolist(), top.indices.tolist()):
                    filled = batch.input_ids[row].clone()
                    filled[position] = token_id
                    real = filled[batch.attention_mask[row].bool()]
                    predictions.append(Prediction(self.tokenizer.convert_ids_to_tokens([token_id])[0] or "",
                                                  token_id, score, self.tokenizer.decode(real.tolist())))
                per_mask.append(predictions)
            results.append(per_mask)
        return results
