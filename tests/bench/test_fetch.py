"""``python -m bench.fetch`` drains the same fetch response both ways, every record, and says
so; bad arguments get one line."""

from bench import fetch


def test_it_drains_every_record_both_ways_and_prints_a_median_each(capsys):
    assert fetch.main(["--records", "1234", "--max-records", "500", "--passes", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["aiokafka", "bulk"]
    assert all("median" in line and "µs CPU/record" in line for line in lines)


def test_the_response_holds_the_records_asked_for():
    # Read by aiokafka itself, untouched by the adapter.
    from aiokafka.consumer.fetcher import PartitionRecords
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    records = PartitionRecords(
        TopicPartition(fetch.TOPIC, 0), MemoryRecords(fetch.response(1234, 10)), [], 0, None, None, True, 0
    )
    assert [(r.offset, len(r.value)) for r in records] == [(i, 10) for i in range(1234)]


def test_a_bad_argument_is_one_line(capsys):
    assert fetch.main(["--records", "0"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
