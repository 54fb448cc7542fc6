"""How many threads the native kernel's OpenMP team takes for a call, chosen by measuring calls.

Why: the kernel synchronises its team at many barriers a layer (after each product and each norm). On a machine
whose cores other processes also want, the OS deschedules one of the team's threads for a time slice, and every
other thread waits for it at the next barrier: a short text that takes a couple of milliseconds on an idle machine
then takes several times that, with a tail of a hundred milliseconds, where one thread, which waits for nobody,
is only somewhat slower than two (``bench/latency_contention.py`` measures both). A server on a shared machine
sees exactly that.

So each kernel layout keeps, per size of call (its tokens' power of two), the seconds of the last ``WINDOW`` calls
with the caller's whole team and with one thread, and runs the one whose median is lower (the team only where it is
clearly lower, ``TEAM_MARGIN``): the median, so that neither a lucky fast call nor a descheduled slow one turns the
choice, and the choice does not flap between the two (each switch back to the team wakes a sleeping thread, which
costs most on a busy machine). Now and then it
runs the other to keep its window fresh, so that it notices when the machine changes: after ``PROBE_FIRST`` calls,
then at twice the distance each time a probe leaves the choice as it was (up to ``PROBE_MOST``), because on a busy
machine each probe of the whole team may be one of those slow calls; a probe faster than the choice's median, or a
change of choice, starts over at ``PROBE_FIRST``, so that a machine that became free is noticed within a few
probes. Results do not depend on the choice: the kernel's outputs are the same bits with one thread or
several (each output is computed by one thread in one order; tests/native/test_team.py checks it).
"""
from __future__ import annotations

import statistics
import threading
from collections import deque

WINDOW = 8  # the calls per size and team whose median is the estimate
PROBE_FIRST = 16  # calls between probes of the other choice, at first and after the choice changed
PROBE_MOST = 1024  # the longest distance between probes
# The whole team runs only where its median is below this share of one thread's. One thread's calls, measured in a
# process whose team has just run, wait for a spinning team thread on a busy machine, so they measure slow; and a
# busy machine's whole team has the worse tail. Quiet, two threads take about 0.55 of one thread's time.
TEAM_MARGIN = 0.8


class _Size:
    """The state of one size of call: each team's recent seconds, the choice, and when to probe next."""

    def __init__(self) -> None:
        self.seconds: dict[int, deque[float]] = {}
        self.medians: dict[int, float] = {}  # each team's median, made when a call is recorded (not at each pick)
        self.choice: int | None = None
        self.calls = 0
        self.next_probe = PROBE_FIRST
        self.distance = PROBE_FIRST
        self.cold: set[int] = set()  # teams whose first (cold) call is behind


class TeamSize:
    """The team size for each call of one kernel layout (see the module doc). Safe to share between threads: the
    state is updated under a lock that no call holds while the kernel runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, _Size] = {}

    @staticmethod
    def size_class(tokens: int) -> int:
        return max(int(tokens), 1).bit_length()

    def pick(self, tokens: int, wanted: int) -> int:
        """The threads for a call of ``tokens`` tokens, where the caller has ``wanted`` (torch's thread count)."""
        if wanted <= 1:
            return max(wanted, 1)
        with self._lock:
            size = self._sizes.setdefault(self.size_class(tokens), _Size())
            size.calls += 1
            for threads in (wanted, 1):  # measure each first: the whole team, then one thread
                if len(size.seconds.get(threads, ())) < 2:
                    return threads
            best = wanted if size.medians[wanted] < TEAM_MARGIN * size.medians[1] else 1
            if size.choice is not None and best != size.choice:  # the choice changed: probe soon again
                size.distance = PROBE_FIRST
                size.next_probe = size.calls + PROBE_FIRST
            elif size.calls >= size.next_probe:  # a probe of the other; later next time if nothing changes
                size.next_probe = size.calls + size.distance
                size.distance = min(2 * size.distance, PROBE_MOST)
                size.choice = best
                return 1 if best == wanted else wanted
            size.choice = best
            return best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """A call of ``tokens`` tokens on ``threads`` threads took ``seconds``. The first call of each size and team
        (cold caches, a team starting) is left out."""
        with self._lock:
            size = self._sizes.setdefault(self.size_class(tokens), _Size())
            if threads not in size.cold:
                size.cold.add(threads)
                return
            chosen = size.medians.get(size.choice)  # None before a choice
            if threads != size.choice and chosen is not None and seconds < chosen:
                # a probe beat the choice: the machine may have changed, so probe again soon
                size.distance, size.next_probe = PROBE_FIRST, size.calls + PROBE_FIRST
            window = size.seconds.setdefault(threads, deque(maxlen=WINDOW))
            window.append(seconds)
            size.medians[threads] = statistics.median(window)

    def estimates(self) -> dict[tuple[int, int], float]:
        """(size class, threads) -> the median seconds of its recent calls (a test, a benchmark's report)."""
        with self._lock:
            return {(key, threads): median for key, size in self._sizes.items()
                    for threads, median in size.medians.items()}


__all__ = ["PROBE_FIRST", "PROBE_MOST", "TEAM_MARGIN", "TeamSize", "WINDOW"]
