"""Requests from any thread decoded together: one loop thread runs a :class:`~specframe.decode.batch.BatchLoop`
over what the callers :meth:`~BatchScheduler.submit` (continuous batching across threads, as a server needs).

A caller gets a :class:`concurrent.futures.Future`; its request joins the batch at the next step with room and leaves
when it finishes, or before the next step once its ``cancel`` event is set (a client that disconnected). Everything the request calls back (``on_text``, observers) runs on the loop thread; a callback that
raises fails its own request only. A target forward that fails fails every request of that step; the loop then
starts afresh for later ones.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Any, Callable

import torch

from .batch import BatchLoop, BatchRequest

__all__ = ["BatchScheduler"]

log = logging.getLogger("specframe")


class BatchScheduler:
    """One loop thread decoding every submitted request with up to ``batch_size`` in each forward.

    Args:
        target: the target every request's engine runs on.
        batch_size: requests in one forward at most.
        between_steps: called on the loop thread after every step (the thread governor's load check).
    """

    def __init__(self, target: Any, batch_size: int, between_steps: Callable[[], Any] | None = None) -> None:
        self.target, self.batch_size, self.between_steps = target, int(batch_size), between_steps
        self._queue: queue.Queue[tuple[BatchRequest, Future, float] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pending = 0  # submitted and not finished (queued or in the batch)

    @property
    def pending(self) -> int:
        """Requests submitted and not finished yet: queued or decoding."""
        return self._pending

    def submit(self, item: BatchRequest) -> Future:
        """Queue ``item``; the future's result is its :class:`~specframe.decode.engine.GenerationResult` (or the
        error its request raised).

        Raises:
            RuntimeError: the scheduler was closed.
        """
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._pending += 1
            fut.add_done_callback(self._finished)
            self._queue.put((item, fut, time.perf_counter()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specframe-batch", daemon=True)
                self._thread.start()
        return fut

    def _finished(self, fut: Future) -> None:
        with self._lock:
            self._pending -= 1

    def close(self) -> None:
        """Finish what was submitted, then stop the loop thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None:
            thread.join()

    # --- the loop thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            loop: BatchLoop | None = None
            futures: dict[int, Future] = {}
            stopping = False
            while True:
                if loop is None:
                    loop = BatchLoop(self.target, self.batch_size)
                if not loop.active:  # idle: wait for the next request
                    if stopping:
                        break
                    got = self._queue.get()
                    if got is None:
                        stopping = True
                        continue
                    self._admit(loop, futures, *got)
                while loop.room:  # join whatever else is waiting, without waiting
                    try:
                        got = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if got is None:
                        stopping = True
                        continue
                    self._admit(loop, futures, *got)
                if not loop.active:
                    continue
                try:
                    finished = loop.step()
                except Exception as exc:  # noqa: BLE001 - the target failed: every request of the step fails
                    for a in loop.active:
                        fut = futures.pop(a.index)
                        if not fut.done():
                            fut.set_exception(exc)
                    loop.close()
                    loop = None
                    continue
                for index, result in finished:
                    fut = futures.pop(index)
                    if fut.done():  # (cancelled by its caller)
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
                if self.between_steps is not None:
                    try:
                        self.between_steps()
                    except Exception as exc:  # noqa: BLE001 - a load check cannot stop decoding
                        log.warning("the between-steps check raised %s: %s", type(exc).__name__, exc)
            loop.close()

    @staticmethod
    def _admit(loop: BatchLoop, futures: dict[int, Future], item: BatchRequest, fut: Future, arrived: float) -> None:
        gone = item.cancel is not None and item.cancel.is_set()
        if gone or not fut.set_running_or_notify_cancel():  # cancelled while it waited for a row
            if item.release is not None:
                item.release()
            if gone and not fut.done():
                fut.set_running_or_notify_cancel()
                fut.set_exception(CancelledError("the request was cancelled"))
            return
        try:
            loop.admit(item, id(fut), arrived)
        except Exception as exc:  # noqa: BLE001 - a bad request fails alone
            fut.set_exception(exc)
            return
        futures[id(fut)] = fut
