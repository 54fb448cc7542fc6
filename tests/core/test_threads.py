"""encoderkit.threads: model work handed to the process's one compute thread, from any thread, with its result or
its exception, and a call made on the compute thread itself run in place (no thread waits for itself)."""
from __future__ import annotations

import threading

import pytest

from encoderkit.threads import THREAD_NAME, compute_executor, on_compute_thread


def where() -> tuple[str, int]:
    return threading.current_thread().name, threading.get_ident()


def test_calls_from_any_thread_run_on_one_compute_thread():
    seen = [on_compute_thread(where)]
    workers = [threading.Thread(target=lambda: seen.append(on_compute_thread(where))) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(set(seen)) == 1, seen
    name, ident = seen[0]
    assert name.startswith(THREAD_NAME) and ident != threading.get_ident()
    assert compute_executor() is compute_executor()


def test_result_and_exception_come_back_to_the_caller():
    assert on_compute_thread(sorted, [3, 1, 2], reverse=True) == [3, 2, 1]
    with pytest.raises(ZeroDivisionError):
        on_compute_thread(lambda: 1 / 0)
    assert on_compute_thread(lambda: "still serving") == "still serving"  # the thread survived the error


def test_a_call_on_the_compute_thread_runs_in_place():
    outer, inner = on_compute_thread(lambda: (where(), on_compute_thread(where)))  # would deadlock if queued
    assert outer == inner

