"""The int8 accuracy guard: how far an int8 model's outputs are from its fp32 outputs, measured once on a small
calibration set when the model is prepared, with a clear warning when they are too far.

``--dtype int8`` (``Precision.quantized``) makes the encoder's linear layers multiply in int8 (see
``modeling.inference.Int8Prepacked``). That is not exact, and how much it costs depends on the model: a model
whose activations have a few huge channels (outliers) loses most of its resolution to them. So the engine
encodes ``CALIBRATION_TEXTS`` twice, in fp32 and in int8, and compares the mean-pooled final states of each
text by cosine similarity; it also records each int8 layer's relative output error, so that the report can
name the layers worth keeping in fp32.

The thresholds (``MEAN_COSINE_MIN``, ``WORST_COSINE_MIN``) come from measurement: all-MiniLM-L6-v2 in int8,
which loses 0.08 STS-B dev Spearman points (0.13 without smoothing), is at mean cosine 0.9976, worst 0.973 on
these texts (0.993 / 0.967 without smoothing), and at mean 0.987, worst 0.961 on 500 benchmark sentences;
CTranslate2's int8 is at mean 0.997, worst 0.988 there. A model under a mean of 0.98 or with a text under 0.94
has lost several times what a healthy quantisation loses (the outlier model of tests/core/test_int8.py: far below).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

MEAN_COSINE_MIN = 0.98
WORST_COSINE_MIN = 0.94
# SmoothQuant strengths each layer chooses from (None: none), by its int8 error on the calibration rows.
SMOOTHING_CHOICES = (None, 0.5, 0.6, 0.7, 0.8, 0.9)

# Short and long, plain and technical, with numbers, names, code and a little non-English text: the shapes of
# input that move activation ranges.
CALIBRATION_TEXTS = (
    "The cat sat on the mat.",
    "How do I reset my password?",
    "A man is playing a guitar on the stage while the crowd sings along.",
    "Stock markets fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The new smartphone has a 6.1-inch display, 128 GB of storage and a battery that lasts two days.",
    "She didn't expect the train to be late again.",
    "What is the capital of Australia?",
    "Canberra is the capital of Australia, although Sydney is its largest city.",
    "def add(a, b): return a + b",
    "SELECT name, price FROM products WHERE price > 100 ORDER BY price DESC;",
    "Error 404: the page you requested could not be found.",
    "The patient was prescribed 500 mg of amoxicillin three times a day for seven days.",
    "Two dogs are running through a snowy field.",
    "A woman is slicing tomatoes in a kitchen.",
    "The committee will review the proposal and publish its findings by the end of March 2025.",
    "I loved this movie: the acting was superb and the soundtrack gave me chills!",
    "Terrible service. We waited an hour and the food was cold.",
    "Quantum computers use qubits, which can represent zero and one at the same time.",
    "The Treaty of Westphalia, signed in 1648, ended the Thirty Years' War in Europe.",
    "Please find attached the invoice for March; payment is due within 30 days.",
    "Le chat dort sur le canapé.",
    "Der Zug nach Berlin fährt um 14:30 Uhr ab.",
    "El mercado abre a las nueve de la mañana.",
    "https://example.com/docs/getting-started?lang=en#install",
    "GPU memory usage peaked at 23.7 GiB during training with batch size 64.",
    "OK",
    "Why is the sky blue?",
    "Sunlight is scattered by the molecules of the atmosphere, and blue light is scattered more than red light "
    "because it travels as shorter waves, so the sky looks blue from every direction during the day.",
    "The river flooded the village after three days of heavy rain, and hundreds of families had to leave their "
    "homes; volunteers brought food, blankets and drinking water while engineers worked to repair the broken dam "
    "upstream before the next storm arrived.",
    "A child is riding a bike down the street.",
    "The algorithm runs in O(n log n) time and uses O(n) extra memory.",
    "My flight was cancelled, can I get a refund?",
    "The orchestra performed Beethoven's Ninth Symphony to a sold-out audience.",
    "Mix the flour, sugar and eggs, then bake at 180 °C for 25 minutes.",
    "Researchers found that regular exercise reduces the risk of heart disease by up to 35 percent.",
    "Is it going to rain tomorrow in London?",
    "The defendant pleaded not guilty to all charges.",
    "@john thanks for the update!! see you at 5pm :)",
    "Install the package with pip, then run the command with --help to see every option.",
)


@dataclass(frozen=True)
class QuantizationReport:
    """How far int8 outputs are from fp32 outputs on the calibration texts (mean-pooled final states)."""

    texts: int
    mean_cosine: float
    worst_cosine: float
    layer_errors: dict[str, float] = field(default_factory=dict)  # relative output error of each int8 linear
    fp32_layers: tuple[str, ...] = ()
    smoothing: dict[str, float | None] = field(default_factory=dict)  # each layer's SmoothQuant alpha
    mean_cosine_min: float = MEAN_COSINE_MIN
    worst_cosine_min: float = WORST_COSINE_MIN

    @property
    def ok(self) -> bool:
        return self.mean_cosine >= self.mean_cosine_min and self.worst_cosine >= self.worst_cosine_min

    def worst_layers(self, count: int = 3) -> list[str]:
        """The int8 layers with the largest output errors, worst first: the ones to keep in fp32."""
        return sorted(self.layer_errors, key=self.layer_errors.get, reverse=True)[:count]

    def summary(self) -> str:
        return (f"int8 vs fp32 on {self.texts} calibration texts: mean cosine {self.mean_cosine:.4f} (threshold "
                f"{self.mean_cosine_min}), worst {self.worst_cosine:.4f} (threshold {self.worst_cosine_min})")

    def advice(self) -> str:
        worst = ", ".join(f"{name} ({self.layer_errors[name]:.1%} error)" for name in self.worst_layers())
        return (f"int8 changes this model's outputs more than expected: {self.summary()}. Use --dtype fp32 (exact) "
                f"or bf16, or keep the worst layers in fp32: dtype=Precision.quantized(purpose, "
                f"fp32_layers=[...]) in Python; the worst are {worst}")


def measure_int8(engine, ids: list[list[int]]) -> QuantizationReport:
    """Runs ``ids`` through ``engine``'s int8 linears observing (exact fp32 products, and the range of each input
    channel), smooths them (``engine.precision.smoothing``), runs again in int8, and compares the mean-pooled
    vectors. ``engine``: an ``encoderkit.engine.Engine`` prepared with int8 linears."""
    from .modeling.inference import int8_layers

    layers = int8_layers(engine.encoder)
    for layer in layers:
        layer.observing = True
    try:
        reference = engine.pooled(ids)
    finally:
        for layer in layers:
            layer.observing = False
    alphas = {}
    for layer in layers:
        if engine.precision.smoothing:
            alphas[layer.name] = layer.smooth(SMOOTHING_CHOICES)
        layer.errors = []
    try:
        cosine = torch.nn.functional.cosine_similarity(engine.pooled(ids), reference, dim=1)
        errors = {layer.name: max(layer.errors) for layer in layers if layer.errors}
    finally:
        for layer in layers:
            layer.errors = None
    report = QuantizationReport(len(ids), float(cosine.mean()), float(cosine.min()), errors,
                                engine.precision.fp32_layers, alphas)
    if report.ok:
        log.info("%s", report.summary())
    else:
        log.warning("%s", report.advice())
    return report


__all__ = ["CALIBRATION_TEXTS", "MEAN_COSINE_MIN", "QuantizationReport", "WORST_COSINE_MIN", "measure_int8"]
