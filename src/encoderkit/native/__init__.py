"""A native kernel for the layers of a post-norm encoder: the single-text (serving) case, and batches of short texts.

Why: for one short text, a PyTorch forward of all-MiniLM-L6-v2 spends more time between its ops than in them: the
least PyTorch loop over pre-packed products is slower than ONNX Runtime's whole model, though its matrix products
alone are not (bench/latency_floor.py): each product reads its weights from memory once for a handful of rows, and
about a hundred Python calls and dispatches sit around them. ``small_batch.cpp`` runs every layer in one call:
weights packed once into panels read front to back, bias, activation and residual applied in registers, attention
per sequence and head, LayerNorm, on torch's own OpenMP team (the caller's torch thread count, or one thread where
that is faster now: ``native.team``). On AVX2 (256-bit builds) larger fp32 batches of short texts run here too:
its products, taking the rows in chunks that stay in the core's cache, were faster than oneDNN's AVX2 ones
(``FP32_MAX_TOKENS``).

int8 (``dtype="int8"``): the linear layers ``for_inference`` made int8 (``modeling.inference.Int8Prepacked``: int8
weights per output channel, SmoothQuant factors from the accuracy guard's calibration) run here as int8 products
too, with the same arithmetic: each product's input rows, divided by the smoothing, quantised to uint8 with each
row's own scale and zero point (its minimum and maximum), then summed exactly in 32 bits by 8-bit dot-product
instructions (AVX512-VNNI, or AVX-VNNI on 256-bit vectors) and scaled back to fp32. Without those instructions see
below. The guard's calibration itself runs the PyTorch layers, which observe and
measure. For one short text it is several times faster than PyTorch's int8 kernels (bench/latency_floor.py).

It applies, through ``EncoderModel.run`` (the one forward; this is a kernel switch like SDPA's), where all of these
hold: the model was prepared by ``for_inference`` (in fp32, int8 layers or not, or in bf16: see below), runs on the
CPU with no gradient, returns only its last states, its layers are post-norm with absolute positions (BERT, RoBERTa,
DistilBERT, ALBERT, ELECTRA; MPNet too, whose attention adds a learned bias by relative position: its table is laid
out once per span, ``bias_layout``; not ModernBERT or DeBERTa), its activation is GELU (erf or tanh) or ReLU, and
the batch is packed in row order and has at most ``MAX_TOKENS`` tokens, or more whose sequences are all short: int8
ones of up to ``BATCH_MAX_TOKENS`` tokens (the engine's default budget for embedding) of sequences of at most
``int8_max_length()`` tokens, fp32 ones of up to ``fp32_max_tokens()`` tokens (``BATCH_MAX_TOKENS`` on 256-bit
builds) of at most ``attention_max_length()`` (past it SDPA's attention is the faster one). Everything else runs the
PyTorch layers as before.

bf16 (``dtype="bf16"``, and ``"auto"`` where it means bf16): batches of at most ``MAX_TOKENS`` tokens run here too,
in fp32, from the fp32 parameters (for_inference keeps them beside its bf16 packs), and larger ones keep their bf16
products: at this size the kernel's fp32 layers are faster than bf16 products, and exact (on CPUs with AVX512-BF16
and with AMX: bench/latency_floor.py). So a text's bf16 vector depends, within bf16's error (about 1e-3), on
whether its batch was small enough for the kernel.

int8 without VNNI (AVX2, AVX-512 without VNNI): the kernel adds pairs of u8 x s8 products into 16 bits
(vpmaddubsw), as PyTorch's int8 kernels do there, which is exact for the 7-bit weight codes int8 weights get on
such CPUs (``modeling.inference.int8_weight_levels``). Where the kernel cannot sum a model's codes exactly (no int8
instructions, or 8-bit codes against 16-bit pair sums), an int8 model's batches of at most ``MAX_TOKENS`` tokens
run here in fp32, exact and faster than PyTorch's int8 kernels on so few rows, and larger ones run PyTorch's int8
kernels; this is logged once. The int8 guard's calibration always measures the int8 layers (``calibrating``).

Its attention also runs alone (``attention``) as the PyTorch layers' inference attention for the fp32 batches that
the whole kernel does not take (more than ``fp32_max_tokens()`` tokens) whose sequences have at most
``attention_max_length()`` tokens: one call for the packed batch, where SDPA takes one call per run of equal lengths,
each with its own set-up.

The same library holds kernels of the training step (``training.cpp``): dropout (Philox4x32-10 masks drawn and
applied in one pass, drawn again for the backward pass; ``modeling.dropout``), attention's probabilities (softmax and
that dropout in one pass, and their gradient; ``modeling.attention``), a post-norm layer's residual add, dropout and
LayerNorm in one pass, and its gradient (``modeling.dropout.add_norm``), and the gradients' total norm
(``gradient_norm``).

Built at first use with the machine's C++ compiler (``g++``, or ``$CXX``) for the CPU it runs on (``-march=native``)
into ``$ENCODERKIT_CACHE`` (default ``~/.cache/encoderkit``)/native/, a few seconds once, and checked when loaded
(``native.loader``: the cache key, a failed build remembered, the ABI check). Without a compiler, or with
``ENCODERKIT_NATIVE=0``, the PyTorch layers run, with the same results to fp32 rounding. ``status()`` says which and
why. ``ENCODERKIT_NATIVE_FLAGS`` adds compiler flags (``-mno-avx512f``: the 256-bit build on an AVX-512 CPU).
"""
from __future__ import annotations

import ctypes
import logging
import operator
import threading
import time

import torch
from torch import nn

from ..modeling.registration import parameters_registered, replaced
from ..precision import EXACT_WEIGHT_LEVELS, PAIR_SUM_WEIGHT_LEVELS
from .loader import Embedding as _Embedding, Layer as _Layer, Linear as _Linear, library, status
from .team import TeamSize

log = logging.getLogger(__name__)
_VERSION = operator.attrgetter("_version")

# Batches of at most this many tokens take the native kernel in every dtype it runs (bf16 ones in fp32), where it beat
# the PyTorch layers (bench/native_phases.py).
MAX_TOKENS = 64
# Larger batches, up to BATCH_MAX_TOKENS tokens, take it where each of their sequences is short enough. int8: at most
# int8_max_length() tokens, where the kernel beat PyTorch's int8 kernels. That length depends on the kernel's int8
# products (INT8_MAX_LENGTHS, by the largest weight code they sum exactly): with VNNI's exact 8-bit sums the kernel was
# the faster one up to the longest sequences an embedding model usually takes, and so it was where it adds pairs of
# products in 16 bits, on a real AVX2 EPYC (Zen 3): faster than PyTorch's int8 kernels at every length up to 256, and
# an embedding job fastest with that limit (bench/int8_lengths.py, BENCHMARKS.md). Two CPUs that imitated the tier had
# disagreed (a Zen 4 class EPYC: 64, a Zen 5: 256). AVX512BW without VNNI is unmeasured and shares the pair sums'
# entry. The cap is the engine's default budget for embedding (precision.TOKEN_BUDGETS); it bounds the
# scratch each calling thread keeps.
BATCH_MAX_TOKENS = 2048
# fp32: batches of up to this many tokens, by the build's vector lanes (8: 256-bit, 16: 512-bit), whose sequences have
# at most attention_max_length() tokens. On 256-bit builds (AVX2) the kernel's products, in chunks of rows that stay
# in the core's cache, beat oneDNN's AVX2 ones, and the kernel was faster end to end; on 512-bit builds they were even
# with oneDNN's AVX-512 ones and end to end it was no faster, so the PyTorch layers keep those batches
# (bench/kernel_batches.py, BENCHMARKS.md).
FP32_MAX_TOKENS = {8: BATCH_MAX_TOKENS, 16: MAX_TOKENS}
INT8_MAX_LENGTHS = {EXACT_WEIGHT_LEVELS: 256, PAIR_SUM_WEIGHT_LEVELS: 256}
# The PyTorch layers' inference attention (``attention``) runs here where a batch's longest sequence has at most this
# many tokens, by the build's vector lanes (8: 256-bit, 16: 512-bit): up to there the kernel's attention beat SDPA's,
# and past it SDPA's blocked kernel caught up (bench/attention_lengths.py, BENCHMARKS.md).
ATTENTION_MAX_LENGTHS = {8: 256, 16: 512}
ACTIVATIONS = {"gelu": 0, "relu": 1, "gelu_new": 2, "gelu_fast": 2, "gelu_pytorch_tanh": 2}

def sum_of_squares(tensors: list[torch.Tensor]) -> float | None:
    """The sum of the squares of every element of ``tensors`` (contiguous fp32 CPU tensors), in double, in one pass
    on torch's threads (``ek_sum_squares``); None where the library is not built."""
    lib = library()
    if lib is None:
        return None
    pointers = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
    sizes = (ctypes.c_int64 * len(tensors))(*(t.numel() for t in tensors))
    return float(lib.ek_sum_squares(pointers, sizes, len(tensors), torch.get_num_threads()))


def adamw_rows(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               active: torch.Tensor, touched: torch.Tensor, *, decay: float, betas: tuple[float, float],
               step_size: float, bc2_sqrt: float, eps: float, inv_scale: float) -> None:
    """AdamW's step of a table (``ek_adamw_rows``) whose gradient is zero outside the rows marked in ``touched``
    (uint8, one a row); ``active`` marks the rows touched at an earlier step (m and v are zero in the others). All
    contiguous fp32 CPU tensors of the same 2-D shape but the marks. The caller checks ``library()`` first."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the native AdamW step is not available here: {status()}")
    rows, width = param.shape
    lib.ek_adamw_rows(param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), rows, width,
                      active.data_ptr(), touched.data_ptr(), decay, betas[0], betas[1], step_size, bc2_sqrt, eps,
                      inv_scale, torch.get_num_threads())


def attention(qkv: torch.Tensor, starts: torch.Tensor, heads: int, scale: float, longest: int,
              bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """Self-attention of packed sequences, for the PyTorch layers' inference: (tokens, 3 * hidden) rows of query |
    key | value, heads side by side in each, -> (tokens, hidden), each sequence (rows ``starts[s]`` to
    ``starts[s + 1]``, ``longest`` rows at most) attending within itself, softmax(q k^T * scale + bias) v, ``bias``
    the position bias laid out by ``bias_layout`` (MPNet's) or none. The kernel's own attention (``attention_part``
    in small_batch.cpp), on torch's threads: one call for the whole batch, where SDPA takes one call per run of equal
    lengths. None where it does not apply (no library, not fp32 on the CPU, a gradient to keep, a sequence longer
    than ``attention_max_length()``, a bias table not for these heads or this length); the caller then runs SDPA."""
    lib = library()
    if lib is None or qkv.dtype != torch.float32 or qkv.device.type != "cpu" or qkv.requires_grad \
            or qkv.dim() != 2 or qkv.shape[1] % (3 * heads) or longest > _for_build(ATTENTION_MAX_LENGTHS, lib):
        return None
    arguments = _bias_arguments(bias, heads, longest, lib)
    if arguments is None:
        return None
    qkv = qkv.contiguous()
    hidden = qkv.shape[1] // 3
    out = qkv.new_empty(qkv.shape[0], hidden)
    starts = starts.to(torch.int64).contiguous()
    code = lib.ek_attention(qkv.data_ptr(), out.data_ptr(), starts.data_ptr(), starts.shape[0] - 1, heads,
                            hidden // heads, scale, *arguments, torch.get_num_threads())
    return out if code == 0 else None  # -2: a sequence longer than ``longest`` said, past the bias table


def bias_layout(position_bias: nn.Module, longest: int) -> torch.Tensor | None:
    """An attention bias by relative position (``modeling.attention.RelativePositionBias``: MPNet's) laid out for
    the kernel, for sequences of up to ``longest`` tokens: (heads, 2 * span - 1 + lanes), span the power of two
    from ``longest`` (at least 16, so that few lengths share few layouts), one row a head by query - key + span - 1,
    then the build's vector lanes of zeros (read past the last query, unused). None where the library is not
    built."""
    lib = library()
    if lib is None:
        return None
    with torch.no_grad():
        return position_bias.by_distance(_bias_span(longest), pad=lib.ek_vector_width()).float().contiguous()


def _bias_span(longest: int) -> int:
    """The span of ``bias_layout``'s table for sequences of up to ``longest`` tokens."""
    return max(16, 1 << (max(longest, 1) - 1).bit_length())


def _bias_arguments(bias: torch.Tensor | None, heads: int, longest: int, lib: ctypes.CDLL) -> tuple | None:
    """``ek_encode``'s and ``ek_attention``'s bias, row length and centre for a ``bias_layout`` table (null, 0, 0
    without one), or None where the table does not fit: not fp32 on the CPU, not a row a head, too short."""
    if bias is None:
        return None, 0, 0
    width = lib.ek_vector_width()
    center = (bias.shape[-1] - width - 1) // 2
    if bias.dtype != torch.float32 or bias.device.type != "cpu" or bias.dim() != 2 or bias.shape[0] != heads \
            or not bias.is_contiguous() or center < longest - 1:
        return None
    return bias.data_ptr(), bias.shape[1], center


def attention_max_length() -> int:
    """The longest sequence a batch may hold for its attention to run here (``ATTENTION_MAX_LENGTHS``, by this
    build's vector lanes); 0 where the library is not built."""
    lib = library()
    return 0 if lib is None else _for_build(ATTENTION_MAX_LENGTHS, lib)


def _for_build(table: dict[int, int], lib: ctypes.CDLL) -> int:
    """``table``'s entry for the vector lanes ``lib`` was built for (8: 256-bit, 16: 512-bit), else its smallest."""
    return table.get(lib.ek_vector_width(), min(table.values()))


def fp32_max_tokens() -> int:
    """The most tokens an fp32 batch may have to run on the kernel (``FP32_MAX_TOKENS``, by this build's vector
    lanes); ``MAX_TOKENS`` where the library is not built."""
    lib = library()
    return MAX_TOKENS if lib is None else _for_build(FP32_MAX_TOKENS, lib)


def int8_weight_limit() -> int:
    """The largest weight code the kernel's int8 product sums exactly: 127 with VNNI, 63 where it adds pairs of
    products in 16 bits (AVX2, AVX512BW), 0 where it has no int8 product."""
    lib = library()
    return {0: 0, 1: EXACT_WEIGHT_LEVELS, 2: PAIR_SUM_WEIGHT_LEVELS}[lib.ek_int8()] if lib is not None else 0


def int8_max_length() -> int:
    """The longest sequence an int8 batch of more than ``MAX_TOKENS`` tokens may hold to run on the kernel, by the
    kernel's int8 products here (``INT8_MAX_LENGTHS``)."""
    return INT8_MAX_LENGTHS.get(int8_weight_limit(), min(INT8_MAX_LENGTHS.values()))


def int8_available() -> bool:
    """Whether the kernel runs int8 layers here: with VNNI for any codes, with AVX2 or AVX512BW for the 7-bit codes
    that int8 weights get on such CPUs; elsewhere an int8 model's small batches run the kernel in fp32."""
    lib = library()
    return lib is not None and bool(lib.ek_int8())


def eligible(encoder: nn.Module) -> str | None:
    """None where ``encoder``'s layers can run natively, else the reason they cannot."""
    config = encoder.config
    if config.is_pre_norm or encoder.final_norm is not None:
        return "pre-norm layers (ModernBERT, EuroBERT)"
    if encoder.rotary is not None or encoder.relative is not None or config.pos_att_type:
        return "rotary or relative positions"
    if config.kv_heads != config.num_attention_heads:
        return "grouped-query attention"
    if config.family.norm != "layer" or not config.family.embedding_norm:
        return "norms other than LayerNorm"
    if encoder.conv is not None:
        return "a convolution beside the first layer"
    for layer in encoder.layers:
        if layer.glu or layer.activation.name not in ACTIVATIONS:
            return f"the activation {layer.activation.name}{' (GLU)' if layer.glu else ''}"
        if layer.attention.window_half is not None:
            return "sliding-window attention"
        if not isinstance(layer.attention_norm, nn.LayerNorm):
            return "a layer without its attention norm"
    return None


class NativeEncoder:
    """An encoder's embeddings and layers laid out for ``small_batch.cpp``, rebuilt when a parameter or an int8
    product's codes change (as ``Prepacked``). Embeddings with a projection (ALBERT, ELECTRA's small sizes) run in
    PyTorch first. A linear layer that ``for_inference`` made int8 (``Int8Prepacked``) runs in int8 here too, from
    its codes, scales and SmoothQuant factors; the others in fp32."""

    def __init__(self, encoder: nn.Module, lib: ctypes.CDLL, plan) -> None:
        from ..modeling.inference import Int8Prepacked, int8_weight_levels

        self.encoder, self.lib = encoder, lib
        self.width = lib.ek_vector_width()
        self.versions: int | None = None  # the sum of the sources' version counters when the layout was made
        self.registered = 0  # ``parameters_registered()`` when the sources were last seen to be the encoder's
        self.lock = threading.Lock()
        self.ran = False  # whether a batch has taken the kernel (``kernel_of``)
        self.team = TeamSize()  # the threads of each call (``native.team``)
        self.sources: list[torch.Tensor] = []
        self.codes: list[torch.Tensor] = []  # each int8 product's codes the layout was made from
        self.tensors: list[torch.Tensor] = []
        self.layers = None
        config = encoder.config
        self.hidden, self.heads = config.hidden_size, config.num_attention_heads
        self.inter = config.intermediate_size
        self.eps = float(config.layer_norm_eps)
        self.scale = float(encoder.layers[0].attention.head_dim) ** -0.5
        self.activation = ACTIVATIONS[encoder.layers[0].activation.name]
        self.schedule = encoder.layer_schedule()
        self.native_embeddings = encoder.embeddings.projection is None  # else not of the hidden size
        self.position_bias = encoder.position_bias  # MPNet's attention bias by relative position, or None
        self.bias_tables: dict[int, torch.Tensor] = {}  # its layout for the kernel, by span (``_bias_table``)
        self.tables: dict[str, int | float | None] = {}
        # (layer, product) -> the int8 product for_inference made, where it made one
        made = {(index, name): product for index, products in enumerate(plan.layers)
                for name, product in products.items() if isinstance(product, Int8Prepacked)}
        self.quantized = list(made.values())  # every int8 product, whether it runs here or not (``calibrating``)
        # Where the kernel cannot sum the codes exactly (no int8 product, or 8-bit codes against its 16-bit pair
        # sums), it runs an int8 model's small batches in fp32 (see the module doc)
        self.int8_in_fp32 = bool(made) and int8_weight_levels() > int8_weight_limit()
        self.int8 = {} if self.int8_in_fp32 else made
        self.fp32 = plan.dtype == torch.float32 and not made  # an fp32 model (not bf16, not int8 run in fp32)

    def calibrating(self) -> bool:
        """Whether an int8 product is being calibrated or measured (``quantization.measure_int8``): then the
        PyTorch layers run, which observe and measure."""
        return any(p.observing or p.errors is not None for p in self.quantized)

    def _vector(self, value: torch.Tensor | None, size: int, fill: float = 0.0) -> torch.Tensor:
        return _padded(value, size, self.width, fill)

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None, int8=None) -> list[torch.Tensor | None]:
        if int8 is None:
            return _fp32_linear(self.lib, weight, bias)
        return _int8_linear(self.lib, int8.quantized, int8.scales, int8.bias, int8.inverse_smoothing)

    def _parameters(self) -> list[torch.Tensor]:
        bias = [] if self.position_bias is None else list(self.position_bias.parameters())
        return list(self.encoder.layers.parameters()) + list(self.encoder.embeddings.parameters()) + bias

    def _bias_table(self, longest: int) -> torch.Tensor:
        """The position bias laid out for sequences of up to ``longest`` tokens (``bias_layout``), made once per
        span and kept until the weights change (``_rebuild``)."""
        span = _bias_span(longest)
        table = self.bias_tables.get(span)
        if table is None:
            table = self.bias_tables[span] = bias_layout(self.position_bias, longest)
        return table

    def _stale(self) -> bool:
        """Whether a parameter changed in place or was replaced on its module (``parameters_registered``), or an
        int8 product has new codes (re-quantised, or smoothed: then its ``versions`` are None until it
        re-quantises)."""
        # version counters only grow, so their sum changes whenever one does (half the time of a tuple of them)
        if self.versions is None or self.versions != sum(map(_VERSION, self.sources)):
            return True
        if self.registered != parameters_registered():  # a parameter replaced somewhere: were any of these?
            if replaced(self.sources, self._parameters()):
                return True
            self.registered = parameters_registered()
        return any(p.versions is None or p.quantized is not c for p, c in zip(self.int8.values(), self.codes))

    def _refresh(self) -> None:
        """The layout made (again) where it is stale; under a lock, so that threads whose first calls arrive together
        (an embedding job's lanes, a server's workers) make it once, and the others wait for it."""
        if not self._stale():
            return
        with self.lock:
            if self._stale():
                self._rebuild()

    def _rebuild(self) -> None:
        encoder = self.encoder
        self.registered = parameters_registered()
        self.sources = self._parameters()
        versions = sum(map(_VERSION, self.sources))
        for product in self.int8.values():
            product._refresh()
        self.codes = [p.quantized for p in self.int8.values()]
        self.bias_tables = {}
        per_layer, tensors = [], []
        h, inter = self.hidden, self.inter
        with torch.no_grad():
            for index, layer in enumerate(encoder.layers):
                attention = layer.attention
                if hasattr(attention, "qkv"):
                    qkv_weight, qkv_bias = attention.qkv.weight, attention.qkv.bias
                else:
                    qkv_weight = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])
                    qkv_bias = None if attention.query.bias is None else \
                        torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
                weights = {"qkv": (qkv_weight, qkv_bias), "output": (attention.output.weight, attention.output.bias),
                           "ffn_in": (layer.ffn_in.weight, layer.ffn_in.bias),
                           "ffn_out": (layer.ffn_out.weight, layer.ffn_out.bias)}
                linears = {}
                for name, (weight, bias) in weights.items():
                    parts = self._linear(weight, bias, self.int8.get((index, name)))
                    tensors += [t for t in parts if t is not None]
                    linears[name] = _Linear(*[None if t is None else t.data_ptr() for t in parts])
                norms = [self._vector(layer.attention_norm.weight, h, 1.0), self._vector(layer.attention_norm.bias, h),
                         self._vector(layer.ffn_norm.weight, h, 1.0), self._vector(layer.ffn_norm.bias, h)]
                tensors += norms
                per_layer.append(_Layer(**linears, attention_norm_weight=norms[0].data_ptr(),
                                        attention_norm_bias=norms[1].data_ptr(), ffn_norm_weight=norms[2].data_ptr(),
                                        ffn_norm_bias=norms[3].data_ptr()))
            if self.native_embeddings:
                embeddings = encoder.embeddings
                tables = [embeddings.word.weight.detach().float().contiguous(),
                          None if embeddings.position is None else embeddings.position.weight.detach().float().contiguous(),
                          None if embeddings.token_type is None else
                          embeddings.token_type.weight.detach().float().contiguous(),
                          self._vector(embeddings.norm.weight, h, 1.0), self._vector(embeddings.norm.bias, h)]
                tensors += [t for t in tables if t is not None]
                pointers = [None if t is None else t.data_ptr() for t in tables]
                self.tables = dict(zip(("word", "position", "segment", "norm_weight", "norm_bias"), pointers),
                                   words=tables[0].shape[0], places=0 if tables[1] is None else tables[1].shape[0],
                                   segments=0 if tables[2] is None else tables[2].shape[0],
                                   eps=float(embeddings.norm.eps))
        self.tensors = tensors  # alive as long as the layout points at them
        self.layers = (_Layer * len(self.schedule))(*[per_layer[index] for index in self.schedule])
        self.versions = versions

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 position_ids: torch.Tensor | None, starts: torch.Tensor,
                 longest: int | None = None) -> torch.Tensor | None:
        """(tokens,) ids laid out from ``starts`` ((sequences + 1,) first rows) -> the last layer's (tokens, hidden)
        states; None where an id lies outside its table (the PyTorch path then says which). ``longest``: the longest
        sequence's tokens where the caller knows it (the packing does), else found from ``starts`` where needed."""
        self._refresh()
        self.ran = True
        # this call's layout and the tensors it points into, held until the kernel returns: a layout made again
        # meanwhile (weights changed by another thread) replaces them without freeing these
        layers, keep = self.layers, [self.tensors]
        tokens = input_ids.shape[0]
        if self.native_embeddings:
            x = torch.empty(tokens, self.hidden, dtype=torch.float32)
            e = _Embedding(**self.tables)  # one per call: calls from several threads share the plan
            for field, ids in (("ids", input_ids), ("positions", position_ids), ("types", token_type_ids)):
                if ids is not None:
                    ids = ids.to(torch.int64).contiguous()
                    keep.append(ids)
                setattr(e, field, None if ids is None else ids.data_ptr())
            embedding = ctypes.byref(e)
        else:
            x = self.encoder.embeddings(input_ids, token_type_ids, position_ids).contiguous()
            embedding = None
        starts = starts.to(torch.int64).contiguous()
        table = None
        if self.position_bias is not None:
            longest = int((starts[1:] - starts[:-1]).max()) if longest is None else longest
            table = self._bias_table(longest)
            keep.append(table)
        bias, stride, center = _bias_arguments(table, self.heads, longest or 0, self.lib)  # fits: made for it
        threads = self.team.pick(tokens, torch.get_num_threads())  # fewer where other processes hold the cores
        started = time.perf_counter()
        code = self.lib.ek_encode(x.data_ptr(), embedding, tokens, self.hidden, self.heads, self.inter,
                                  len(self.schedule), ctypes.byref(layers), starts.data_ptr(),
                                  starts.shape[0] - 1, self.activation, self.eps, self.scale, bias, stride, center,
                                  threads)  # a ``longest`` said too short for the batch: -2, nothing computed
        self.team.record(tokens, threads, time.perf_counter() - started)
        return x if code == 0 else None


def _int8_linear(lib: ctypes.CDLL, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 inverse: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The tensors of an int8 ``_Linear``: (N, K) int8 ``codes`` packed four k at a time, the bias and the (N,)
    weight ``scales`` padded to the panels' width, each column's sum of codes, the (K,) inverse smoothing or None."""
    width = lib.ek_vector_width()
    rows, cols = codes.shape
    padded = -(-rows // width) * width
    packed = torch.empty(padded * (-(-cols // 4) * 4), dtype=torch.int8)
    sums = torch.zeros(padded, dtype=torch.int32)
    lib.ek_pack_int8(codes.to(torch.int8).contiguous().data_ptr(), packed.data_ptr(), sums.data_ptr(), rows, cols)
    return [packed, _padded(bias, rows, width), _padded(scales, rows, width), sums,
            None if inverse is None else inverse.float().contiguous()]


def _padded(value: torch.Tensor | None, size: int, width: int, fill: float = 0.0) -> torch.Tensor:
    """(size,) ``value`` (None: all ``fill``) in fp32, padded with ``fill`` to whole panels of ``width`` lanes."""
    out = torch.full((-(-size // width) * width,), fill, dtype=torch.float32)
    if value is not None:
        out[:size] = value.detach().float()
    return out


def _fp32_linear(lib: ctypes.CDLL, weight: torch.Tensor, bias: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The tensors of an fp32 ``_Linear``: the (N, K) ``weight`` packed into panels of the build's width (zero past
    N) and the bias padded to them."""
    weight = weight.detach().float().contiguous()
    width = lib.ek_vector_width()
    rows, cols = weight.shape
    packed = torch.empty(-(-rows // width) * width * cols, dtype=torch.float32)
    lib.ek_pack(weight.data_ptr(), packed.data_ptr(), rows, cols)
    return [packed, _padded(bias, rows, width), None, None, None]


def fp32_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's fp32 product alone, on the calling thread (tests): (M, K) rows times the (N, K) ``weight``
    packed as the kernel packs it, plus ``bias`` -> (M, N), each sum in k order with fused multiply-adds."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the native kernel is not available here: {status()}")
    x = x.float().contiguous()
    tensors = _fp32_linear(lib, weight, bias)
    linear = _Linear(*[None if t is None else t.data_ptr() for t in tensors])
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    lib.ek_product(ctypes.byref(linear), x.data_ptr(), y.data_ptr(), x.shape[0], weight.shape[0], weight.shape[1])
    return y


def int8_product(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 inverse: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's int8 product alone, on the calling thread (tests, benchmarks): (M, K) fp32 rows times
    ``inverse`` (1 / SmoothQuant factors, (K,)) quantised to uint8 with each row's scale and zero point, times the
    (N, K) int8 ``codes`` with their (N,) per-row ``scales``, plus ``bias`` -> (M, N) fp32."""
    lib = library()
    if lib is None or not lib.ek_int8():
        raise RuntimeError(f"the native int8 product is not available here: {status()}")
    if int(codes.abs().max()) > int8_weight_limit():
        raise ValueError(f"weight codes up to {int(codes.abs().max())}, but this build's int8 product sums exactly "
                         f"only codes within +-{int8_weight_limit()} (pairs in 16 bits): {status()}")
    x = x.float().contiguous()
    tensors = _int8_linear(lib, codes, scales, bias, inverse)
    linear = _Linear(*[None if t is None else t.data_ptr() for t in tensors])
    y = torch.empty(x.shape[0], codes.shape[0], dtype=torch.float32)
    lib.ek_product(ctypes.byref(linear), x.data_ptr(), y.data_ptr(), x.shape[0], codes.shape[0], codes.shape[1])
    return y


def _fits(plan: NativeEncoder, tokens: int, packing) -> bool:
    """Whether a batch of ``tokens`` (at most ``BATCH_MAX_TOKENS``) laid out by ``packing`` is one the kernel is
    faster on: any of at most ``MAX_TOKENS`` tokens; a larger one by its longest sequence, at most
    ``int8_max_length()`` for int8 products, and for an fp32 model at most ``attention_max_length()`` in a batch of
    at most ``fp32_max_tokens()`` tokens (none for a bf16 model, or an int8 one the kernel runs in fp32)."""
    if tokens <= MAX_TOKENS:
        return True
    if plan.int8:
        return packing.max_length <= int8_max_length()
    return plan.fp32 and tokens <= fp32_max_tokens() and packing.max_length <= attention_max_length()


# The inference dtypes whose small batches take the kernel (in fp32: see the module doc for bf16's).
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def native_forward(encoder: nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                   position_ids: torch.Tensor | None, packing) -> torch.Tensor | None:
    """The last layer's states of the (tokens,) ids laid out by ``packing``, from the native kernel, or None where
    it does not apply (see the module doc): then the caller runs the PyTorch forward."""
    tokens = input_ids.shape[0]
    inference = getattr(encoder, "inference_plan", None)  # for_inference's plan: the kernel's layout lives on it
    if inference is None or tokens > BATCH_MAX_TOKENS or tokens == 0 or input_ids.device.type != "cpu" \
            or encoder.training or torch.is_grad_enabled() or inference.dtype not in _KERNEL_DTYPES \
            or getattr(encoder, "traceable", False) or not packing.by_sequence_only:
        return None
    plan = inference.native
    if plan is None:
        if inference.native_checked:
            return None
        lib = library()
        if lib is None or eligible(encoder) is not None or next(encoder.parameters()).dtype != torch.float32:
            inference.native_checked = True
            return None
        plan = NativeEncoder(encoder, lib, inference)
        if plan.int8_in_fp32:
            _say_once("int8 without 8-bit dot products the kernel can sum exactly here: batches of at most %d tokens "
                      "run the native kernel in fp32, which is faster than PyTorch's int8 kernels and exact; larger "
                      "ones run int8", MAX_TOKENS)
        inference.native = plan
    if not _fits(plan, tokens, packing):
        return None
    if plan.quantized and plan.calibrating():
        return None
    return plan(input_ids, token_type_ids, position_ids, packing.cu_seqlens, packing.max_length)


_said: set[str] = set()


def _say_once(message: str, *args) -> None:
    """Logs ``message`` once per process (a fact about this CPU, not about each model or call)."""
    if message not in _said:
        _said.add(message)
        log.info(message, *args)


def _plan_of(model: nn.Module):
    """``modeling.inference.plan_of``: the model's InferencePlan, or None."""
    from ..modeling.inference import plan_of

    return plan_of(model)


def kernel_of(model: nn.Module) -> NativeEncoder | None:
    """The native kernel's plan for ``model`` (an encoder, or a task model with one): made at its first batch that
    took the kernel; None before that, or where the kernel does not apply."""
    inference = _plan_of(model)
    plan = None if inference is None else inference.native
    return plan if plan is not None and plan.ran else None


def disable(model: nn.Module) -> None:
    """Run the PyTorch layers of ``model`` (an encoder, or a task model with one) from now on, never the native
    kernel (a comparison, a test). ``for_inference`` turns it back on (its new plan asks the kernel again)."""
    inference = _plan_of(model)
    if inference is not None:
        inference.native, inference.native_checked = None, True


def reset(model: nn.Module) -> None:
    """Forget the native layout of ``model`` (an encoder, or a task model with one): made again at its next call."""
    inference = _plan_of(model)
    if inference is not None:
        inference.native, inference.native_checked = None, False


__all__ = ["ATTENTION_MAX_LENGTHS", "BATCH_MAX_TOKENS", "FP32_MAX_TOKENS", "INT8_MAX_LENGTHS", "MAX_TOKENS",
           "NativeEncoder", "attention", "attention_max_length", "bias_layout", "disable", "eligible",
           "fp32_max_tokens", "fp32_product", "int8_available", "int8_max_length", "int8_product",
           "int8_weight_limit", "kernel_of", "library", "native_forward", "reset", "status"]
