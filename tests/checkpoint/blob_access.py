"""Raw access to a blob-backed store's files, for conformance contexts that corrupt them."""

from __future__ import annotations

from laminar_sdk._checkpointing.blob import BlobCheckpointer


class BlobRawAccess:
    """``read_raw`` / ``write_raw`` / ``delete_raw`` through a store's own primitives.

    Subclasses set ``_raw`` to a private instance of the store under test.
    """

    _raw: BlobCheckpointer

    async def read_raw(self, path: str) -> bytes:
        data, _ = await self._raw._read(path)
        return data

    async def write_raw(self, path: str, data: bytes) -> None:
        await self._raw._write(path, data)

    async def delete_raw(self, path: str) -> None:
        await self._raw._delete(path)
