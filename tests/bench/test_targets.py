"""``make bench`` judges issue 3's targets from what it measured (no broker needed)."""

from bench.kafka import target_verdicts


def test_each_target_is_judged_against_its_threshold():
    results = {
        "raw": 40_000.0,
        "worker": {"rate": 21_000.0},
        "latency": {"rate": 2_000.0, "offered": 1_998.0, "p99": 21.7},
        "floor": {"p99": 18.6},
    }
    assert target_verdicts(results) == [
        "(b) >= 20,000 events/s per worker: 21,000, met",
        "(b)/(a) >= 0.5: 0.53, met",
        "(c) p99 < 20 ms at 2,000 events/s: 21.7 ms, NOT MET (the raw responder (c'): 18.6 ms)",
    ]


def test_misses_and_boundaries():
    results = {"raw": 40_000.0, "worker": {"rate": 19_999.0}, "latency": {"rate": 2_000.0, "offered": 1_700.0, "p99": 20.0}}
    assert target_verdicts(results) == [
        "(b) >= 20,000 events/s per worker: 19,999, NOT MET",
        "(b)/(a) >= 0.5: 0.50, NOT MET",  # 0.499975: shown rounded, judged exactly
        "(c) p99 < 20 ms at 2,000 events/s: 20.0 ms, NOT MET",  # a generator that fell behind is still judged
    ]


def test_only_what_was_measured_is_judged():
    assert target_verdicts({}) == []
    assert target_verdicts({"worker": {"rate": 25_000.0}}) == ["(b) >= 20,000 events/s per worker: 25,000, met"]
    # The latency target is set at 2,000 events/s: another --rate is not judged against it.
    assert target_verdicts({"latency": {"rate": 500.0, "offered": 500.0, "p99": 5.0}}) == []


def test_several_rounds_are_judged_on_their_median_p99():
    from bench.kafka import median_round

    rounds = [
        {"rate": 2_000.0, "p50": 7.0, "p99": 30.4, "p999": 60.0},
        {"rate": 2_000.0, "p50": 9.0, "p99": 18.1, "p999": 31.0},
        {"rate": 2_000.0, "p50": 8.0, "p99": 19.9, "p999": 40.0},
    ]
    latency = median_round(rounds)
    assert latency == {"p50": 8.0, "p99": 19.9, "p999": 40.0, "rate": 2_000.0, "rounds": 3}
    floor = median_round([{"rate": 2_000.0, "p50": 6.0, "p99": p99, "p999": 30.0} for p99 in (15.0, 21.0)])
    assert floor["p99"] == 18.0  # an even number of rounds: the mean of the middle two
    assert target_verdicts({"latency": latency, "floor": floor}) == [
        "(c) p99 < 20 ms at 2,000 events/s: 19.9 ms (median of 3 rounds), met (the raw responder (c'): 18.0 ms)",
    ]


def test_loopwatch_is_judged_ahead_of_each_peer_only_when_faster():
    results = {
        "worker": {"rate": 25_000.0},
        "peers": {"quix": {"rate": 10_000.0}, "faust": {"rate": 25_000.0}},
    }
    assert target_verdicts(results) == [
        "(b) >= 20,000 events/s per worker: 25,000, met",
        "loopwatch ahead of Quix Streams: met (2.50×)",
        "loopwatch ahead of Faust: NOT MET (1.00×)",  # a tie is not ahead
    ]
    # Without (b) there is nothing to compare the peers with.
    assert target_verdicts({"peers": {"quix": {"rate": 10_000.0}}}) == []


def test_the_options_ratio_is_judged_against_0_7():
    assert target_verdicts({"options_ratio": 0.74}) == ["(e) all four options >= 0.7 of the default config: 0.74, met"]
    assert target_verdicts({"options_ratio": 0.69}) == ["(e) all four options >= 0.7 of the default config: 0.69, NOT MET"]
    assert target_verdicts({"options_ratio": 0.8, "options_run_keyed_ratio": 0.6}) == [
        "(e) all four options >= 0.7 of the default config: 0.80, met",
        "(e) the same, runners keying by run (the repartition hop): 0.60, NOT MET"]


def test_the_options_workload_puts_its_sends_in_traces():
    from bench.kafka import fleet, with_traces

    events = with_traces(fleet(4_000, 200, seed=3, start_ms=0))
    sends = [e for e in events if getattr(e, "tool_name", None) == "message"]
    assert sends and all(e.trace_id.startswith("trace-") and e.target == "slack:#ops" for e in sends)
    assert all(not getattr(e, "trace_id", None) for e in events if getattr(e, "tool_name", None) != "message")
def test_a_candidate_config_is_judged_on_the_median_of_its_pairs():
    pairs = [({"rate": 20_000.0}, {"rate": 11_000.0}), ({"rate": 22_000.0}, {"rate": 10_000.0}),
             ({"rate": 18_000.0}, {"rate": 9_500.0})]
    assert target_verdicts({"candidate_pairs": pairs}) == [
        "(b'')/(b) >= 0.5 with a candidate config: 0.53 (median of 3 pairs), met",  # 0.55, 0.45, 0.53
    ]
    assert target_verdicts({"candidate_pairs": pairs[1:2]}) == ["(b'')/(b) >= 0.5 with a candidate config: 0.45, NOT MET"]
