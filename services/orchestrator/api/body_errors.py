"""What a 400 for a request body says, in OpenAI's error shape: the field a validation error is about, and for a body
that is not JSON, the field being written where parsing stopped (not a byte offset)."""

import json

from services.orchestrator.api.openai_protocol import error


def field_at(doc: str, pos: int) -> str | None:
    """The top-level field of a JSON object whose key is the last one opened before offset pos; None before any."""
    depth, field, key, start, in_string, escaped = 0, None, None, 0, False, False
    for i, ch in enumerate(doc[:pos]):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                key = doc[start : i + 1] if depth == 1 else None
        elif ch == '"':
            in_string, start = True, i
        elif ch == ":" and key is not None:
            field = json.loads(key)
        elif not ch.isspace():
            key = None
            depth += (ch in "{[") - (ch in "}]")
    return field


def invalid_body(errors: list[dict], doc: object) -> dict:
    """The first validation error of a body as OpenAI's error body, `param` naming the field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        pos = first["loc"][-1]
        param = field_at(doc, pos) if isinstance(doc, str) and isinstance(pos, int) else None
        where = f" in field {param!r}" if param else ""
        message = f"the body is not valid JSON{where}: {first['ctx']['error']} (character {pos})"
        return error(message, "invalid_request_error", param)
    param = ".".join(str(part) for part in first["loc"] if part != "body") or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    return error(message, "invalid_request_error", param)
