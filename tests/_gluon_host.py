"""Runs a Gluon kernel's control flow on the host: the Python function under a @gluon.jit function,
with `gl` standing in for gluon.language (integer arithmetic, the program's id and grid, atomics on
a list; a tensor, layout or shared-memory value is an inert stand-in) and every @gluon.jit function
it calls run the same way unless a stub takes its place. Gluon has no interpreter: this runs the
kernel's own source for what is integer code (its entry's prologue, the tile scheduler, the
producer's loop over tiles), so tests check it against the C++ launcher's grids by behaviour
instead of against a copy of its lines."""
from __future__ import annotations

import threading
import types


class HInt(int):
    """A kernel integer: arithmetic stays an HInt, `.to(dtype)` keeps the value."""

    def to(self, *_args, **_kw):
        return self


def _lift(name):
    op = getattr(int, name)
    return lambda self, *a: HInt(op(self, *(int(x) for x in a)))


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__neg__"):
    setattr(HInt, _name, _lift(_name))


class Inert:
    """A value the host run does not follow (a tensor, a layout, shared memory, a descriptor):
    any attribute, call, index or arithmetic gives another."""

    def __getattr__(self, _name):
        return Inert()

    def __call__(self, *_a, **_kw):
        return Inert()

    def __getitem__(self, _k):
        return Inert()

    def _same(self, *_a):
        return Inert()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = _same
    __mod__ = __and__ = __or__ = __neg__ = _same


class Ptr:
    """A device pointer into a list of ints (the tile counter pair): `ptr + i`; atomics through HostGl."""

    def __init__(self, cells: list, i: int = 0):
        self.cells, self.i = cells, i

    def __add__(self, k: int) -> "Ptr":
        return Ptr(self.cells, self.i + k)


class HostGl:
    """gluon.language for CTA `pid` of `grid`, on the host. `point`, where given, runs before each
    atomic (Interleaving.point: another CTA may run there). warp_specialize runs the partitions
    `partitions` names (their indices; the default partition is 0), one after another."""

    int32, int64 = "int32", "int64"

    def __init__(self, grid=(1, 1, 1), pid=(0, 0, 0), num_warps=4, point=None, partitions=()):
        self.grid, self.pid, self._warps = tuple(grid), tuple(pid), num_warps
        self._point, self._partitions = point, partitions

    def __getattr__(self, _name):  # layouts, allocations, tensors: not followed
        return Inert()

    @staticmethod
    def minimum(a, b):
        return HInt(min(a, b))

    @staticmethod
    def maximum(a, b):
        return HInt(max(a, b))

    @staticmethod
    def cdiv(a, b):
        return HInt(-(-a // b))

    def num_programs(self, axis):
        return HInt(self.grid[axis])

    def program_id(self, axis):
        return HInt(self.pid[axis])

    def num_warps(self):
        return self._warps

    @staticmethod
    def static_assert(cond, msg=""):
        assert bool(cond), msg

    @staticmethod
    def static_range(*args):
        return range(*(int(a) for a in args))

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
        for i in self._partitions:
            fn, args = partitions[i]
            fn(*args)


def host(jit_fn, gl: HostGl, _seen=None, **stubs):
    """`jit_fn`'s Python function with `gl` for gluon.language; the @gluon.jit functions it names run
    on the host too, and `stubs` replace globals of any of them by name (a callee, `mbarrier`, ...)."""
    from triton.runtime.jit import JITFunction

    seen = {} if _seen is None else _seen
    if id(jit_fn) in seen:
        return seen[id(jit_fn)]
    fn = jit_fn.fn
    env = dict(fn.__globals__)
    out = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    seen[id(jit_fn)] = out
    for name in fn.__code__.co_names:
        if name in stubs:
            env[name] = stubs[name]
        elif isinstance(env.get(name), JITFunction):  # a @gluon.jit callee
            env[name] = host(env[name], gl, seen, **stubs)
    env["gl"] = gl
    return out


class Interleaving:
    """Runs callables one at a time on threads of their own, switching at each `point()` (and at
    each one's start) to a waiting one chosen by `rng`: the CTAs of a launch, running at once, in
    any order of their atomics."""

    def __init__(self, rng):
        self.rng = rng
        self._main = threading.Semaphore(0)
        self._go: dict = {}
        self._ready: list = []
        self._me = threading.local()

    def point(self):
        me = self._me.i
        self._ready.append(me)
        self._main.release()
        self._go[me].acquire()

    def run(self, fns):
        errors = []

        def body(i, fn):
            self._me.i = i
            self._go[i].acquire()
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 (re-raised by run)
                errors.append(e)
            finally:
                self._main.release()

        threads = []
        for i, fn in enumerate(fns):
            self._go[i] = threading.Semaphore(0)
            self._ready.append(i)
            threads.append(threading.Thread(target=body, args=(i, fn), daemon=True))
            threads[-1].start()
        while self._ready:
            self._go[self._ready.pop(self.rng.randrange(len(self._ready)))].release()
            self._main.acquire()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
