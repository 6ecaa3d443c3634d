"""The console's REST API over httpx, with every error turned into one readable sentence."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from satrain.config import Settings
from satrain.files import save_download

JOBS = "/api/v1/training-jobs/"
BUNDLES = "/api/v1/code-bundles/"

JsonObject = dict[str, Any]
"""A JSON object the console answered (a job, a node, a page of lines): its fields as JSON gives them."""


class ApiError(Exception):
    """An answer the user must read: the HTTP status and the console's own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def describe(body: Any) -> str:
    """DRF's error bodies as text: ``{"detail": …}``, ``{"field": ["msg"]}``, nested fields."""
    if isinstance(body, str):
        return body
    if isinstance(body, list):
        return "; ".join(describe(item) for item in body)
    if isinstance(body, dict):
        if set(body) == {"detail"}:
            return describe(body["detail"])
        parts = []
        for field, problem in body.items():
            text = describe(problem)
            parts.append(text if field in ("detail", "non_field_errors") else f"{field}: {text}")
        return "; ".join(parts)
    return str(body)


class Client:
    def __init__(self, settings: Settings, *, timeout: float = 30.0) -> None:
        self.settings = settings
        headers = {"Accept": "application/json", "User-Agent": "satrain"}
        if settings.token:
            headers["Authorization"] = f"Token {settings.token}"
        self.http = httpx.Client(base_url=settings.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, json: Any = None, params: Any = None) -> Any:
        try:
            response = self.http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach the console at {self.settings.url}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, self.error_text(response))
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiError(response.status_code, f"the console answered {method} {path} with something that is not JSON") from None

    def error_text(self, response: httpx.Response) -> str:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code == 401:
            detail = describe(body) if body else "authentication required"
            return f"{detail} (log in with `satrain login`)"
        if body is not None:
            return describe(body)
        return f"HTTP {response.status_code} from {response.request.method} {response.request.url.path}"

    # --- convenience -----------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def upload(self, path: str, data: bytes, *, name: str, fields: dict[str, Any]) -> JsonObject:
        """POST a file (``archive``) and form fields as multipart."""
        try:
            response = self.http.post(path, files={"archive": (name, data, "application/gzip")}, data={k: str(v) for k, v in fields.items()}, timeout=300)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach the console at {self.settings.url}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, self.error_text(response))
        answer: JsonObject = response.json()
        return answer

    def download(self, path: str, params: dict[str, Any], destination: Path) -> Path:
        """GET a download and save it (``satrain.files.save_download``)."""
        try:
            with self.http.stream("GET", path, params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(response.status_code, self.error_text(response))
                is_tar = response.headers.get("content-type", "").startswith("application/x-tar")
                if not is_tar and destination.is_dir():
                    destination = destination / Path(params.get("path", "download")).name
                return save_download(io.BufferedReader(StreamReader(response.iter_bytes()), 1 << 20), is_tar=is_tar, destination=destination)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"the download from {self.settings.url} broke off: {exc}") from None

    def job(self, job_id: int) -> JsonObject:
        job: JsonObject = self.get(f"{JOBS}{job_id}/")
        return job

    def token(self, username: str, password: str) -> JsonObject:
        answer: JsonObject = self.request("POST", "/api/v1/auth/token/", json={"username": username, "password": password})
        return answer

    def list_jobs(self, **filters: Any) -> list[JsonObject]:
        """Every job matching the filters (the API pages; this follows the pages)."""
        jobs: list[JsonObject] = []
        offset = 0
        while True:
            page = self.get(JOBS, limit=500, offset=offset, **filters)
            jobs.extend(page["results"])
            if not page.get("next"):
                return jobs
            offset += len(page["results"])


class StreamReader(io.RawIOBase):
    """A response's byte chunks as a file to read (what tarfile's stream mode reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            try:
                self.pending = next(self.chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self.pending))
        buffer[:size], self.pending = self.pending[:size], self.pending[size:]
        return size
