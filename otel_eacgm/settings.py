"""One convention for the settings of the agent and the detector.

A settings class is a dataclass deriving from `Settings`; each field is a key, documented by the
docstring written under it. The rules, the same for both:

- Precedence: command-line flag > environment (``<ENV_PREFIX><KEY>``, KEY in upper case) >
  config file > default. `Settings.load` applies them in that order and validates once.
- YAML: a mapping of keys. A mapping under a name that is no key is a section that only groups
  keys (``exporter:``, ``capture:``); its name carries no meaning. A key set twice is an error.
- Values are coerced by the field's type, whatever their source: text is parsed (``true``,
  ``on``, ``1``; ``5``; ``0.5``; ``a,b`` for a list), an integral number is an int, a number
  is text for a text field; floats must be finite.
- The environment: an empty variable counts as unset (as OpenTelemetry's specification says);
  a variable under the prefix that names no key is ignored (the agent's prefix is also the
  start of the detector's). A value that does not parse raises, like a bad file value: a
  setting the operator asked for is never dropped silently.
- Every refusal is a `ConfigError` (a ValueError) naming the source, the key, the value and
  what was expected; an unknown key is refused with its name.

otel_eacgm/environment_variables.py documents the variables this yields.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import os
import textwrap
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml

__all__ = ["SECRET", "ConfigError", "Settings", "field_docs", "variables"]

SECRET = types.MappingProxyType({"secret": True})
"""Field metadata of a setting whose value never appears in an error message."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting is unknown or its value is invalid; the message names the key, the value and
    what was expected."""


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A field's declared type, reduced to what coercion needs."""

    base: type  # bool, int, float, str or list
    item: type | None  # element type of a list
    optional: bool
    text: str  # the annotation as written

    @property
    def expected(self) -> str:
        words = {bool: "true or false (yes/no, on/off, 1/0)", int: "an integer", float: "a finite number",
                 str: "text"}
        if self.base is list:
            what = {str: "strings", int: "integers"}.get(self.item, self.item.__name__)
            out = f"a list of {what} (or comma-separated text)"
        else:
            out = words[self.base]
        return out + (", or null" if self.optional else "")

    def coerce(self, raw: Any) -> Any:
        """`raw` as a value of this type; ValueError (the reason) when it is none."""
        if raw is None:
            if self.optional:
                return None
            raise ValueError("no value")
        if self.base is not list:
            return _scalar(raw, self.base)
        if isinstance(raw, str):
            items: list[Any] = raw.split(",")
        elif isinstance(raw, list):
            items = raw
        else:
            raise ValueError(f"a {type(raw).__name__}, not a list")
        items = [x.strip() if isinstance(x, str) else x for x in items]
        return [_scalar(x, self.item) for x in items if x != ""]

    def fits(self, value: Any) -> bool:
        """Whether `value` already is of this type (what a directly built object must hold)."""
        if value is None:
            return self.optional
        if self.base is list:
            return isinstance(value, list) and all(_fits(x, self.item) for x in value)
        return _fits(value, self.base)


def _fits(value: Any, base: type) -> bool:
    if base is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if base is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, base)


def _scalar(raw: Any, base: type) -> Any:
    if base is bool:
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower() if isinstance(raw, (str, int)) else None
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError("not a boolean")
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ValueError(f"a {type(raw).__name__}")
    if base is int:
        try:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        except (ValueError, OverflowError):
            raise ValueError("not an integer") from None
    if base is float:
        try:
            value = float(raw)
        except (ValueError, OverflowError):
            raise ValueError("not a number") from None
        if not math.isfinite(value):
            raise ValueError("not finite")
        return value
    return str(raw)


@functools.cache
def _kinds(cls: type) -> dict[str, _Kind]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional, hint = len(args) < len(typing.get_args(hint)), args[0]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if (item or hint) not in (bool, int, float, str):
            raise TypeError(f"{cls.__name__}.{f.name}: {f.type} is no settings type (bool, int, float, str, "
                            "a list of int or str, or one of them | None)")
        out[f.name] = _Kind(list if item else hint, item, optional, str(f.type))
    return out


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls` (PEP 257 attribute docstrings), read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (frozen or zipped without .py)
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    return {node.target.id: inspect.cleandoc(doc.value.value) for node, doc in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}


def variables(cls: type[Settings]) -> dict[str, str]:
    """Each environment variable of `cls` (``<ENV_PREFIX><KEY>``) and its meaning: type, default, docstring."""
    docs, out = field_docs(cls), {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out[cls.ENV_PREFIX + f.name.upper()] = f"{f.name} ({f.type}, default {default!r}): {docs.get(f.name, '')}"
    return out


def _show(cls: type, key: str, value: Any) -> str:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key in fields and fields[key].metadata.get("secret"):
        return "<hidden>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_yaml(path: str | Path) -> Mapping[Any, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of settings, not {type(data).__name__}")
    return data


class _InSection(typing.NamedTuple):
    """An unknown key found in a section, kept to be named with its section."""

    sections: tuple[Any, ...]
    key: Any

    def __str__(self) -> str:
        return f"{self.key!r} (in section {' > '.join(repr(s) for s in self.sections)})"


def _flatten(data: Mapping[Any, Any], keys: Mapping[str, Any], source: str) -> dict[Any, Any]:
    """The keys of `data` and of its sections; an unknown key is kept with its sections, to be named."""
    flat: dict[Any, Any] = {}
    paths: dict[Any, str] = {}

    def walk(mapping: Mapping[Any, Any], sections: tuple[Any, ...]) -> None:
        for key, value in mapping.items():
            if key not in keys and isinstance(value, Mapping):
                walk(value, (*sections, key))
                continue
            name = key if key in keys or not sections else _InSection(sections, key)
            path = ".".join(str(s) for s in (*sections, key))
            if name in flat:
                raise ConfigError(f"{source}: {name!r} is set twice ({paths[name]} and {path})")
            flat[name], paths[name] = value, path

    walk(data, ())
    return flat


class Settings:
    """Base of a settings dataclass: loading, coercion and type checks by the rules above."""

    ENV_PREFIX: ClassVar[str] = ""
    """Prefix of the environment variables: ``<ENV_PREFIX><KEY>`` sets the key."""

    def validate(self) -> Self:
        """Raise ConfigError unless every field holds a value of its declared type; return self.
        Subclasses check their own rules after ``super().validate()``."""
        for key, kind in _kinds(type(self)).items():
            value = getattr(self, key)
            if not kind.fits(value):
                raise ConfigError(f"{key}: {_show(type(self), key, value)} is not a valid {kind.text}"
                                  + (" (finite)" if kind.base is float else ""))
        return self

    def apply(self, values: Mapping[Any, Any], source: str, *, origins: Mapping[str, str] | None = None) -> Self:
        """Overlay `values` (key -> raw value) read from `source` (a file name, "environment",
        "flags"); `origins` names where each came from, for the message. Does not validate."""
        kinds = _kinds(type(self))
        for key, raw in values.items():
            if key not in kinds:
                word = key.key if isinstance(key, _InSection) else key
                close = difflib.get_close_matches(str(word), kinds, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(kinds))}"
                name = key if isinstance(key, _InSection) else repr(key)
                raise ConfigError(f"{source}: unknown setting {name}{hint}")
            kind = kinds[key]
            try:
                value = kind.coerce(raw)
            except (TypeError, ValueError, OverflowError) as exc:
                where = f" (from {origins[key]})" if origins and key in origins else ""
                raise ConfigError(f"{source}: {key}={_show(type(self), key, raw)} is invalid ({exc}); "
                                  f"expected {kind.expected}{where}") from None
            setattr(self, key, value)
        return self

    def apply_file(self, path: str | Path) -> Self:
        """Overlay the settings of a YAML file (keys, optionally grouped in sections)."""
        return self.apply(_flatten(_read_yaml(path), _kinds(type(self)), str(path)), str(path))

    def apply_environment(self, environ: Mapping[str, str] | None = None) -> Self:
        """Overlay ``<ENV_PREFIX><KEY>`` variables of `environ` (default: os.environ) that are set and non-empty."""
        env = os.environ if environ is None else environ
        names = {key: self.ENV_PREFIX + key.upper() for key in _kinds(type(self))}
        found = {key: env[name] for key, name in names.items() if env.get(name)}
        return self.apply(found, "environment", origins=names)

    @classmethod
    def from_mapping(cls, data: Mapping[Any, Any], source: str = "config") -> Self:
        """Build and validate from a mapping shaped like a config file (parsed YAML)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source} must be a mapping of settings, not {type(data).__name__}")
        return cls().apply(_flatten(data, _kinds(cls), source), source).validate()

    @classmethod
    def load(cls, path: str | Path | None = None, flags: Mapping[str, Any] | None = None,
             environ: Mapping[str, str] | None = None) -> Self:
        """Defaults, then the file at `path`, the environment (default: os.environ) and `flags`
        (None values are flags not given); validated."""
        cfg = cls()
        if path:
            cfg.apply_file(path)
        cfg.apply_environment(environ)
        cfg.apply({k: v for k, v in (flags or {}).items() if v is not None}, "flags")
        return cfg.validate()
