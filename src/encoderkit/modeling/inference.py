"""``for_inference``: speed-ups prepared for a model, never a second model class.

``for_inference`` makes one ``InferencePlan`` and hands it to the encoder (``encoder.inference_plan``). The layers
stay as they are (plain ``nn.Linear``: the same parameters and state dict; training and saving see no difference);
the layer code asks the plan for each product (``apply_linear``, ``fused_product``, ``plus_product``: with no plan,
or while a gradient is wanted, the module itself runs). The plan's products multiply, on CPU, with a copy of
the weight pre-packed once into oneDNN's blocked layout, in the compute dtype (fp32, or bf16 with fp32
LayerNorm, softmax statistics and residual stream). On Intel CPUs, fp32 products of few rows (one short text)
run on MKL's packed GEMM instead, which costs less per call (``mkl_for_small_products``). Query, key and
value, which BERT-style checkpoints keep as three matrices, get one pre-packed fused projection (one tall GEMM
instead of three narrow ones). The plan also holds the native kernel's layout of the encoder (``encoderkit.native``),
made at the first batch that takes it; a new ``for_inference`` makes a new plan, so nothing stale survives it.

With ``int8=True`` the same layers multiply in int8 instead (``Int8Prepacked``: per-channel int8 weights,
activations quantised per call and row), for inference only: a product that wants a gradient still runs in fp32.

A packed copy remembers the version counters of the tensors it was made from, and which tensors its modules held,
and is rebuilt when either changes: so a model that trains after ``for_inference``, or loads other weights (in place,
or as new parameters with ``load_state_dict(assign=True)``), or is moved or cast (``to``, ``half``: the encoder's
``_apply`` drops the copies), never computes with stale weights. Not seen: a tensor given new data by the caller's
own ``.data = ...``, which keeps its version counter: seeing it would take every tensor's data pointer at every
call, a second walk over the parameters for each served text. After such a change, call ``for_inference`` again.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..precision import EXACT_WEIGHT_LEVELS, PAIR_SUM_WEIGHT_LEVELS
from . import int8_rows
from .registration import parameters_registered, replaced
from .training_linear import linear as linear_product


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


# fp32 products of at most this many rows (one short text, a few) run on MKL's packed GEMM where that is the faster
# kernel (``mkl_for_small_products``).
SMALL_FP32_ROWS = 32


@functools.cache
def mkl_for_small_products() -> bool:
    """Whether fp32 products of few rows run on MKL's packed GEMM (``torch.ops.mkl._mkl_linear``, MKL's
    cblas_sgemm_compute on a weight packed once) rather than oneDNN's. On Intel CPUs MKL's product is the faster one
    with few rows, while oneDNN fuses GELU and the residual add into its product, which wins once the rows are many
    (bench/latency_floor.py). Intel CPUs only: elsewhere MKL takes a generic path, slower than oneDNN's
    (``modeling.training_linear``).

    torch packs the weight for a nominal row count; MKL's packed B does not depend on it, which is checked here
    once, on products of several row counts against ``F.linear``: where it differs, oneDNN serves every product."""
    from ..precision import cpu_vendor

    if cpu_vendor() != "GenuineIntel" or not torch.backends.mkl.is_available() \
            or not hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"):
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight, bias = torch.randn(72, 40, generator=generator), torch.randn(72, generator=generator)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, SMALL_FP32_ROWS)
        for rows in (1, 5, SMALL_FP32_ROWS):
            x = torch.randn(rows, 40, generator=generator)
            out = torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)
            if not torch.allclose(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5):
                return False
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


class Prepacked:
    """Weights (concatenated along the output dimension) pre-packed for inference in ``dtype``, made again when a
    weight or bias changes in place or is replaced on its module (``modules``, where given)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], dtype: torch.dtype,
                 modules: Sequence[nn.Module] = ()) -> None:
        self.dtype, self.modules = dtype, list(modules)
        self._take(weights, biases)
        self.registered = parameters_registered()
        self.versions: tuple[int, ...] | None = None
        self.weight = self.bias = self.packed = None
        self.small_packed = None  # MKL's pack for products of few rows, made at the first one (never for batch jobs)

    def _take(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> None:
        """The tensors this product is packed from (``sources``: the weights and the biases there are)."""
        self.weights, self.biases = weights, biases
        self.sources = weights + [b for b in biases if b is not None]

    def _follow_modules(self) -> None:
        """The modules' parameters now, where one may have been replaced since they were read (``_REGISTERED``)."""
        self.registered = parameters_registered()
        held = self.sources
        self._take([m.weight for m in self.modules], [m.bias for m in self.modules])
        if replaced(held, self.sources):
            self.versions = None

    def _refresh(self) -> None:
        if self.modules and self.registered != parameters_registered():
            self._follow_modules()
        versions = tuple(t._version for t in self.sources)
        if versions == self.versions:
            return
        with torch.no_grad():
            weight = torch.cat([w.detach() for w in self.weights]) if len(self.weights) > 1 else self.weights[0].detach()
            bias = None
            if self.biases[0] is not None:
                bias = torch.cat([b.detach() for b in self.biases]) if len(self.biases) > 1 else self.biases[0].detach()
            self._build(weight, bias)
        self.versions = versions

    def _build(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.to(self.dtype).contiguous()
        self.bias = None if bias is None else bias.to(self.dtype).contiguous()
        self.packed = self.small_packed = None
        if self.weight.device.type == "cpu" and _onednn_available():
            try:  # faster products than F.linear on CPU (bench/encode.py measures the embedding path)
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 256)
                torch.ops.mkldnn._linear_pointwise(torch.zeros(2, self.weight.shape[1], dtype=self.dtype),
                                                   self.packed, self.bias, "none", [], "")
            except (RuntimeError, AttributeError):  # an op missing from this build: plain path
                self.packed = None

    def _small(self, x: torch.Tensor) -> torch.Tensor | None:
        """MKL's product of few rows (``mkl_for_small_products``), or None where this one is not such a product."""
        if self.dtype != torch.float32 or x.dim() != 2 or x.shape[0] > SMALL_FP32_ROWS or x.shape[0] == 0 \
                or x.device.type != "cpu" or not mkl_for_small_products():
            return None
        if self.small_packed is None:
            self.small_packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, SMALL_FP32_ROWS)
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.to(torch.float32).contiguous()
        return torch.ops.mkl._mkl_linear(x, self.small_packed, self.weight, self.bias, x.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._refresh()
        small = self._small(x)
        if small is not None:
            return small
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        if self.packed is not None and x.device.type == "cpu" and x.dim() == 2:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def fused(self, x: torch.Tensor, activation: str | None, residual: torch.Tensor | None) -> torch.Tensor | None:
        """``act(x W + b)`` (exact erf GELU only) or ``x W + b + residual`` in the one oneDNN call (for a product
        of few rows on MKL, its GELU or add right after it, in place), or None where this product cannot fuse them
        (no packed weight, another activation, a residual of another dtype or shape), decided before any work so
        that the caller's plain steps repeat nothing."""
        if residual is None and activation != "gelu":  # oneDNN's eltwise_gelu_erf: the exact GELU, as F.gelu
            return None
        if residual is not None and (residual.dtype != self.dtype or residual.shape[0] != x.shape[0]):
            return None
        if x.device.type != "cpu" or x.dim() != 2:
            return None
        self._refresh()
        small = self._small(x)  # a few rows: MKL's product, then the GELU or the add in place
        if small is not None:
            return torch.ops.aten.gelu_(small) if residual is None else small.add_(residual)
        if self.packed is None or (residual is not None and self.bias is None):
            return None
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        if residual is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "gelu", [], "none")


def _int8_kernel_available() -> bool:
    return "onednn" in torch.backends.quantized.supported_engines and hasattr(torch.ops.onednn, "qlinear_pointwise")


def _int8_prepack(quantized: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed form of (N, K) int8 weight codes, for ``_int8_product``."""
    return torch.ops.onednn.qlinear_prepack(quantized, None)


def _int8_product(codes: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                  zero_points: torch.Tensor) -> torch.Tensor:
    """oneDNN's int8 product of (M, K) uint8 ``codes`` (taken as they are: scale 1, zero point 0) with packed weight
    codes -> (M, N) fp32 sums, each output times its weight scale."""
    return torch.ops.onednn.qlinear_pointwise(codes, 1.0, 0, packed, scales, zero_points, None, 1.0, 0,
                                              torch.float32, "none", [], "")


@functools.lru_cache(maxsize=None)
def _sums_exactly() -> bool:
    """Whether oneDNN's int8 product sums u8 x s8 products without saturating, found by running the worst case once
    (every activation code 255, every weight code 127) at a few row counts, since oneDNN picks kernels by shape.
    This asks the kernel itself, not the CPU's flags: the same CPU takes a saturating path under
    ``ONEDNN_MAX_CPU_ISA=AVX2``."""
    if not _int8_kernel_available():
        return False
    depth, outputs = 64, 8
    try:
        packed = _int8_prepack(torch.full((outputs, depth), EXACT_WEIGHT_LEVELS, dtype=torch.int8))
    except RuntimeError:
        return False
    exact = 255.0 * EXACT_WEIGHT_LEVELS * depth
    for rows in (1, 14, 200):
        codes = torch.full((rows, depth), 255, dtype=torch.uint8)
        out = _int8_product(codes, packed, torch.ones(outputs), torch.zeros(outputs, dtype=torch.long))
        if float((out - exact).abs().max()) > 1e-3 * exact:
            return False
    return True


def int8_weight_levels(device: torch.device | str = "cpu") -> int:
    """The largest weight code the int8 product takes on ``device``: 127 where the kernel's sums are exact, 63
    where it adds pairs in 16 bits. The fp32 emulation (a GPU, or PyTorch without oneDNN) is exact: 127."""
    if torch.device(device).type != "cpu" or not _int8_kernel_available():
        return EXACT_WEIGHT_LEVELS
    return EXACT_WEIGHT_LEVELS if _sums_exactly() else PAIR_SUM_WEIGHT_LEVELS


class Int8Prepacked(Prepacked):
    """Weights quantised to int8 per output channel (symmetric), multiplied with activations quantised to uint8
    at each call, each row with its own scale and zero point from its min and max (asymmetric; per token, so that
    a text's codes do not depend on the other texts of its batch: ``int8_rows``), by oneDNN's int8 product
    (``onednn.qlinear_pointwise``) on the codes, each row's scale and zero point applied to its output after
    (``int8_rows.rescale_rows``), and the bias in fp32. Where PyTorch has no oneDNN the same arithmetic runs in
    fp32.

    Why this scheme (measured on all-MiniLM-L6-v2, STS-B dev, bench/int8.py): activations after LayerNorm and
    GELU are skewed, so an asymmetric 8-bit range loses less than a symmetric one (per matrix: ~0.01 Spearman
    points against 0.30) or a 7-bit one (``reduce_range``, the default of ``torch.ao.quantization.quantize_dynamic``:
    0.31-0.53). Without 8-bit dot-product instructions (VNNI: AVX2, early AVX-512) the kernels add u8 x s8 pairs
    into 16 bits, which saturates; there the weights take 7-bit codes (``int8_weight_levels``), whose pair sums
    fit, so the product is still exact to its own arithmetic.

    Activation outliers in a few channels (the same channels in every row, which a range per row does not help)
    cost the range most of its resolution; ``smooth`` moves them into the weights (SmoothQuant), choosing per layer
    the strength that loses least on the calibration rows it observed.

    ``errors``: when a list, each call also computes the fp32 product and appends the relative error of the int8
    one (the calibration of ``encoderkit.quantization``)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], name: str,
                 modules: Sequence[nn.Module] = ()) -> None:
        super().__init__(weights, biases, torch.float32, modules)
        self.name = name
        self.errors: list[float] | None = None
        self.observing = False  # calibration: exact products, recording the input rows
        self.observed: torch.Tensor | None = None  # per input channel max |x| seen while observing
        self.sample: list[torch.Tensor] = []  # up to SAMPLE_ROWS observed input rows
        self.smoothing: torch.Tensor | None = None  # per input channel s: (x / s) times (W * s)
        self.inverse_smoothing: torch.Tensor | None = None
        self.alpha: float | None = None
        self.levels = EXACT_WEIGHT_LEVELS  # the largest weight code (``int8_weight_levels``), set by ``_build``

    SAMPLE_ROWS = 512

    def smooth(self, alphas: tuple[float | None, ...]) -> float | None:
        """SmoothQuant (Xiao et al., 2023): move activation outliers into the weights by a per-input-channel
        scale s = max|x|^alpha / max|W|^(1 - alpha) from the observed activations, so that x / s and W * s
        share the range; the product is the same in exact arithmetic, and int8 loses less of it. Of ``alphas``
        (None: no smoothing), keeps the one whose int8 product is nearest the exact one on the observed rows."""
        if self.observed is None or not self.sample:
            return None
        self._refresh()
        rows = torch.cat(self.sample)
        exact = F.linear(rows, self.weight, self.bias)
        weight_max = self.weight.abs().amax(dim=0).clamp_min(1e-5)
        best, best_error = None, float("inf")
        for alpha in alphas:
            smoothing = None if alpha is None else \
                (self.observed.clamp_min(1e-5).pow(alpha) / weight_max.pow(1 - alpha)).clamp(1e-3, 1e3)
            inverse = None if smoothing is None else 1.0 / smoothing
            approx = _int8_arithmetic(rows, _dequantized(*_int8_weight(self.weight, smoothing, self.levels)),
                                      self.bias, inverse)
            error = float((approx - exact).norm())
            if error < best_error:
                best, best_error = (alpha, smoothing, inverse), error
        self.alpha, self.smoothing, self.inverse_smoothing = best
        self.sample = []
        self.versions = None  # rebuilt with the chosen smoothing at the next call
        return self.alpha

    def _build(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.float().contiguous()
        self.bias = None if bias is None else bias.float().contiguous()
        self.levels = int8_weight_levels(self.weight.device)
        self.quantized, self.scales = _int8_weight(self.weight, self.smoothing, self.levels)
        self.packed = None
        if self.weight.device.type == "cpu" and _int8_kernel_available():
            try:
                self.packed = _int8_prepack(self.quantized)
            except RuntimeError:  # an op missing from this build: the fp32 arithmetic
                self.packed = None
        if self.packed is not None:  # what int8_rows.rescale_rows takes
            self.weight_sums = (self.quantized.float().sum(dim=1) * self.scales).contiguous()
            self.weight_zero_points = torch.zeros(len(self.scales), dtype=torch.long)
            self.bias_or_zeros = torch.zeros(len(self.scales)) if self.bias is None else self.bias
        # without the int8 kernel: the same arithmetic in fp32, with the weight dequantised once here
        self.dequantized = _dequantized(self.quantized, self.scales) if self.packed is None else None

    def fused(self, x: torch.Tensor, activation: str | None, residual: torch.Tensor | None) -> None:
        """The int8 kernel fuses nothing: the caller takes its plain steps (and this product keeps its guard's
        error measurement and calibration)."""
        return None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._refresh()
        shape = x.shape
        rows = x.float().reshape(-1, shape[-1])
        if self.observing:
            seen = rows.abs().amax(dim=0)
            self.observed = seen if self.observed is None else torch.maximum(self.observed, seen)
            room = self.SAMPLE_ROWS - sum(len(r) for r in self.sample)
            if room > 0:
                self.sample.append(rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))[:room]])
            return F.linear(rows, self.weight, self.bias).reshape(*shape[:-1], -1)
        if self.packed is not None and rows.device.type == "cpu":
            codes, scale, zero = int8_rows.quantize_rows(rows, self.inverse_smoothing)
            out = _int8_product(codes, self.packed, self.scales, self.weight_zero_points)
            int8_rows.rescale_rows(out, scale, zero, self.weight_sums, self.bias_or_zeros)
        else:
            out = _int8_arithmetic(rows, self.dequantized, self.bias, self.inverse_smoothing)
        if self.errors is not None:
            exact = F.linear(rows, self.weight, self.bias)
            self.errors.append(float((out - exact).norm() / exact.norm().clamp_min(1e-12)))
        return out.reshape(*shape[:-1], out.shape[-1])


def _int8_weight(weight: torch.Tensor, smoothing: torch.Tensor | None,
                 levels: int = EXACT_WEIGHT_LEVELS) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight (times the smoothing of its input channels) -> codes in -levels..levels and
    per-output-channel scales."""
    scaled = weight if smoothing is None else weight * smoothing
    scales = (scaled.abs().amax(dim=1) / levels).clamp_min(1e-12)
    return torch.round(scaled / scales[:, None]).clamp_(-levels, levels).to(torch.int8), scales


def _dequantized(quantized: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return quantized.float() * scales[:, None]


def _int8_arithmetic(rows: torch.Tensor, dequantized: torch.Tensor, bias: torch.Tensor | None,
                     inverse_smoothing: torch.Tensor | None) -> torch.Tensor:
    """The int8 product computed in fp32: rows quantised to uint8 codes (``int8_rows.uint8_rows``), times the
    dequantised int8 weight."""
    codes, scale, zero = int8_rows.uint8_rows(rows, inverse_smoothing)
    return F.linear((codes - zero) * scale, dequantized, bias)


def _wants_grad(module: nn.Module, x: torch.Tensor) -> bool:
    return module.training or (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad))


class InferencePlan:
    """What ``for_inference`` prepared for one encoder: the compute dtype, whether its layers run in int8, each
    linear layer's pre-packed product (``Prepacked`` or ``Int8Prepacked``, found by its module), the fused
    query/key/value projection of each attention that keeps three matrices, and the native kernel's layout
    (``native``: made by ``encoderkit.native`` at the first batch that takes it; ``native_checked``: the kernel was
    asked and does not apply). The layers reach every speed-up through it; the modules are never changed."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._by_module: dict[int, tuple[nn.Module, Prepacked]] = {}  # id(linear) -> (the linear, its product)
        self._projections: dict[int, tuple[nn.Module, Any]] = {}  # id(attention) -> (attention, fused projection)
        self.ordered: list[Prepacked] = []  # the products inference runs, in layer order
        self.layers: list[dict[str, Prepacked]] = []  # per layer: qkv, output, ffn_in, ffn_out (the native kernel's)
        self.native: Any = None
        self.native_checked = False

    def add(self, linear: nn.Module, product: Prepacked) -> None:
        self._by_module[id(linear)] = (linear, product)

    def forget_packs(self) -> None:
        """Every packed copy (the products, the fused projections, the native layout) made again at its next call:
        after ``Module.to`` and its kind (``EncoderModel._apply``), which change parameters' data but not their
        version counters."""
        for _, product in [*self._by_module.values(), *self._projections.values()]:
            if isinstance(product, Prepacked):
                product.versions = None
        if self.native is not None:
            self.native.versions = None

    def product_of(self, linear: nn.Module) -> Prepacked | None:
        """The pre-packed product of ``linear``, or None (a module the plan did not prepare)."""
        found = self._by_module.get(id(linear))
        return found[1] if found is not None and found[0] is linear else None

    def projection_of(self, attention: nn.Module) -> Any:
        """The fused query/key/value projection of ``attention`` (a callable on rows), or None."""
        found = self._projections.get(id(attention))
        return found[1] if found is not None and found[0] is attention else None

    def set_projection(self, attention: nn.Module, projection: Any) -> None:
        """Run ``projection`` (rows -> query, key and value side by side) as ``attention``'s fused projection (a
        benchmark's stand-in; ``for_inference`` sets the pre-packed one)."""
        self._projections[id(attention)] = (attention, projection)

    def project(self, attention: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """Query, key and value of ``x`` from the fused projection, or None (none made, or a gradient wanted: the
        caller runs its three matrices)."""
        projection = self.projection_of(attention)
        if projection is None or _wants_grad(attention.query, x):
            return None
        return projection(x)


def apply_linear(plan: InferencePlan | None, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)``, with the plan's pre-packed product where it has one and no gradient is wanted; while one is,
    the training product (``training_linear.linear``)."""
    product = None if plan is None else plan.product_of(linear)
    if product is None:
        return linear(x)
    if _wants_grad(linear, x):
        return linear_product(x, linear.weight, linear.bias)
    return product(x)


def fused_product(plan: InferencePlan | None, linear: nn.Module, x: torch.Tensor, *, activation: str | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """``linear(x)`` with ``activation`` applied or ``residual`` added inside the product's kernel, where ``plan``
    has a pre-packed product for ``linear`` and it runs for inference; None otherwise (the caller then takes its
    plain steps). The same layer code runs either way: this is a switch, not a second forward."""
    product = None if plan is None else plan.product_of(linear)
    if product is None or _wants_grad(linear, x):
        return None
    return product.fused(x, activation, residual)


def plus_product(plan: InferencePlan | None, residual: torch.Tensor, linear: nn.Module, x: torch.Tensor,
                 dropout: nn.Module | None = None) -> torch.Tensor:
    """``residual + dropout(linear(x))``, the add run inside the product's kernel where ``fused_product`` can."""
    summed = fused_product(plan, linear, x, residual=residual)
    if summed is not None:
        return summed
    out = apply_linear(plan, linear, x)
    return residual + (out if dropout is None else dropout(out)).to(residual.dtype)


def _product(linears: Sequence[nn.Module], dtype: torch.dtype, int8_name: str | None) -> Prepacked:
    """One pre-packed product of ``linears`` side by side (query, key and value as one), int8 where named."""
    weights, biases = [m.weight for m in linears], [m.bias for m in linears]
    if int8_name is None:
        return Prepacked(weights, biases, dtype, linears)
    return Int8Prepacked(weights, biases, int8_name, linears)


def for_inference(model: nn.Module, dtype: torch.dtype = torch.float32, *, int8: bool = False,
                  fp32_layers: tuple[str, ...] = ()) -> nn.Module:
    """Prepare ``model`` (an encoder, or a task model with one) for fast inference in ``dtype``: a new
    ``InferencePlan`` for its encoder (``encoder.inference_plan``).

    ``int8``: the encoder layers' linears compute in int8 (``Int8Prepacked``), except those whose names
    (``layers.{i}.attention.qkv`` for the fused query/key/value, ``layers.{i}.attention.output``,
    ``layers.{i}.ffn_in``, ``layers.{i}.ffn_out``, ...) are in ``fp32_layers``; the rest of the model (embeddings,
    norms, attention products, heads) stays in fp32. Returns the same model, in eval mode. Calling it again with
    other settings makes a new plan."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise InputError(f"encoderkit computes in float32 or bfloat16, not {dtype}")
    if int8 and dtype != torch.float32:
        raise InputError("int8 linear layers run with the rest of the model in fp32, not in bf16")
    encoder = getattr(model, "encoder", model)
    plan = InferencePlan(dtype)
    known = set()

    def int8_name(full: str) -> str | None:  # the layer's name where it runs in int8
        return full if int8 and full not in fp32_layers else None

    for index, layer in enumerate(encoder.layers):
        attention = layer.attention
        separate = () if hasattr(attention, "qkv") else (attention.query, attention.key, attention.value)
        named = {}
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                full = f"layers.{index}.{name}"
                if any(module is m for m in separate):  # inference runs them fused, as attention.qkv below
                    plan.add(module, _product([module], dtype, None))
                    continue
                known.add(full)
                named[name] = _product([module], dtype, int8_name(full))
                plan.add(module, named[name])
        fused = None
        if separate:
            full = f"layers.{index}.attention.qkv"
            known.add(full)
            fused = _product(separate, dtype, int8_name(full))  # one pre-packed projection of the three
            plan.set_projection(attention, fused)
            plan.ordered.append(fused)
        plan.ordered += named.values()
        plan.layers.append({"qkv": fused if fused is not None else plan.product_of(attention.qkv),
                            "output": plan.product_of(attention.output), "ffn_in": plan.product_of(layer.ffn_in),
                            "ffn_out": plan.product_of(layer.ffn_out)})
    unknown = sorted(set(fp32_layers) - known)
    if unknown:
        raise InputError(f"fp32_layers names no linear layer of this model: {', '.join(unknown)}; its int8 layers "
                         f"are named like {', '.join(sorted(known)[:4])}, ...")
    encoder.inference_plan = plan
    return model.eval()


def plan_of(model: nn.Module) -> InferencePlan | None:
    """The ``InferencePlan`` of ``model`` (an encoder, or a task model with one), or None before ``for_inference``."""
    return getattr(getattr(model, "encoder", model), "inference_plan", None)


def _products(model: nn.Module) -> Iterator[Prepacked]:
    """The packed products inference runs, in layer order: the fused query/key/value projection where there is one
    (then not its three separate layers, which inference never calls), and the other packed linear layers."""
    plan = plan_of(model)
    return iter(()) if plan is None else iter(plan.ordered)


def int8_layers(model: nn.Module) -> list[Int8Prepacked]:
    """The int8 products of a model prepared by ``for_inference(..., int8=True)``, in layer order."""
    return [p for p in _products(model) if isinstance(p, Int8Prepacked)]


def prepack(model: nn.Module) -> None:
    """Make every packed weight of a model prepared by ``for_inference`` now, rather than at its first product
    (threads that start products at once would each make it); the packs for products of few rows stay made at
    the first such product."""
    for product in _products(model):
        product._refresh()


__all__ = ["InferencePlan", "Int8Prepacked", "SMALL_FP32_ROWS", "apply_linear", "for_inference", "fused_product",
           "int8_layers", "int8_weight_levels", "mkl_for_small_products", "plan_of", "plus_product", "prepack"]
