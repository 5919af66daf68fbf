"""Settings that mean the same in every service: the bounds of the HTTP edge (``http.install_edge``)
and how an outbound client connects. Each is a type that carries its bound and its description; a
service's settings give it their own default, and a fuller description where that service needs one."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MaxBodyBytes = Annotated[
    int, Field(ge=1024, description="Bound on a request's body, checked before it is read (413 past it).")
]
MaxClientConcurrency = Annotated[
    int, Field(ge=1, description="Requests one client (token or address) may have in flight (429 past it).")
]
ConnectTimeout = Annotated[float, Field(gt=0, description="Connect timeout of every outbound request.")]
ConnectRetries = Annotated[
    int, Field(ge=0, description="httpx retries of an outbound connection that failed (nothing was sent yet).")
]
