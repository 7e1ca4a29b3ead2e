"""The contract's rule after ``close()``, enforced for every connector by the base classes.

:class:`~laminar_sdk.SourceConnector` and :class:`~laminar_sdk.SinkConnector` call
:func:`guard_calls_after_close` for each subclass: the lifecycle methods it defines raise
:class:`~laminar_sdk.Closed` once ``close()`` has returned, and a second ``close()`` does
nothing. An author writes neither check.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from typing import Any

from laminar_sdk._contract.errors import Closed, PluginError

_CLOSED = "_laminar_closed"
_GUARD = "__laminar_closed_guard__"


def _closed(instance: object) -> bool:
    return bool(getattr(instance, _CLOSED, False))


def _refuse(instance: object, name: str) -> Closed:
    return Closed(
        f"{type(instance).__name__}.{name}() called after close(): a closed connector is not "
        "used again; build a new instance"
    )


def _guarded(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def guarded_coroutine(self: object, *args: object, **kwargs: object) -> object:
            if _closed(self):
                raise _refuse(self, name)
            return await method(self, *args, **kwargs)

        wrapper: Callable[..., Any] = guarded_coroutine
    else:

        @functools.wraps(method)
        def guarded_call(self: object, *args: object, **kwargs: object) -> object:
            if _closed(self):
                raise _refuse(self, name)
            return method(self, *args, **kwargs)

        wrapper = guarded_call
    setattr(wrapper, _GUARD, True)
    return wrapper


def _closing(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def close_once(self: object) -> None:
        if _closed(self):
            return
        try:
            await method(self)
        finally:
            # Set after the subclass's close() ran: its own clean-up may still call a flush.
            setattr(self, _CLOSED, True)

    setattr(close_once, _GUARD, True)
    return close_once


def guard_calls_after_close(cls: type, guarded: Collection[str]) -> None:
    """Wrap the methods ``cls`` itself defines among ``guarded``, and its ``close``.

    Abstract methods are left alone (they stay abstract); a base class's provided defaults
    are guarded by calling this on the base class itself.
    """
    for name in (*guarded, "close"):
        method = cls.__dict__.get(name)
        if (
            not callable(method)
            or getattr(method, _GUARD, False)
            or getattr(method, "__isabstractmethod__", False)
        ):
            continue
        setattr(cls, name, _closing(method) if name == "close" else _guarded(name, method))


def require_the_contracts_kinds(cls: type, contract: type) -> None:
    """Refuse ``cls`` when it overrides a coroutine of ``contract`` with a plain method, or back.

    The runtime awaits the contract's coroutines and calls its plain methods: a ``def close``
    would return ``None`` where an awaitable is due, an ``async def schema`` a coroutine where
    a schema is — failures far from their cause. Checked when the class is defined.

    :raises PluginError: naming the class, the method and how to declare it.
    """
    for name, method in vars(cls).items():
        expected = getattr(contract, name, None)
        if name.startswith("_") or not callable(expected) or not callable(method):
            continue
        wants_coroutine = inspect.iscoroutinefunction(expected)
        if inspect.iscoroutinefunction(method) != wants_coroutine:
            declare = (
                f"`async def {name}(...)`: the runtime awaits it"
                if wants_coroutine
                else f"`def {name}(...)`, not `async def`: the runtime calls it without await"
            )
            raise PluginError(
                f"{cls.__module__}.{cls.__qualname__}.{name} does not match "
                f"{contract.__name__}.{name}: declare it {declare}"
            )
