"""The facade's frames of workers' token streams (app/api/frames.py): one frame open at a time,
other workers' text held until it closes, whole frames for workers that ended meanwhile."""

from __future__ import annotations

import re

from app.api.frames import FRAME_END, Frames

FRAME = re.compile(r"\[SUB_AGENT_(\w+)\](.*?)\[/SUB_AGENT\]\n", re.S)


def parsed(text: str) -> list[tuple[str, str]]:
    """What a parser of whole frames (seed 001's) reads."""
    return FRAME.findall(text)


def test_one_worker_streams_into_its_frame_and_closes_with_the_rest() -> None:
    f = Frames()
    assert f.delta("a", "Hel") == ["[SUB_AGENT_a]Hel"]
    assert f.delta("a", "lo") == ["lo"]
    assert f.end("a", "Hello world") == [f" world{FRAME_END}\n"]
    assert f.finish() == []


def test_other_workers_wait_until_the_open_frame_closes() -> None:
    f = Frames()
    out = f.delta("a", "A1")
    assert f.delta("b", "B1") == [] and f.delta("b", "B2") == []  # held: a's frame is open
    out += f.delta("a", "A2")
    closing = f.end("a", "A1A2")
    assert closing == [FRAME_END + "\n", "[SUB_AGENT_b]B1B2"]  # b opens with what it gathered
    out += closing + f.delta("b", "B3") + f.end("b", "B1B2B3")
    assert parsed("".join(out)) == [("a", "A1A2"), ("b", "B1B2B3")]
    assert f.open is None


def test_a_worker_that_ended_while_another_streamed_goes_out_whole_next() -> None:
    f = Frames()
    out = f.delta("a", "x")
    out += f.delta("c", "partial")
    assert f.end("b", "B whole") == []  # a's frame is open
    assert f.end("c", "C whole") == []
    out += f.end("a", "xy")
    assert parsed("".join(out)) == [("a", "xy"), ("b", "B whole"), ("c", "C whole")]
    assert f.delta("c", "late") == [] and f.end("c", "C whole") == []


def test_a_failed_worker_closes_its_open_frame_and_sends_nothing_otherwise() -> None:
    f = Frames()
    out = f.delta("a", "half")
    out += f.delta("b", "B")
    out += f.end("a", None)  # failed mid-stream: its frame closes as it is
    out += f.end("c", None)  # never streamed: no frame
    out += f.end("b", "B!")
    assert parsed("".join(out)) == [("a", "half"), ("b", "B!")]


def test_an_output_that_differs_from_what_streamed_closes_without_repeating() -> None:
    f = Frames()
    out = f.delta("a", "first try")  # a retried attempt's text, then another output
    out += f.end("a", "second")
    assert parsed("".join(out)) == [("a", "first try")]


def test_the_frame_end_inside_a_workers_text_does_not_close_its_frame() -> None:
    f = Frames()
    out = f.delta("a", "see [/SUB_AGENT] here") + f.end("a", "see [/SUB_AGENT] here")
    ((name, text),) = parsed("".join(out))
    assert name == "a" and FRAME_END not in text


def test_the_swarms_end_closes_what_is_open_and_flushes_what_waits() -> None:
    f = Frames()
    out = f.delta("a", "A") + f.delta("b", "B")
    out += f.finish()
    assert parsed("".join(out)) == [("a", "A"), ("b", "B")]
    assert f.open is None
