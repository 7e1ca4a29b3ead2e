"""Where a connector's calls leave Python: the crash points the kit finds by tracing, not by name.

While a connector's protocol call runs, the kit traces every instruction of the connector's own
code (the files of its top-level package, or its module when it has none) and everything those
instructions run, in the calling thread, in the event loop's executor threads and in threads the
connector starts itself. An instruction of the connector's code is a *call site* when, measured
in a clean run, it left Python: it called a C function that is not the interpreter's own
computation (a database driver, a C extension, the operating system, ``ctypes``), directly or
through library code, or called something the interpreter does not report at all (a Cython or
``ctypes`` function, a C type), whatever its name. The crash points are before and after each
site: a crash just before the instruction runs, or just after it finished, before the next one.

Nothing here knows a library: what is *not* a point is the interpreter's own pure computation
(:data:`PURE_MODULES`: built-in types, ``itertools``, locks, …), the same for every connector.
A crash before an instruction that had no effect is the same as one after the instruction
before it, so a site that is not a point costs nothing but time.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import dis
import inspect
import linecache
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from _typeshed import TraceFunction

PURE_MODULES = frozenset(
    {
        "builtins",
        "_abc",
        "_asyncio",
        "_bisect",
        "_blake2",
        "_codecs",
        "_collections",
        "_contextvars",
        "_datetime",
        "_decimal",
        "_functools",
        "_hashlib",
        "_heapq",
        "_json",
        "_locale",
        "_md5",
        "_operator",
        "_pickle",
        "_queue",
        "_random",
        "_sha1",
        "_sha256",
        "_sha3",
        "_sha512",
        "_sre",
        "_stat",
        "_statistics",
        "_string",
        "_struct",
        "_thread",
        "_typing",
        "_warnings",
        "_weakref",
        "array",
        "binascii",
        "cmath",
        "collections",
        "contextvars",
        "datetime",
        "decimal",
        "functools",
        "gc",
        "itertools",
        "math",
        "operator",
        "re",
        "sys",
        "time",
        "unicodedata",
        "zlib",
    }
)
"""Modules whose C functions only compute inside the interpreter: a call to one is no point.

Everything else a connector calls into C is: drivers, extensions, ``posix``, ``_socket``,
``_io``'s files, ``ctypes``, ``sqlite3``. ``_io``'s in-memory ``StringIO`` and ``BytesIO``
are pure too (:func:`is_pure`)."""

_PURE_IO_TYPES = frozenset({"StringIO", "BytesIO"})

_CONTINUING = frozenset(
    {
        "CACHE",
        "EXTENDED_ARG",
        "GET_AWAITABLE",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "LOAD_CONST",
        "NOP",
        "RESUME",
        "SEND",
        "YIELD_VALUE",
    }
)
"""Instructions that go on with the site before them: an ``await`` of a call is one site."""

_CALLS = frozenset(
    {"BEFORE_ASYNC_WITH", "BEFORE_WITH", "CALL", "CALL_FUNCTION_EX", "CALL_KW", "SEND"}
)
"""Instructions that call something: one that reports no call event called native code."""

_UNKNOWN = object()
_GENERATOR = object()

_SDK = "laminar_sdk"

_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def _module_of(function: object) -> tuple[str, str]:
    """The module ``function`` belongs to, and its owner's type name (``""`` for a module)."""
    owner = getattr(function, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__, ""
    if isinstance(function, type):
        return function.__module__, function.__name__
    if owner is not None and not isinstance(owner, type):
        return type(owner).__module__, type(owner).__name__
    module = getattr(function, "__module__", None)
    if not isinstance(module, str):
        module = type(function).__module__
    return module, ""


def _interpreter_types() -> frozenset[type]:
    empty: tuple[Iterable[object], ...] = ([], (), {}, set(), "", b"", bytearray(), range(0))
    samples: list[object] = [iter(container) for container in empty]
    samples += [{}.keys(), {}.values(), {}.items(), iter({}.items()), iter({}.values())]
    nothing: tuple[object, ...] = ()
    samples += [reversed([]), (item for item in nothing), memoryview(b""), NotImplemented, ...]
    found = [*vars(builtins).values(), *vars(types).values(), *map(type, samples)]
    return frozenset(value for value in found if isinstance(value, type))


_INTERPRETER_TYPES = _interpreter_types()
"""The interpreter's own types: an extension's C type may call itself ``builtins`` too."""


def is_pure(function: object) -> bool:
    """Whether a call of ``function`` (a C function, or a type) stays inside the interpreter."""
    module, owner = _module_of(function)
    if module == "_io":
        return owner in _PURE_IO_TYPES
    if module == "builtins" and owner:
        kind = function if isinstance(function, type) else type(function.__self__)  # type: ignore[attr-defined]
        return kind in _INTERPRETER_TYPES
    return module.partition(".")[0] in PURE_MODULES


def describe(function: object) -> str:
    """``module.Type.name`` of a C function, for messages."""
    module, owner = _module_of(function)
    name = getattr(function, "__name__", type(function).__name__)
    return f"{module}.{owner}.{name}" if owner and owner != name else f"{module}.{name}"


@dataclass(frozen=True, slots=True)
class ConnectorCode:
    """The files whose code is the connector's own: its calls out of them are the sites.

    :param roots: directories (a package) and files (a module without a package).
    """

    roots: tuple[str, ...]

    @classmethod
    def of(cls, connector: object) -> ConnectorCode:
        """The code of ``connector``'s classes, bar the SDK's and the standard library's.

        A class's code is its top-level package, or its module when it has none; a connector
        the SDK ships (``laminar_sdk.reference``) is its own subpackage, not the SDK's runtime.
        """
        roots: list[str] = []
        for klass in type(connector).__mro__:
            module = sys.modules.get(klass.__module__)
            file = getattr(module, "__file__", None)
            if file is None or file.startswith(_STDLIB):
                continue
            package = klass.__module__.partition(".")[0]
            top = sys.modules.get(package)
            top_file = getattr(top, "__file__", None)
            if package == _SDK:
                if klass.__module__.startswith(f"{_SDK}._"):
                    continue  # the contract's classes and the runtime's wrappers
                roots.append(str(Path(file).parent))
            elif package != klass.__module__ and top_file is not None:
                roots.append(str(Path(top_file).parent))
            else:
                roots.append(str(Path(file)))
        return cls(tuple(dict.fromkeys(roots)))

    @classmethod
    def files(cls, paths: Iterable[str | Path]) -> ConnectorCode:
        """The code in ``paths`` (directories or files)."""
        return cls(tuple(str(Path(path)) for path in paths))

    def owns(self, code: types.CodeType) -> bool:
        """Whether ``code`` is the connector's own."""
        return _owned(self.roots, code.co_filename)


@cache
def _owned(roots: tuple[str, ...], filename: str) -> bool:
    return any(filename == root or filename.startswith(root + "/") for root in roots)


@dataclass(frozen=True, slots=True)
class Site:
    """One instruction of the connector's code, named for a person, and who called it.

    The same instruction reached from two places of the connector's code (a helper that runs
    a statement, called to publish and again to record) is two sites: a crash at the first
    visit of one tells nothing of the other.
    """

    label: str
    """The source of what it calls (``db.commit()``), or of the instruction."""
    file: str
    line: int
    function: str
    callers: tuple[str, ...] = ()
    """The frames of the connector's code it was reached from, innermost first
    (``record:186``)."""
    visit: int = 1
    """Which run of the instruction in the protocol call this is (a loop's, a helper's)."""

    @property
    def place(self) -> str:
        """Where it is in the source, without its callers."""
        return f"{self.label} at {Path(self.file).name}:{self.line}"

    def reached(self, visit: int, frame: types.FrameType | None, code: ConnectorCode) -> Site:
        """This site at its ``visit``-th run, from ``frame`` (its frame's caller) and above."""
        callers = []
        while frame is not None:
            if code.owns(frame.f_code):
                callers.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return Site(self.label, self.file, self.line, self.function, tuple(callers), visit)

    def __str__(self) -> str:
        callers = "".join(f" <- {caller}" for caller in self.callers)
        visit = f" (run {self.visit})" if self.visit > 1 else ""
        return f"{self.place} in {self.function}{callers}{visit}"


@cache
def _opnames(code: types.CodeType) -> dict[int, str]:
    return {instruction.offset: instruction.opname for instruction in dis.get_instructions(code)}


@cache
def site_at(code: types.CodeType, offset: int) -> Site:
    """The site of the instruction at ``offset`` of ``code``."""
    text = _source_at(code, offset)
    node = _parse(text)
    if isinstance(node, ast.Await):
        node = node.value
    if isinstance(node, ast.Call):
        label = f"{ast.unparse(node.func)}()"
    elif node is not None:
        label = ast.unparse(node)
    elif text:  # a statement: the enter and exit of ``with``
        opname = _opnames(code).get(offset, "")
        label = text.splitlines()[0].strip().rstrip(":")
        label += " (enter)" if opname.startswith("BEFORE_") else " (exit)"
    else:
        label = _opnames(code).get(offset, "instruction").lower()
    if len(label) > _LONGEST_LABEL:
        label = label[: _LONGEST_LABEL - 3] + "..."
    return Site(label, code.co_filename, _line_at(code, offset), code.co_name)


_LONGEST_LABEL = 72


def _line_at(code: types.CodeType, offset: int) -> int:
    positions = list(code.co_positions())
    line = positions[offset // 2][0] if offset // 2 < len(positions) else None
    return line or code.co_firstlineno


@cache
def _source_at(code: types.CodeType, offset: int) -> str:
    """The source of the instruction at ``offset`` (``""`` when it has none)."""
    positions = list(code.co_positions())
    if offset // 2 >= len(positions):
        return ""
    start, end, start_column, end_column = positions[offset // 2]
    if start is None or end is None or start_column is None or end_column is None:
        return ""
    lines = linecache.getlines(code.co_filename)[start - 1 : end]
    if not lines:
        return ""
    # Columns count UTF-8 bytes.
    encoded = [line.encode() for line in lines]
    encoded[-1] = encoded[-1][:end_column]
    encoded[0] = encoded[0][start_column:]
    return b"".join(encoded).decode(errors="replace").strip()


def _parse(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body if text else None
    except SyntaxError:
        return None


def _callee(code: types.CodeType, offset: int, frame: types.FrameType) -> object:
    """What the call at ``offset`` called, resolved without running anything."""
    node = _parse(_source_at(code, offset))
    if isinstance(node, ast.Await):
        node = node.value
    if isinstance(node, (ast.GeneratorExp, ast.Lambda)):
        return _GENERATOR  # a generator created: it runs (reported) when iterated
    chain = _callee_chain(code, offset)
    if chain is not None:
        return _resolve(chain, frame)
    if isinstance(node, ast.Call):
        names = _names(node.func)
        return _UNKNOWN if names is None else _resolve(names, frame)
    return _UNKNOWN


_LOADS = frozenset({"LOAD_DEREF", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_NAME"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_BEFORE_CALL = frozenset({"CACHE", "KW_NAMES", "PRECALL"})


@cache
def _callee_chain(code: types.CodeType, offset: int) -> tuple[str, ...] | None:
    """The names the callable of the ``CALL`` at ``offset`` was loaded by (``x``, ``f``, ``g``).

    Read from the bytecode (so code without source resolves too): back from the call over its
    arguments, by their stack effects, to the instruction that pushed the callable, and back
    over the attribute loads before it to a variable. ``None`` for anything else.
    """
    instructions = list(dis.get_instructions(code))
    index = next((i for i, ins in enumerate(instructions) if ins.offset == offset), None)
    if index is None or instructions[index].opname not in ("CALL", "CALL_KW"):
        return None
    arguments = instructions[index].arg or 0
    index -= 1
    while index >= 0 and instructions[index].opname in _BEFORE_CALL:
        index -= 1
    depth = 0
    while index >= 0:
        instruction = instructions[index]
        argument = instruction.arg if instruction.opcode >= dis.HAVE_ARGUMENT else None
        depth += dis.stack_effect(instruction.opcode, argument, jump=False)
        if depth > arguments:
            break
        index -= 1
    else:
        return None
    names: list[str] = []
    while index >= 0 and instructions[index].opname in _ATTRIBUTES:
        names.append(str(instructions[index].argval))
        index -= 1
    if index < 0 or instructions[index].opname not in _LOADS:
        return None
    names.append(str(instructions[index].argval))
    return tuple(reversed(names))


def _names(node: ast.expr) -> tuple[str, ...] | None:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        owner = _names(node.value)
        return None if owner is None else (*owner, node.attr)
    return None


def _resolve(names: tuple[str, ...], frame: types.FrameType) -> object:
    """The object ``names`` (a variable and attributes) stand for in ``frame``, read statically."""
    first, *attributes = names
    for scope in (frame.f_locals, frame.f_globals, vars(builtins)):
        if first in scope:
            found = scope[first]
            break
    else:
        return _UNKNOWN
    for attribute in attributes:
        try:
            found = inspect.getattr_static(found, attribute)
        except AttributeError:
            return _UNKNOWN
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
        if isinstance(found, (property, types.MemberDescriptorType, types.GetSetDescriptorType)):
            return _UNKNOWN
    return found


class FrameTracer:
    """The trace function of one frame of the connector's code: its sites as they run."""

    __slots__ = ("current", "impure", "visit", "watcher")

    def __init__(self, watcher: CallWatcher) -> None:
        self.watcher = watcher
        self.current = -1
        """The offset of the site now running in the frame (``-1``: none)."""
        self.impure = False
        """Whether the site now running left Python."""
        self.visit = 0
        """Which run of its instruction in the protocol call the site now running is."""

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> FrameTracer:
        if event != "opcode":
            return self
        watcher = self.watcher
        watcher.opaque_check(frame)
        offset = frame.f_lasti
        opname = _opnames(frame.f_code).get(offset, "")
        if opname in _CONTINUING and self.current >= 0:
            return self
        if self.current >= 0:
            previous, impure = self.current, self.impure
            self.current = -1
            watcher.site_ended(frame, previous, self.visit, impure=impure)
        self.current, self.impure = offset, False
        self.visit = watcher.site_starts(frame, offset)
        if opname in _CALLS:
            watcher.pending_call(frame, offset)
        return self


Apart = Literal["thread", "task"]
"""Where a site ran apart from the call it was reached in (see :meth:`CallWatcher.apart`)."""


class CallWatcher:
    """Traces one protocol call: calls :attr:`before` / :attr:`after` at each site.

    :param code: the connector's code.
    :param wanted: whether a crash may be planned at a site (its callers not yet known):
        :attr:`before` and :attr:`after` are called only for those.
    :param before: called with a site about to run (it may raise: a crash there).
    :param after: called with a site that ran and left Python (it may raise too).
    :param visited: called with a site that ran and left Python, and whether it ran apart
        from the call (:meth:`apart`).
    """

    def __init__(
        self,
        code: ConnectorCode,
        wanted: Callable[[Site], bool],
        before: Callable[[Site], None],
        after: Callable[[Site], None],
        visited: Callable[[Site, Apart | None], None],
    ) -> None:
        self.code = code
        self.wanted = wanted
        self.before = before
        self.after = after
        self.visited = visited
        self.calling_thread = threading.get_ident()
        self._local = threading.local()
        self._visits: dict[tuple[types.CodeType, int], int] = {}
        self._counting = threading.Lock()  # the calling thread and others may count at once

    def apart(self) -> Apart | None:
        """Where this runs, if apart from the call: a thread or a task the connector started.

        ``"thread"``: not the caller's thread, nor an executor thread of the loop (which
        marks itself in ``_EXECUTOR`` while it runs a job: it is apart as the code that handed
        the job over was). ``"task"``: in the caller's
        thread, an asyncio task whose coroutine is the connector's own
        (``asyncio.create_task(self._fetch())``). A crash raised in either would end that
        thread or task, not the call, which may wait for it: only a real kill stops both.
        """
        if threading.get_ident() != self.calling_thread:
            return _EXECUTOR.apart if _EXECUTOR.flag else "thread"
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            return None
        code = getattr(None if task is None else task.get_coro(), "cr_code", None)
        return "task" if isinstance(code, types.CodeType) and self.code.owns(code) else None

    def site_starts(self, frame: types.FrameType, offset: int) -> int:
        """A site of the connector's code is about to run in ``frame``: which run of it."""
        key = (frame.f_code, offset)
        with self._counting:
            visit = self._visits[key] = self._visits.get(key, 0) + 1
        site = site_at(frame.f_code, offset)
        if self.wanted(site):
            self.before(site.reached(visit, frame.f_back, self.code))
        return visit

    def site_ended(self, frame: types.FrameType, offset: int, visit: int, *, impure: bool) -> None:
        """A site of the connector's code ran in ``frame``: a point if it left Python."""
        if not impure:
            return
        site = site_at(frame.f_code, offset).reached(visit, frame.f_back, self.code)
        self.visited(site, self.apart())
        if self.wanted(site):
            self.after(site)

    def pending_call(self, frame: types.FrameType, offset: int) -> None:
        """``frame`` is about to call at ``offset``: native code if no call event follows."""
        self._local.pending = (frame, offset)

    def call_reported(self) -> None:
        """The interpreter reported the pending call (a Python frame, a C function)."""
        self._local.pending = None

    def opaque_check(self, frame: types.FrameType) -> None:
        """Mark the site when the last call ``frame`` made ran native code no event reported."""
        pending = getattr(self._local, "pending", None)
        if pending is None or pending[0] is not frame:
            return
        self._local.pending = None
        code, offset = frame.f_code, pending[1]
        if not _opaque_is_pure(code, offset, frame):
            self.left_python(frame)

    def left_python(self, frame: types.FrameType | None) -> None:
        """Code running in ``frame`` left Python: the site of the innermost connector frame."""
        while frame is not None:
            tracer = frame.f_trace
            if isinstance(tracer, FrameTracer) and tracer.watcher is self:
                tracer.impure = True
                return
            frame = frame.f_back
        submitter = _EXECUTOR.submitter
        if submitter is not None and submitter.watcher is self:
            submitter.impure = True  # a job the connector's code handed to an executor

    def trace(self, frame: types.FrameType) -> TraceFunction:
        """The local trace function of a new or resumed ``frame``."""
        frame.f_trace_opcodes = True
        if self.code.owns(frame.f_code):
            existing = frame.f_trace
            if isinstance(existing, FrameTracer) and existing.watcher is self:
                return existing
            return FrameTracer(self)
        return self._library

    def _library(self, frame: types.FrameType, event: str, arg: object) -> TraceFunction:
        if event == "opcode":
            self.opaque_check(frame)
            if _opnames(frame.f_code).get(frame.f_lasti, "") in _CALLS:
                self.pending_call(frame, frame.f_lasti)
        return self._library

    def profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        """The profile hook's events: calls the interpreter reports."""
        if event == "call":
            self.call_reported()
        elif event == "c_call":
            self.call_reported()
            if not is_pure(arg):
                self.left_python(frame)


_cache_pure: dict[tuple[types.CodeType, int], bool] = {}


def _opaque_is_pure(code: types.CodeType, offset: int, frame: types.FrameType) -> bool:
    key = (code, offset)
    if key not in _cache_pure:
        callee = _callee(code, offset, frame)
        if isinstance(callee, types.MethodType):
            callee = callee.__func__
        # A Python function that reports no call made a generator or a coroutine: its frame
        # runs, and reports, when iterated or awaited.
        python = callee is _GENERATOR or isinstance(callee, types.FunctionType)
        _cache_pure[key] = python or (callee is not _UNKNOWN and is_pure(callee))
    return _cache_pure[key]


class _ExecutorState(threading.local):
    flag = False
    submitter: FrameTracer | None = None
    apart: Apart | None = None


_EXECUTOR = _ExecutorState()
"""In an executor thread of the kit's loops: set while it runs a job (see ``_faults``)."""


def innermost_site(watcher: CallWatcher | None) -> FrameTracer | None:
    """The tracer of the innermost frame of the connector's code on this thread's stack."""
    if watcher is None:
        return None
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        tracer = frame.f_trace
        if isinstance(tracer, FrameTracer) and tracer.watcher is watcher:
            return tracer
        frame = frame.f_back
    return None
