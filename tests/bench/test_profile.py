"""``python -m bench.profile`` puts each py-spy sample in one part of the worker (no broker needed).
The stacks below are written by hand in py-spy's raw format, outermost frame first."""

from pathlib import Path

from bench.profile import breakdown, main, part_of, read_stacks

LOOP = "<module> (streams/app/worker.py:40);BaseEventLoop._run_once (asyncio/base_events.py:1906)"
PROCESS = (
    LOOP + ";Checkpointer._handle (streams/app/checkpoint.py:401);BatchProcessor.process (streams/app/processor.py:210)"
)

RAW = f"""\
{PROCESS};kafka_key_problem (streams/engine/intake.py:120) 7
{PROCESS};decode_event (schemas/events.py:300);check_event (schemas/events.py:250) 11
{PROCESS};LoopEngine.handle (streams/engine/engine.py:400) 13
{PROCESS} 3
{LOOP};EpollSelector.select (selectors.py:468) 40
_bootstrap (threading.py:995);_worker (concurrent/futures/thread.py:81);get (queue.py:171) 5
Thread._bootstrap (threading.py:1002);BaseServer.serve_forever (socketserver.py:233);_PollLikeSelector.select (selectors.py:415) 30
not a sample line
"""


def test_each_sample_goes_to_the_first_part_that_matches_any_of_its_frames(tmp_path: Path):
    raw = tmp_path / "b.raw"
    raw.write_text(RAW)
    stacks = read_stacks(raw)
    assert sum(stacks.values()) == 109  # the malformed line is skipped
    parts, idle, waiting = breakdown(stacks)
    assert parts == {
        # called from the processor, the key check is the key check, not the processor's loop
        "Kafka key check (issue 13)": 7,
        "decode events": 11,
        "engine": 13,
        "batch processor's own loop (group, clamp, bookkeeping)": 3,
    }
    # The metrics server's thread in its own select is waiting, not the event loop idle.
    assert (idle, waiting) == (40, 35)


def test_a_stack_no_rule_names_is_the_rest():
    assert (
        part_of(("main (app.py:1)", "something (lib.py:2)"))
        == "asyncio, sockets (reads), aiokafka connections, the rest"
    )


def test_the_report_gives_shares_of_busy_samples_and_the_idle_share(tmp_path: Path, capsys):
    raw = tmp_path / "b.raw"
    raw.write_text(RAW)
    assert main([str(raw), "--cpu-us", "20"]) == 0
    out = capsys.readouterr().out
    # 34 busy samples; the event loop idle in 40 of its 74: 54 %
    assert "109 samples" in out and "34 busy" in out and "40, 54 % of its samples" in out
    assert "| engine | 38.2 % | 7.6 |" in out  # 13 / 34 of the busy samples; of 20 µs


def test_an_unreadable_or_empty_file_is_a_one_line_error(tmp_path: Path, capsys):
    assert main([str(tmp_path / "missing.raw")]) == 1
    empty = tmp_path / "empty.raw"
    empty.write_text("")
    assert main([str(empty)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("bench.profile: ") for line in err)
