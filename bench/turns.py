"""Interleaved training contenders: one process each, taking turns of a few optimizer steps.

Each contender trains on its own main thread with its own random stream and thread pool, in a process of its own,
and the parent hands the turns over through a pipe: only one contender computes at a time, and machine-speed drift
hits all alike. The protocol, parent -> child / child -> parent:

- child: ``("ready", info)`` once set up;
- parent ``("run", steps)`` -> child ``("turn", (done, train_seconds, examples))``;
- parent ``("evaluate", 0)`` -> child ``("quality", metrics)``, then the child ends;
- any failure: child ``("error", traceback)``; the parent stops with it.

An encoderkit contender steps its ``Trainer`` (``TrainerPlayer``); a transformers or sentence-transformers Trainer
trains on its own loop, and a callback (``transformers_turns``) gives the turn back after every chunk of steps.
Training time excludes set-up and evaluation.
"""
from __future__ import annotations

import functools
import time
import traceback
from typing import Any, Callable


@functools.cache
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


# Trim between turns only when the machine has less memory available than this share of its total.
TRIM_BELOW_AVAILABLE = 0.25


def memory_is_short(share: float = TRIM_BELOW_AVAILABLE) -> bool:
    """True when /proc/meminfo's MemAvailable is below ``share`` of MemTotal (True where it cannot be read)."""
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
        available, total = (int(fields[key].split()[0]) for key in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        return True
    return available < share * total


def give_back_memory() -> None:
    """Return freed heap to the system between turns, when memory is short (``memory_is_short``): idle contenders
    would otherwise each keep their peak (glibc keeps freed activations), and several contenders could overrun the
    machine's memory. Only then: a trim takes from encoderkit's training process the memory it keeps between
    steps (``memory.keep_freed_memory``), which a user's process never gives back, and the next step faults it in
    anew. Measured (Intel Xeon, 2 cores, one SST-2 epoch): trimmed at every 10-step turn, encoderkit ran 1.06x the
    grouped Trainer interleaved; each alone, back to back, 1.14x."""
    if not memory_is_short():
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class TrainerPlayer:
    """An encoderkit ``Trainer`` stepped a chunk at a time; ``seconds`` counts only the steps."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.seconds, self.examples = 0.0, 0
        self.trainer.begin(resume=False)

    @property
    def done(self) -> bool:
        return self.trainer.step >= self.trainer.config.max_steps

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if self.done:
                return
            started = time.perf_counter()
            record = self.trainer.train_step()
            self.seconds += time.perf_counter() - started
            self.examples += record["examples"]


def serve_player(conn, player: TrainerPlayer) -> None:
    """Answer the parent's ``run`` turns with ``player`` until it says ``evaluate``."""
    while True:
        command, steps = conn.recv()
        if command == "evaluate":
            return
        player.run(steps)
        give_back_memory()
        conn.send(("turn", (player.done, player.seconds, player.examples)))


def transformers_turns(trainer, conn):
    """A callback that gives the turn back to the parent after every ``steps`` optimizer steps of a transformers
    (or sentence-transformers) Trainer. Call ``wait()`` before ``trainer.train()`` and ``finish(examples)`` after."""
    import transformers

    class Turns(transformers.TrainerCallback):
        budget, started, seconds = 0, 0.0, 0.0

        def wait(self) -> None:
            command, self.budget = conn.recv()
            if command != "run":
                raise RuntimeError(f"the Trainer was told {command!r} before it finished its epoch")
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.budget -= 1
            if self.budget <= 0:
                self.seconds += time.perf_counter() - self.started
                give_back_memory()
                conn.send(("turn", (False, self.seconds, state.global_step * args.per_device_train_batch_size)))
                self.wait()

        def finish(self, examples: int) -> None:
            self.seconds += time.perf_counter() - self.started
            conn.send(("turn", (True, self.seconds, examples)))

    turns = Turns()
    trainer.add_callback(turns)
    return turns


def contender_process(target: Callable[..., None], conn, *args: Any) -> None:
    """A contender process's body: ``target(conn, *args)`` with failures reported to the parent."""
    try:
        target(conn, *args)
    except BaseException:  # the parent reports it and stops the other contenders
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Contender:
    """The parent's handle on a contender's process: ``target(conn, *args)`` runs in a spawned process."""

    def __init__(self, context, name: str, target: Callable[..., None], *args: Any) -> None:
        self.name = name
        self.conn, child = context.Pipe()
        self.process = context.Process(target=contender_process, args=(target, child, *args), daemon=True)
        self.process.start()
        child.close()
        self.done, self.seconds, self.examples = False, 0.0, 0
        self.info = self._receive("ready")

    def _receive(self, expected: str):
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise SystemExit(f"{self.name}: its process ended without a word (exit code {self.process.exitcode})")
        if kind == "error":
            raise SystemExit(f"{self.name} failed:\n{value}")
        assert kind == expected, (kind, expected)
        return value

    def run(self, steps: int) -> None:
        if not self.done:
            self.conn.send(("run", steps))
            self.done, self.seconds, self.examples = self._receive("turn")

    def quality(self) -> dict[str, float]:
        self.conn.send(("evaluate", 0))
        value = self._receive("quality")
        self.process.join()
        return value


def take_turns(players: list[Contender], chunk: int, report_every: int = 10) -> None:
    """Run the contenders in turns of ``chunk`` steps until each has finished."""
    turn = 0
    while not all(p.done for p in players):
        for player in players:
            player.run(chunk)
        turn += 1
        if turn % report_every == 0:
            print("  " + ", ".join(f"{p.name} {p.seconds:,.0f} s" for p in players), flush=True)
