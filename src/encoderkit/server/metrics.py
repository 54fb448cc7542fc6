"""Prometheus metrics in the text exposition format, written by hand.

Why not ``prometheus_client``: the server needs four kinds of numbers (counters, one gauge family, histograms)
rendered as text, which is some eighty lines; the library would be a dependency for that, and its default
registry is process-global, while each app here (tests build many) owns its metrics. Every update happens on
the event loop (the batcher records a batch before it hands it to the worker thread), so nothing needs a lock.
"""
from __future__ import annotations

import math
from typing import Iterable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

LabelKey = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{_escape(value)}"' for name, value in key)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Family:
    kind = ""

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        super().__init__(name, help)
        self.values: dict[LabelKey, float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = _key(labels)
        self.values[key] = self.values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        return self.values.get(_key(labels), 0)

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(self.values.items())]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self.values[_key(labels)] = value


class Histogram(_Family):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        super().__init__(name, help)
        self.buckets = tuple(buckets) + (math.inf,)
        self.series: dict[LabelKey, tuple[list[int], list[float]]] = {}  # counts per bucket, [sum]

    def observe(self, value: float, **labels: str) -> None:
        counts, total = self.series.setdefault(_key(labels), ([0] * len(self.buckets), [0.0]))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
                break
        total[0] += value

    def count(self, **labels: str) -> int:
        series = self.series.get(_key(labels))
        return sum(series[0]) if series else 0

    def render(self) -> list[str]:
        lines = self.header()
        for key, (counts, total) in sorted(self.series.items()):
            cumulative = 0
            for bound, count in zip(self.buckets, counts):
                cumulative += count
                lines.append(f"{self.name}_bucket{_labels(key + (('le', _number(bound)),))} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(key)} {_number(total[0])}")
            lines.append(f"{self.name}_count{_labels(key)} {cumulative}")
        return lines


class Metrics:
    """The server's metrics, one instance per app."""

    def __init__(self) -> None:
        self.requests = Counter("encoderkit_requests_total", "HTTP requests by route and status code")
        self.latency = Histogram("encoderkit_request_duration_seconds", "time to answer a request, by route",
                                 LATENCY_BUCKETS)
        self.in_flight = Gauge("encoderkit_requests_in_flight", "inference requests being served (queued or running)")
        self.queue_depth = Gauge("encoderkit_queue_depth", "sequences waiting for a batch, by model and kind")
        self.batch_size = Histogram("encoderkit_batch_size", "sequences per batch run, by model and kind",
                                    BATCH_SIZE_BUCKETS)
        self.batch_tokens = Histogram("encoderkit_batch_tokens", "padded tokens (sequences x longest) per batch",
                                      BATCH_TOKEN_BUCKETS)
        self.cancelled = Counter("encoderkit_cancelled_items_total",
                                 "queued sequences dropped before running (client gone or request timed out)")
        self.orphaned = Counter("encoderkit_orphaned_items_total",
                                "sequences computed for a request that had gone (hung up or timed out) while its "
                                "batch was running")
        self.families: list[_Family] = [self.requests, self.latency, self.in_flight, self.queue_depth,
                                        self.batch_size, self.batch_tokens, self.cancelled, self.orphaned]

    def render(self) -> str:
        return "\n".join(line for family in self.families for line in family.render()) + "\n"
