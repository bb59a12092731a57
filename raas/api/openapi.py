"""What the OpenAPI document says beyond the wire models: the instances the server's tasks take.

A request's ``instance`` is a dict at run time (the task named by its ``data_source`` validates
it), so the wire module documents it as any object. This server knows its tasks, so its
document says what each takes: a ``oneOf`` of the registered tasks' instance models, told apart
by ``data_source``, so a client (or a fuzzer) can build a valid submission from the document.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from raas.api.prorl_compat import params_model, prorl_params_schema, raas_task
from raas.settings import TaskSettings
from raas.tasks import TaskRegistry

REF = "#/components/schemas/"
# The request models with an `instance` field (pydantic may suffix a name with -Input).
REQUESTS = re.compile(r"^(RolloutRequest|ProcessRequest)(-Input)?$")


def _component_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def _any_case(prefix: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in prefix)


def instance_schema(
    name: str,
    handler: object,
    components: dict[str, Any],
    aliases: list[str] | None = None,
    settings: TaskSettings | None = None,
) -> dict[str, Any]:
    """The JSON schema of task ``name``'s instances; models it refers to go to ``components``
    under names prefixed by the task's, so two tasks' models never collide. ``aliases`` are the
    dataset names that run as the task (``PREFIX*`` for any name starting with PREFIX). A
    handler's optional ``document_instance(schema, settings)`` says what this server's
    ``settings`` (what tasks may name on its host) change of it: the path form of a Harbor
    task, documented only where the server reads task directories."""
    model = getattr(handler, "instance_model", None)
    schema: dict[str, Any]
    if isinstance(model, type) and issubclass(model, BaseModel):
        prefix = _component_name(name) + "."
        schema = model.model_json_schema(ref_template=REF + prefix + "{model}")
        for key, sub in schema.pop("$defs", {}).items():
            components[prefix + key] = sub
    else:  # a handler that declares no model: only data_source is known
        schema = {"type": "object", "additionalProperties": True}
    here = getattr(handler, "document_instance", None)
    if callable(here):
        here(schema, settings if settings is not None else TaskSettings())
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "data_source"}
    required = [k for k in schema.get("required", []) if k != "data_source"]
    source: dict[str, Any] = {"type": "string", "const": name}
    if aliases:
        exact = [a for a in aliases if not a.endswith("*")]
        source = {
            "type": "string",
            "description": f"`{name}`, or a dataset that runs as it: " + ", ".join(aliases),
        }
        patterns = [_any_case(a[:-1]) for a in aliases if a.endswith("*")]
        source["anyOf"] = [{"enum": [name, *exact]}]
        if patterns:  # ECMA-262 patterns have no inline flags: each letter in either case
            source["anyOf"].append({"pattern": "^(?:" + "|".join(patterns) + ")"})
    return {
        **schema,
        "title": f"{name} instance",
        "properties": {"data_source": source, **properties},
        "required": ["data_source", *required],
    }


def params_schema(name: str, handler: object, components: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of the sampling_params task ``name`` takes (its models to
    ``components``, prefixed as an instance's)."""
    prefix = _component_name(name) + ".params."
    schema = params_model(handler).model_json_schema(ref_template=REF + prefix + "{model}")
    for key, sub in schema.pop("$defs", {}).items():
        components[prefix + key] = sub
    # A key given as null means its default (raas.tasks.protocol.parse_params).
    properties = {k: {"anyOf": [v, {"type": "null"}]} for k, v in schema["properties"].items()}
    return {**schema, "title": f"{name} sampling_params", "properties": properties}


def _without_data_source(schema: dict[str, Any]) -> dict[str, Any]:
    """An instance ``schema`` for a row that names no data_source (ProRL's default task)."""
    properties = {k: v for k, v in schema["properties"].items() if k != "data_source"}
    required = [k for k in schema["required"] if k != "data_source"]
    return {
        **schema,
        "title": schema["title"] + " without a data_source",
        "properties": properties,
        "required": required,
        "not": {"required": ["data_source"]},
    }


def document_instances(
    document: dict[str, Any], registry: TaskRegistry, settings: TaskSettings | None = None
) -> None:
    """Make ``instance`` of the request models in ``document`` a oneOf of the tasks' instances,
    and the request a oneOf of the tasks' pairs of instance and sampling_params (the task the
    instance names decides which keys sampling_params may hold); ``settings``: the server's,
    of what its tasks may name on its host (default: nothing)."""
    components: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    mapping: dict[str, str] = {}
    pairs: dict[str, str] = {}  # instance component -> params component
    unbranched: set[str] = set()  # instance components of the tasks that cannot branch
    for name in registry.names():
        key = "Instance." + _component_name(name)
        aliases = registry.aliases(name)
        components[key] = instance_schema(name, registry.get(name), components, aliases, settings)
        pairs[key] = "Params." + _component_name(name)
        components[pairs[key]] = params_schema(name, registry.get(name), components)
        components[pairs[key] + ".prorl"] = prorl_params_schema(components[pairs[key]])
        if not getattr(registry.get(name), "can_branch", False):
            unbranched.add(key)
        for source in (name, *(a for a in aliases if not a.endswith("*"))):
            mapping[source] = REF + key
    if not mapping:
        return
    default = "Instance." + _component_name(raas_task(None, registry))
    if default in components:  # /process: a row without a data_source is ProRL's default's
        components[default + ".default"] = _without_data_source(components[default])
        pairs[default + ".default"] = pairs[default]
        if default in unbranched:
            unbranched.add(default + ".default")
    for model, schema in list(components.items()):
        field = schema.get("properties", {}).get("instance") if REQUESTS.match(model) else None
        if field is None:
            continue
        prorl = model.startswith("ProcessRequest")
        instances = [key for key in pairs if prorl or not key.endswith(".default")]
        schema["properties"]["instance"] = {
            "description": field.get("description", "The task instance.")
            + " The schema is the one of the task its `data_source` names.",
            "oneOf": [{"$ref": REF + key} for key in instances],
        }
        if not prorl:  # every instance names its task
            schema["properties"]["instance"]["discriminator"] = {
                "propertyName": "data_source",
                "mapping": mapping,
            }
        suffix = ".prorl" if prorl else ""
        schema["oneOf"] = [
            _pair(key, pairs[key] + suffix, key in unbranched and not prorl) for key in instances
        ]


def _pair(instance: str, params: str, unbranched: bool) -> dict[str, Any]:
    """One task's part of a request's oneOf: its instance and its sampling_params, and no
    ``branch`` where the task cannot branch (its validate refuses one)."""
    properties: dict[str, Any] = {
        "instance": {"$ref": REF + instance},
        "sampling_params": {"$ref": REF + params},
    }
    if unbranched:
        properties["branch"] = {"type": "null"}
    return {"properties": properties}


def document_api_key(document: dict[str, Any]) -> None:
    """The server has an API key: every operation but /healthz needs it."""
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["apiKey"] = {"type": "http", "scheme": "bearer"}
    document["security"] = [{"apiKey": []}]
    for operation in document.get("paths", {}).get("/healthz", {}).values():
        operation["security"] = []


def document_form_refusal(
    document: dict[str, Any], methods: Collection[str], form_paths: Collection[str]
) -> None:
    """Every operation that changes something answers a form with a 415 (see
    raas.api.browser_guard), but those of ``form_paths``, which take one."""
    refusal = {
        "description": "The body was sent as a form or as text, not as JSON"
        " (`Content-Type: application/json`).",
        "content": {"application/json": {"schema": {"$ref": REF + "ErrorBody"}}},
    }
    for path, operations in document.get("paths", {}).items():
        if path in form_paths:
            continue
        for method, operation in operations.items():
            if method.upper() in methods:
                operation.setdefault("responses", {}).setdefault("415", refusal)


def document_streams(document: dict[str, Any], media_type: str) -> None:
    """The routes that stream ``media_type`` (JSON lines): FastAPI writes their error answers
    under that type, and a string type beside the model of a line; their errors are JSON, and
    each line is an object of the model."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for code, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if media_type not in content:
                    continue
                if code.startswith("2"):
                    content[media_type].get("schema", {}).pop("type", None)
                else:
                    content["application/json"] = content.pop(media_type)
