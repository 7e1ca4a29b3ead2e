"""Where the source's files are: its ``path`` key, and the checks of the location it names.

The location itself (a pyarrow filesystem and a directory in it, from ``path`` and the
``s3.*`` keys) is the SDK's :class:`~laminar_sdk.reference.StorageLocation`.
"""

from __future__ import annotations

import pyarrow.fs as pafs
from laminar_sdk import ConfigKeySpec, ConfigurationError, ConnectionFailed, PathKind
from laminar_sdk.reference import StorageLocation

SOURCE_PATH_KEY = ConfigKeySpec(
    "path",
    required=True,
    description="the directory of the files: a local (or mounted) path, file:///..., or an "
    "object-store prefix such as s3://bucket/prefix (see the s3.* keys) or any URI pyarrow's "
    "filesystems understand (gs://...)",
    path=PathKind.MUST_EXIST,
)


def check_location(label: str, location: StorageLocation) -> None:
    """Check that the directory can be listed; object stores are contacted once.

    A local directory must exist; under an object-store prefix, no objects yet is an empty
    directory (the source reads the objects that appear), but the bucket must exist.

    :raises ConfigurationError: naming ``path`` when the directory (or bucket) does not exist,
        is a file, or may not be read.
    :raises ConnectionFailed: naming ``path`` when the object store cannot be reached or
        refuses the request.
    """
    filesystem = location.filesystem
    try:
        kind = filesystem.get_file_info(location.root).type
        if kind is pafs.FileType.NotFound and location.remote:
            bucket = location.root.split("/", 1)[0]
            if filesystem.get_file_info(bucket).type is pafs.FileType.NotFound:
                raise ConfigurationError(
                    f"{label}: config key 'path' names {location.shown}, whose bucket "
                    f"{bucket!r} does not exist (or this account cannot see it); create it, "
                    "or fix 'path' (and s3.endpoint, s3.region)",
                    key=SOURCE_PATH_KEY.name,
                )
        elif kind is not pafs.FileType.Directory:
            problem = "does not exist" if kind is pafs.FileType.NotFound else "is not a directory"
            raise ConfigurationError(
                f"{label}: config key 'path' names {location.shown}, which {problem}; create "
                "the directory (the source reads the files that appear in it) or fix 'path'",
                key=SOURCE_PATH_KEY.name,
            )
        filesystem.get_file_info(pafs.FileSelector(location.root, allow_not_found=True))
    except PermissionError as error:
        raise ConfigurationError(
            f"{label}: config key 'path' names {location.shown}, which this process may not "
            "read; give it read access to the directory and its files",
            key=SOURCE_PATH_KEY.name,
        ) from error
    except OSError as error:
        raise unreachable(label, location, error) from error


# How pyarrow's S3 errors say the store refused the credentials or the request.
_REFUSALS = ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


def unreachable(label: str, location: StorageLocation, error: OSError) -> ConnectionFailed:
    """The error for a location whose filesystem failed a request (network, access).

    Transient, unless the store refused the credentials: retrying those unchanged never helps.
    """
    failed = ConnectionFailed(
        f"{label}: cannot list {location.shown} (config key 'path'): {error}; check that the "
        "endpoint is reachable (s3.endpoint, s3.region), that the credentials are valid and "
        "may list and read the prefix, and that the bucket exists"
    )
    failed.transient = not any(refusal in str(error) for refusal in _REFUSALS)
    return failed
