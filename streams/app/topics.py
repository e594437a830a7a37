"""The worker's topics: ``tool-calls`` (consumed), ``loop-verdicts`` and the dead-letter
topic (produced), those of the fleet-wide options (``loop-incidents``, the worker's
repartition and ring topics), made sure of before the worker starts (``ensure_topics``); the
shadow topic when shadow mode or a candidate config needs it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from streams.edge.broker import BrokerAccessError, broker_access

from .output import DLQ_MAX_MESSAGE_BYTES
from .settings import Settings

__all__ = ["ensure_topics"]

log = logging.getLogger("loopwatch.worker")


async def ensure_topics(
    settings: Settings,
    extra: dict[str, dict[str, str]] | None = None,
    timeout: float = 30.0,
    *,
    shadow: bool = False,
    only_shadow: bool = False,
) -> list[str]:
    """Create ``tool-calls``, ``loop-verdicts`` and the dead-letter topic when missing, and the
    topics of loopwatch's own options (``extra``: name -> topic configs; ``Worker.extra_topics``);
    with ``shadow`` also the shadow topic (``only_shadow``: that one alone), which is never
    fatal: a worker that may not create it runs, and loses its shadow verdicts (counted) until
    it exists.

    Faust declares them too, but only just before it subscribes, and the consumer's metadata
    may not show a brand-new topic yet: the first assignment then misses ``tool-calls``
    ("Ignoring missing topic") until a second rebalance.  Creating them before the worker
    starts, then waiting until the broker describes each with a leader for every partition
    (at most ``timeout``; a warning after it), avoids that.  Returns the topics created.

    This is also the worker's first connection, so it fails the start (``BrokerAccessError``,
    one line) when the broker refuses the credentials or its certificate is not trusted, or
    when a topic is missing and the worker may not create it, or when no broker answers
    (Faust's producer would stop the start a moment later anyway, with a traceback; the
    orchestrator restarts the worker).  Other errors are logged, not raised (Faust declares
    the topics again).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError

    wanted = (
        {}
        if only_shadow
        else {
            settings.tool_calls_topic: {},
            settings.verdicts_topic: {},
            settings.dead_letter_topic: {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)},
            **(extra or {}),
        }
    )
    if shadow or only_shadow:
        wanted[settings.shadow_verdicts_topic] = {}
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.broker_hosts,
        request_timeout_ms=int(timeout * 1000),
        **settings.kafka_client_options(),
    )
    created: list[str] = []
    refused: set[str] = set()  # not created here (Faust declares them, or the shadow topic is lost)
    try:
        async with broker_access(
            settings.broker_hosts,
            username=settings.sasl_username,
            mechanism=settings.sasl_mechanism,
            unreachable=True,
            tls=settings.tls,
        ):
            await asyncio.wait_for(admin.start(), timeout)
        existing = set(await admin.list_topics())  # those this principal may describe
        missing = [name for name in wanted if name not in existing]
        for name in missing:
            response = await admin.create_topics(
                [NewTopic(name, settings.partitions, settings.replication, topic_configs=wanted[name])]
            )
            for entry in response.topic_errors:  # (topic, error_code[, error_message])
                code, message = entry[1], entry[2] if len(entry) > 2 else ""
                if code == TopicAuthorizationFailedError.errno and name == settings.shadow_verdicts_topic:
                    log.warning(
                        "topic %s does not exist and this worker may not create it: shadow verdicts are "
                        "lost until it exists (docs/configuration.md, Changing thresholds safely)",
                        name,
                    )
                    refused.add(name)
                    continue
                if code == TopicAuthorizationFailedError.errno:
                    who = f"user {settings.sasl_username!r}" if settings.sasl_username else "this worker"
                    raise BrokerAccessError(
                        f"topic {name} does not exist (or may not be described) and {who} may not create it:"
                        " create it first and grant the ACLs (docs/security.md)"
                    )
                if code == 0:
                    created.append(name)
                elif code != TopicAlreadyExistsError.errno:
                    refused.add(name)
                    log.warning("could not create topic %s (error %d: %s); Faust will declare it", name, code, message)
        if created:
            log.info("created topics %s (%d partitions)", ", ".join(created), settings.partitions)
        await wait_until_described(admin, [name for name in wanted if name not in refused], timeout)
    except BrokerAccessError:
        raise
    except Exception as exc:  # noqa: BLE001 - Faust declares them again
        log.warning("could not check/create topics before start (%r); Faust will declare them", exc)
    finally:
        try:
            await admin.close()
        except Exception:  # noqa: BLE001
            pass
    return created


async def wait_until_described(admin: Any, topics: list[str], timeout: float, poll_s: float = 0.1) -> list[str]:
    """Wait until a broker describes every topic of ``topics`` with a leader for each of its
    partitions, or ``timeout`` has passed (a warning then).  Returns the topics not described.

    A topic is in a broker's metadata a moment after its creation: on a busy machine a worker
    that started at once was told a second later that one did not exist, and its consumer
    kept that answer (``faust_adapter.AskAgainForMissingTopics`` now asks again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        described = {entry["topic"]: entry for entry in await admin.describe_topics(topics)}
        missing = [name for name in topics if not _has_leaders(described.get(name))]
        if not missing or loop.time() >= deadline:
            break
        await asyncio.sleep(poll_s)
    if missing:
        log.warning(
            "the broker does not describe topics %s %.0f s after they were made sure of; the worker starts anyway",
            ", ".join(missing),
            timeout,
        )
    return missing


def _has_leaders(entry: dict[str, Any] | None) -> bool:
    """A topic described without an error, with a leader for each of its partitions."""
    if entry is None or entry["error_code"] != 0 or not entry["partitions"]:
        return False
    return all(partition["leader"] >= 0 for partition in entry["partitions"])
