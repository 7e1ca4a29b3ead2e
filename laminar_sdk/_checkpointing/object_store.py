"""The ``object`` checkpoint store: S3, GCS or Azure Blob Storage through obstore.

Manifests are created with a conditional put (``If-None-Match: *``), so a racing writer can
never overwrite one; sink-status updates and the latest pointer are conditional updates on the
etag (or generation) read just before, retried after re-reading and comparing.

This module is imported only when an ``object`` store is opened (through its entry point), so
obstore is needed only then: ``pip install 'laminar-sdk[s3]'``.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from typing import Any, BinaryIO

from laminar_sdk._checkpointing.blob import BlobCheckpointer, PreconditionFailed
from laminar_sdk._checkpointing.checkpointer import display_location
from laminar_sdk._checkpointing.errors import CheckpointNotFound
from laminar_sdk._checkpointing.registry import OBJECT_STORE_SCHEMES
from laminar_sdk._contract.config import ConnectorConfig
from laminar_sdk._contract.errors import CheckpointError

try:
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
    from obstore.store import ObjectStore, from_url
except ImportError as missing:
    raise ImportError(
        f"the object checkpoint store needs obstore ({missing}): pip install 'laminar-sdk[s3]'"
    ) from missing

# What obstore raises besides its own BaseError family.
_OBSTORE_ERRORS = (BaseError, OSError, ValueError)

# obstore takes HTTP client settings apart from the store's own configuration (passing one of
# them as store configuration makes obstore 0.12 panic), so options are routed by name.
_CLIENT_OPTIONS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "root_certificate",
        "timeout",
        "user_agent",
    }
)
# Credential options whose names the generic secret pattern does not recognise.
_SECRET_OPTION = re.compile(r"(key|sas|signature)", re.IGNORECASE)
_URL_QUERY = re.compile(r"(https?://[^\s?\"']+)\?[^\s\"']*")


def _first_line(error: BaseException) -> str:
    """An obstore error's summary, without query strings (signed URLs carry credentials)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return _URL_QUERY.sub(r"\1?***", text)


class ObjectStoreCheckpointer(BlobCheckpointer):
    """Checkpoints in an object store: ``s3://bucket/prefix``, ``gs://...``, ``az://...``.

    :param location: the store URL; checkpoints go under its path.
    :param options: obstore configuration, e.g. ``endpoint``, ``region``,
        ``access_key_id``, ``secret_access_key`` (S3), plus HTTP client settings such as
        ``allow_http`` and ``timeout``. Credentials may also come from the environment, as
        obstore reads them. Values are never shown: ``repr`` and errors redact them.
    """

    def __init__(self, location: str, options: Mapping[str, str] | None = None) -> None:
        scheme = location.partition("://")[0].lower()
        if scheme not in OBJECT_STORE_SCHEMES:
            hint = (
                " (obstore's local store cannot update objects conditionally, which the "
                "latest pointer needs: use the `file` store for a local directory)"
                if scheme == "file"
                else ""
            )
            raise CheckpointError(
                f"the object checkpoint store opens {', '.join(sorted(OBJECT_STORE_SCHEMES))} "
                f"URLs, not {display_location(location)!r}{hint}"
            )
        options = dict(options or {})
        self._options = ConnectorConfig(
            "object checkpoint store",
            options,
            secret_keys={key for key in options if _SECRET_OPTION.search(key)},
        )
        self._location = display_location(location)
        self._store = self._open(location, options)

    def _open(self, url: str, options: dict[str, str]) -> ObjectStore:
        client = {key: value for key, value in options.items() if key in _CLIENT_OPTIONS}
        config = {key: value for key, value in options.items() if key not in _CLIENT_OPTIONS}
        try:
            store: ObjectStore = from_url(url, config=config or None, client_options=client or None)  # type: ignore[arg-type]
        except _OBSTORE_ERRORS as error:
            raise CheckpointError(
                f"cannot open object store {self._location} with options "
                f"{self._options.redacted()}: {_first_line(error)}"
            ) from error
        return store

    @property
    def location(self) -> str:
        """The store URL, without credentials."""
        return self._location

    def __repr__(self) -> str:
        return f"ObjectStoreCheckpointer({self._location!r}, {self._options.redacted()!r})"

    def _failed(self, action: str, path: str, error: Exception) -> CheckpointError:
        return CheckpointError(
            f"object store {self._location}: {action} {path} failed: "
            f"{type(error).__name__}: {_first_line(error)}; check the endpoint, the "
            "credentials and that the bucket exists"
        )

    async def _read(self, path: str) -> tuple[bytes, object]:
        try:
            result = await obstore.get_async(self._store, path)
            data = bytes(await result.bytes_async())
        except FileNotFoundError:
            raise CheckpointNotFound(f"{self._location}/{path} does not exist", path=path) from None
        except _OBSTORE_ERRORS as error:
            raise self._failed("reading", path, error) from error
        meta = result.meta
        version = {key: meta[key] for key in ("e_tag", "version") if meta.get(key) is not None}
        return data, version

    async def _read_file(self, path: str) -> BinaryIO:
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it
        try:
            await self._download(path, spool)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool

    async def _download(self, path: str, spool: BinaryIO) -> None:
        try:
            result = await obstore.get_async(self._store, path)
            async for chunk in result.stream():
                spool.write(chunk)
        except FileNotFoundError:
            raise CheckpointNotFound(f"{self._location}/{path} does not exist", path=path) from None
        except _OBSTORE_ERRORS as error:
            raise self._failed("reading", path, error) from error

    async def _write(self, path: str, data: bytes) -> None:
        await self._put(path, data, "overwrite")

    async def _write_file(self, path: str, file: BinaryIO) -> None:
        # obstore reads the file in chunks and uploads a large one in parts; the object
        # appears only when the upload completes.
        await self._put(path, file, "overwrite")

    async def _write_if(self, path: str, data: bytes, expected: object | None) -> None:
        mode: Any = "create" if expected is None else expected
        try:
            await self._put(path, data, mode)
        except (AlreadyExistsError, PreconditionError, FileNotFoundError) as error:
            # FileNotFoundError: an If-Match update of an object deleted meanwhile.
            raise PreconditionFailed(path) from error

    async def _put(self, path: str, data: bytes | BinaryIO, mode: Any) -> None:  # noqa: ANN401 - obstore's PutMode
        try:
            await obstore.put_async(self._store, path, data, mode=mode)
        except (AlreadyExistsError, PreconditionError, FileNotFoundError):
            raise
        except _OBSTORE_ERRORS as error:
            raise self._failed("writing", path, error) from error

    async def _list(self) -> list[str]:
        paths: list[str] = []
        try:
            async for chunk in obstore.list(self._store):
                paths.extend(meta["path"] for meta in chunk)
        except _OBSTORE_ERRORS as error:
            raise self._failed("listing", "/", error) from error
        return paths

    async def _delete(self, path: str) -> None:
        try:
            await obstore.delete_async(self._store, path)
        except FileNotFoundError:
            return
        except _OBSTORE_ERRORS as error:
            raise self._failed("deleting", path, error) from error
