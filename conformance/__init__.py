"""chatgold: conformance suite and golden files for LLM chat templates."""
from functools import lru_cache
from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout holding templates/ and goldens/ (overridable with CHATGOLD_ROOT)."""
    import os

    env = os.environ.get("CHATGOLD_ROOT")
    return _resolved(env) if env else PACKAGE_DIR.parent


@lru_cache(maxsize=8)
def _resolved(path: str) -> Path:
    # Every golden path starts here: resolving (a syscall per component) once per value, not per cell.
    return Path(path).resolve()


@lru_cache(maxsize=None)
def schema_validator(name: str, formats: bool = False):
    """A validator for one of the project's JSON Schemas (conformance/schemas/ or runners/protocol/), with
    every other schema registered so that one may $ref another; `formats` also checks `format` (date-time)."""
    import json

    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource

    schemas = {}
    for folder in (PACKAGE_DIR / "schemas", _protocol_schema_dir()):
        for path in sorted(folder.glob("*.schema.json")):
            schemas[path.name] = json.loads(path.read_text(encoding="utf-8"))
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    schema = schemas[name]
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry, format_checker=FormatChecker() if formats else None)


def _protocol_schema_dir() -> Path:
    # Located, not imported: validating a report must load no runner module (runners/ is engines).
    from importlib.util import find_spec

    return Path(find_spec("runners").submodule_search_locations[0]) / "protocol"
