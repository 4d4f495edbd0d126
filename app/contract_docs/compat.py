"""Compatibility gate: is every event valid under an old published schema still valid under the new one?

What a schema registry's BACKWARD check guards, without a registry: consumers upgraded to the new
contract must still accept every event already on the topics (retention is up to 30 days) and
every event an old producer still writes. ``avcc contracts check --against REF`` compares the
schemas generated from the current models with ``schemas/json`` at a git ref
(``git show REF:schemas/json/...``) and reports each break with the field it concerns:

* field removed (the object no longer allows it), new required field;
* type narrowed (a JSON type or ``null`` no longer accepted), enum value removed;
* constraint narrowed (pattern, length, range, item count changed the strict way), rule added;
* topic removed (a payload schema that existed at REF is gone).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from app.contract_docs.json_schemas import END_OF_TEXT, ENVELOPE_FILE
from app.platform.errors import AvccError

__all__ = ["Break", "GitRefError", "compare_documents", "compare_sets", "schemas_at_ref"]

_LOWER: Final = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_UPPER: Final = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")
_EXACT: Final = ("pattern", "format", "multipleOf", "uniqueItems")
#: Contracts are flat documents; deeper nesting means a recursive model, which is not supported.
_MAX_DEPTH: Final = 32


@dataclass(frozen=True, slots=True)
class Break:
    """One backward-incompatible change."""

    document: str
    field: str
    change: str
    detail: str

    def line(self) -> str:
        """``file: field: change (detail)``, one line."""
        return f"{self.document}: {self.field}: {self.change} ({self.detail})"


class GitRefError(AvccError):
    """The ref cannot be read (unknown ref, not a git checkout)."""


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    """JSON types a (branch) schema accepts; ``None``: any."""
    if "type" in schema:
        declared = schema["type"]
        return set(declared) if isinstance(declared, list) else {declared}
    values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if values is None:
        return None
    return {_json_type(v) for v in values}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _covers(new: set[str] | None, old: set[str] | None) -> bool:
    if new is None:
        return True
    if old is None:
        return False
    widened = new | ({"integer"} if "number" in new else set())
    return old <= widened


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _exact(keyword: str, value: Any) -> Any:
    """``value`` of an exact-match keyword in a canonical form: a pattern ending in
    :data:`~app.contract_docs.json_schemas.END_OF_TEXT` is the same ECMA-262 language
    (JSON Schema's regex dialect) as the one ending in a bare ``$``."""
    if keyword == "pattern" and isinstance(value, str) and value.endswith(END_OF_TEXT):
        return value.removesuffix(END_OF_TEXT) + "$"
    return value


class _Comparison:
    """One old document against one new document (each resolves its own ``#/$defs`` refs)."""

    def __init__(self, name: str, old: Mapping[str, Any], new: Mapping[str, Any], prefix: str) -> None:
        self.name, self.old_doc, self.new_doc, self.prefix = name, old, new, prefix
        self.breaks: list[Break] = []

    def run(self) -> list[Break]:
        self._schema(self.old_doc, self.new_doc, self.prefix)
        return self.breaks

    def _add(self, path: str, change: str, detail: str) -> None:
        self.breaks.append(Break(self.name, path or "(event)", change, detail))

    @staticmethod
    def _resolve(doc: Mapping[str, Any], schema: Any) -> Any:
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"only local $refs are supported, got {ref!r}")
            node: Any = doc
            for part in ref[2:].split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema

    def _schema(self, old: Any, new: Any, path: str) -> None:
        old, new = self._resolve(self.old_doc, old), self._resolve(self.new_doc, new)
        if new is True or old is False or new == {}:
            return
        if path.count(".") > _MAX_DEPTH:
            raise ValueError(f"{self.name}: schema nested deeper than {_MAX_DEPTH} levels (recursive?)")
        if new is False:
            self._add(path, "field removed", "no value is accepted any more")
            return
        new_branches = [self._resolve(self.new_doc, b) for b in new.get("anyOf", new.get("oneOf", [new]))]
        for branch in old.get("anyOf", old.get("oneOf", [old])):
            self._branch(self._resolve(self.old_doc, branch), new_branches, path)
        self._rules(old, new, path)

    def _branch(self, old: Mapping[str, Any], new_branches: list[Any], path: str) -> None:
        candidates = [b for b in new_branches if _covers(_types(b), _types(old))]
        if not candidates:
            was = sorted(_types(old) or {"any"})
            self._add(path, "type narrowed", f"{'/'.join(was)} no longer accepted")
            return
        best: list[Break] | None = None
        for candidate in candidates:
            saved, self.breaks = self.breaks, []
            self._single(old, candidate, path)
            found, self.breaks = self.breaks, saved
            if best is None or len(found) < len(best):
                best = found
            if not found:
                break
        self.breaks.extend(best or [])

    def _single(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        self._values(old, new, path)
        self._constraints(old, new, path)
        if "properties" in old or "properties" in new or _types(old) == {"object"}:
            self._object(old, new, path)
        if "items" in old or "items" in new:
            self._schema(old.get("items", True), new.get("items", True), f"{path}[]")

    def _values(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        new_values = new["enum"] if "enum" in new else [new["const"]] if "const" in new else None
        if new_values is None:
            return
        old_values = old["enum"] if "enum" in old else [old["const"]] if "const" in old else None
        if old_values is None:
            self._add(path, "type narrowed", f"now only {new_values!r}")
            return
        removed = [v for v in old_values if v not in new_values]
        if removed:
            self._add(path, "enum value removed", ", ".join(repr(v) for v in removed))

    def _constraints(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        for keyword in _LOWER:
            if keyword in new and (keyword not in old or new[keyword] > old[keyword]):
                self._add(path, "constraint narrowed", f"{keyword} {old.get(keyword)} -> {new[keyword]}")
        for keyword in _UPPER:
            if keyword in new and (keyword not in old or new[keyword] < old[keyword]):
                self._add(path, "constraint narrowed", f"{keyword} {old.get(keyword)} -> {new[keyword]}")
        for keyword in _EXACT:
            if keyword in new and _exact(keyword, new[keyword]) != _exact(keyword, old.get(keyword)):
                self._add(path, "constraint narrowed", f"{keyword} {old.get(keyword)!r} -> {new[keyword]!r}")

    def _object(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        old_props: Mapping[str, Any] = old.get("properties", {})
        new_props: Mapping[str, Any] = new.get("properties", {})
        old_extra, new_extra = old.get("additionalProperties", True), new.get("additionalProperties", True)
        for name, sub in old_props.items():
            child = f"{path}.{name}" if path else name
            if name in new_props:
                self._schema(sub, new_props[name], child)
            elif new_extra is False:
                self._add(child, "field removed", "the object no longer allows it")
            else:
                self._schema(sub, new_extra, child)
        old_required = set(old.get("required", []))
        for name in new.get("required", []):
            if name not in old_required:
                child = f"{path}.{name}" if path else name
                self._add(child, "new required field", "events without it are now invalid")
        if new_extra is not True and old_extra is not False:
            self._schema(old_extra, new_extra, f"{path}.*" if path else "*")

    def _rules(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        old_rules = {_canonical(r) for r in old.get("allOf", [])}
        for rule in new.get("allOf", []):
            if _canonical(rule) not in old_rules:
                self._add(path, "rule added", _canonical(rule)[:200])


def compare_documents(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Break]:
    """Breaks between two versions of one schema file (payload fields are named ``payload.*``)."""
    prefix = "" if name == ENVELOPE_FILE else "payload"
    return _Comparison(name, old, new, prefix).run()


def compare_sets(old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]) -> list[Break]:
    """Breaks between two sets of schema files (file name -> document)."""
    breaks: list[Break] = []
    for name, old_doc in sorted(old.items()):
        if name not in new:
            breaks.append(
                Break(name, "(topic)", "topic removed", "its payload schema is no longer published")
            )
        else:
            breaks.extend(compare_documents(name, old_doc, new[name]))
    return breaks


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise GitRefError(f"git is not available: {exc}") from exc
    if done.returncode != 0:
        raise GitRefError(done.stderr.strip() or f"git {' '.join(args)} failed")
    return done.stdout


def _paths_at(root: Path, commit: str, directory: str) -> Iterator[str]:
    listing = _git(root, "ls-tree", "--name-only", f"{commit}:{directory}") if directory else ""
    for line in listing.splitlines():
        if line.endswith(".json"):
            yield line


def schemas_at_ref(root: Path, ref: str, directory: str = "schemas/json") -> dict[str, dict[str, Any]] | None:
    """File name -> document of the schemas published at ``ref``; ``None`` if ``ref`` has none."""
    try:
        commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except GitRefError as exc:
        raise GitRefError(f"cannot read git ref {ref!r} in {root}: {exc}") from exc
    try:
        names = list(_paths_at(root, commit, directory))
    except GitRefError:
        return None
    return {name: json.loads(_git(root, "show", f"{commit}:{directory}/{name}")) for name in names}
