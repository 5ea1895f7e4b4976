"""An iterator read ahead in a thread: a producer that releases the GIL (a decompressor, a file read)
overlaps its consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any


def read_ahead(items: Generator[Any, None, None]) -> Iterator[Any]:
    """`items` produced in a thread, one item ahead of the consumer; its error raised here."""
    done = object()
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ahead.put(item)
            ahead.put(done)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            ahead.put(err)
        finally:
            items.close()  # closes the file it reads

    thread = threading.Thread(target=produce, daemon=True, name="convsts-read-ahead")
    thread.start()
    try:
        while (item := ahead.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
