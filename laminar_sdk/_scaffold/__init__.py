"""``laminar new-plugin NAME``: a third-party plugin project that installs and passes the kit.

The project is rendered from the templates next to this module (``templates/*.tmpl``, shipped
in the wheel as package data) with :class:`string.Template` and a handful of names derived
from ``NAME`` (:class:`PluginNames`). What it contains, and why, is described in the generated
``README.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from string import Template

from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._plugins.loading import load_connector_registry

_NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
# Long enough for any real name, short enough that generated lines stay within 100 columns.
_MAX_NAME = 32
_PREFIX = "laminar-plugin-"

# (template, where it goes in the project): both are templates, so paths may name $package.
_FILES = (
    ("pyproject.toml", "pyproject.toml"),
    ("README.md", "README.md"),
    ("tox.ini", "tox.ini"),
    ("gitignore", ".gitignore"),
    ("ci.yml", ".github/workflows/ci.yml"),
    ("wheelhouse_readme.md", "wheelhouse/README.md"),
    ("package_init.py", "$package/__init__.py"),
    ("package_records.py", "$package/_records.py"),
    ("package_source.py", "$package/_source.py"),
    ("package_sink.py", "$package/_sink.py"),
    ("package_testing.py", "$package/testing.py"),
    ("py.typed", "$package/py.typed"),
    ("test_records.py", "tests/test_records.py"),
)


@dataclass(frozen=True, slots=True)
class PluginNames:
    """The names a plugin project is built from, all derived from the plugin's name.

    :param name: the plugin's name: its entry point, and the name of its source and its sink.
    :param distribution: what ``pip`` installs, ``laminar-plugin-<name>`` (``_`` becomes ``-``).
    :param package: the import package, ``laminar_plugin_<name>`` (``-`` becomes ``_``).
    :param title: the name in CamelCase, prefixing the connector classes (``AcmeDbSource``).
    """

    name: str
    distribution: str
    package: str
    title: str

    @classmethod
    def parse(cls, name: str) -> PluginNames:
        """The names for plugin ``name``.

        :raises ConfigurationError: (key ``name``) when ``name`` is not lowercase letters,
            digits and single ``-`` / ``_`` between them, starting with a letter.
        """
        if name.startswith((_PREFIX, _PREFIX.replace("-", "_"))):
            raise ConfigurationError(
                f"give the plugin's name without the {_PREFIX!r} prefix: "
                f"`laminar new-plugin {name[len(_PREFIX) :]}`",
                key="name",
            )
        if not _NAME.fullmatch(name) or len(name) > _MAX_NAME:
            raise ConfigurationError(
                f"{name!r} cannot name a plugin: use lowercase letters and digits, starting with "
                "a letter, with single '-' or '_' between words (such as 'acme' or 'acme-db'), "
                f"at most {_MAX_NAME} characters; "
                "it names the connectors, the distribution laminar-plugin-NAME and the package "
                "laminar_plugin_NAME",
                key="name",
            )
        words = re.split(r"[-_]", name)
        return cls(
            name=name,
            distribution=_PREFIX + "-".join(words),
            package=_PREFIX.replace("-", "_") + "_".join(words),
            title="".join(word.capitalize() for word in words),
        )


@dataclass(frozen=True, slots=True)
class CreatedFile:
    """A file of a generated project.

    :param path: where it is, relative to the project's directory.
    :param replaced: whether it replaced a file that was there (``--force``).
    """

    path: Path
    replaced: bool


@dataclass(frozen=True, slots=True)
class PluginProject:
    """A generated plugin project.

    :param names: the plugin's names.
    :param directory: the project's directory.
    :param files: every file written, in the order written.
    """

    names: PluginNames
    directory: Path
    files: tuple[CreatedFile, ...]


def lowest_supported(*distributions: str) -> dict[str, str]:
    """The lowest version of each of ``distributions`` that laminar-sdk supports, by name.

    Read from laminar-sdk's own requirements (``pyspark>=4.2`` gives ``4.2``), so the
    generated project's lowest environment follows the SDK's floors.

    :raises LookupError: for a distribution the SDK requires without a floor.
    """
    floors = {}
    for requirement in metadata.requires("laminar-sdk") or []:
        found = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", requirement)
        if found:
            floors[found[1].lower()] = found[2]
    missing = [name for name in distributions if name not in floors]
    if missing:
        raise LookupError(f"laminar-sdk states no lowest version of {missing}")
    return {name: floors[name] for name in distributions}


def render_project(names: PluginNames) -> dict[Path, str]:
    """The files of the project for ``names``: path relative to the project, content."""
    lowest = lowest_supported("pyspark", "pyarrow")
    values = {
        "name": names.name,
        "distribution": names.distribution,
        "package": names.package,
        "title": names.title,
        "sdk_version": metadata.version("laminar-sdk"),
        "lowest_pyspark": lowest["pyspark"],
        "lowest_pyarrow": lowest["pyarrow"],
    }
    templates = resources.files(__name__).joinpath("templates")
    return {
        Path(Template(target).substitute(values)): Template(
            templates.joinpath(f"{template}.tmpl").read_text(encoding="utf-8")
        ).substitute(values)
        for template, target in _FILES
    }


def _check_name_is_free(names: PluginNames) -> None:
    """Refuse a name an installed plugin (other than this very project) already registers."""
    taken = [
        spec
        for spec in load_connector_registry()
        if spec.name == names.name
        and spec.distribution.lower().replace("_", "-") != names.distribution
    ]
    if taken:
        raise ConfigurationError(
            f"a connector named {names.name!r} is already installed (from "
            f"{taken[0].distribution}): two plugins registering one name cannot be installed "
            "together; pick another name",
            key="name",
        )


def create_plugin_project(
    name: str, directory: Path | None = None, *, force: bool = False
) -> PluginProject:
    """Write a new plugin project for plugin ``name`` into ``directory``.

    :param name: the plugin's name (see :meth:`PluginNames.parse`).
    :param directory: the project's directory; default ``./laminar-plugin-<name>``.
    :param force: write into a directory that is not empty, replacing the generated files
        that are there already (other files are left alone).
    :raises ConfigurationError: for a bad name (key ``name``), a name an installed plugin
        registers, or a ``directory`` that is a file, is not empty (without ``force``) or
        cannot be written (key ``directory``).
    """
    names = PluginNames.parse(name)
    _check_name_is_free(names)
    root = Path(names.distribution) if directory is None else directory
    if root.exists() and not root.is_dir():
        raise ConfigurationError(
            f"{root} is a file, not a directory: choose another --directory", key="directory"
        )
    if root.is_dir() and any(root.iterdir()) and not force:
        raise ConfigurationError(
            f"{root} exists and is not empty: choose another --directory, or pass --force to "
            "write the project's files into it (replacing files of the same names)",
            key="directory",
        )
    created = []
    for relative, content in render_project(names).items():
        target = root / relative
        replaced = target.exists()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as error:
            raise ConfigurationError(
                f"cannot write {target}: {error}; choose another --directory", key="directory"
            ) from error
        created.append(CreatedFile(relative, replaced))
    return PluginProject(names, root, tuple(created))


def next_steps(project: PluginProject) -> list[str]:
    """The commands to run next in ``project``, one a line, each with what it is for."""
    names = project.names
    steps = [
        (f"cd {project.directory}", ""),
        ("git init", ""),
        ("python -m pip install -e .", "the plugin, editable, next to this laminar-sdk"),
        ("laminar plugins list", f"the {names.name!r} source and sink, from {names.distribution}"),
        (f"laminar conformance run {names.name} --strict", "both roles, both layers"),
        ("tox", "what CI runs (the SDK's wheels: wheelhouse/README.md)"),
    ]
    width = max(len(command) for command, _ in steps)
    return [f"{command:<{width}}  # {note}" if note else command for command, note in steps]
