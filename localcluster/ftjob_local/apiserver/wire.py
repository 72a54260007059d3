"""How requests and answers travel: JSON responses, request bodies (JSON, YAML, protobuf), query flags."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import yaml
from aiohttp import web

from . import protobuf
from .errors import ApiError, bad_request

log = logging.getLogger("ftjob.apiserver")


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=dumps(obj), status=status, content_type="application/json", headers=headers)


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "yes")


async def read_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    ctype = request.content_type
    if "protobuf" in ctype:
        return protobuf.decode(raw)
    if "yaml" in ctype:
        return yaml.safe_load(raw.decode())
    return json.loads(raw)


def pop_warnings(obj: Any) -> dict[str, str] | None:
    """The `Warning` header for what admission noted on `obj` (under "__warnings__", never stored)."""
    warnings = obj.pop("__warnings__", None) if isinstance(obj, dict) else None
    if not warnings:
        return None
    return {"Warning": ", ".join(f"299 - {json.dumps(w)}" for w in warnings)}


def path_not_found(request: web.Request) -> ApiError:
    return ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")


@web.middleware
async def errors_as_status(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure leaves as a metav1 Status with its code; a bug is a 500 Status, and the server keeps serving."""
    try:
        return await handler(request)
    except ApiError as e:
        return json_response(e.status(), e.code)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
        return json_response(bad_request(f"the request body is not valid JSON/YAML: {e}").status(), 400)
    except web.HTTPException:
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:  # a bug: say so as a Status, keep serving
        log.exception("internal error on %s %s", request.method, request.path)
        return json_response(
            ApiError(
                500,
                "InternalError",
                f"an error on the server ({e!r}) has prevented the request from succeeding",
            ).status(),
            500,
        )
