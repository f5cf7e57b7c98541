"""Every constructor argument of the provider's classes has a ``:param`` line in the class
docstring, and no ``:param`` line names an argument that does not exist.

Airflow users learn an operator's, sensor's, hook's or trigger's arguments from these lines:
the API reference and their IDE show them. An argument added without one is undocumented,
and a line left behind by a renamed or removed argument tells them to pass one that fails.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest
from airflow.providers.common.sql.hooks.sql import DbApiHook

import airflow_provider_backlog

PROVIDER = airflow_provider_backlog.__name__
#: ``:param name:`` or ``:param type name:``; the name is the last word before the colon.
_PARAM_LINE = re.compile(r"^\s*:param\s+([^:\n]+):", re.MULTILINE)
_UNNAMED = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def provider_modules() -> list[ModuleType]:
    """Every module of the provider: hooks, operators, sensors, triggers, links, profiles."""
    package = importlib.import_module(PROVIDER)
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(package.__path__, f"{PROVIDER}.")
    ]


def provider_classes() -> list[type]:
    """The classes those modules define (not the ones they import), private bases included."""
    return [
        cls
        for module in provider_modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
    ]


def is_provider(cls: type) -> bool:
    return cls.__module__.startswith(f"{PROVIDER}.")


def init_parameters(cls: type) -> tuple[list[str], bool]:
    """The named parameters of ``cls``'s own ``__init__`` (without ``self``), and whether it
    takes ``**kwargs``."""
    parameters = list(inspect.signature(vars(cls)["__init__"]).parameters.values())[1:]
    named = [parameter.name for parameter in parameters if parameter.kind not in _UNNAMED]
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    return named, takes_kwargs


def init_owners(cls: type) -> list[type]:
    """The classes whose ``__init__`` a call of ``cls(...)`` runs, first to last."""
    return [klass for klass in cls.__mro__ if "__init__" in vars(klass)]


def required_params(cls: type) -> set[str]:
    """What the docstring must document: the named parameters of the ``__init__`` that
    ``cls`` uses, when the provider defines it (an inherited Airflow or standard library
    ``__init__`` is documented where it is defined). A private base's arguments are
    documented on the public classes built on it, which users read."""
    if cls.__name__.startswith("_"):
        return set()
    owner = init_owners(cls)[0]
    names = set(init_parameters(owner)[0]) if is_provider(owner) else set()
    if issubclass(cls, DbApiHook):
        # DbApiHook takes the connection id as its one positional argument or as a keyword
        # named after ``conn_name_attr``, the hook's main argument.
        names.add(cls.conn_name_attr)
    return names


def accepted_params(cls: type) -> set[str]:
    """What the docstring may document: besides its own, the parameters of the provider's
    base classes its ``__init__`` passes ``**kwargs`` on to (a public class repeats what its
    private base takes, since users do not see the base's docstring)."""
    names = required_params(cls)
    for owner in init_owners(cls):
        if not is_provider(owner):
            break
        named, takes_kwargs = init_parameters(owner)
        names.update(named)
        if not takes_kwargs:
            break
    return names


def documented_params(cls: type) -> list[str]:
    """The names of the ``:param`` lines of ``cls``'s own docstring (not a base's)."""
    return [match.split()[-1] for match in _PARAM_LINE.findall(cls.__doc__ or "")]


CLASSES = provider_classes()


def test_the_walk_covers_every_registered_module() -> None:
    """The modules Airflow is told about are among those walked, so the checks below are not
    vacuous."""
    info = airflow_provider_backlog.get_provider_info()
    registered = {
        module
        for kind in ("hooks", "operators", "sensors", "triggers")
        for entry in info[kind]
        for module in entry["python-modules"]
    }
    registered |= {link.rpartition(".")[0] for link in info["extra-links"]}
    walked = {module.__name__ for module in provider_modules()}
    assert registered <= walked, f"not walked: {sorted(registered - walked)}"
    assert {cls.__name__ for cls in CLASSES} >= {
        "BacklogLaunchOperator",
        "BacklogPhaseSensor",
        "BacklogMetricsHook",
        "JobExpectationTrigger",
    }


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_constructor_argument_is_documented(cls: type) -> None:
    documented = documented_params(cls)
    missing = sorted(required_params(cls) - set(documented))
    stale = sorted(set(documented) - accepted_params(cls))
    repeated = sorted({name for name in documented if documented.count(name) > 1})
    problems = [
        f"{what}: {names}"
        for what, names in (
            ("no ':param' line for", missing),
            ("a ':param' line for what __init__ does not take", stale),
            ("more than one ':param' line for", repeated),
        )
        if names
    ]
    assert not problems, f"{cls.__module__}.{cls.__qualname__}: " + "; ".join(problems)
