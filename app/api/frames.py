"""The facade's frames of workers' text (SPEC §10): `[SUB_AGENT_<name>]…[/SUB_AGENT]`, one frame
open at a time, so a parser of whole frames reads a token stream as it reads whole outputs.

The first worker to send text opens its frame and streams into it; the others' text waits
until that frame closes (its worker ended). A worker that ended meanwhile goes out whole next,
then the next waiting one opens with the text it gathered.
"""

from __future__ import annotations

FRAME_END = "[/SUB_AGENT]"


def _inside(text: str) -> str:
    # a worker's text that closes the frame itself must not end it early for the reader
    return text.replace(FRAME_END, "[/SUB_AGENT\u200b]")


def whole(name: str, output: str) -> str:
    """A worker's frame sent at once, when it ended."""
    return f"[SUB_AGENT_{name}]{_inside(output)}{FRAME_END}\n"


class Frames:
    """What goes out for each delta and each worker's end; every method returns the text to
    send now (possibly none)."""

    def __init__(self) -> None:
        self.open: str | None = None
        self._sent = ""  # the open frame's text so far
        self._waiting: dict[str, list[str]] = {}  # text of workers whose frame is not open
        self._ended: dict[str, str] = {}  # outputs of workers that ended while another streamed
        self._closed: set[str] = set()

    def delta(self, name: str, text: str) -> list[str]:
        if name in self._closed or name in self._ended:
            return []
        if self.open is None:
            self.open, self._sent = name, text
            return [f"[SUB_AGENT_{name}]{_inside(text)}"]
        if self.open == name:
            self._sent += text
            return [_inside(text)]
        self._waiting.setdefault(name, []).append(text)
        return []

    def end(self, name: str, output: str | None) -> list[str]:
        """Worker `name` ended: with its whole output, or None (failed, skipped: no frame of
        its own, but a frame it had opened is closed)."""
        if name in self._closed:
            return []
        self._waiting.pop(name, None)
        if self.open == name:
            sent = self._sent
            rest = output[len(sent):] if output is not None and output.startswith(sent) else ""
            out = [f"{_inside(rest)}{FRAME_END}\n"]
            self._close(name)
            return out + self._next()
        if output is None:
            self._closed.add(name)
            return []
        if self.open is None:
            self._closed.add(name)
            return [whole(name, output)]
        self._ended[name] = output
        return []

    def finish(self) -> list[str]:
        """The swarm ended: a frame still open is closed, what waits goes out."""
        out: list[str] = []
        while self.open is not None:
            out.append(f"{FRAME_END}\n")
            self._close(self.open)
            out += self._next()
        return out

    def _close(self, name: str) -> None:
        self._closed.add(name)
        self.open, self._sent = None, ""

    def _next(self) -> list[str]:
        out = []
        for name, output in self._ended.items():
            self._closed.add(name)
            out.append(whole(name, output))
        self._ended.clear()
        if self._waiting:
            name = next(iter(self._waiting))
            out += self.delta(name, "".join(self._waiting.pop(name)))
        return out
