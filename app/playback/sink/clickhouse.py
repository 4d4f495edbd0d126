"""ClickHouse backends: a real server through clickhouse-driver, or embedded chDB, behind one Protocol.

``connect(settings.clickhouse_url, settings.data_dir)`` picks the backend from the URL:

* ``clickhouse://[user[:password]@]host[:port][/database]`` - a server over the native protocol
  (port 9000 by default; the database is created on first connect). Works with Debian's 18.16.
* ``chdb:///abs/path`` or ``chdb://relative/path`` (resolved under the data dir) - in-process
  chDB; one process per path.

Every backend takes SQL with ClickHouse-style ``{name:Type}`` placeholders in :meth:`query`
(server-side parameters on chDB; safely quoted client-side by clickhouse-driver, since 18.16
has no server-side parameters). Unreachable servers surface as
:class:`~app.platform.errors.DependencyUnavailable` (or :class:`~app.platform.errors.DependencyTimeout`).
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlparse

import orjson

from app.platform.errors import ConfigurationError, DependencyTimeout, DependencyUnavailable
from app.platform.redaction import redact_url

__all__ = [
    "ChdbBackend",
    "ClickHouseBackend",
    "DriverBackend",
    "connect",
    "quote_cluster",
    "quote_identifier",
]

log = logging.getLogger(__name__)

_DEFAULT_PORT = 9000
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):[^{}]+\}")

#: Server error codes that mean "try again later" (overload, memory, too many parts, readonly
#: replica, timeouts...). Any other server error is a bug in the SQL or the data.
_TRANSIENT_SERVER_CODES = frozenset(
    {
        159,  # TIMEOUT_EXCEEDED
        164,  # READONLY
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        203,  # NO_FREE_CONNECTION
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        236,  # ABORTED
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        252,  # TOO_MANY_PARTS
        319,  # UNKNOWN_STATUS_OF_INSERT
        425,  # SYSTEM_ERROR
    }
)


def quote_cluster(name: str) -> str:
    """``name`` if it can name a cluster in DDL; ``ConfigurationError`` otherwise."""
    if _IDENTIFIER.fullmatch(name) is None:
        raise ConfigurationError(f"AVCC_CLICKHOUSE_CLUSTER must be a plain identifier, got {name!r}")
    return name


def quote_identifier(name: str) -> str:
    """``name`` if it is a plain identifier (tables, columns, databases); ``ValueError`` otherwise."""
    if _IDENTIFIER.fullmatch(name) is None:
        raise ValueError(f"not a plain ClickHouse identifier: {name!r}")
    return name


@runtime_checkable
class ClickHouseBackend(Protocol):
    """What the playback store needs from ClickHouse. Implementations are thread-safe."""

    #: Where the backend points, without credentials (for logs).
    description: str
    #: The cluster the tables live on (``Distributed`` over replicated shards), ``None``: one server.
    cluster: str | None

    @property
    def supports_dedup_token(self) -> bool:
        """Whether inserts accept ``insert_deduplication_token`` (ClickHouse >= 22.2; not 18.16)."""
        ...

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        """Run one statement (DDL or a SELECT without parameters); returns its rows."""
        ...

    def insert_columns(
        self,
        table: str,
        column_names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        dedup_token: str | None = None,
    ) -> None:
        """Insert one block given column by column; returns once the server acknowledged it.

        ``dedup_token`` is passed as ``insert_deduplication_token`` where supported (an identical
        retry of an insert whose acknowledgement was lost is then dropped by the server).
        """
        ...

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a SELECT with ``{name:Type}`` placeholders bound from ``params``."""
        ...

    def close(self) -> None:
        """Release connections (idempotent)."""
        ...


# --- clickhouse-driver -------------------------------------------------------------------------


class DriverBackend:
    """A ClickHouse server over the native protocol (clickhouse-driver ``Client``).

    The client reconnects by itself on the next call after a failure; a lock serialises callers
    (one TCP connection). The server version and its capabilities are read once per process.
    """

    def __init__(
        self,
        host: str,
        port: int = _DEFAULT_PORT,
        database: str = "default",
        user: str = "default",
        password: str = "",
        *,
        connect_timeout: float = 3.0,
        send_receive_timeout: float = 60.0,
        secure: bool = False,
        cluster: str | None = None,
    ) -> None:
        from clickhouse_driver import Client

        self.database = quote_identifier(database)
        self.description = f"clickhouse://{host}:{port}/{database}" + (
            f" (cluster {cluster})" if cluster else ""
        )
        self.cluster = cluster
        self._lock = threading.Lock()
        options: dict[str, Any] = {
            "port": port,
            "user": user,
            "password": password,
            "connect_timeout": connect_timeout,
            "send_receive_timeout": send_receive_timeout,
            "sync_request_timeout": connect_timeout,
            "secure": secure,
            "client_name": "avcc",
        }
        self._bootstrap = Client(host, database="default", **options)
        self._client = Client(host, database=database, **options)
        self._dedup_token: bool | None = None
        self._database_ready = False

    # The whole connection setup runs under the lock, once per process (and again after a
    # failed first attempt).
    def _ready(self) -> None:
        if self._database_ready:
            return
        if self.database != "default":
            self._bootstrap.execute(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            self._bootstrap.disconnect()
        rows = self._client.execute(
            "SELECT version(), "
            "(SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token')"
        )
        version_text, has_token = rows[0]
        self._dedup_token = bool(has_token)
        self._database_ready = True
        log.info(
            "ClickHouse %s at %s (insert_deduplication_token: %s)",
            version_text,
            self.description,
            "yes" if has_token else "no",
        )

    @property
    def supports_dedup_token(self) -> bool:
        """Known after the first successful call (``False`` until then)."""
        return bool(self._dedup_token)

    def _call(self, action: Any) -> Any:
        from clickhouse_driver import errors as ch_errors

        try:
            self._ready()
            return action()
        except ch_errors.SocketTimeoutError as exc:
            self._client.disconnect()
            raise DependencyTimeout(f"ClickHouse at {self.description} timed out: {exc}") from exc
        except (ch_errors.NetworkError, EOFError, OSError) as exc:
            self._client.disconnect()
            raise DependencyUnavailable(f"ClickHouse at {self.description} is unreachable: {exc}") from exc
        except ch_errors.ServerException as exc:
            if exc.code in _TRANSIENT_SERVER_CODES:
                raise DependencyUnavailable(
                    f"ClickHouse at {self.description} refused temporarily (code {exc.code}): "
                    f"{str(exc.message).splitlines()[0] if exc.message else exc}"
                ) from exc
            raise

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._call(lambda: self._client.execute(sql)))

    def insert_columns(
        self,
        table: str,
        column_names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        dedup_token: str | None = None,
    ) -> None:
        names = ", ".join(quote_identifier(name) for name in column_names)
        sql = f"INSERT INTO {quote_identifier(table)} ({names}) VALUES"
        # clickhouse-driver slices every column into insert blocks (copies) before converting
        # values in place, so the caller's lists are left untouched.
        data = columns
        with self._lock:

            def insert() -> None:
                settings: dict[str, Any] = {}
                if self.cluster is not None:
                    # acknowledged only once every shard has its part: a failed insert is retried
                    # whole, and each shard's replicas drop the sub-block they already hold
                    settings["insert_distributed_sync"] = 1
                if dedup_token is not None and self._dedup_token:
                    settings["insert_deduplication_token"] = dedup_token
                self._client.execute(sql, data, columnar=True, settings=settings or None)

            self._call(insert)

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        # 18.16 has no server-side parameters: let the driver quote the values client-side.
        text = _PLACEHOLDER.sub(lambda m: f"%({m.group(1)})s", sql.replace("%", "%%"))
        with self._lock:
            return list(self._call(lambda: self._client.execute(text, dict(params or {}))))

    def close(self) -> None:
        with self._lock:
            self._client.disconnect()
            self._bootstrap.disconnect()


# --- chDB --------------------------------------------------------------------------------------


class ChdbBackend:
    """Embedded ClickHouse (chDB) storing its data under ``path``; one process per path.

    Inserts hand chDB an Arrow table (``INSERT ... SELECT * FROM Python(table)``: no text to
    format or parse, measured ~2x cheaper than ``JSONCompactColumns`` for the sink's 50k-row
    blocks); columns Arrow cannot type (all ``None``, integers beyond 64 bits), or a chDB build
    without the ``Python`` table function, fall back to one ``JSONCompactColumns`` document.
    Results come back as ``JSONCompact``.
    """

    cluster: str | None = None

    def __init__(self, path: Path) -> None:
        from chdb import session

        self.path = path
        self.description = f"chdb://{path}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            open_session: Any = session.Session  # untyped in chdb
            self._session: Any = open_session(str(path))
        except Exception as exc:  # chDB raises plain RuntimeError for a locked/unusable path
            if "already initialized" in str(exc):
                raise ConfigurationError(
                    f"chDB at {path}: this process already has another chDB path open "
                    f"(chDB serves one data path per process): {exc}"
                ) from exc
            raise DependencyUnavailable(f"chDB at {path} cannot be opened: {exc}") from exc
        # Exact types in JSONCompact: 64-bit integers as numbers, decimals as strings.
        self._run("SET output_format_json_quote_64bit_integers = 0", None)
        self._run("SET output_format_json_quote_decimals = 1", None)
        rows = self._run(
            "SELECT version(), "
            "(SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token'), "
            "(SELECT count() FROM system.settings WHERE name = 'optimize_on_insert')",
            None,
        )
        _, has_token, has_optimize = rows[0]
        self._dedup_token = bool(int(has_token))
        # Inserts skip the in-block replacing merge (``optimize_on_insert``, ~40% of chDB's insert
        # CPU): blocks are deduplicated by the caller, every query deduplicates by id and
        # background merges still collapse duplicates.
        self._insert_settings = ["optimize_on_insert = 0"] if int(has_optimize) else []
        self._arrow = self._probe_arrow()

    def _probe_arrow(self) -> bool:
        """Whether this chDB reads Arrow tables through the ``Python`` table function."""
        try:
            avcc_arrow_probe = _pyarrow().table({"x": [1]})  # noqa: F841 - read by chDB by name
            with self._lock:
                result = self._session.query("SELECT sum(x) FROM Python(avcc_arrow_probe)", "CSV")
            return bool(result is not None and result.bytes().strip() == b"1")
        except Exception as exc:
            log.info("chDB inserts go through JSON (no Arrow input: %s)", exc)
            return False

    @property
    def supports_dedup_token(self) -> bool:
        return self._dedup_token

    def _run(self, sql: str, params: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._session is None:
                raise DependencyUnavailable(f"chDB at {self.path} is closed")
            try:
                result = self._session.query(
                    sql,
                    "JSONCompact",
                    params=dict(params) if params else None,
                )
            except Exception as exc:
                raise _chdb_error(exc, self.path) from exc
        raw = result.bytes() if result is not None else b""
        if not raw.strip():
            return []
        document = orjson.loads(raw)
        return [tuple(row) for row in document.get("data", ())]

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        return self._run(sql, None)

    def insert_columns(
        self,
        table: str,
        column_names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        dedup_token: str | None = None,
    ) -> None:
        names = ", ".join(quote_identifier(name) for name in column_names)
        options = list(self._insert_settings)
        if dedup_token is not None and self._dedup_token:
            token = dedup_token.replace("\\", "\\\\").replace("'", "\\'")
            options.append(f"insert_deduplication_token = '{token}'")
        settings = f" SETTINGS {', '.join(options)}" if options else ""
        avcc_insert_block = _arrow_table(column_names, columns) if self._arrow else None
        if avcc_insert_block is not None:
            # chDB finds the table by its variable name in this frame.
            sql = (
                f"INSERT INTO {quote_identifier(table)} ({names}){settings} "
                "SELECT * FROM Python(avcc_insert_block)"
            )
            with self._lock:
                if self._session is None:
                    raise DependencyUnavailable(f"chDB at {self.path} is closed")
                try:
                    self._session.query(sql, "CSV")
                except Exception as exc:
                    raise _chdb_error(exc, self.path) from exc
            return
        body = orjson.dumps(list(columns)).decode()
        sql = f"INSERT INTO {quote_identifier(table)} ({names}){settings} FORMAT JSONCompactColumns\n{body}"
        with self._lock:
            if self._session is None:
                raise DependencyUnavailable(f"chDB at {self.path} is closed")
            try:
                self._session.query(sql, "CSV")
            except Exception as exc:
                raise _chdb_error(exc, self.path) from exc

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params)

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None


def _pyarrow() -> Any:
    """``pyarrow`` (installed with chDB; imported on first use, untyped)."""
    return importlib.import_module("pyarrow")


def _arrow_table(column_names: Sequence[str], columns: Sequence[Sequence[Any]]) -> Any:
    """The columns as a ``pyarrow.Table``, or ``None`` if one cannot be typed.

    A column of strings or integers (judged by its first value) is converted with that type
    given (~30% cheaper than inferring it); any other, or one that refuses it, is inferred.
    """
    pyarrow = _pyarrow()
    hints = {str: pyarrow.string(), int: pyarrow.int64()}
    arrays = []
    for column in columns:
        hint = hints.get(type(column[0])) if len(column) else None
        try:
            array = pyarrow.array(column, type=hint) if hint is not None else pyarrow.array(column)
        except (pyarrow.ArrowException, OverflowError, TypeError, ValueError):
            try:
                array = pyarrow.array(column) if hint is not None else None
            except (pyarrow.ArrowException, OverflowError, TypeError, ValueError):
                array = None
        if array is None:
            return None
        if pyarrow.types.is_null(array.type):
            return None  # all None (or empty): let the server's JSON parser type it
        arrays.append(array)
    return pyarrow.Table.from_arrays(arrays, names=list(column_names))


def _chdb_error(exc: Exception, path: Path) -> Exception:
    text = str(exc)
    if "MEMORY_LIMIT_EXCEEDED" in text or "TOO_MANY_PARTS" in text or "Cannot lock" in text:
        return DependencyUnavailable(f"chDB at {path} refused temporarily: {text.splitlines()[0]}")
    return exc


# --- URL ---------------------------------------------------------------------------------------


def connect(url: str, data_dir: Path, cluster: str | None = None) -> ClickHouseBackend:
    """The backend ``url`` names (see the module docstring); ``ConfigurationError`` on a bad URL.

    ``cluster`` names the server's cluster the tables live on (``AVCC_CLICKHOUSE_CLUSTER``).

    A server is contacted lazily (first call); chDB opens its path at once. Either raises
    ``DependencyUnavailable`` when the store cannot be reached.
    """
    parsed = urlparse(url)
    if parsed.scheme == "clickhouse":
        if not parsed.hostname:
            raise ConfigurationError(f"AVCC_CLICKHOUSE_URL needs a host: {redact_url(url)!r}")
        database = parsed.path.strip("/") or "default"
        if _IDENTIFIER.fullmatch(database) is None:
            raise ConfigurationError(f"AVCC_CLICKHOUSE_URL database must be an identifier: {database!r}")
        options = parse_qs(parsed.query)
        secure = options.get("secure", ["0"])[0].lower() in {"1", "true", "yes"}
        try:
            port = parsed.port or _DEFAULT_PORT
        except ValueError as exc:
            raise ConfigurationError(f"AVCC_CLICKHOUSE_URL has a bad port: {redact_url(url)!r}") from exc
        return DriverBackend(
            parsed.hostname,
            port,
            database,
            unquote(parsed.username) if parsed.username else "default",
            unquote(parsed.password) if parsed.password else "",
            secure=secure,
            cluster=quote_cluster(cluster) if cluster else None,
        )
    if cluster:
        raise ConfigurationError("AVCC_CLICKHOUSE_CLUSTER needs a clickhouse:// server URL, not chDB")
    if parsed.scheme == "chdb":
        # chdb:///abs/path -> netloc "" + "/abs/path"; chdb://rel/path -> netloc "rel" + "/path".
        raw = unquote(parsed.netloc + parsed.path) if parsed.netloc else unquote(parsed.path)
        path = Path(raw) if raw.startswith("/") else Path(data_dir) / (raw or "chdb")
        return ChdbBackend(path.resolve())
    raise ConfigurationError(
        f"AVCC_CLICKHOUSE_URL must be clickhouse://host:port/db or chdb:///path, got {redact_url(url)!r}"
    )
