"""Every error leaves the API as ``application/problem+json`` naming the field at fault."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ablab.platform.errors import ALL_ERRORS, AblabError, refine_field

PROBLEM = "application/problem+json"


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or (str(loc[0]) if loc else "body")


def install(app: FastAPI) -> None:
    @app.exception_handler(AblabError)
    async def _ablab(_: Request, exc: AblabError) -> JSONResponse:
        return problem(exc.status_code, exc.title, exc.message, field=exc.field)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            field, message = refine_field(_field(tuple(e.get("loc", ()))), e.get("msg", "invalid"))
            errors.append({"field": field, "message": message})
        first = errors[0] if errors else {"field": "body", "message": "invalid request"}
        return problem(422, "Validation failed", f"{first['field']}: {first['message']}", field=first["field"], errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), str(exc.detail))


def responses(*errors: type[AblabError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` generated from the error classes a route can raise."""
    chosen = errors or ALL_ERRORS
    return {
        e.status_code: {"description": e.title, "content": {PROBLEM: {"schema": {"type": "object"}}}}
        for e in chosen
    }
