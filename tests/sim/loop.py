"""A deterministic event loop on virtual time (FoundationDB's simulator, TigerBeetle's VOPR):
no real I/O, no threads — a timer that is due runs when nothing else is ready, and time jumps
to it — so a run is a function of its seed alone, and seconds of cluster time take
milliseconds. Work the code hands to threads (``asyncio.to_thread``, any executor) runs inline —
or, with ``threads`` (a rate and a generator of its own), a share of it runs a little later in
virtual time, as a pool's threads finish in an order of their own: jobs handed over in one
order complete in another, never while their process is stopped, never after it is killed."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import random
import selectors


class Stalled(Exception):
    """Nothing is ready and no timer is due: every task waits for something that never comes."""


class _VirtualSelector(selectors.BaseSelector):
    """Registers what the loop asks (its self-pipe) and never reports an event: waiting for
    ``timeout`` seconds is advancing the clock by that much."""

    def __init__(self, loop: "SimLoop"):
        self._loop, self._map = loop, {}

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._map[key.fd] = key
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout=None):
        if timeout is None:
            raise Stalled("no task is ready and no timer is due")
        self._loop.now += max(timeout, 0.0)
        return []

    def get_map(self):
        return self._map

    def close(self):
        self._map.clear()


class _Inline(concurrent.futures.ThreadPoolExecutor):  # the type the loop insists on; no thread runs
    def submit(self, fn, /, *args, **kwargs):
        f = concurrent.futures.Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            f.set_exception(e)
        return f


class _Task(asyncio.Task):
    """Hashed by creation order, not by address: code that keeps tasks in a set (and cancels or
    awaits them in its order) then runs the same way every time."""

    _made = 0

    def __init__(self, *a, **kw):
        _Task._made += 1
        self._n = _Task._made  # before the base registers it in a (weak) set
        super().__init__(*a, **kw)

    def __hash__(self) -> int:
        return self._n


class _Future(asyncio.Future):
    _made = 0

    def __init__(self, *a, **kw):
        _Future._made += 1
        self._n = _Future._made  # before the base registers it in a (weak) set
        super().__init__(*a, **kw)

    def __hash__(self) -> int:
        return self._n


# The simulated process a piece of code runs in: every task inherits it from the code that
# created it, so a crash cancels exactly that node's tasks.
PROCESS: contextvars.ContextVar[str] = contextvars.ContextVar("sim_process", default="")


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self, threads: tuple[float, random.Random] | None = None):
        self.now = 0.0
        super().__init__(_VirtualSelector(self))
        self._default_executor = _Inline(max_workers=1)
        self.tasks: dict[str, set[asyncio.Task]] = {}
        self.paused: dict[str, list[asyncio.Handle]] = {}  # process -> its steps held until resumed
        self.threads = threads  # (share of executor jobs run late, its generator)
        self.late_jobs = 0
        self._incarnation: dict[str, int] = {}  # process -> kills so far (a job of a killed one never runs)
        _Task._made = _Future._made = 0
        self.set_task_factory(self._task)

    def time(self) -> float:
        return self.now

    def create_future(self) -> asyncio.Future:
        return _Future(loop=self)

    def run_in_executor(self, _executor, func, *args):
        """Inline whatever executor the code names (``terrafs.iopool``'s threads too): a real
        thread would finish at a real moment, and the run would depend on the machine. With
        ``threads``, a share of jobs runs 0.5-20 ms of virtual time later instead."""
        if self.threads is None or self.threads[1].random() >= self.threads[0]:
            return super().run_in_executor(self._default_executor, func, *args)
        self.late_jobs += 1
        fut = self.create_future()
        owner = contextvars.copy_context().get(PROCESS)
        born = self._incarnation.get(owner, 0)

        def run() -> None:
            if self._incarnation.get(owner, 0) != born:
                return  # its process was killed: the thread died with it
            if owner in self.paused:
                self.call_later(0.005, run)  # a stopped process's threads are stopped too
                return
            try:  # a thread runs its job even when the coroutine that waited for it gave up
                res = func(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                if not fut.cancelled():
                    fut.set_exception(e)
                return
            if not fut.cancelled():
                fut.set_result(res)
        self.call_later(self.threads[1].uniform(0.0005, 0.02), run)
        return fut

    def call_soon(self, callback, *args, context=None):
        """Every step of every task passes here: one of a paused process waits for its resume."""
        owner = (context if context is not None else contextvars.copy_context()).get(PROCESS)
        if owner in self.paused:
            h = asyncio.Handle(callback, args, self, context)
            self.paused[owner].append(h)
            return h
        return super().call_soon(callback, *args, context=context)

    def pause(self, process: str) -> None:
        """SIGSTOP: nothing of ``process`` runs until :meth:`resume` (its timers come due
        meanwhile; what they wake runs after it)."""
        self.paused.setdefault(process, [])

    def resume(self, process: str) -> None:
        for h in self.paused.pop(process, []):
            if not h.cancelled():
                self._ready.append(h)

    def _task(self, loop, coro, context=None):
        t = _Task(coro, loop=loop, context=context)
        owner = (context or contextvars.copy_context()).get(PROCESS)
        if owner:
            group = self.tasks.setdefault(owner, set())
            group.add(t)
            t.add_done_callback(group.discard)
        return t

    def kill(self, process: str) -> int:
        """Cancel every task of ``process`` (kill -9: nothing of it runs any more)."""
        self.resume(process)  # a stopped process is killed all the same
        self._incarnation[process] = self._incarnation.get(process, 0) + 1
        group = self.tasks.pop(process, set())
        for t in group:
            t.cancel()
        return len(group)


def in_process(name: str, coro) -> asyncio.Task:
    """Run ``coro`` as a task of simulated process ``name``."""
    ctx = contextvars.copy_context()
    ctx.run(PROCESS.set, name)
    return asyncio.get_running_loop().create_task(coro, context=ctx)
