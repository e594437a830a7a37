"""The ``loopwatch`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _conformance(args: argparse.Namespace) -> int:
    if args.traces or args.expected:
        if not (args.traces and args.expected) or args.files:
            print("loopwatch conformance: --traces and --expected go together, without case files", file=sys.stderr)
            return 2
        from .conformance.traces import TraceFileError, run_traces
        from .engine.config import PEER_PROFILES

        def progress(n: int) -> None:
            if n % 100 == 0:
                print(f"  … {n} sessions", file=sys.stderr, flush=True)

        try:
            if args.profile in PEER_PROFILES:  # the peers' own answers
                from .conformance.peers import run_peer_traces

                results = run_peer_traces(args.traces, args.expected, args.profile, progress=progress)
            else:
                results = run_traces(args.traces, args.expected, progress=progress, profile=args.profile)
        except TraceFileError as exc:
            print(f"loopwatch conformance: {exc}", file=sys.stderr)
            return 2
        failed = [r for r in results if r.failure]
        for r in failed:
            print(f"FAIL {r.session_id}: {r.failure}")
        steps = sum(r.steps for r in results)
        print(f"{steps} steps compared")
        print(f"{len(results) - len(failed)} passed, {len(failed)} failed, 0 skipped")
        return 1 if failed else 0

    if not args.files:
        print("loopwatch conformance: give case files, or --traces and --expected", file=sys.stderr)
        return 2
    from .conformance.cases import load_cases, run_case

    passed = failed = skipped = 0
    for path in args.files:
        try:
            cases = load_cases(path)
        except (OSError, ValueError) as exc:
            print(f"loopwatch conformance: {path}: {exc}", file=sys.stderr)
            return 2
        for case in cases:
            result = run_case(case)
            if result.status == "passed":
                passed += 1
            elif result.status == "skipped":
                skipped += 1
                print(f"SKIP {result.case_id}: {result.detail}")
            else:
                failed += 1
                print(f"FAIL {result.case_id}: {result.detail}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def _load_root(path: str | None):
    from schemas.config import load_config_file

    return load_config_file(path) if path else None


def _replay(args: argparse.Namespace) -> int:
    from schemas.config import ConfigError

    from .engine import engine_for
    from .engine.config import with_profile, with_scope
    from .offline.replay import print_summary, run_replay

    try:
        root = _load_root(args.config)
    except ConfigError as exc:
        print(f"loopwatch replay: {exc}", file=sys.stderr)
        return 2
    if args.profile:
        root = with_profile(root, args.profile)
    if args.scope:
        root = with_scope(root, args.scope)
    engine = engine_for(root)
    try:
        summary = run_replay(Path(args.trace), engine, as_json=args.json, verbose=args.verbose, out=sys.stdout)
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        print(f"loopwatch replay: cannot read {args.trace}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"summary": summary.as_dict()}))
    else:
        print_summary(summary)
    if summary.events == 0:  # nothing was replayed: a wrong file, not a quiet run
        what = f"all {summary.rejected} lines were rejected" if summary.rejected else "it holds no events"
        print(f"loopwatch replay: nothing replayed from {args.trace}: {what}", file=sys.stderr)
        return 1
    return 0


def _backtest(args: argparse.Namespace) -> int:
    from schemas.config import RUN_SCOPE, ConfigError
    from schemas.names import BAD_SIGNATURE

    from .engine import engine_for
    from .offline.backtest import (
        Backtest,
        BacktestError,
        FileSource,
        KafkaRange,
        Progress,
        parse_time,
        plot,
        render_table,
    )
    from .offline.sharded import available_cores

    def fail(message: str, code: int = 2) -> int:
        print(f"loopwatch backtest: {message}", file=sys.stderr)
        return code

    if args.jobs is not None and args.jobs < 1:
        return fail(f"--jobs must be at least 1, not {args.jobs}")
    named_broker = args.bootstrap or args.deprecated_broker
    if args.files and (args.topic or named_broker):
        return fail("give files or --topic (and --bootstrap), not both")
    if not args.files and not args.topic:
        return fail("give JSONL files of tool-calls events, or --topic (and --bootstrap)")
    if args.files and (args.from_offset is not None or args.to_offset is not None or args.since or args.until):
        return fail("--from-offset, --to-offset, --since and --until read a topic: they need --topic")
    if args.files and args.signing_keys is not None:
        return fail(
            "--signing-keys checks the signatures in a topic's record headers, which files do not hold: it needs --topic"
        )
    engines = {}
    for name in ("baseline", "candidate"):
        try:
            engines[name] = engine_for(_load_root(getattr(args, name)))
        except ConfigError as exc:
            return fail(f"--{name}: {exc}")
        config = engines[name].config
        if config.scope != RUN_SCOPE:
            # The backtest runs each run id's events from fresh state, as its report counts runs.
            return fail(
                f"--{name}: loopwatch.scope: session is not backtested (loopwatch replay --scope session "
                "runs a session's history)"
            )
        if config.fleet_incidents is not None or config.agent_rings is not None:
            print(
                f"loopwatch backtest: --{name}: fleetIncidents and agentRings need the fleet topology and are not "
                "backtested (loopwatch replay runs them)",
                file=sys.stderr,
            )
    keyring = None
    try:
        if args.files:
            source = FileSource([Path(f) for f in args.files])
        else:
            from schemas.signing import Keyring, SigningKeyError, load_keys

            from .app.broker_options import client_settings
            from .app.settings import SettingsError

            try:
                settings = client_settings(args, "loopwatch backtest")
                options = settings.kafka_client_options()
                if settings.signing_keys is not None:
                    keyring = Keyring(load_keys(settings.signing_keys))
            except (SettingsError, SigningKeyError) as exc:
                return fail(str(exc))
            source = KafkaRange(
                settings.broker,
                args.topic,
                start=args.from_offset,
                end=args.to_offset,
                since_ms=parse_time(args.since) if args.since else None,
                until_ms=parse_time(args.until) if args.until else None,
                timeout_s=args.timeout,
                client_options=options,
            )
        backtest = Backtest(
            engines["baseline"],
            engines["candidate"],
            agents=args.agent,
            normal_reasons=args.normal_end or ("completed",),
            keyring=keyring,
        )
        progress = Progress(sys.stderr, source.progress)
        backtest.run(source.records(), keyed=source.keyed, progress=progress, jobs=args.jobs or available_cores())
        progress.done(backtest.records)
    except BacktestError as exc:
        return fail(str(exc), exc.code)
    if args.agent:
        missing = [a for a in args.agent if a not in backtest.agents_seen]
        if missing:
            seen = ", ".join(sorted(str(a) for a in backtest.agents_seen)[:10]) or "none"
            return fail(
                f"unknown agent {', '.join(map(repr, missing))}: no event of it in the input (agents seen: {seen})", 1
            )
    if backtest.signed:
        print(
            f"loopwatch backtest: {backtest.signed:,} records are signed and their signatures were not checked: "
            "give --signing-keys (the worker's keys) to verify them as the worker does",
            file=sys.stderr,
        )
    elif keyring is not None:
        refused = backtest.dead.get(BAD_SIGNATURE, 0)
        print(
            f"loopwatch backtest: signatures checked with {len(keyring)} keys: "
            f"{backtest.records - refused:,} of {backtest.records:,} records passed, {refused:,} bad_signature",
            file=sys.stderr,
        )
    if backtest.events == 0:  # a wrong input: no report of zeros, no plot
        return fail(_nothing_read("compare", args.files, sum(backtest.dead.values())), 1)
    report = backtest.report()
    if args.plot:
        try:
            plot(report, Path(args.plot), baseline=args.baseline, candidate=args.candidate)
        except BacktestError as exc:
            return fail(str(exc))
    if args.json:
        print(json.dumps(report.data, indent=2))
    else:
        render_table(report, sys.stdout)
    return 0


def _nothing_read(what: str, files: list[str], refused: int) -> str:
    """Why an offline tool read no event: a raw transcript is named by its format, with the
    ``loopwatch import`` command that turns it into events."""
    for name in files:
        fmt = _transcript_format(Path(name))
        if fmt is not None:
            return (
                f"nothing to {what}: {name} is a {fmt} transcript, not tool-calls events; "
                f"run `loopwatch import {fmt} {name} -o events.jsonl` first and give events.jsonl"
            )
    return f"nothing to {what}: " + (f"all {refused:,} records were refused" if refused else "it holds no events")


def _transcript_format(path: Path) -> str | None:
    """The ``loopwatch import`` format ``path`` is in, or None (not a transcript, or unreadable)."""
    from .importers import ImportFailed, detect
    from .importers.reader import open_source

    try:
        src = open_source(path)
    except ImportFailed:
        return None
    try:
        return detect(src)[0].NAME
    except (ImportFailed, OSError, EOFError, ValueError):
        return None
    finally:
        src.close()


UPSTREAM_DEFAULTS = {"tools": {"loopDetection": {"enabled": True}}}
"""Upstream's defaults with detection on: its literal default (``enabled: false``) detects
nothing, so the evaluation's baseline is its thresholds, switched on."""


def _evaluate(args: argparse.Namespace) -> int:
    from schemas.config import RUN_SCOPE, ConfigError

    from .engine import engine_for
    from .engine.config import PEER_PROFILES, with_profile
    from .offline.backtest import BacktestError, FileSource, Progress
    from .offline.evaluate import (
        REFERENCE_ROWS,
        SUCCESSFUL,
        EngineRow,
        Evaluation,
        distribution_path,
        plot,
        render_table,
    )
    from .offline.sharded import available_cores

    def fail(message: str, code: int = 2) -> int:
        print(f"loopwatch evaluate: {message}", file=sys.stderr)
        return code

    if args.jobs is not None and args.jobs < 1:
        return fail(f"--jobs must be at least 1, not {args.jobs}")
    rows = []
    for profile in args.profile or ():
        # The peer profiles read no tools.loopDetection block: their own thresholds, always on.
        what = "its system's defaults" if profile in PEER_PROFILES else "upstream defaults, enabled"
        rows.append(EngineRow(f"profile {profile} ({what})", engine_for(with_profile(UPSTREAM_DEFAULTS, profile))))
    for path in args.config or ():
        try:
            engine = engine_for(_load_root(path))
        except ConfigError as exc:
            return fail(f"--config {path}: {exc}")
        if engine.config.scope != RUN_SCOPE:
            return fail(f"--config {path}: loopwatch.scope: session is not evaluated (runs are judged one by one)")
        if engine.config.fleet_incidents is not None or engine.config.agent_rings is not None:
            print(
                f"loopwatch evaluate: --config {path}: fleetIncidents and agentRings need the fleet topology and "
                "are not evaluated (loopwatch replay runs them)",
                file=sys.stderr,
            )
        if not engine.settings_for(None).detection.enabled:
            print(
                f"loopwatch evaluate: note: {path} leaves detection off (tools.loopDetection.enabled): "
                "its row detects nothing",
                file=sys.stderr,
            )
        rows.append(EngineRow(Path(path).stem, engine))
    if args.early_warning:
        rows.append(
            EngineRow(
                "early warning (upstream defaults, enabled, detectors.earlyWarning: true)",
                engine_for({**UPSTREAM_DEFAULTS, "loopwatch": {"detectors": {"earlyWarning": True}}}),
            )
        )
    if not rows:
        rows = [
            EngineRow("upstream defaults (enabled)", engine_for(UPSTREAM_DEFAULTS)),
            EngineRow("profile latest (enabled)", engine_for(with_profile(UPSTREAM_DEFAULTS, "latest"))),
        ]
    if not args.no_reference:
        rows.extend(REFERENCE_ROWS)
    try:
        source = FileSource([Path(f) for f in args.files])
        evaluation = Evaluation(rows, SUCCESSFUL | set(args.success or ()))
        progress = Progress(sys.stderr, source.progress, what="evaluate")
        evaluation.run(source.records(), progress=progress, jobs=args.jobs or available_cores())
        progress.done(evaluation.records)
        if evaluation.events == 0:  # a wrong input: no report of zeros, no plot
            return fail(_nothing_read("evaluate", args.files, sum(evaluation.dead.values())), 1)
        report = evaluation.report()
        if args.plot:
            plot(report, Path(args.plot))
            print(
                f"loopwatch evaluate: wrote {args.plot} and {distribution_path(Path(args.plot))} (calls into the loop)",
                file=sys.stderr,
            )
    except BacktestError as exc:
        return fail(str(exc), exc.code)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_table(report, sys.stdout)
    return 0


def _plant(args: argparse.Namespace) -> int:
    from collections import Counter

    from schemas.events import encode_event_lines

    from .importers import open_output
    from .offline.backtest import BacktestError, FileSource
    from .offline.evaluate import Evaluation
    from .offline.plant import plant_runs

    def fail(message: str, code: int = 2) -> int:
        print(f"loopwatch plant: {message}", file=sys.stderr)
        return code

    if not 0.0 <= args.fraction <= 1.0:
        return fail(f"--fraction must be between 0 and 1, not {args.fraction:g}")
    try:
        source = FileSource([Path(f) for f in args.files])
        reader = Evaluation([])
        runs = [events for _order, _key, events in reader.runs_of(enumerate(source.records()))]
    except BacktestError as exc:
        return fail(str(exc), exc.code)
    if not runs:
        return fail("no runs in the input", 1)
    planted, where = plant_runs(runs, args.seed, args.fraction)
    shapes = Counter(w.shape for w in where if w is not None)
    fh, finish = open_output(Path(args.output))
    ok = False
    try:
        for events in planted:
            fh.write(encode_event_lines(events))
        ok = True
    finally:
        finish(ok)
    dead = sum(reader.dead.values())
    print(
        f"loopwatch plant: {len(runs):,} runs into {args.output}, {sum(shapes.values()):,} planted ("
        + ", ".join(f"{k} {v}" for k, v in sorted(shapes.items()))
        + f"), seed {args.seed}"
        + (f"; skipped {dead:,} records the worker would refuse" if dead else ""),
        file=sys.stderr,
    )
    return 0


def _tune(args: argparse.Namespace) -> int:
    import multiprocessing
    import shlex

    import yaml

    from .offline import tune
    from .offline.backtest import BacktestError, FileSource
    from .offline.evaluate import Evaluation
    from .offline.sharded import ShardError, available_cores, run_split

    def fail(message: str, code: int = 2) -> int:
        print(f"loopwatch tune: {message}", file=sys.stderr)
        return code

    if args.folds < 2 or args.folds > 100:
        return fail(f"--folds must be between 2 and 100, not {args.folds}")
    if args.trials < 1 or args.trials > 10_000:
        return fail(f"--trials must be between 1 and 10000, not {args.trials}")
    if not 0.0 <= args.max_false_alarms <= 1.0:
        return fail(f"--max-false-alarms must be between 0 and 1, not {args.max_false_alarms:g}")
    if args.jobs is not None and args.jobs < 1:
        return fail(f"--jobs must be at least 1, not {args.jobs}")
    try:
        reader = Evaluation([])
        runs = [
            (key, events)
            for _o, key, events in reader.runs_of(enumerate(FileSource([Path(f) for f in args.files]).records()))
        ]
    except BacktestError as exc:
        return fail(str(exc), exc.code)
    facts = [tune.facts(key, events) for key, events in runs]
    if not any(f.start is not None and f.length >= tune.MIN_LOOP for f in facts):
        return fail("no planted loop of 5+ calls in the input (loopwatch plant writes them)", 1)
    if len(runs) < args.folds:
        return fail(f"{len(runs)} runs cannot be split into {args.folds} folds", 1)
    configs = tune.sample_trials(args.trials, args.seed)
    jobs = min(args.jobs or available_cores(), len(configs))
    print(f"tune: {len(runs):,} runs, {len(configs)} trials, {args.folds} folds, {jobs} processes", file=sys.stderr)
    judged = multiprocessing.get_context("fork").Value("i", 0)

    def one_done() -> None:
        with judged.get_lock():
            judged.value += 1

    bar = tune.TrialBar(sys.stderr, len(configs))
    try:
        parts = run_split(
            lambda shard: tune.judge_trials(configs[shard::jobs], runs, one_done), jobs, poll=lambda: bar(judged.value)
        )
    except ShardError as exc:
        return fail(str(exc), 1)
    bar.done()
    stops = [None] * len(configs)
    for shard, part in enumerate(parts):
        stops[shard::jobs] = part
    folds = tune.folds_of(facts, args.folds, args.seed)
    report = tune.tune_report(configs, stops, facts, folds, args.max_false_alarms)
    command = (
        "loopwatch tune " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "tune")
        if args.command_line is None
        else args.command_line
    )
    report["command"] = command
    chosen = report["chosen"]

    def figures_line(fig: dict) -> str:
        return (
            f"loops of 5+ stopped {fig['caught_5']}/{fig['loops_5']} ({fig['stopped_before_loop']} stopped before "
            f"the loop); calls into the loop median {_num(fig['into_median'])}, p90 {_num(fig['into_p90'])}; "
            f"pure false alarms {fig['pure_false_alarms']}/{fig['successful']} (all stops of successful runs "
            f"{fig['false_alarms']})"
        )

    def shapes_line(fig: dict) -> str:
        return ", ".join(f"{k} {v['caught_5']}/{v['loops_5']}" for k, v in fig["by_shape"].items())

    if chosen is not None:
        lines = [
            "# Chosen by loopwatch tune (docs/evaluation.md): the best catch rate of planted loops of 5+ calls",
            "# within the pure false-alarm budget, ties broken by fewer calls into the loop, chosen on all runs.",
            "# Its figures are held out: in each fold, the config chosen the same way on the other folds, scored",
            "# on that fold.",
            f"# command: {command}",
            f"# runs: {len(runs)}; trials: {len(configs)}; folds: {args.folds} (seed {args.seed}); "
            f"budget (pure false alarms): {args.max_false_alarms:g}",
            f"# held-out, pooled: {figures_line(report['chosen_figures'])}",
            f"# held-out, pooled, loops of 5+ stopped by shape: {shapes_line(report['chosen_figures'])}",
        ]
        for per in report["chosen_per_fold"]:
            lines.append(f"# held-out, fold {per['fold']} (trial {per['trial']}): {figures_line(per)}")
        lines.append(
            f"# on the runs it was chosen on (flatters it; not a held-out figure): {figures_line(report['in_sample'])}"
        )
        Path(args.output).write_text("\n".join(lines) + "\n" + yaml.safe_dump(configs[chosen], sort_keys=False))
    if args.plot:
        try:
            _tune_plot(report, Path(args.plot))
        except BacktestError as exc:
            return fail(str(exc), exc.code)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("held-out front (nested cross-validation, pooled over folds), one point per pure false-alarm budget:")
        print("  budget  loops 5+ stopped  before  into median/p90  pure false alarms  all stops of successful runs")
        for point in report["front"]:
            fig = point["pooled"]
            mark = "  front" if point["on_front"] else ""
            mark += "  (asked)" if point["budget"] == args.max_false_alarms else ""
            print(
                f"  {point['budget']:>6g}  {fig['caught_5']:>9}/{fig['loops_5']:<6}  {fig['stopped_before_loop']:>6}  "
                f"{_num(fig['into_median']):>6}/{_num(fig['into_p90']):<7}  {fig['pure_false_alarms']:>9}/"
                f"{fig['successful']:<7}  {fig['false_alarms']:>8}{mark}"
            )
        if chosen is not None:
            print(f"chosen: trial {chosen} {json.dumps(configs[chosen], separators=(',', ':'))}")
            print(f"  held-out, pooled: {figures_line(report['chosen_figures'])}")
            print(f"  held-out, pooled, by shape: {shapes_line(report['chosen_figures'])}")
            print(f"  on the runs it was chosen on: {figures_line(report['in_sample'])}")
    if chosen is None:
        return fail(f"no trial stays within --max-false-alarms {args.max_false_alarms:g}; nothing written", 1)
    print(f"loopwatch tune: wrote {args.output} (trial {chosen})", file=sys.stderr)
    return 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _tune_plot(report: dict, path: Path) -> None:
    """The held-out front: per budget, catch rate of planted loops of 5+ against the pure
    false-alarm rate, each budget its own colour and marker."""
    from .offline.backtest import BacktestError
    from .offline.plots import Marker, PlotError, Points, row_styles, save, scatter_chart

    points = report["front"]
    rows = []
    for (color, shape), point in zip(row_styles(len(points)), points):
        fig = point["pooled"]
        xy = [
            (
                100 * fig["pure_false_alarm_rate"],
                100 * (fig["catch_rate"] or 0.0),
                "front" if point["on_front"] else "off",
            )
        ]
        label = f"budget {point['budget']:g}: {fig['caught_5']}/{fig['loops_5']} stopped, median {_num(fig['into_median'])} in"
        rows.append(Points(label, xy, color, shape))
    try:
        chart = scatter_chart(
            rows,
            markers={
                "front": Marker("o", 13, "on the held-out front (large)"),
                "off": Marker("o", 8, "off it (small)"),
            },
            title=f"loopwatch tune: held-out figures of the choice per budget ({report['runs']:,} runs, {report['trials']} trials)",
            xlabel="pure false alarms, % of successful background runs (held out)",
            ylabel="planted loops of 5+ stopped inside, % (held out)",
        )
        save(chart, path)
    except PlotError as exc:
        raise BacktestError(str(exc)) from None


def _import(args: argparse.Namespace) -> int:
    from .importers import FORMATS, ImportFailed, import_files, load_labels, open_output

    files = [Path(f) for f in args.files]
    fmt = args.format or (args.format_positional if args.format_positional in FORMATS else None)
    if args.format_positional and args.format_positional not in FORMATS:
        files.insert(0, Path(args.format_positional))  # no format named: autodetect every file
    if not files:
        print("loopwatch import: give transcript files", file=sys.stderr)
        return 2
    out = Path(args.output)
    progress = _ImportProgress(sys.stderr)
    try:
        labels = load_labels(Path(args.labels)) if args.labels else None
        total = sum(f.stat().st_size for f in files if f.is_file())
        fh, finish = open_output(out)
        ok = False
        try:
            summary = import_files(
                files, fh, fmt=fmt, labels=labels, agent_id=args.agent, progress=progress, total_bytes=total
            )
            ok = True
        finally:
            finish(ok)
    except ImportFailed as exc:
        progress.clear()
        print(f"loopwatch import: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        progress.clear()
        print("loopwatch import: interrupted, nothing written", file=sys.stderr)
        return 130
    progress.clear()
    print(f"loopwatch import: {summary.line(str(out))}", file=sys.stderr)
    if labels is not None:
        print(
            f"loopwatch import: {summary.labelled:,} of {summary.runs:,} runs labelled from {args.labels}",
            file=sys.stderr,
        )
    return 0


class _ImportProgress:
    """A progress line on stderr once an import takes more than two seconds."""

    def __init__(self, out, after_s: float = 2.0) -> None:
        import time

        self.out, self.after_s, self.clock = out, after_s, time.monotonic
        self.started = self.clock()
        self.shown_at: float | None = None
        self.tty = hasattr(out, "isatty") and out.isatty()

    def __call__(self, summary, share: float | None) -> None:
        now = self.clock()
        if now - self.started < self.after_s or (
            self.shown_at is not None and now - self.shown_at < (0.5 if self.tty else 5)
        ):
            return
        self.shown_at = now
        elapsed = now - self.started
        line = f"import: {summary.runs:,} runs, {summary.calls:,} tool calls, {summary.calls / elapsed:,.0f} calls/s"
        if share:
            line += f", {share:.0%}, ETA {max(0.0, elapsed / share - elapsed):.0f} s"
        self.out.write(("\r" + line + "   ") if self.tty else line + "\n")
        self.out.flush()

    def clear(self) -> None:
        if self.shown_at is not None and self.tty:
            self.out.write("\n")
            self.out.flush()


def _config_check(args: argparse.Namespace) -> int:
    from schemas.config import PEER_PROFILES, ConfigError, load_config_file, warnings

    from .engine import ConfigSet
    from .engine.config import DETECTION_OFF_HINT

    try:
        root = load_config_file(args.file)
    except ConfigError as exc:
        print(f"loopwatch config check: {exc}", file=sys.stderr)
        for issue in exc.issues[1:]:
            print(f"  also: {issue}", file=sys.stderr)
        return 1
    for note in warnings(root):
        print(f"loopwatch config check: warning: {note}", file=sys.stderr)
    config = ConfigSet(root)
    agents = [None] + config.agent_ids()
    effective = {}
    for agent in agents:
        s = config.settings_for(agent)
        on = config.profile_for(agent) in PEER_PROFILES or s.detection.enabled
        effective["(default)" if agent is None else agent] = {
            "detection": "on" if on else f"OFF: {DETECTION_OFF_HINT}",
            "profile": config.profile_for(agent),
            **s.detection.as_dict(),
            "postCompactionGuard": {"enabled": s.guard.enabled, "windowSize": s.guard.window_size},
            "loopwatch": {
                "abortAfterCriticalBlocks": s.abort_after_critical_blocks,
                "surfaceWarnings": s.surface_warnings,
                "mode": config.mode_for(agent),
                "detectors": {
                    "cycle": s.cycle,
                    "nearIdentical": s.near_identical,
                    "earlyWarning": False if s.early_warning is None else s.early_warning.as_dict(),
                },
            },
        }
    fleet = {  # root only: how the whole fleet's events are keyed and repartitioned
        "scope": config.scope,
        "fleetIncidents": config.fleet_incidents.as_dict() if config.fleet_incidents else {"enabled": False},
        "agentRings": config.agent_rings.as_dict() if config.agent_rings else {"enabled": False},
    }
    if args.json:
        print(json.dumps({**effective, "(fleet)": fleet}, indent=2))
    else:
        print(f"{args.file}: valid")
        off = [name for name, values in effective.items() if values["detection"] != "on"]
        if off:
            print(f"detection OFF for {', '.join(off)}: {DETECTION_OFF_HINT}")
        for name, values in {**effective, "(fleet)": fleet}.items():
            print(f"\n[{name}]")
            for key, value in values.items():
                print(f"  {key}: {json.dumps(value)}")
    return 0


def _schemas_export(args: argparse.Namespace) -> int:
    from schemas.export import write_json_schemas

    written = write_json_schemas(Path(args.directory))
    for path in written:
        print(path)
    return 0


# The worker's packages are an optional extra: a runner installs loopwatch without them.
WORKER_PACKAGES = {
    "faust": "faust-streaming",
    "mode": "mode-streaming",
    "rocksdict": "rocksdict",
    "prometheus_client": "prometheus-client",
}


def missing_worker_packages() -> list[str]:
    from importlib.util import find_spec

    return [dist for module, dist in WORKER_PACKAGES.items() if find_spec(module) is None]


def _worker(args: argparse.Namespace, rest: list[str]) -> int:
    missing = missing_worker_packages()
    if missing:
        print(
            f"loopwatch worker: needs the optional extra (missing {', '.join(missing)}): "
            "pip install 'loopwatch[worker]'",
            file=sys.stderr,
        )
        return 2
    from .app.worker import run_worker

    return run_worker(rest)


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .offline.demo import run_demo

    return run_demo(rest)


def _mcp_gateway(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        import mcp  # noqa: F401 - the optional extra; the gateway's package imports it everywhere
    except ImportError:
        print("loopwatch mcp-gateway: needs the optional extra: pip install 'loopwatch[mcp]'", file=sys.stderr)
        return 2
    from streams.integrations.mcp.cli import main as gateway_main

    return gateway_main(rest)


def _hook(args: argparse.Namespace, rest: list[str]) -> int:
    if rest[:1] and rest[0] in HOOK_CLIS:
        from streams.integrations.hooks.call import main as call_main

        return call_main(rest)
    from streams.integrations.hooks.cli import main as hook_main

    return hook_main(rest)


def _otlp(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        import aiohttp  # noqa: F401 - the optional extra's packages
        import opentelemetry.proto  # noqa: F401
    except ImportError:
        print("loopwatch otlp: needs the optional extra: pip install 'loopwatch[otlp]'", file=sys.stderr)
        return 2
    from streams.integrations.otlp.cli import main as otlp_main

    return otlp_main(rest)


HOOK_CLIS = ("claude-code", "codex", "gemini")
"""``loopwatch hook <cli>``: the per-call command an agent CLI runs (``main`` takes it first)."""


class _Version(argparse.Action):
    """``--version``: ``loopwatch <version>``, read when asked (the metadata lookup is not free)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help="print the version")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import streams

        # streams.__version__ is the installed distribution's (pyproject.toml's) version.
        print(f"loopwatch {streams.__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    from schemas.config import PROFILES

    parser = argparse.ArgumentParser(prog="loopwatch", description="Central tool-loop detection for AI agent runners.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("conformance", help="run conformance case files or golden traces against the engine")
    p.add_argument("files", nargs="*", help="case files (JSON arrays, spec §6)")
    p.add_argument("--traces", help="golden sessions (JSONL, optionally .gz)")
    p.add_argument("--expected", help="upstream's expected step lines (JSONL, optionally .gz)")
    p.add_argument(
        "--profile",
        choices=("configurable-final", "latest", "openhands", "gemini-cli"),
        default="configurable-final",
        help="the profile the golden traces answer for (case files name their own)",
    )
    p.set_defaults(func=_conformance)

    p = sub.add_parser("replay", help="run the engine over a JSONL file of tool-calls events, without Kafka")
    p.add_argument("trace")
    p.add_argument("--config", help="loop-detection config (JSON5 or YAML)")
    p.add_argument("--json", action="store_true", help="machine output: one verdict per line, then a summary line")
    p.add_argument("--verbose", "-v", action="store_true", help="also print allow decisions")
    p.add_argument(
        "--profile",
        choices=("configurable-final", "latest", "openhands", "gemini-cli"),
        help="the default profile (loopwatch.profile); agents that name their own keep it",
    )
    p.add_argument(
        "--scope", choices=("run", "session"), help="one history per run or per session key (loopwatch.scope)"
    )
    p.set_defaults(func=_replay)

    p = sub.add_parser(
        "backtest",
        help="compare a candidate config with a baseline over recorded events (files or a topic range)",
        description="Run a baseline and a candidate loop-detection config over the same recorded tool-calls "
        "events, each with fresh state, and report what each would have warned, blocked and aborted.",
    )
    p.add_argument("files", nargs="*", help="JSONL files of tool-calls events (.gz: gzip), in order")
    p.add_argument("--baseline", required=True, metavar="CONFIG", help="the config in force (JSON5 or YAML)")
    p.add_argument("--candidate", required=True, metavar="CONFIG", help="the config to try")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--plot", metavar="PNG", help="write would-fire per minute, baseline against candidate")
    p.add_argument("--topic", help="read this tool-calls topic instead of files (on --bootstrap's cluster)")
    p.add_argument(
        "--from-offset", type=int, metavar="N", help="first offset of every partition (default: the beginning)"
    )
    p.add_argument(
        "--to-offset", type=int, metavar="N", help="end offset of every partition, exclusive (default: the end)"
    )
    p.add_argument("--since", metavar="TIME", help="from this record time: ISO 8601, epoch ms, or 30m/2h/7d ago")
    p.add_argument("--until", metavar="TIME", help="up to this record time, exclusive (same forms)")
    p.add_argument(
        "--timeout", type=float, default=15.0, metavar="S", help="seconds to wait for the broker (default 15)"
    )
    p.add_argument("--agent", action="append", metavar="ID", help="only this agent's events (repeat for several)")
    p.add_argument(
        "--normal-end",
        action="append",
        metavar="REASON",
        help="a run.ended reason of a run that finished normally (default: completed; repeat for several)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="processes to split the runs over (default: the cores available to this process)",
    )
    from .app.broker_options import add_broker_options

    add_broker_options(p, signing="verify")
    p.set_defaults(func=_backtest)

    from .importers import FORMATS

    p = sub.add_parser(
        "import",
        help="turn recorded agent transcripts into tool-calls events (hashed, as a runner would)",
        description="Read recorded transcripts of other agents (formats: " + ", ".join(FORMATS) + "; told by "
        "content unless given) and write loopwatch tool-calls events, one a line: raw arguments and "
        "results are hashed in memory and never written.",
    )
    p.add_argument(
        "format_positional",
        nargs="?",
        metavar="FORMAT",
        help="the format of every file (" + ", ".join(FORMATS) + "); leave out to detect each file's",
    )
    p.add_argument("files", nargs="*", help="transcript files (.gz: gzip)")
    p.add_argument("-o", "--output", required=True, metavar="EVENTS.jsonl[.gz]", help="the events file to write")
    p.add_argument("--format", choices=sorted(FORMATS), help="force the format (same as the FORMAT argument)")
    p.add_argument(
        "--labels",
        metavar="FILE",
        help="outcome labels by run id: results_summary.json, a SWE-bench report (resolved_ids), or {id: true/false}",
    )
    p.add_argument("--agent", metavar="ID", help="the agent_id to give every event (default: none)")
    p.set_defaults(func=_import)

    p = sub.add_parser(
        "evaluate",
        help="configs, profiles and the peers' simple rules side by side over recorded runs",
        description="Judge the same recorded runs (tool-calls events: loopwatch import writes them) under several "
        "configs and profiles and the peers' reference rules (Roo Code, Gemini CLI, OpenHands): runs "
        "warned, blocked and aborted, strict loops caught and how early, false alarms on runs "
        "labelled successful, calls saved.",
    )
    p.add_argument("files", nargs="+", help="JSONL files of tool-calls events (.gz: gzip)")
    p.add_argument(
        "--profile",
        action="append",
        choices=PROFILES,
        help="a row: the profile with upstream's defaults, detection on (gemini-cli, openhands: their own "
        "thresholds); repeat for several",
    )
    p.add_argument("--config", action="append", metavar="FILE", help="a row: a config file (repeat for several)")
    p.add_argument("--no-reference", action="store_true", help="leave out the peers' reference rows")
    p.add_argument(
        "--early-warning",
        action="store_true",
        help="a row: upstream's defaults, detection on, with loopwatch.detectors.earlyWarning at its defaults "
        "(a --config row that turns it on is reported the same way): planted loops warned before they start, "
        "the lead in calls, and warnings on successful runs",
    )
    p.add_argument(
        "--success",
        action="append",
        metavar="REASON",
        help="another run.ended reason of a successful run (besides completed, resolved, reward:1)",
    )
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="write catch rate against false-alarm rate per row, and beside it (NAME-calls-into-loop.png) "
        "the calls into the loop at each catch",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="processes to split the runs over (default: the cores available to this process)",
    )
    p.set_defaults(func=_evaluate)

    p = sub.add_parser(
        "plant",
        help="plant one loop into a seeded fraction of recorded runs (labelled planted:<shape>:<start>:<length>)",
        description="Read recorded runs (tool-calls events: loopwatch import writes them) and write them all "
        "again, one loop planted at a random point of a seeded fraction of them; docs/evaluation.md lists "
        "the shapes and where real agents loop so.",
    )
    p.add_argument("files", nargs="+", help="JSONL files of tool-calls events (.gz: gzip)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl[.gz]", help="the events file to write")
    p.add_argument("--seed", type=int, default=0, help="the random seed (default 0): same seed, same output")
    p.add_argument("--fraction", type=float, default=0.5, help="the share of runs to plant a loop in (default 0.5)")
    p.set_defaults(func=_plant)

    p = sub.add_parser(
        "tune",
        help="search one profile's settings on labelled runs, k-fold cross-validated; write the chosen config",
        description="A seeded search over profile configurable-final's settings on runs with planted loops "
        "(loopwatch plant), nested k-fold: the config chosen on the other folds is scored on each fold. Prints "
        "the held-out front over false-alarm budgets and writes the config chosen within the budget as YAML, "
        "its held-out figures and the command in its comments.",
    )
    p.add_argument("files", nargs="+", help="JSONL files of tool-calls events (.gz: gzip)")
    p.add_argument("-o", "--output", required=True, metavar="CONFIG.yaml", help="the chosen config to write")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds, by run (default 5)")
    p.add_argument("--trials", type=int, default=40, help="configs to try, drawn seeded (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seeds the trials and the folds (default 0)")
    p.add_argument(
        "--max-false-alarms",
        type=float,
        default=0.01,
        metavar="RATE",
        help="the share of successful background runs a config may stop outside any strict loop (pure false "
        "alarms; default 0.01)",
    )
    p.add_argument("--jobs", type=int, metavar="N", help="processes (default: the cores available)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--plot", metavar="PNG", help="write the held-out front: loops stopped against pure false alarms")
    p.add_argument("--command-line", help=argparse.SUPPRESS)
    p.set_defaults(func=_tune)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    c = config_sub.add_parser("check", help="validate a config file and print the effective settings per agent")
    c.add_argument("file")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_config_check)

    p = sub.add_parser("schemas", help="wire schema tools")
    schema_sub = p.add_subparsers(dest="schemas_command", required=True)
    c = schema_sub.add_parser("export", help="write JSON Schema for every wire type")
    c.add_argument("directory", nargs="?", default="schemas/jsonschema")
    c.set_defaults(func=_schemas_export)

    # These two parse their own options (and answer --help with all of them): add_help=False
    # leaves -h/--help in the arguments they are given.
    p = sub.add_parser(
        "worker", add_help=False, help="start the stream processor (loopwatch worker --help: its options)"
    )
    p.set_defaults(func=_worker, passthrough=True)

    p = sub.add_parser(
        "demo", add_help=False, help="start broker (if needed), worker and a simulated fleet; show decisions live"
    )
    p.set_defaults(func=_demo, passthrough=True)

    p = sub.add_parser(
        "mcp-gateway",
        add_help=False,
        help="an MCP server in front of MCP servers, guarding every tool call (needs loopwatch[mcp])",
    )
    p.set_defaults(func=_mcp_gateway, passthrough=True)

    p = sub.add_parser(
        "hook",
        add_help=False,
        help="loopwatch behind an agent CLI's hooks: --serve, install, or the per-call command (claude-code, codex, gemini)",
    )
    p.set_defaults(func=_hook, passthrough=True)

    p = sub.add_parser(
        "otlp",
        add_help=False,
        help="receive OpenTelemetry GenAI tool spans over OTLP/HTTP; observe-only (needs loopwatch[otlp])",
    )
    p.set_defaults(func=_otlp, passthrough=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hook"] and argv[1:2] and argv[1] in HOOK_CLIS:
        # An agent CLI runs this for every tool call: no parser, none of the rooms' imports.
        from streams.integrations.hooks.call import main as call_main

        return call_main(argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        return args.func(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
