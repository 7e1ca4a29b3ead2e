"""Writes the API reference, ``docs/api/*.md``, from the public names' docstrings.

Run ``python docs/api.py`` after changing a public name or its docstring; ``--check`` exits
non-zero when a page is not what the code says (the test suite runs it). A public name is
one a module lists in ``__all__``; every one must have a docstring, or the reference is not
written.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import itertools
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PAGES = HERE / "api"

MODULES = {
    "laminar_sdk": "the connector contract, configuration, errors, checkpoint stores, runtime",
    "laminar_sdk.spark": "the Spark bridge: format('laminar'), its options",
    "laminar_sdk.faults": "fault injection for test kits: simulated crashes and crash points",
    "laminar_sdk.reference": "the reference connectors: generator, memory, null",
    "laminar_conformance.contexts": "what a plugin gives the kit: its test contexts",
    "laminar_conformance.sink": "the sink suites",
    "laminar_conformance.source": "the source suites",
    "laminar_conformance.spark": "the Spark layer's suites and pipelines",
    "laminar_conformance.checkpointer": "the checkpoint store suites",
    "laminar_conformance.services": "external systems for tests: Kafka, S3, PostgreSQL",
}
"""The documented modules, each with what it holds (the index's line)."""

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`~?(?:[\w.]+\.)?([\w]+)`")
_FIELD = re.compile(r"^:(param|raises|returns|yields)\s*([^:]*):\s*(.*)$")


def markdown(docstring: str) -> str:
    """A reStructuredText docstring as Markdown: roles, literals and field lists."""
    lines = []
    for line in docstring.splitlines():
        text = _ROLE.sub(r"`\1`", line).replace("``", "`")
        field = _FIELD.match(text.strip())
        if field:
            kind, name, rest = field.groups()
            label = {"param": f"`{name.strip()}`", "raises": f"raises `{name.strip()}`"}.get(
                kind, kind
            )
            text = f"- **{label}**: {rest}"
        lines.append(text)
    return "\n".join(lines).strip()


def _attribute_docstrings(module: ModuleType) -> dict[str, str]:
    """The docstrings written under module-level assignments (``NAME = ...`` then a string)."""
    found: dict[str, str] = {}
    for name in _defining_modules(module):
        source = inspect.getsource(importlib.import_module(name))
        body = ast.parse(source).body
        for statement, following in itertools.pairwise(body):
            targets = (
                [statement.target]
                if isinstance(statement, ast.AnnAssign)
                else statement.targets
                if isinstance(statement, ast.Assign)
                else []
            )
            if not (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, inspect.cleandoc(following.value.value))
    return found


def _defining_modules(module: ModuleType) -> list[str]:
    """``module`` and the modules its public names come from."""
    names = {module.__name__}
    for name in module.__all__:
        value = getattr(module, name)
        origin = getattr(value, "__module__", None)
        if isinstance(origin, str) and origin.split(".")[0] == module.__name__.split(".")[0]:
            names.add(origin)
    package = module.__name__.split(".")[0]
    names |= {
        m
        for m in sys.modules
        if m.startswith(package + ".") and any(p.startswith("_") for p in m.split(".")[1:])
    }
    return sorted(names)


def _signature(value: Callable[..., object]) -> str:
    """``(a: int, b: str = 'x') -> None``, the annotations as written (no quotes)."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return "(...)"
    plain = signature.replace(
        parameters=[
            parameter.replace(annotation=_Written(parameter.annotation))
            if isinstance(parameter.annotation, str)
            else parameter
            for parameter in signature.parameters.values()
        ],
        return_annotation=_Written(signature.return_annotation)
        if isinstance(signature.return_annotation, str)
        else signature.return_annotation,
    )
    return str(plain)


def _kind(function: object) -> str:
    """``async `` for a coroutine function (the runtime awaits it), else nothing."""
    return "async " if inspect.iscoroutinefunction(function) else ""


class _Written:
    """An annotation kept as text (``from __future__ import annotations``), shown unquoted."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _methods(cls: type) -> Iterator[tuple[str, object]]:
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, property) or callable(member) or isinstance(member, classmethod):
            yield name, member


_MISSING: list[str] = []
"""Public names found without a docstring, reported together."""


def _undocumented(what: str) -> list[str]:
    _MISSING.append(what)
    return []


def _describe(qualified: str, name: str, value: object, attribute_doc: str | None) -> list[str]:
    if inspect.isclass(value):
        return _describe_class(qualified, name, value)
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        doc = inspect.getdoc(value)
        if not doc:
            return _undocumented(f"{qualified}.{name}")
        signature = _signature(value)
        return [f"### {_kind(value)}`{name}{signature}`", "", markdown(doc), ""]
    if not attribute_doc:
        return _undocumented(f"{qualified}.{name} (a string under its assignment)")
    shown = repr(value) if isinstance(value, str | int | float | tuple | frozenset) else ""
    heading = f"### `{name}`" + (f" = `{shown}`" if shown and len(shown) < 60 else "")
    return [heading, "", markdown(attribute_doc), ""]


def _describe_class(qualified: str, name: str, cls: type) -> list[str]:
    doc = inspect.getdoc(cls)
    if not doc:
        return _undocumented(f"{qualified}.{name}")
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    heading = f"### class `{name}`" + (f" ({', '.join(bases)})" if bases else "")
    lines = [heading, ""]
    if dataclasses.is_dataclass(cls) or "__init__" in vars(cls):
        lines += [f"`{name}{_signature(cls)}`", ""]
    lines += [markdown(doc), ""]
    if issubclass(cls, enum.Enum):
        members = ", ".join(f"`{member.name}` (`{member.value!r}`)" for member in cls)
        return [*lines, f"Members: {members}.", ""]
    for method_name, member in _methods(cls):
        if method_name == "__init__":
            continue
        function = member.fget if isinstance(member, property) else member
        function = getattr(function, "__func__", function)
        method_doc = inspect.getdoc(function)
        if not method_doc:
            continue
        suffix = "" if isinstance(member, property) else _signature(function)
        heading = f"#### {_kind(function)}`{name}.{method_name}{suffix}`"
        lines += [heading, "", markdown(method_doc), ""]
    return lines


def page(qualified: str) -> str:
    """The reference page of the module ``qualified``."""
    module = importlib.import_module(qualified)
    names = getattr(module, "__all__", None)
    if names is None:
        raise SystemExit(f"{qualified} has no __all__: list its public names")
    attribute_docs = _attribute_docstrings(module)
    summary = inspect.getdoc(module) or ""
    lines = [
        f"# `{qualified}`",
        "",
        "<!-- Written by `python docs/api.py` from the docstrings: edit those, not this. -->",
        "",
        markdown(summary),
        "",
    ]
    for name in names:
        lines += _describe(qualified, name, getattr(module, name), attribute_docs.get(name))
    return "\n".join(lines).rstrip() + "\n"


def index() -> str:
    """The index of the reference pages."""
    lines = [
        "# API reference",
        "",
        "<!-- Written by `python docs/api.py`. -->",
        "",
        "Every public name, from its docstring. The guides in [the docs](../README.md) say how "
        "the pieces fit together.",
        "",
    ]
    lines += [f"- [`{module}`]({module}.md): {what}" for module, what in MODULES.items()]
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    """Every page, by path."""
    written = {PAGES / "README.md": index()}
    written.update({PAGES / f"{module}.md": page(module) for module in MODULES})
    return written


def main(argv: list[str] | None = None) -> int:
    """Write the pages, or with ``--check`` say which differ from the code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    written = pages()
    if _MISSING:
        print(f"docs: public names without a docstring: {', '.join(_MISSING)}", file=sys.stderr)
        return 1
    stale = []
    for path, text in written.items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.relative_to(HERE.parent))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"docs: {', '.join(map(str, stale))} differ from the docstrings: run "
            "`python docs/api.py` and commit the pages",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
