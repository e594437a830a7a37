"""``bench/evaluate.py`` runs end to end on a small generated workload and judges each figure
against issue 28's target (the figures themselves are recorded in docs/benchmarks.md)."""

from bench import evaluate


def test_it_times_import_and_every_row_and_judges_the_target(capsys):
    assert evaluate.main(["--runs", "6", "--calls", "12", "--repeat", "1", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "generated chat (openai-chat, one file)" in out and "generated Claude Code sessions" in out
    for row in ("upstream defaults", "profile latest", "recommended", "Roo Code", "Gemini CLI", "OpenHands"):
        assert row in out
    judged = [line for line in out.splitlines() if line.endswith(("met", "NOT met"))]
    assert len(judged) == 2 + 6  # two imports, six rows
    assert "72" in out  # 6 runs x 12 calls imported and evaluated
    assert "--jobs 2 / --jobs 1 (wall time)" in out and "reports identical to one process: yes" in out


def test_the_generated_runs_hold_the_calls_asked_for():
    runs = evaluate.chat_runs(5, 17)
    assert [sum(len(m.get("tool_calls") or ()) for m in r["traj"]) for r in runs] == [17] * 5
