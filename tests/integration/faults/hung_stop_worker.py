"""``streams.app.worker`` whose stop never finishes: the verdict producer's close (the last
step of the worker's stop, ``Output.close``) waits for ever, as a stop that awaits something
that can no longer happen does.  What is left to end the process is the membership watchdog
(``streams.app.watchdog``): the case checks it does, within its bound, and that ``/healthz``
answers 503 until then."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from streams.app import output  # noqa: E402
from streams.app.worker import main  # noqa: E402


async def close(self) -> None:
    await asyncio.Event().wait()  # never set


output.Output.close = close

if __name__ == "__main__":
    main()
