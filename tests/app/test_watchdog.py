"""The membership watchdog's decisions (``streams.app.watchdog``) on a fake clock, worked by
hand: a bound of 22 s (the fault harness's 2 x 6 s session + 10 s rebalance)."""

from __future__ import annotations

import pytest

from streams.app.settings import Settings, SettingsError
from streams.app.watchdog import EXIT_CODE, Standing, Watch, Watchdog, decide, observe

BOUND = 22.0
MEMBER = Standing(member=True, stopping=False)
REJOINING = Standing(member=False, stopping=False, why="joining")
STOPPING = Standing(member=False, stopping=True, why="NotAMember: no longer a member")


def ticks(watch: Watch, standing: Standing, start: int, end: int) -> Watch:
    """The event loop's ticks, one a second, from ``start`` to ``end`` inclusive."""
    for t in range(start, end + 1):
        watch = observe(watch, float(t), standing)
    return watch


def test_a_starting_worker_has_the_bound_to_join():
    watch = Watch.starting(0.0)
    assert decide(watch, 21.9, BOUND).kind == "ok"
    watch = ticks(watch, REJOINING, 1, 22)  # the loop runs, the group never takes it
    decision = decide(watch, 22.5, BOUND)
    assert decision.kind == "exit"
    assert "for 22 s (bound 22 s)" in decision.reason
    assert "not a member of its consumer group (joining)" in decision.reason


def test_a_member_stays_ok_and_a_rejoin_within_the_bound_is_ok():
    watch = ticks(Watch.starting(0.0), MEMBER, 1, 10)
    watch = ticks(watch, REJOINING, 11, 31)  # out of the group for 21 s of the 22
    assert decide(watch, 31.9, BOUND).kind == "ok"
    watch = observe(watch, 32.0, MEMBER)  # back in
    assert watch.last_good == 32.0
    assert decide(watch, 53.9, BOUND).kind == "ok"  # nothing new since: the loop's ticks still count


def test_a_worker_out_of_its_group_past_the_bound_exits():
    watch = ticks(ticks(Watch.starting(0.0), MEMBER, 1, 10), REJOINING, 11, 32)
    assert decide(watch, 32.0, BOUND).kind == "ok"  # last a member at 10: 22 s, not more
    assert decide(watch, 32.1, BOUND).kind == "exit"


def test_a_stop_is_unhealthy_at_once_and_a_stop_that_hangs_exits():
    watch = ticks(Watch.starting(0.0), MEMBER, 1, 10)
    watch = ticks(watch, STOPPING, 11, 12)
    decision = decide(watch, 12.0, BOUND)
    assert (decision.kind, decision.reason) == ("unhealthy", "stopping for 2 s: NotAMember: no longer a member")
    watch = ticks(watch, STOPPING, 13, 32)
    assert decide(watch, 32.0, BOUND).kind == "unhealthy"
    decision = decide(watch, 32.5, BOUND)
    assert decision.kind == "exit"
    assert "its stop has not finished (NotAMember: no longer a member)" in decision.reason


def test_a_member_that_says_it_stops_is_not_a_working_member():
    """A stop counts against the bound even while the coordinator still holds a membership."""
    watch = ticks(Watch.starting(0.0), MEMBER, 1, 10)
    watch = ticks(watch, Standing(member=True, stopping=True, why="a stop was asked for"), 11, 33)
    assert decide(watch, 33.0, BOUND).kind == "exit"


def test_a_silent_event_loop_past_the_bound_exits():
    watch = ticks(Watch.starting(0.0), MEMBER, 1, 10)  # then SIGSTOP, or a wedged loop
    assert decide(watch, 32.0, BOUND).kind == "ok"
    decision = decide(watch, 35.0, BOUND)
    assert decision.kind == "exit"
    assert "the event loop has not run for 25 s" in decision.reason


def test_a_reason_is_one_bounded_line():
    long = Standing(member=False, stopping=True, why="line one\nline two " + "x" * 1000)
    decision = decide(ticks(Watch.starting(0.0), long, 1, 30), 30.0, BOUND)
    assert "\n" not in decision.reason
    assert len(decision.reason) == 300 and decision.reason.endswith("...")


def test_leaving_exits_with_its_code_and_healthz_says_why():
    now = [0.0]
    codes: list[int] = []
    dog = Watchdog(lambda: REJOINING, BOUND, clock=lambda: now[0], exit_=codes.append, grace_s=0.0)
    dog._tick()  # noqa: SLF001 - the loop's half, without a loop
    now[0] = 23.0
    assert dog.decision().kind == "ok"  # not started: a worker built without its watchdog
    decision = decide(dog.watch, now[0], BOUND)
    assert decision.kind == "exit"
    dog.leave(decision)
    assert codes == [EXIT_CODE] and EXIT_CODE != 0
    assert dog.decision() is decision  # /healthz keeps saying why until the process is gone


def test_a_standing_that_cannot_be_read_counts_as_no_membership():
    now = [0.0]

    def broken() -> Standing:
        raise RuntimeError("consumer not started")

    dog = Watchdog(broken, BOUND, clock=lambda: now[0], exit_=lambda code: None, grace_s=0.0)
    now[0] = 5.0
    dog._tick()  # noqa: SLF001
    assert dog.watch.last_good == 0.0 and "cannot be read" in dog.watch.standing.why


def test_the_bound_defaults_to_two_sessions_and_a_rebalance():
    assert Settings.from_env({}).member_watchdog_bound_s == 2 * 60.0 + 60.0
    env = {"LOOPWATCH_SESSION_TIMEOUT_S": "6", "LOOPWATCH_REBALANCE_TIMEOUT_S": "10"}
    assert Settings.from_env(env).member_watchdog_bound_s == 22.0
    assert Settings.from_env({**env, "LOOPWATCH_MEMBER_WATCHDOG_S": "90"}).member_watchdog_bound_s == 90.0


def test_a_bound_shorter_than_the_session_is_refused_in_one_line():
    with pytest.raises(SettingsError) as exc:
        Settings.from_env({"LOOPWATCH_SESSION_TIMEOUT_S": "30", "LOOPWATCH_MEMBER_WATCHDOG_S": "10"})
    assert "LOOPWATCH_MEMBER_WATCHDOG_S=10 is shorter than LOOPWATCH_SESSION_TIMEOUT_S=30" in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(SettingsError, match="LOOPWATCH_MEMBER_WATCHDOG_S"):
        Settings.from_env({"LOOPWATCH_MEMBER_WATCHDOG_S": "soon"})
