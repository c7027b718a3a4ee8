"""The stop deadline: a stop that overruns it ends the process (here: a recorded exit)
with the step it was stuck in and every thread's stack; one that finishes does not."""

from __future__ import annotations

import threading

import pytest

from meshmq.transport.stop_deadline import EXIT_STOP_OVERRAN, StopDeadline


def test_an_overrun_stop_logs_the_step_dumps_the_stacks_and_exits(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    exited: list[int] = []
    done = threading.Event()

    def exit_(code: int) -> None:
        exited.append(code)
        done.set()

    deadline = StopDeadline(lambda: "store", seconds=0.05, exit=exit_)
    deadline.arm()
    deadline.arm()  # a second signal changes nothing
    assert done.wait(10)
    assert exited == [EXIT_STOP_OVERRAN]
    assert "did not stop within 0.05 s of the signal (still stopping: store)" in caplog.text
    stacks = capfd.readouterr().err
    assert "Thread 0x" in stacks and "in _expired" in stacks  # every thread's, its own too


def test_a_stop_that_finishes_in_time_is_not_ended() -> None:
    exited: list[int] = []
    deadline = StopDeadline(lambda: "store", seconds=0.2, exit=exited.append)
    deadline.arm()
    timer = next(t for t in threading.enumerate() if t.name == "meshmq-stop-deadline")
    assert timer.daemon  # it never keeps a process that did stop alive
    deadline.cancel()
    timer.join(5)
    assert not timer.is_alive() and not deadline.armed
    assert exited == []
