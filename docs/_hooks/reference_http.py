"""The HTTP reference: one page per service, rendered from the OpenAPI document its FastAPI app builds
(the same documents `corl proto export` writes to proto/openapi/; no server is started)."""

from __future__ import annotations

import json
from typing import Any

from markdown_text import cell

# proto/openapi/<file> -> (page, service name, how it is started)
SERVICES = {
    "openapi/model_server.json": ("http-model-server.md", "Model server", "corl serve model --model DIR"),
    "openapi/aggregator.json": ("http-aggregator.md", "Aggregator", "corl serve aggregator --config FILE"),
    "openapi/evaluator.json": ("http-evaluator.md", "Evaluator", "corl serve evaluator --config FILE"),
    "openapi/sandbox.json": ("http-sandbox.md", "Sandbox", "corl serve sandbox"),
    "openapi/gateway.json": ("http-gateway.md", "Gateway", "corl serve gateway --config FILE"),
}
_METHODS = ("get", "put", "post", "delete", "patch")


def openapi_documents() -> dict[str, dict[str, Any]]:
    """OpenAPI file name -> document, built from each service's app with default settings."""
    from corl.cli.proto import exported_files

    files = exported_files()
    return {name: json.loads(files[name]) for name in SERVICES}


def schema_anchor(name: str) -> str:
    return f"schema-{name.lower()}"


def schema_type(schema: dict[str, Any]) -> str:
    """A JSON Schema as a short type: referenced models linked to their section on the page."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(schema_type(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        if isinstance(items, dict):
            return f"array[{schema_type(items)}]"
        if "prefixItems" in schema:
            return f"[{', '.join(schema_type(s) for s in schema['prefixItems'])}]"
        return "array"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object[string, {schema_type(schema['additionalProperties'])}]"
    if isinstance(kind, list):
        return " | ".join(kind)
    return kind or "any"


def limits(schema: dict[str, Any]) -> str:
    signs = {
        "minimum": ">=",
        "exclusiveMinimum": ">",
        "maximum": "<=",
        "exclusiveMaximum": "<",
        "minLength": "min length",
        "maxLength": "max length",
        "minItems": "min items",
        "maxItems": "max items",
    }
    parts = [f"{sign} {schema[key]}" for key, sign in signs.items() if key in schema]
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    return ", ".join(parts)


def body_schema(content: dict[str, Any]) -> str:
    parts = []
    for media, spec in content.items():
        schema = spec.get("schema")
        parts.append(f"`{media}`" + (f": {schema_type(schema)}" if schema else ""))
    return "; ".join(parts)


def operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if summary := op.get("summary"):
        lines += [f"**{summary}.**", ""]
    if description := op.get("description"):
        lines += [" ".join(description.split()), ""]
    security = [name for requirement in op.get("security", []) for name in requirement]
    if security:
        lines += ["Auth: " + ", ".join(f"`{name}` bearer token" for name in security) + ".", ""]
    if params := op.get("parameters"):
        lines += ["| parameter | in | type | required | default | description |", "|---|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            default = f"`{json.dumps(schema['default'])}`" if "default" in schema else ""
            note = " ".join(x for x in (p.get("description") or schema.get("description", ""), limits(schema)) if x)
            lines.append(
                f"| `{p['name']}` | {p['in']} | {cell(schema_type(schema))} | {'yes' if p.get('required') else 'no'} "
                f"| {cell(default)} | {cell(note)} |"
            )
        lines.append("")
    if body := op.get("requestBody"):
        lines += [f"Request body: {body_schema(body.get('content', {}))}.", ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        lines.append(
            f"| {status} | {cell(response.get('description', ''))} | {cell(body_schema(response.get('content', {})))} |"
        )
    return [*lines, ""]


def schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{ #{schema_anchor(name)} }}", ""]
    if description := schema.get("description"):
        lines += [" ".join(description.split()), ""]
    properties = schema.get("properties")
    if not properties:
        return [*lines, f"Type: {schema_type(schema)}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        note = " ".join(x for x in (spec.get("description", ""), limits(spec)) if x)
        lines.append(
            f"| `{field}` | {cell(schema_type(spec))} | {'yes' if field in required else 'no'} "
            f"| {cell(default)} | {cell(note)} |"
        )
    if schema.get("additionalProperties") is False:
        lines += ["", "Unknown fields are refused (422)."]
    return [*lines, ""]


def page(doc: dict[str, Any], title: str, command: str) -> str:
    info = doc.get("info", {})
    schemes = doc.get("components", {}).get("securitySchemes", {})
    lines = [
        f"# {title} HTTP API",
        "",
        f"Generated at build time from the OpenAPI document of `{command}` ({info.get('title', '')}, contract "
        f"version {info.get('version', '')}); the running service serves the same document at `/openapi.json`.",
        "",
    ]
    if schemes:
        lines += ["## Auth", "", "| scheme | kind | what it is |", "|---|---|---|"]
        for name, scheme in schemes.items():
            kind = f"{scheme.get('type', '')} {scheme.get('scheme', '')}".strip()
            lines.append(f"| `{name}` | {kind} | {cell(scheme.get('description', ''))} |")
        lines.append("")
    lines += ["## Routes", ""]
    for path, ops in doc.get("paths", {}).items():
        for method in _METHODS:
            if method in ops:
                lines += operation(path, method, ops[method])
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Models", ""]
        for name in sorted(schemas):
            lines += schema_section(name, schemas[name])
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """Page path under reference/ -> Markdown, one per service."""
    docs = openapi_documents()
    return {page_name: page(docs[file], title, command) for file, (page_name, title, command) in SERVICES.items()}
