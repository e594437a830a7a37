"""A checkpoint writes only while the group coordinator counts the worker a member of the
generation its batches were processed in (issue 26: a worker paused past its session
timeout used to write stale states to the changelog after the new owner's)."""

from __future__ import annotations

import pytest

from streams.app.checkpoint import Checkpointer, NotAMember
from streams.app.live_runs import LiveRun, LiveRuns
from streams.app.records import BatchResult
from streams.engine import RunState


class Group:
    """The consumer group as the checkpointer sees it (``faust_adapter.ConsumerView``)."""

    def __init__(self, member: bool | None) -> None:
        self.epoch = (2, 1)
        self.member = member
        self.asked: list[int] = []
        self.session_timeout_s = 0.3
        self.rebalancing = self.stopping = False

    async def still_member(self, generation: int) -> bool | None:
        self.asked.append(generation)
        return self.member


class Processor:
    def __init__(self) -> None:
        self.runs = LiveRuns()

    def process(self, messages, read):
        for partition, key in messages:  # each message changes one run
            self.runs.touched[(partition, key)] = LiveRun(None, RunState(), offset=1)
        return BatchResult()


class Store:
    def __init__(self) -> None:
        self.writes: list = []

    def read(self, partition, key):
        return None

    async def write(self, writes, on_stored=None, step_aside=None):
        self.writes.extend(writes)
        if on_stored is not None:
            on_stored()
        return []

    def count(self, created, deleted):
        pass


def checkpointer(group: Group) -> tuple[Checkpointer, Store]:
    store = Store()
    return Checkpointer(Processor(), store, output=None, checkpoint_s=5.0, spawn=None, group=group), store


async def test_a_member_writes_and_acks():
    group = Group(member=True)
    cp, store = checkpointer(group)
    acked = []
    await cp.handle_batch([(0, b"run:a")], lambda: acked.append(1))
    await cp.checkpoint()
    assert group.asked == [2] and acked == [1] and cp.checkpoints == 1
    assert [pk for pk, _envelope in store.writes] == [(0, b"run:a")]


@pytest.mark.parametrize("member", [False, None], ids=["expelled", "no answer for a session timeout"])
async def test_a_worker_that_is_no_longer_a_member_writes_and_acks_nothing(member):
    group = Group(member=member)
    cp, store = checkpointer(group)
    acked = []
    await cp.handle_batch([(0, b"run:a")], lambda: acked.append(1))
    with pytest.raises(NotAMember):
        await cp.checkpoint()
    assert store.writes == [] and acked == [] and cp.checkpoints == 0
    assert cp.failed is not None  # no later checkpoint either: the worker stops


async def test_batches_of_a_generation_the_group_left_are_not_written():
    group = Group(member=True)
    cp, store = checkpointer(group)
    await cp.handle_batch([(0, b"run:a")], lambda: None)
    group.epoch = (3, 2)  # reassigned since: the coordinator is not even asked
    with pytest.raises(NotAMember):
        await cp.checkpoint()
    assert store.writes == [] and group.asked == []


async def test_after_a_lost_membership_a_checkpoint_returns_at_once_even_while_one_holds_the_lock():
    """A rebalance or a stop that waits for a checkpoint (``before_wait_empty``) must not wait
    behind the checkpoint that failed (or any other): nothing will ever be written again."""
    import asyncio

    group = Group(member=False)
    cp, _store = checkpointer(group)
    await cp.handle_batch([(0, b"run:a")], lambda: None)
    with pytest.raises(NotAMember):
        await cp.checkpoint()
    async with cp._checkpoint_lock:  # noqa: SLF001 - held, as by a checkpoint still on its way out
        await asyncio.wait_for(cp.checkpoint(), timeout=1.0)
