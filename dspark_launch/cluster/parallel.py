"""Work on several nodes at once: each node's agent is its own process, so threads only wait."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Generic, Iterable, TypeVar

from dspark_launch.agent.transport import kill_in_flight
from dspark_launch.errors import Terminated

T = TypeVar("T")


def on_each(nodes: Iterable, work: Callable[..., T]) -> dict[str, T]:
    """`work(node)` on every node at once; the first failure (in node order) is raised after all ended."""
    nodes = list(nodes)
    if len(nodes) <= 1:
        return {node.name: work(node) for node in nodes}
    pool = concurrent.futures.ThreadPoolExecutor(len(nodes))
    try:
        futures = {node.name: pool.submit(work, node) for node in nodes}
        concurrent.futures.wait(futures.values())
    except BaseException:
        # Interrupted: end the agents these threads wait on instead of waiting for them.
        kill_in_flight()
        raise
    finally:
        pool.shutdown(wait=False)
    return {name: future.result() for name, future in futures.items()}


class Background(Generic[T]):
    """`work()` in a daemon thread (an interrupt never waits for it); `result()` joins and re-raises."""

    def __init__(self, work: Callable[[], T]):
        self._value: list = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._value.append(work())
            except BaseException as exc:  # handed to result()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until the work ended; its outcome stays for result()."""
        self._thread.join()

    def ended(self, within_s: float) -> bool:
        """Whether the work ended, waiting at most `within_s` for it."""
        self._thread.join(within_s)
        return not self._thread.is_alive()

    def result(self) -> T:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._value[0]


def settle(work: Background, cause: BaseException) -> None:
    """`cause` ended the caller's own part: let `work` (short, and maybe writing) end before the caller
    unwinds, so nothing of it outlives the rollback; an interrupt does not wait (its agents end at exit)."""
    if not isinstance(cause, (KeyboardInterrupt, Terminated)):
        work.join()
