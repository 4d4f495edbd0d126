"""Settings: frozen objects read from ``AVCC_*`` environment variables, one getter each.

The convention every settings class of the pipeline follows (``tests/unit/test_settings_convention.py``
lists them): a class named ``*Settings`` in its package's ``settings.py``, a frozen pydantic
``BaseSettings`` with an ``AVCC_*`` prefix, each field documented (the README's configuration
tables are generated from them) and no field repeated by another class; read through its one
cached getter, made by :func:`cached_settings` (``cache_clear()`` reads the environment again).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol, TypeVar
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.credentials import ApiKey, refuse_weak_secret
from app.platform.errors import ConfigurationError
from app.platform.redaction import redact_url

__all__ = ["DEV_HMAC_KEYS", "Settings", "SettingsGetter", "cached_settings", "get_settings"]

_S = TypeVar("_S", bound=BaseSettings)
_S_co = TypeVar("_S_co", bound=BaseSettings, covariant=True)


class SettingsGetter(Protocol[_S_co]):
    """The one getter of a settings class: the same object at every call."""

    def __call__(self) -> _S_co: ...

    def cache_clear(self) -> None:
        """Forget the object: the next call reads the environment again."""


def cached_settings(kind: type[_S]) -> SettingsGetter[_S]:
    """The getter of ``kind``: built from the environment on the first call, the same after."""
    return lru_cache(maxsize=1)(kind)


#: The only credential the project ships, for the dev stack alone (``avcc dev`` says so loudly).
DEV_HMAC_KEYS: dict[str, str] = {"dev": "dev-secret"}

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class Settings(BaseSettings):
    """Every knob of the pipeline. Each field maps to ``AVCC_<FIELD>`` (upper case)."""

    model_config = SettingsConfigDict(env_prefix="AVCC_", frozen=True, extra="ignore")

    kafka_url: str = Field(
        "kafka://127.0.0.1:19092",
        description="Kafka bootstrap URL(s), `kafka://host:port[;host:port]`. The default is "
        "where `avcc dev` starts the embedded Apache Kafka broker.",
    )
    kafka_security_protocol: SecurityProtocol = Field(
        "PLAINTEXT", description="Kafka security protocol, passed to every client."
    )
    kafka_sasl_mechanism: SaslMechanism | None = Field(None, description="SASL mechanism.")
    kafka_sasl_username: str | None = Field(None, description="SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password.")
    kafka_ssl_cafile: Path | None = Field(None, description="CA bundle for TLS to Kafka.")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate for mTLS.")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client key for mTLS.")
    kafka_session_timeout_ms: int = Field(
        10_000, description="Consumer session timeout; low so rebalances after a crash are quick."
    )
    kafka_group_instance_id: str | None = Field(
        None,
        description="Static consumer-group membership (KIP-345): this worker's stable identity in "
        "its group, unique among the group's replicas (a StatefulSet pod's name). A worker restarted "
        "within the session timeout gets its partitions back at once, without a rebalance; a worker "
        "stopped for good keeps them until the session timeout. Unset: dynamic membership.",
    )
    table_standby_replicas: int = Field(
        0,
        ge=0,
        description="Warm copies of each table partition that other replicas of the group keep "
        "(standbys): when the owner of a partition dies, a replica holding its copy serves it "
        "after replaying only the tail. 0 in dev; 1 in the Kubernetes manifests.",
    )
    replication_factor: int = Field(1, description="Replication factor for created topics.")
    kafka_fetch_min_bytes: int = Field(
        64 * 1024,
        ge=1,
        description="A core worker's fetch returns once this many bytes are there (or its wait is "
        "over): fewer, larger fetches cost the worker and the broker less per event.",
    )
    kafka_fetch_max_wait_ms: int = Field(
        25,
        ge=1,
        le=1500,
        description="Longest a core worker's fetch waits for data: the latency it adds per hop when "
        "traffic is light.",
    )
    batch_max_events: int = Field(
        1000,
        ge=1,
        le=10_000,
        description="Most events a core agent takes in one batch (its outputs are produced at once, "
        "its table writes made durable at once, its offsets committed once).",
    )
    batch_wait_ms: int = Field(
        10,
        ge=0,
        le=1000,
        description="How long a core agent waits for more events once its previous batch is done: "
        "the latency a batch adds per hop when traffic is light; longer batches cost less per event.",
    )
    commit_interval_ms: int = Field(
        200,
        ge=0,
        le=60_000,
        description="Least time between two offset commits of a core agent (a rebalance commits at "
        "once): a crash replays at most this much, which the event-id dedup absorbs.",
    )

    clickhouse_url: str = Field(
        "chdb://chdb",
        description="`clickhouse://host:port/db` for a server, `chdb:///path` for embedded chDB "
        "(a relative path is resolved against the data dir).",
    )
    clickhouse_cluster: str | None = Field(
        None,
        description="A ClickHouse cluster (`remote_servers` name) to run the sink's tables on: "
        "`Replicated*MergeTree` tables per shard, `Distributed` tables over them (needs a "
        "`clickhouse://` URL of any member). Unset: tables on the one server.",
    )
    data_dir: Path = Field(Path("var"), description="Local state: RocksDB tables, ledger, chDB.")
    web_host: str = Field(
        "127.0.0.1",
        description="Interface every worker's web server listens on (`0.0.0.0` for all: "
        "then set `AVCC_WEB_ADVERTISED_URL`).",
    )
    web_advertised_url: str = Field(
        "http://{host}:{port}",
        description="URL a worker announces to its peers for owner routing; `{host}` and `{port}` "
        "become `AVCC_WEB_HOST` and the worker's port. Must name a reachable address (the pod IP), "
        "never a wildcard.",
    )
    dev_allow_public_bind: bool = Field(
        False,
        description="Dev mode only: allow a non-loopback `AVCC_WEB_HOST` (the shipped dev key and "
        "`admin`/`admin` then answer from the network).",
    )
    web_port: int = Field(6066, description="Web port of the console (workers use the next ones).")
    dev_mode: bool = Field(
        False,
        description="Dev stack only: allows the shipped dev HMAC key and a broker that cannot "
        "honour the core profile (with a loud warning).",
    )
    hmac_keys: dict[str, ApiKey | SecretStr] = Field(
        default_factory=dict,
        description='API keys for the `/v1/` endpoints as JSON: `{"partner-a": "secret"}` (every scope) '
        'or `{"partner-a": {"secret": "...", "scopes": ["playback:write", "playback:read"]}}`; scopes: '
        "`apply`, `records:read`, `review:decide`, `settlement`, `playback:write`, `playback:read`. "
        "Empty outside dev mode means every signed request is refused; empty or placeholder secrets "
        "are refused at start.",
    )
    hmac_max_skew_ms: int = Field(300_000, description="Accepted clock skew of signed requests.")
    operator_users: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='Operator console logins as JSON `{"user": "password"}` (dev: admin/admin); '
        "empty or placeholder passwords are refused at start.",
    )
    nonce_store: Literal["kafka", "local"] = Field(
        "kafka",
        description="Where signed requests' nonces are recorded: `kafka` (shared by every replica "
        "through `topic.system.nonces`, so a request is accepted once in the whole deployment) or "
        "`local` (one process only; single-worker setups and tests).",
    )
    http_body_timeout_s: float = Field(
        10.0, description="Longest time a client may take to send a request body (408 after)."
    )
    avcc_org: str = Field("10005", description="Issuer (organisation) digits of AVCC codes.")
    avcc_node: str = Field("8361", description="Node digits of AVCC codes.")
    block_interval_ms: int = Field(100, description="Local ledger block interval.")
    chain_url: str = Field(
        "local://",
        description="Chain backend of the chain group: `local://` = the local hash-chain ledger "
        "(one chain worker); `ledger://host:port` = a ledger node (`avcc chain node`) shared by "
        "every chain replica; "
        "`http(s)://host:port` = an EVM JSON-RPC node (FISCO BCOS, ChainMaker, Ethereum-compatible) "
        "running the AvccRegistry contract.",
    )
    chain_node_token: SecretStr | None = Field(
        None,
        description="Bearer token of the ledger node (`avcc chain node` requires it, and chain "
        "replicas send it with `AVCC_CHAIN_URL=ledger://...`).",
    )
    chain_contract: str | None = Field(
        None,
        description="Address of the deployed AvccRegistry contract (EVM backend); "
        "`avcc chain deploy` deploys one.",
    )
    chain_key_file: Path | None = Field(
        None, description="File holding the hex private key that signs chain transactions (EVM backend)."
    )
    chain_confirmations: int = Field(
        1,
        ge=1,
        description="Blocks, the transaction's own included, before `chain.tx.confirmed` is produced "
        "(EVM backend).",
    )
    chain_tx_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A sent transaction not mined after this long is replaced (same nonce, higher "
        "gas price) (EVM backend).",
    )
    retry_backoff_s: tuple[float, ...] = Field(
        (1.0, 2.0, 4.0), description="In-process retry delays; its length is the retry count."
    )
    retry_topic_rounds: int = Field(
        1, description="Rounds through the retry topic before a message is dead-lettered."
    )
    retry_topic_delay_s: float = Field(8.0, description="Delay before a retry-topic redelivery.")
    alert_webhook_url: str | None = Field(
        None, description="Alertmanager-compatible webhook for P2 alerts (log sink always on)."
    )
    alert_dedup_window_s: float = Field(300.0, description="Same group+error alerts merge window.")
    worker_stop_s: float = Field(
        8.0,
        gt=0,
        le=120,
        description="Longest a worker takes to stop once asked (SIGTERM): past it, it exits with the "
        "status it would have stopped with (its broker gone, faust would wait 60 s). Keep it below "
        "the pod's termination grace period.",
    )
    worker_stall_s: float = Field(
        120.0,
        description="A faust worker whose assigned partitions keep lag while their committed "
        "offsets do not move, or whose table recovery reads nothing, for this long exits "
        "(status 70) to be restarted; 0 disables.",
    )
    log_level: str = Field("INFO", description="Log level of workers.")

    @field_validator("hmac_keys")
    @classmethod
    def _strong_api_secrets(cls, keys: dict[str, ApiKey | SecretStr]) -> dict[str, ApiKey | SecretStr]:
        for name, key in keys.items():
            secret = key.secret if isinstance(key, ApiKey) else key
            refuse_weak_secret(f"AVCC_HMAC_KEYS[{name!r}]", secret.get_secret_value())
        return keys

    @field_validator("operator_users")
    @classmethod
    def _strong_passwords(cls, users: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, password in users.items():
            refuse_weak_secret(f"AVCC_OPERATOR_USERS[{name!r}]", password.get_secret_value())
        return users

    @field_validator("chain_node_token")
    @classmethod
    def _strong_node_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None:
            refuse_weak_secret("AVCC_CHAIN_NODE_TOKEN", token.get_secret_value())
        return token

    @field_validator("avcc_org", "avcc_node")
    @classmethod
    def _digits(cls, value: str) -> str:
        if not value.isdigit() or len(value) > 10:
            raise ValueError("must be 1-10 digits")
        return value

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port[,host:port]`` from :attr:`kafka_url`."""
        try:
            parsed = urlparse(self.kafka_url)
        except ValueError:  # e.g. an unbalanced "[" in the host
            parsed = urlparse("")
        if parsed.scheme not in {"kafka", ""} or not parsed.netloc:
            raise ConfigurationError(
                f"AVCC_KAFKA_URL must look like kafka://host:port, got {redact_url(self.kafka_url)!r}"
            )
        if "@" in parsed.netloc:
            raise ConfigurationError(
                f"AVCC_KAFKA_URL holds credentials ({redact_url(self.kafka_url)!r}): "
                "set them in AVCC_KAFKA_SASL_USERNAME / AVCC_KAFKA_SASL_PASSWORD"
            )
        return parsed.netloc.replace(";", ",")

    def advertised_url(self, port: int) -> str:
        """The URL a worker on ``port`` announces to its peers (``ConfigurationError`` if unusable).

        Owner routing forwards a request to the URL its owner announced, so every replica must
        announce a distinct, reachable one: a wildcard host would make every replica its own owner.
        """
        url = self.web_advertised_url.format(host=self.web_host, port=port)
        host = urlparse(url).hostname or ""
        if host in _WILDCARD_HOSTS:
            raise ConfigurationError(
                f"AVCC_WEB_ADVERTISED_URL resolves to {url!r}, which peers cannot reach: set it to "
                "this worker's own address, e.g. http://$(POD_IP):{port}"
            )
        return url

    def check_bind(self) -> None:
        """Refuse a dev stack that listens beyond loopback unless explicitly allowed."""
        if self.dev_mode and not self.dev_allow_public_bind and not _is_loopback(self.web_host):
            raise ConfigurationError(
                f"dev mode refuses AVCC_WEB_HOST={self.web_host!r}: the dev key and admin/admin would be "
                "reachable from the network; set AVCC_DEV_ALLOW_PUBLIC_BIND=true to do it anyway"
            )

    def kafka_client_config(self) -> dict[str, str]:
        """Security settings in librdkafka spelling, passed through to every confluent client."""
        conf: dict[str, str] = {
            "bootstrap.servers": self.kafka_bootstrap,
            "security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username:
            conf["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password:
            conf["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_cafile:
            conf["ssl.ca.location"] = str(self.kafka_ssl_cafile)
        if self.kafka_ssl_certfile:
            conf["ssl.certificate.location"] = str(self.kafka_ssl_certfile)
        if self.kafka_ssl_keyfile:
            conf["ssl.key.location"] = str(self.kafka_ssl_keyfile)
        return conf

    def api_keys(self) -> dict[str, ApiKey]:
        """Configured API keys with their scopes; in dev mode the shipped dev key (every scope)."""
        keys = {
            name: key if isinstance(key, ApiKey) else ApiKey(secret=key)
            for name, key in self.hmac_keys.items()
        }
        if self.dev_mode:
            dev = {name: ApiKey(secret=SecretStr(secret)) for name, secret in DEV_HMAC_KEYS.items()}
            keys = {**dev, **keys}
        return keys

    def effective_hmac_keys(self) -> dict[str, str]:
        """Key id -> secret of :meth:`api_keys`."""
        return {name: key.secret.get_secret_value() for name, key in self.api_keys().items()}

    def effective_operators(self) -> dict[str, str]:
        """Operator logins; in dev mode ``admin``/``admin`` is added."""
        users = {name: secret.get_secret_value() for name, secret in self.operator_users.items()}
        if self.dev_mode:
            users = {"admin": "admin", **users}
        return users

    def resolve_data_path(self, *parts: str) -> Path:
        """A path under the data dir, created on demand."""
        path = self.data_dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path


#: Hosts that mean "every interface" when bound and "nowhere" when announced.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


#: The process-wide settings (read once from the environment).
get_settings: SettingsGetter[Settings] = cached_settings(Settings)
