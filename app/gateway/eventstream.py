"""Reading a gateway's event stream: each event bounded, so an endless one cannot take the
process's memory (the passthrough's streams and the workers' streamed calls alike)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import httpx
from httpx_sse import SSEError

DONE = "[DONE]"

# the longest event a stream may send (its lines together): an event is a few hundred bytes;
# an endless line, or endless `data:` lines with no blank line between them, would be held
# whole by the SSE decoder, and take the process's memory with it
MAX_EVENT_CHARS = 8 * 1024 * 1024


def _last_blank_line(text: str) -> int:
    """Where the last blank line (the end of an event) starts in `text`, or -1. Line breaks
    are CRLF, CR or LF, so two in a row show as LF LF, CR CR or LF CR (CRLF CRLF holds the
    last; a lone CR LF is one break)."""
    return max(text.rfind("\n\n"), text.rfind("\r\r"), text.rfind("\n\r"))


class _CappedText:
    """A streamed response as EventSource reads it (its headers, its text), refusing an event
    longer than MAX_EVENT_CHARS (SSEError: the attempt's, or the stream's, failure)."""

    def __init__(self, response: httpx.Response) -> None:
        self.headers = response.headers
        self._response = response

    async def aiter_text(self) -> AsyncIterator[str]:
        run, tail = 0, ""  # characters since the last blank line; the text's last character
        async for text in self._response.aiter_text():
            window = tail + text  # a blank line split between two pieces
            cut = _last_blank_line(window)
            run = len(window) - cut - 2 if cut >= 0 else run + len(text)
            if run > MAX_EVENT_CHARS:
                raise SSEError(f"a stream event over {MAX_EVENT_CHARS} characters")
            tail = text[-1:] or tail
            yield text


def capped(response: httpx.Response) -> httpx.Response:
    return cast(httpx.Response, _CappedText(response))
