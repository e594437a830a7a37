"""What the worker's Faust app is told: its settings and broker credentials, from ``Settings``."""

from __future__ import annotations

from typing import Any

from .settings import Settings

__all__ = ["broker_credentials", "faust_settings"]


def broker_credentials(settings: Settings) -> Any:
    """Faust's ``broker_credentials``: SSLCredentials, SASLCredentials or None (PLAINTEXT).

    The SSL context is built here: ``faust.SSLCredentials()`` without a context cannot build
    one itself in faust-streaming 0.15 (it passes ``purpose=None`` to
    ``ssl.create_default_context``).
    """
    import faust

    if settings.sasl:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            ssl_context=settings.ssl_context(),
            mechanism=settings.sasl_mechanism,
        )
    if settings.tls:
        return faust.SSLCredentials(settings.ssl_context())
    return None


def faust_settings(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for the Faust app."""
    return dict(
        broker=settings.broker_url,
        broker_credentials=broker_credentials(settings),
        store="rocksdb://",  # faust-streaming 0.15.3 has no "rocksdict://" scheme: see the table options
        datadir=str(settings.data_dir),
        autodiscover=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        topic_disable_leader=True,
        table_standby_replicas=settings.standby_replicas,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_commit_interval=settings.commit_interval_s,
        broker_max_poll_records=settings.max_batch,
        consumer_max_fetch_size=4 * 1024 * 1024,
        producer_acks=-1,
        producer_linger=0.0,  # latency: verdict and changelog batches are built explicitly anyway
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=4 * 1024 * 1024,
        # Static membership: a restarted worker rejoins as itself, without a rebalance.
        consumer_group_instance_id=settings.group_instance_id,
        web_enabled=True,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        canonical_url=settings.web_url,
    )
