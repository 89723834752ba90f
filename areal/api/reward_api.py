"""``AsyncRewardWrapper``: await a blocking reward function without blocking the rollout loop.

    await wrapper(**kwargs) ─► ProcessPoolExecutor (shared per process, per max_workers)
                                  │ timeout_seconds ─► the pool is killed and replaced; retry
                                  │ worker died (segfault, os._exit, OOM) ─► new pool; retry
                                  ▼
                               float(result)

Why a process pool: math verification (sympy) can run for seconds on adversarial completions
and holds the GIL; in a thread it would stall every agent of the event loop.

Invariants:
- The result is a float (``bool`` and ints are converted); anything else is a ``TypeError``.
- An exception raised by the reward function itself propagates at once, unretried: it is
  deterministic, so a retry would only repeat it.
- A timeout or a dead worker is retried ``max_retries`` times on a fresh pool; then
  ``RewardTimeoutError`` / ``RewardWorkerError`` is raised, unless ``timeout_reward`` is set,
  in which case a timed-out call scores that value (AReaL's behaviour is 0.0).
- A timed-out worker is killed by PID (the pool cannot cancel a running task); other calls in
  flight on that pool see it break and are retried on the replacement.
- Pools are per process (checked by PID), so a forked sandbox episode never reuses its parent's.

Not covered: reward functions that are not picklable (lambdas, closures) — define them at
module level, as AReaL requires too.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any


class RewardTimeoutError(TimeoutError):
    """The reward function did not finish within its timeout, on every attempt."""


class RewardWorkerError(RuntimeError):
    """The worker running the reward function died, on every attempt."""


_POOLS: dict[tuple[int, int], ProcessPoolExecutor] = {}  # (pid, max_workers) -> pool


def _pool(max_workers: int) -> ProcessPoolExecutor:
    key = (os.getpid(), max_workers)
    pool = _POOLS.get(key)
    if pool is None:
        # fork: workers start in milliseconds and inherit the reward function's module, also
        # when it lives in the script being run (__main__).
        pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("fork"))
        _POOLS[key] = pool
    return pool


def _discard_pool(max_workers: int, pool: ProcessPoolExecutor) -> None:
    """Kill ``pool``'s workers by PID and forget it, so the next call gets a fresh one."""
    key = (os.getpid(), max_workers)
    if _POOLS.get(key) is pool:
        del _POOLS[key]
    # Private but stable since 3.2: the only handle on the worker processes of a pool.
    for proc in list(getattr(pool, "_processes", {}).values()):
        if proc.is_alive():
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


@atexit.register
def _shutdown_pools() -> None:
    for (pid, _), pool in list(_POOLS.items()):
        if pid == os.getpid():
            pool.shutdown(wait=False, cancel_futures=True)
    _POOLS.clear()


class AsyncRewardWrapper:
    """``await AsyncRewardWrapper(fn)(*args, **kwargs)`` runs ``fn`` in a process pool."""

    def __init__(
        self,
        reward_fn: Callable[..., Any],
        timeout_seconds: float = 15.0,
        max_workers: int | None = None,
        max_retries: int = 2,
        timeout_reward: float | None = None,
    ) -> None:
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be callable, got {reward_fn!r}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.reward_fn = reward_fn
        self.timeout_seconds = timeout_seconds
        self.max_workers = max_workers or max(1, min(4, os.cpu_count() or 1))
        self.max_retries = max_retries
        self.timeout_reward = timeout_reward

    async def __call__(self, *args: Any, **kwargs: Any) -> float:
        last: BaseException | None = None
        for _ in range(self.max_retries + 1):
            pool = _pool(self.max_workers)
            try:
                future = pool.submit(self.reward_fn, *args, **kwargs)
                result = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_seconds)
            except TimeoutError as e:
                last = e
                _discard_pool(self.max_workers, pool)
                continue
            except BrokenProcessPool as e:  # a worker died: this call's or a neighbour's
                last = e
                _discard_pool(self.max_workers, pool)
                continue
            return _as_float(result, self.reward_fn)
        name = getattr(self.reward_fn, "__qualname__", repr(self.reward_fn))
        attempts = self.max_retries + 1
        if isinstance(last, asyncio.TimeoutError):
            if self.timeout_reward is not None:
                return float(self.timeout_reward)
            raise RewardTimeoutError(f"reward function {name} exceeded {self.timeout_seconds} s on all {attempts} attempts")
        raise RewardWorkerError(f"reward function {name}: its worker process died on all {attempts} attempts ({last!r})")


def _as_float(result: Any, fn: Callable[..., Any]) -> float:
    if isinstance(result, (bool, int, float)):
        return float(result)
    if hasattr(result, "item"):  # numpy / torch scalars
        return float(result.item())
    raise TypeError(f"reward function {getattr(fn, '__qualname__', fn)!r} returned {type(result).__name__}; expected a number")
