"""How many threads the native kernel's OpenMP team takes for a call, chosen by measuring calls.

Why: the kernel synchronises its team at many barriers a layer (after each product and each norm). On a machine
whose cores other processes also want, the OS deschedules one of the team's threads for a time slice, and every
other thread waits for it at the next barrier: a short text that takes a couple of milliseconds on an idle machine
then takes tens to hundreds, where one thread, which waits for nobody, is only somewhat slower than two
(``bench/latency_contention.py`` measures both). A server on a shared machine sees exactly that.

So each kernel layout keeps, per size of call (its tokens' power of two), a running estimate of the seconds a call
takes with the caller's whole team and with one thread, runs the faster, and now and then (``PROBE_EVERY`` calls)
runs the other to refresh its estimate, so that it notices when the machine changes (contention starts or ends).
Results do not depend on the choice: the kernel's outputs are the same bits with one thread or several (each output
is computed by one thread in one order; tests/native/test_native.py checks it).
"""
from __future__ import annotations

import threading

# One call in this many (per size of call) runs the choice that is not the current best, to keep its estimate fresh.
PROBE_EVERY = 32
# Weight of a slower measurement in the running estimate (exponential moving average): a call slower than the
# estimate moves it half way, so a few slow calls in a row (contention began) turn the choice; a faster one replaces
# it at once, so one probe notices that the machine is free again.
WEIGHT = 0.5


class TeamSize:
    """The team size for each call of one kernel layout (see the module doc). Safe to share between threads: the
    estimates are approximations, updated under a lock that no call holds while the kernel runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[tuple[int, int], float] = {}  # (size class, threads) -> estimated seconds of a call
        self._calls: dict[int, int] = {}  # size class -> calls so far
        self._warm: set[tuple[int, int]] = set()  # (size class, threads) whose first call (a cold one) is behind

    @staticmethod
    def size_class(tokens: int) -> int:
        return max(int(tokens), 1).bit_length()

    def pick(self, tokens: int, wanted: int) -> int:
        """The threads for a call of ``tokens`` tokens, where the caller has ``wanted`` (torch's thread count)."""
        if wanted <= 1:
            return max(wanted, 1)
        size = self.size_class(tokens)
        with self._lock:
            calls = self._calls[size] = self._calls.get(size, 0) + 1
            full, one = self._seconds.get((size, wanted)), self._seconds.get((size, 1))
        if full is None:
            return wanted
        if one is None:
            return 1
        best, other = (1, wanted) if one < full else (wanted, 1)
        return other if calls % PROBE_EVERY == 0 else best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """A call of ``tokens`` tokens on ``threads`` threads took ``seconds``. The first call of each size and team
        (cold caches, a team starting) is left out."""
        key = (self.size_class(tokens), threads)
        with self._lock:
            if key not in self._warm:
                self._warm.add(key)
                return
            before = self._seconds.get(key)
            self._seconds[key] = seconds if before is None or seconds < before else before + WEIGHT * (seconds - before)

    def estimates(self) -> dict[tuple[int, int], float]:
        """(size class, threads) -> the estimated seconds of a call (a test, a benchmark's report)."""
        with self._lock:
            return dict(self._seconds)


__all__ = ["PROBE_EVERY", "TeamSize", "WEIGHT"]
