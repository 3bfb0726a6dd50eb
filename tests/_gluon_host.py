"""Runs a Gluon kernel's control flow on the host: the Python function under a @gluon.jit function,
with `gl` standing in for gluon.language (integer arithmetic, the program's id and grid, atomics on
a list, shared memory whose slots remember what was put there; any other tensor or layout is an
inert stand-in) and every @gluon.jit function it calls run the same way unless a stub takes its
place. Gluon has no interpreter: this runs the kernel's own source for what is integer code and
synchronization (its entry's prologue, the tile scheduler, the partitions' loops and their
barriers), so tests check it by behaviour instead of against a copy of its lines.

Two ways to run it. Sequentially: `HostGl(partitions=...)` runs the chosen partitions of
warp_specialize one after another (tests/test_ws_scheduler.py, with the barriers stubbed inert).
On threads: `HostGl(threads=Interleaving(...))` runs each partition of each CTA on a thread of its
own, one at a time in a random order, and `Hopper(...)`'s stand-ins for mbarrier, TMA and wgmma
make them wait for each other as the hardware would, checking every hazard on the way and, by
vector clocks, that the words partitions hand each other (a tile id) are stored and loaded in an
order their barriers give (tests/test_ws_protocol.py).

The host's model of the values: a kernel integer is an HInt; a uniform integer tensor
(gl.full of an int, its reductions) is its one value as an HInt; gl.arange gives an integer vector
(numpy), which minimum, maximum, where and the reductions follow; an integer divided by zero is
undefined (an Inert: the GPU gives some value, which the host run may carry but never branch on);
a floating-point tensor, a layout or a descriptor is an Inert, and branching on an Inert raises,
so a host run never silently follows a value it does not model."""
from __future__ import annotations

import inspect
import threading
import types

import numpy as np


class HInt(int):
    """A kernel integer: arithmetic stays an HInt, `.to(dtype)` keeps the value."""

    def to(self, *_args, **_kw):
        return self


def _lift(name):
    op = getattr(int, name)
    divisor = {"__floordiv__": 1, "__mod__": 1, "__rfloordiv__": 0, "__rmod__": 0}.get(name)

    def f(self, *a):
        if not all(isinstance(x, int) for x in a):
            return NotImplemented  # a tensor (Inert) or a float: theirs to answer
        if divisor is not None and int((self, *a)[divisor]) == 0:
            return Inert()  # undefined on the GPU; fine while nothing depends on it
        return HInt(op(self, *(int(x) for x in a)))
    return f


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__neg__"):
    setattr(HInt, _name, _lift(_name))


class Inert:
    """A value the host run does not follow (a tensor, a layout, a descriptor): any attribute,
    call, index, arithmetic or comparison gives another; branching on one raises."""

    def __getattr__(self, _name):
        return Inert()

    def __call__(self, *_a, **_kw):
        return Inert()

    def __getitem__(self, _k):
        return Inert()

    def __bool__(self):
        raise TypeError("the kernel branches on a value the host run does not model")

    def _same(self, *_a):
        return Inert()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same
    __floordiv__ = __mod__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __neg__ = __invert__ = _same
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _same
    __hash__ = object.__hash__
    __array_ufunc__ = None  # with an integer vector: ours to answer


class Ptr:
    """A device pointer into a list of ints (the tile counter pair, key bounds): `ptr + i`; `.to(int64)` its
    address, 0 for Ptr(None) (a null pointer: the launch passed none); atomics through HostGl."""

    def __init__(self, cells: list | None, i: int = 0):
        self.cells, self.i = cells, i

    def __add__(self, k: int) -> "Ptr":
        return Ptr(self.cells, self.i + k)

    def to(self, *_a, **_kw) -> HInt:
        return HInt(0 if self.cells is None else 0x1000 + 8 * self.i)


class ProtocolError(Exception):
    """A hazard of the barrier protocol, found by Hopper's stand-ins or the Interleaving."""


class Deadlock(ProtocolError):
    """Every live thread waits and nothing is in flight."""


class Unordered(ProtocolError):
    """Two accesses to a hand-off word, one of them a store, that no barrier orders (a data race)."""


class Desc:
    """A TMA descriptor: its name (what a load puts into a slot is (name, *coordinates)), its box's
    bytes and, where given, its tensor's shape (the dims the launch passes with it)."""

    def __init__(self, name: str, nbytes: int, shape=None):
        self.name = name
        self.block_type = types.SimpleNamespace(nbytes=nbytes)
        if shape is not None:
            self.shape = tuple(HInt(x) for x in shape)

    def __getattr__(self, _name):  # dtype, layout
        return Inert()


class Smem:
    """A shared-memory allocation: `.index(i)` its i-th slot (a buffer or an mbarrier). Named by
    the first partition parameter it is passed as (HostGl.warp_specialize)."""

    def __init__(self, n: int, gl: "HostGl"):
        self.gl, self.name, self.content = gl, None, None
        self.hb = [None, {}]  # a hand-off word's accesses (Hopper.words): the last store, the reads since
        self.slots = [Slot(self, i) for i in range(n)]

    def index(self, i):
        return self.slots[int(i)]

    def store(self, value):  # the whole allocation (a small vector)
        if self.gl.threads is not None:
            self.gl.threads.point()
        if self.gl.hopper is not None:
            self.gl.hopper.stored(self)
        self.content = value

    def load(self, *_a, **_kw):
        if self.content is None:
            raise ProtocolError(f"a read of {self}, which nothing has stored yet")
        if self.gl.hopper is not None:
            self.gl.hopper.loaded(self)
        return self.content

    def __getattr__(self, _name):  # dtype, layout
        return Inert()

    def __repr__(self):
        return self.name or "smem"


class Slot:
    """One slot of an allocation: what it holds (a TMA load's (desc, *coords), a stored integer,
    or ("regs", thread, n) for the n-th tensor a thread stored), the load in flight into it, the
    threads that read it and have not freed it (with what they read), and, once initialized as an
    mbarrier, its state."""

    def __init__(self, smem: Smem, i: int):
        self.smem, self.i = smem, i
        self.content = None
        self.loading = None
        self.holders: dict = {}
        self.bar = None
        self.hb = [None, {}]  # a hand-off word's accesses (Hopper.words): the last store, the reads since

    def __repr__(self):
        return f"{self.smem}[{self.i}]"

    def reshape(self, *_a):
        return View(self)

    permute = reshape

    def store(self, value):
        hopper = self.smem.gl.hopper
        if hopper is not None:
            hopper.write(self, value)
        else:
            self.content = value

    def load(self, *_a, **_kw):
        if self.content is None and self.smem.gl.threads is not None:
            raise ProtocolError(f"a read of {self!r}, which nothing has stored yet")
        if self.smem.gl.hopper is not None:
            self.smem.gl.hopper.loaded(self)
        return HInt(self.content) if isinstance(self.content, int) else Inert()

    def __getattr__(self, _name):  # dtype, shape
        return Inert()


class View:
    """A reshaped or permuted slot (an MMA operand): the slot itself to the stand-ins."""

    def __init__(self, slot: Slot):
        self.slot = slot

    def reshape(self, *_a):
        return self

    permute = reshape

    def store(self, value):
        self.slot.store(value)

    def load(self, *a, **kw):
        return self.slot.load(*a, **kw)

    def __getattr__(self, _name):
        return Inert()


def _slot(x):
    return x.slot if isinstance(x, View) else (x if isinstance(x, Slot) else None)


def _ints(op, *xs):
    """op over integers and integer vectors; an Inert (a float tensor) anywhere gives an Inert."""
    if not all(isinstance(x, (int, np.ndarray)) for x in xs):
        return Inert()
    r = op(*xs)
    return HInt(r) if np.ndim(r) == 0 else r


def _reduce(x, op):
    if isinstance(x, np.ndarray):
        return HInt(op(x))
    return x if isinstance(x, int) else Inert()


class HostGl:
    """gluon.language for CTA `pid` of `grid`, on the host. `point`, where given, runs before each
    atomic (Interleaving.point: another CTA may run there). warp_specialize runs the partitions
    `partitions` names (their indices; the default partition is 0), one after another; or, with
    `threads` (an Interleaving), every partition on a thread of its own: the default one on the
    calling thread, which then waits for the others (`hopper`: the stand-ins its shared memory
    reports register stores to)."""

    int32, int64 = "int32", "int64"

    def __init__(self, grid=(1, 1, 1), pid=(0, 0, 0), num_warps=4, point=None, partitions=(), threads=None,
                 hopper=None):
        self.grid, self.pid, self._warps = tuple(grid), tuple(pid), num_warps
        self._point, self._partitions = point, partitions
        self.threads, self.hopper = threads, hopper
        self.smem: dict = {}  # allocations by name (the partitions' parameter names)

    def __getattr__(self, _name):  # layouts, tensors: not followed
        return Inert()

    @staticmethod
    def minimum(a, b):
        return _ints(np.minimum, a, b)

    @staticmethod
    def maximum(a, b):
        return _ints(np.maximum, a, b)

    @staticmethod
    def where(c, a, b):
        return _ints(np.where, c, a, b)

    @staticmethod
    def cdiv(a, b):
        return HInt(-(-a // b))

    @staticmethod
    def arange(start, end, **_kw):
        return np.arange(int(start), int(end))

    @staticmethod
    def full(_shape, value, _dtype=None, _layout=None, **_kw):
        return HInt(value) if isinstance(value, int) else Inert()

    @staticmethod
    def max(x, *_a, **_kw):  # a uniform integer tensor's reduction is its value
        return _reduce(x, np.max)

    @staticmethod
    def min(x, *_a, **_kw):
        return _reduce(x, np.min)

    @staticmethod
    def sum(x, *_a, **_kw):
        return _reduce(x, np.sum) if isinstance(x, np.ndarray) else Inert()

    @staticmethod
    def load(ptr, *_a, **_kw):
        """A scalar load through a Ptr (a batch row's key bound): its cell. Other loads (mask
        values, tensors) are not modelled."""
        return HInt(ptr.cells[ptr.i]) if isinstance(ptr, Ptr) and ptr.cells is not None else Inert()

    def num_programs(self, axis):
        return HInt(self.grid[axis])

    def program_id(self, axis):
        return HInt(self.pid[axis])

    def num_warps(self):
        return self._warps

    def thread_barrier(self):
        if self.hopper is not None:
            self.hopper.thread_barrier()

    @staticmethod
    def static_assert(cond, msg=""):
        assert bool(cond), msg

    @staticmethod
    def static_range(*args):
        return range(*(int(a) for a in args))

    def allocate_shared_memory(self, _dtype, shape, _layout=None):
        return Smem(int(shape[0]), self)

    def atomic_add(self, ptr: Ptr, v, sem=None):
        if self._point:
            self._point()
        old = ptr.cells[ptr.i]
        ptr.cells[ptr.i] = old + v
        return HInt(old)

    def atomic_xchg(self, ptr: Ptr, v, sem=None):
        if self._point:
            self._point()
        old = ptr.cells[ptr.i]
        ptr.cells[ptr.i] = v
        return HInt(old)

    def warp_specialize(self, partitions, _warps, _regs):
        if self.threads is None:
            for i in self._partitions:
                fn, args = partitions[i]
                fn(*args)
            return
        for fn, args in partitions:  # name each allocation by its parameter, or its field of a struct
            code = fn.__code__
            for name, a in zip(code.co_varnames[:code.co_argcount], args):
                named = [(f, getattr(a, f)) for f in a.__slots__] if getattr(type(a), "host_struct", False) is True else [(name, a)]
                for n, v in named:
                    if isinstance(v, Smem) and v.name is None:
                        v.name = n
                        self.smem[n] = v
        run = self.threads
        cta = ".".join(str(p) for p in self.pid)
        workers = [run.spawn(lambda fn=fn, args=args: fn(*args), f"CTA {cta} {fn.__name__}")
                   for fn, args in partitions[1:]]
        fn, args = partitions[0]
        run.rename(f"CTA {cta} {fn.__name__}")
        run.point()  # the default partition has no head start on the others
        fn(*args)
        run.point(lambda: all(run.done(w) for w in workers), "the other partitions' end")
        run.rename(f"CTA {cta}")


class Around:
    """A stub for host(): `wrap` gets the callee run on the host and returns what runs in its place
    (to watch a kernel function's arguments without replacing it)."""

    def __init__(self, wrap):
        self.wrap = wrap


def _host_struct(aggregate):
    """A Gluon aggregate (a struct the kernel's functions take) on the host: a plain object holding
    its constructor's arguments under its field names, untyped (the host stand-ins are no Gluon
    values) and unconverted (a constant stays as given)."""
    fields = list(inspect.signature(aggregate.hash_attrs[0].fn).parameters)[1:]

    class HostStruct:
        __slots__ = fields
        host_struct = True

        def __init__(self, *args):
            for name, value in zip(fields, args, strict=True):
                setattr(self, name, value)

    HostStruct.__name__ = aggregate.__name__
    return HostStruct


def host(jit_fn, gl: HostGl, _seen=None, **stubs):
    """`jit_fn`'s Python function with `gl` for gluon.language; the @gluon.jit functions it names run
    on the host too, the structs (Gluon aggregates) it builds are plain host objects, and `stubs`
    replace globals of any of them by name (a callee, `mbarrier`, ...; an Around wraps the callee
    instead)."""
    from triton.runtime.jit import JITFunction

    seen = {} if _seen is None else _seen
    if id(jit_fn) in seen:
        return seen[id(jit_fn)]
    fn = jit_fn.fn
    env = dict(fn.__globals__)
    out = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    seen[id(jit_fn)] = out
    for name in fn.__code__.co_names:
        stub = stubs.get(name)
        if isinstance(stub, Around):
            key = ("around", name)
            if key not in seen:
                seen[key] = stub.wrap(host(env[name], gl, seen, **stubs))
            env[name] = seen[key]
        elif name in stubs:
            env[name] = stub
        elif isinstance(env.get(name), JITFunction):  # a @gluon.jit callee
            env[name] = host(env[name], gl, seen, **stubs)
        elif getattr(env.get(name), "__triton_aggregate__", False):  # a struct
            key = ("struct", id(env[name]))
            if key not in seen:
                seen[key] = _host_struct(env[name])
            env[name] = seen[key]
    env["gl"] = gl
    return out


class _Abort(BaseException):
    """Unwinds a thread the Interleaving stops (after another's error, or a deadlock)."""


def _signal():
    """A binary semaphore at 0 (a held lock: release() signals, acquire() waits): the hand-offs
    between the schedule and its threads strictly alternate."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class Interleaving:
    """Runs callables one at a time on threads of their own, switching at each `point()` (and at
    each one's start) to another chosen by `rng`: the CTAs of a launch (and their partitions),
    running at once, in any order; with `skew` each thread runs at a speed of its own, drawn
    between 2**-skew and 2**skew (a lagging partition, a CTA that starts late). `point(until)` parks the thread until `until()` holds (a wait
    that cannot pass yields); `event(fn)` puts something in flight (a TMA copy) that the schedule
    completes at a random later step; `spawn` adds a thread while running. When every live thread
    waits and nothing is in flight, run() raises Deadlock; the first error of any thread or event
    stops the run and is raised."""

    def __init__(self, rng, skew=0.0):
        self.rng, self.skew = rng, skew
        self._main = _signal()
        self._go: list = []
        self._speed: list = []
        self._names: list = []
        self._until: list = []
        self._done: list = []
        self._ready: list = []
        self._events: list = []
        self._threads: list = []
        self._me = threading.local()
        self._abort = False
        self._errors: list = []

    def me(self) -> int:
        return self._me.i

    def name(self, i=None) -> str:
        return self._names[self._me.i if i is None else i]

    def rename(self, name):
        self._names[self._me.i] = name

    def done(self, i) -> bool:
        return self._done[i]

    def spawn(self, fn, name="") -> int:
        i = len(self._go)
        self._go.append(_signal())
        self._speed.append(2.0 ** self.rng.uniform(-self.skew, self.skew) if self.skew else 1.0)
        self._names.append(name or f"thread {i}")
        self._until.append(None)
        self._done.append(False)
        self._ready.append(i)
        t = threading.Thread(target=self._body, args=(i, fn), daemon=True)
        self._threads.append(t)
        t.start()
        return i

    def _body(self, i, fn):
        self._me.i = i
        self._go[i].acquire()
        try:
            if not self._abort:
                fn()
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 (re-raised by run)
            self._errors.append(e)
        finally:
            self._done[i] = True
            self._main.release()

    def point(self, until=None, what=""):
        i = self._me.i
        self._until[i] = (until, what) if until is not None else None
        self._ready.append(i)
        self._main.release()
        self._go[i].acquire()
        if self._abort:
            raise _Abort()

    def event(self, fn):
        self._events.append(fn)

    def _step(self):
        runnable = [i for i in self._ready if self._until[i] is None or self._until[i][0]()]
        n = len(runnable) + len(self._events)
        if n == 0:
            waits = "; ".join(f"{self._names[i]}: {self._until[i][1]}" for i in self._ready)
            raise Deadlock(f"deadlock: every thread waits, nothing in flight ({waits})")
        if self.skew:
            k = self.rng.choices(range(n), [self._speed[i] for i in runnable] + [1.0] * len(self._events))[0]
        else:
            k = self.rng.randrange(n)
        if k >= len(runnable):
            self._events.pop(k - len(runnable))()
            return
        i = runnable[k]
        self._ready.remove(i)
        self._go[i].release()
        self._main.acquire()

    def run(self, fns, names=None):
        for k, fn in enumerate(fns):
            self.spawn(fn, names[k] if names else "")
        try:
            while (self._ready or self._events) and not self._errors:
                self._step()
        except BaseException as e:  # noqa: BLE001 (an event's error or a deadlock)
            self._errors.append(e)
        finally:
            self._abort = True
            while self._ready:  # unwind the parked threads, one at a time
                self._go[self._ready.pop()].release()
                self._main.acquire()
            for t in self._threads:
                t.join()
        if self._errors:
            raise self._errors[0]


class Hopper:
    """sm_90's asynchronous machinery for partitions on an Interleaving's threads, as stubs for
    host() (`stubs()`): mbarriers (init with a count; arrive; expect = arrive.expect_tx; a phase
    completes when its arrivals and its expected bytes are all in; wait by phase parity as
    try_wait.parity does: a wait on parity p passes while the number of completed phases has the
    other parity), TMA loads (each lands at a random later step, then counts its bytes on its
    barrier) and stores, async wgmma and its waits. Every wait, arrive, expect, load, store (TMA
    or registers into shared memory) and wgmma wait is a switch point.

    Checks, each a ProtocolError: a wait that passes on a phase other than the one it means (its
    intended phase: a thread's successive waits on one barrier mean the same phase or the next, by
    their parity; the first means the phase before 0, which a fresh barrier has completed, or
    phase 0); an arrival on a phase that has all its arrivals but not its bytes; bytes nobody
    expected; a load into a slot whose last load is still in flight, or that another thread has
    read and not freed; a read of a slot whose load is in flight; a slot that changes under an
    async read before the wait that retires it; a thread freeing a slot (arriving on the barrier
    `guards` maps to its allocation: {"k_empty": "k_ring"} frees k_ring[i] on k_empty[i]) that an
    MMA or store of its own still reads, or that no longer holds what it read; a register store
    into a slot another thread holds or a load fills; a barrier invalidated mid-phase. `on_read`
    and `on_store` (thread, slot, what it holds / descriptor, coordinates) let a test check what
    was read and written; `shift(thread, slot)` (0 by default) makes a wait mean an earlier phase
    (a test of the checks).

    The hand-off words (the allocations `words` names: a value one partition stores from registers
    and another loads, such as a tile id) are checked for order, not by what a read happens to
    see: each thread keeps a vector clock (what it has synchronized with, a count per thread); an
    arrival (arrive, expect) adds the arriving thread's clock to its barrier's current phase and
    then advances the thread's own count; a wait that passes on phase k takes in phase k's clock.
    A register store into a word is published by an arrival only once a thread barrier
    (gl.thread_barrier) follows it: a partition is one host thread standing for many GPU threads,
    and the kernel's one-thread arrive orders only the stores of threads that a thread barrier
    brought in before it. Each Unordered: a load of a word whose last store no barrier orders
    before it (a read that may see the value before, or one in flight), and a store into a word
    that a read or store of another thread may not have finished (an overwrite of a value a reader
    may not have read). A race is caught whether or not the schedule at hand makes the read see
    the wrong value. `drop_barrier(thread)` (False by default) makes that thread's thread barriers
    no-ops (a test of the checks)."""

    def __init__(self, run: Interleaving, guards=None, on_read=None, on_store=None, shift=None,
                 words=(), drop_barrier=None):
        self.run = run
        self.guards = guards or {}
        self.on_read = on_read or (lambda *a: None)
        self.on_store = on_store or (lambda *a: None)
        self.shift = shift or (lambda *a: 0)
        self.words = set(words)
        self.drop_barrier = drop_barrier or (lambda *a: False)
        self._vc: dict = {}       # thread -> its vector clock {thread: count}
        self._unfenced: dict = {}  # thread -> the word records it stored into since its thread barrier
        self._intent: dict = {}   # (thread, barrier slot) -> the phase its last wait meant
        self._mma: dict = {}      # thread -> [group: [(slot, content)]] in flight, oldest first
        self._stores: dict = {}   # thread -> [(slot, content)] TMA stores in flight
        self._writes: dict = {}   # thread -> register stores so far

    def stubs(self) -> dict:
        mbarrier = types.SimpleNamespace(MBarrierLayout=Inert, init=self.init, invalidate=self.invalidate,
                                         arrive=self.arrive, expect=self.expect, wait=self.wait)
        tma = types.SimpleNamespace(async_copy_global_to_shared=self.load, async_copy_shared_to_global=self.store,
                                    store_wait=self.store_wait)
        return dict(mbarrier=mbarrier, tma=tma, warpgroup_mma=self.mma, warpgroup_mma_wait=self.mma_wait,
                    fence_async_shared=lambda *a, **kw: None)

    def _who(self):
        return self.run.name()

    @staticmethod
    def _bar(slot):
        if not isinstance(slot, Slot) or slot.bar is None:
            raise ProtocolError(f"{slot!r} used as an mbarrier before its init")
        return slot.bar

    # mbarriers: the state is [arrivals pending, bytes pending, phases completed, count, the clock
    # the current phase's arrivals release, the clock the last completed phase released]
    def init(self, slot, count):
        slot.bar = [int(count), 0, 0, int(count), {}, {}]

    def invalidate(self, slot):
        pending, tx, _, count = self._bar(slot)[:4]
        if pending != count or tx != 0:
            raise ProtocolError(f"{slot!r} invalidated mid-phase ({count - pending} of {count} arrivals, "
                                f"{tx} bytes pending)")

    @staticmethod
    def _complete(bar):
        if bar[0] == 0 and bar[1] == 0:
            bar[2] += 1
            bar[0] = bar[3]
            bar[4], bar[5] = {}, bar[4]

    def _arrive(self, slot):
        bar = self._bar(slot)
        if bar[0] == 0:
            raise ProtocolError(f"{self._who()}: an arrival on {slot!r}, whose phase has all its arrivals")
        self._release(bar)
        bar[0] -= 1
        self._complete(bar)

    def arrive(self, slot, *, count=1, pred=True):
        self.run.point()
        if not pred:
            return
        self._free(slot)
        for _ in range(int(count)):
            self._arrive(slot)

    def expect(self, slot, nbytes, pred=True):
        self.run.point()
        if pred:
            self._bar(slot)[1] += int(nbytes)
            self._arrive(slot)

    def wait(self, slot, parity, pred=True, deps=()):
        bar = self._bar(slot)
        if not pred:
            self.run.point()
            return
        me = self.run.me()
        p = int(parity) & 1
        prev = self._intent.get((me, id(slot)))
        k = (-1 if p else 0) if prev is None else (prev if prev & 1 == p else prev + 1)
        self._intent[(me, id(slot))] = k
        k -= self.shift(self._who(), slot) if k >= 0 else 0
        q = k & 1
        self.run.point(lambda: bar[2] & 1 != q, f"wait {slot!r} parity {q}")
        if bar[2] != k + 1:
            raise ProtocolError(f"{self._who()}: a wait on {slot!r} for phase {k} passed at phase {bar[2]} (aliased)")
        self._join(self._clock(me), bar[5])  # phase k's arrivals happened before this wait's return

    def _free(self, slot):
        """An arrive on a barrier that guards a slot: the arriving thread is done with that slot."""
        data = slot.smem.gl.smem.get(self.guards.get(slot.smem.name))
        if data is None:
            return
        me = self.run.me()
        buf = data.slots[slot.i]
        inflight = [s for g in self._mma.get(me, ()) for s, _ in g] + [s for s, _ in self._stores.get(me, ())]
        if any(s is buf for s in inflight):
            raise ProtocolError(f"{self._who()} frees {buf!r} while its own MMA or store still reads it")
        if me in buf.holders:
            read = buf.holders.pop(me)
            if buf.content != read:
                raise ProtocolError(f"{self._who()} frees {buf!r}, which holds {buf.content}, not the {read} it read")

    # TMA
    def load(self, desc, coord, slot, dst, pred=True):
        self.run.point()
        if not pred:
            return
        bar = self._bar(slot)
        what = (desc.name, *(int(c) for c in coord[:3]))
        if dst.loading is not None:
            raise ProtocolError(f"{self._who()}: a load of {what} into {dst!r}, whose load of {dst.loading} is in flight")
        others = {self.run.name(t): c for t, c in dst.holders.items()}
        if others:
            raise ProtocolError(f"{self._who()}: a load of {what} over {dst!r}, still in use ({others})")
        dst.loading = what

        def land():
            dst.content, dst.loading = what, None
            bar[1] -= desc.block_type.nbytes
            if bar[1] < 0:
                raise ProtocolError(f"the load of {what} landed bytes on {slot!r} that no expect announced")
            self._complete(bar)
        self.run.event(land)

    def store(self, desc, coord, src):
        self.run.point()
        src = _slot(src)
        self._read(src)
        self.on_store(self.run.me(), desc.name, tuple(int(c) for c in coord[:3]), src.content)
        self._stores.setdefault(self.run.me(), []).append((src, src.content))

    def store_wait(self, pendings):
        self.run.point()
        mine = self._stores.get(self.run.me(), [])
        while len(mine) > int(pendings):
            self._retire(*mine.pop(0))

    # wgmma
    def mma(self, a, b, acc, *, use_acc=True, is_async=False, **_kw):
        group = []
        for x in (a, b):
            slot = _slot(x)
            if slot is not None:
                self._read(slot)
                self.on_read(self.run.me(), slot, slot.content)
                group.append((slot, slot.content))
        if is_async:
            self._mma.setdefault(self.run.me(), []).append(group)
        else:
            for s, c in group:
                self._retire(s, c)
        return Inert()

    def mma_wait(self, num_outstanding=0, deps=None):
        self.run.point()
        mine = self._mma.get(self.run.me(), [])
        while len(mine) > int(num_outstanding):
            for s, c in mine.pop(0):
                self._retire(s, c)
        return deps[0] if len(deps) == 1 else tuple(deps)

    def _read(self, slot):
        if slot.loading is not None:
            raise ProtocolError(f"{self._who()} reads {slot!r} while its load of {slot.loading} is in flight")
        slot.holders.setdefault(self.run.me(), slot.content)

    def _retire(self, slot, content):
        if slot.content != content or slot.loading is not None:
            raise ProtocolError(f"{self._who()}: {slot!r} changed from {content} to {slot.content} "
                                f"(load in flight: {slot.loading}) under an async read")

    # the hand-off words' order (happens-before by vector clocks)
    def _clock(self, me):
        return self._vc.setdefault(me, {me: 1})

    @staticmethod
    def _join(into, other):
        for t, n in other.items():
            if into.get(t, 0) < n:
                into[t] = n

    def _release(self, bar):
        """An arrival of this thread: its clock joins the phase's; the word stores it has not yet
        put behind a thread barrier stay after this arrival (their epoch moves on with the count)."""
        me = self.run.me()
        vc = self._clock(me)
        self._join(bar[4], vc)
        vc[me] += 1
        for hb in self._unfenced.get(me, ()):
            if hb[0] is not None and hb[0][0] == me:
                hb[0] = (me, vc[me])

    def thread_barrier(self):
        if not self.drop_barrier(self._who()):
            self._unfenced.pop(self.run.me(), None)

    def _ordered(self, me, access):
        t, n = access
        return t == me or self._clock(me).get(t, 0) >= n

    def _tracked(self, word) -> bool:
        """Whether `word` (a Slot or Smem) belongs to an allocation `words` names."""
        return (word.smem.name if isinstance(word, Slot) else word.name) in self.words

    def stored(self, word):
        """A register store into `word` (a Slot or Smem) by this thread."""
        if not self._tracked(word):
            return
        me = self.run.me()
        hb = word.hb
        late = [(a, "store") for a in [hb[0]] if a is not None and not self._ordered(me, a)]
        late += [((t, n), "read") for t, n in hb[1].items() if not self._ordered(me, (t, n))]
        if late:
            who = sorted({f"{self.run.name(a[0])}'s {k}" for a, k in late})
            raise Unordered(f"{self._who()} stores into {word!r} (holding {word.content}) with no barrier it "
                            f"waited on ordering {' and '.join(who)} of it before this store")
        hb[0], hb[1] = (me, self._clock(me)[me]), {}
        self._unfenced.setdefault(me, []).append(hb)

    def loaded(self, word):
        """A load of `word` (a Slot or Smem) by this thread."""
        if not self._tracked(word):
            return
        me = self.run.me()
        hb = word.hb
        if hb[0] is not None and not self._ordered(me, hb[0]):
            raise Unordered(f"{self._who()} reads {word!r} (holding {word.content}), whose store by "
                            f"{self.run.name(hb[0][0])} no barrier it waited on orders before the read: "
                            f"it may see the value before, or one in flight")
        hb[1][me] = self._clock(me)[me]

    # register stores into shared memory
    def write(self, slot, value):
        self.run.point()
        me = self.run.me()
        others = [self.run.name(t) for t in slot.holders if t != me]
        if others or slot.loading is not None:
            raise ProtocolError(f"{self._who()} stores into {slot!r}, held by {others} or loading {slot.loading}")
        self.stored(slot)
        if isinstance(value, int):
            slot.content = value
        else:
            self._writes[me] = self._writes.get(me, 0) + 1
            slot.content = ("regs", me, self._writes[me])
        if me in slot.holders:
            slot.holders[me] = slot.content
