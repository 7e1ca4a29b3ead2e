"""Where a connector's files are: a pyarrow filesystem and a directory (or prefix) in it.

Local paths, ``file://`` URIs and object-store URIs (with the ``s3.*`` keys for S3) all
become a :class:`StorageLocation`, so a connector lists, reads and writes every kind of
location through one code path: the pyarrow filesystem's. The ``files`` source and the
``delta`` connectors share it.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from laminar_sdk import ConfigKeySpec, ConfigurationError, ConnectorConfig

S3_KEYS: tuple[ConfigKeySpec, ...] = (
    ConfigKeySpec(
        "s3.endpoint",
        description="S3 endpoint URL, for S3-compatible servers (http://127.0.0.1:9000); "
        "default: AWS's endpoint for the region",
    ),
    ConfigKeySpec(
        "s3.region",
        description="S3 region of the bucket; default: pyarrow's (AWS_REGION, the AWS config "
        "file, or us-east-1)",
    ),
    ConfigKeySpec(
        "s3.access_key",
        secret=True,
        description="S3 access key id; with s3.secret_key. Default: the AWS credential chain "
        "(environment, config files, instance role)",
    ),
    ConfigKeySpec(
        "s3.secret_key",
        secret=True,
        description="S3 secret access key; with s3.access_key (never shown)",
    ),
    ConfigKeySpec(
        "s3.session_token",
        secret=True,
        description="S3 session token, for temporary credentials (never shown)",
    ),
    ConfigKeySpec(
        "s3.allow_http",
        default="false",
        value_type=bool,
        description="allow an http:// s3.endpoint (unencrypted: test servers only)",
    ),
    ConfigKeySpec(
        "s3.timeout_s",
        default="5",
        value_type=float,
        description="seconds to wait for a connection, and for data on one; an unreachable "
        "store fails after about s3.timeout_s x s3.max_attempts",
    ),
    ConfigKeySpec(
        "s3.max_attempts",
        default="3",
        value_type=int,
        description="attempts per S3 request before the error surfaces (1: no retries)",
    ),
)

"""The ``s3.*`` keys :func:`storage_location` reads for an ``s3://`` path: endpoint, region,
credentials (secret), plain HTTP, timeout and attempts."""

# The s3.* keys a user gives (those with defaults are always there once validated).
_S3_KEY_NAMES = tuple(spec.name for spec in S3_KEYS if spec.default is None)
_LOCAL_SCHEMES = ("", "file")


@dataclass(frozen=True, slots=True)
class StorageLocation:
    """A directory in a pyarrow filesystem.

    :param filesystem: where the files are (``LocalFileSystem`` for local paths).
    :param root: the directory's path in ``filesystem`` (``bucket/prefix`` for S3).
    :param shown: how messages name the directory: the local path, or the URI without
        credentials or query.
    :param remote: whether ``filesystem`` is an object store, where a prefix with no objects
        under it is an empty directory, not a missing one.
    """

    filesystem: pafs.FileSystem
    root: str
    shown: str
    remote: bool

    def path(self, name: str = "") -> str:
        """The path in the filesystem of ``name``, relative to the directory."""
        return f"{self.root.rstrip('/')}/{name}" if name else self.root

    def show(self, name: str = "") -> str:
        """How messages name ``name`` (relative to the directory), without credentials."""
        return f"{self.shown.rstrip('/')}/{name}" if name else self.shown


def storage_location(label: str, config: ConnectorConfig, key: str = "path") -> StorageLocation:
    """The location the validated ``config``'s ``key`` (and ``s3.*`` keys) name.

    Nothing is contacted yet.

    :param label: the connector, for messages.
    :param key: the configuration key holding the path or URI.

    :raises ConfigurationError: naming the key for an empty path, credentials or a query in
        the URI, ``s3.*`` keys with a path that is not ``s3://``, or a scheme pyarrow does not
        know.
    """
    text = config.require(key)
    scheme, separator, rest = text.partition("://")
    scheme = scheme.lower() if separator else ""
    if scheme in _LOCAL_SCHEMES:
        given = [name for name in _S3_KEY_NAMES if config.get(name) is not None]
        if given:
            raise ConfigurationError(
                f"{label}: config key(s) {', '.join(given)} apply to s3:// paths only, and "
                f"{key!r} is a local directory; remove them or point {key!r} at the bucket",
                key=given[0],
            )
        directory = rest if separator else text
        if not directory.strip():
            raise ConfigurationError(
                f"{label}: config key {key!r} is empty; give the directory of the files",
                key=key,
            )
        root = str(Path(directory).expanduser().absolute())
        return StorageLocation(pafs.LocalFileSystem(), root, root, remote=False)
    parts = urllib.parse.urlsplit(text)
    # Only the scheme is shown until the URI is known to carry no credentials.
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            f"{label}: config key {key!r} carries credentials in its URI ({scheme}://...@...); "
            f"remove them from {key!r} and give them with s3.access_key and s3.secret_key (or "
            "the AWS credential chain)",
            key=key,
        )
    shown = f"{scheme}://{parts.netloc}{parts.path}".rstrip("/")
    if not parts.netloc:
        raise ConfigurationError(
            f"{label}: config key {key!r} ({shown}) names no bucket; write {scheme}://bucket/prefix",
            key=key,
        )
    if scheme == "s3":
        if parts.query or parts.fragment:
            raise ConfigurationError(
                f"{label}: config key {key!r} has a query or fragment ({shown}?...); give S3 "
                "options with the s3.* keys instead",
                key=key,
            )
        root = f"{parts.netloc}{parts.path}".rstrip("/")
        return StorageLocation(_s3_filesystem(label, config), root, shown, remote=True)
    given = [name for name in _S3_KEY_NAMES if config.get(name) is not None]
    if given:
        raise ConfigurationError(
            f"{label}: config key(s) {', '.join(given)} apply to s3:// paths only, and {key!r} "
            f"is {scheme}://...; configure that filesystem through its URI or environment",
            key=given[0],
        )
    try:
        filesystem, root = pafs.FileSystem.from_uri(text)
    except (pa.ArrowException, ValueError) as error:
        raise ConfigurationError(
            f"{label}: config key {key!r} is a {scheme}:// URI, which pyarrow's filesystems "
            f"cannot open ({type(error).__name__}); use a local path, s3://bucket/prefix, or a "
            "URI pyarrow.fs.FileSystem.from_uri accepts",
            key=key,
        ) from None  # the cause may quote the URI, query and all
    return StorageLocation(filesystem, root.rstrip("/"), shown, remote=True)


def _s3_filesystem(label: str, config: ConnectorConfig) -> pafs.S3FileSystem:
    access_key = config.get("s3.access_key")
    secret_key = config.get("s3.secret_key")
    if (access_key is None) != (secret_key is None):
        missing = "s3.secret_key" if secret_key is None else "s3.access_key"
        raise ConfigurationError(
            f"{label}: config keys s3.access_key and s3.secret_key go together, and "
            f"{missing} is missing; give both, or neither to use the AWS credential chain",
            key=missing,
        )
    timeout = config.get_parsed("s3.timeout_s", float, 5.0)
    if not timeout > 0:
        raise ConfigurationError(
            f"{label}: config key 's3.timeout_s' must be > 0, got {timeout}", key="s3.timeout_s"
        )
    attempts = config.get_parsed("s3.max_attempts", int, 3)
    if attempts < 1:
        raise ConfigurationError(
            f"{label}: config key 's3.max_attempts' must be >= 1, got {attempts}",
            key="s3.max_attempts",
        )
    endpoint = config.get("s3.endpoint")
    scheme = "https"
    if endpoint is not None:
        endpoint_scheme, separator, address = endpoint.partition("://")
        if separator:
            scheme, endpoint = endpoint_scheme.lower(), address
        if scheme not in ("http", "https") or not endpoint:
            raise ConfigurationError(
                f"{label}: config key 's3.endpoint' must be an http(s) URL such as "
                f"https://host:port, got {config.get('s3.endpoint')!r}",
                key="s3.endpoint",
            )
        if scheme == "http" and not config.get_parsed("s3.allow_http", bool, False):
            raise ConfigurationError(
                f"{label}: config key 's3.endpoint' is http:// (unencrypted); set "
                "s3.allow_http=true to allow it (test servers only), or use https://",
                key="s3.endpoint",
            )
    return pafs.S3FileSystem(
        access_key=access_key,
        secret_key=secret_key,
        session_token=config.get("s3.session_token"),
        region=config.get("s3.region"),
        endpoint_override=endpoint,
        scheme=scheme,
        connect_timeout=timeout,
        request_timeout=timeout,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    )
