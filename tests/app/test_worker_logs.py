import logging

from streams.app import logs
from streams.engine import LogLine


def test_lines_logged_together_match_the_formatter_and_fall_back_when_the_tree_changes(tmp_path):
    path = tmp_path / "worker.log"
    root_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        logs.configure(str(path))
        logger = logging.getLogger("loopwatch.agents/tools")
        logger.error("through logging")
        assert logs.direct_handler(logger) is not None
        logs.log_many(
            "loopwatch.",
            [
                LogLine("error", "agents/tools", "written directly"),
                LogLine("debug", "agents/tools", "below the level: not written"),
                LogLine("warn", "diagnostic", "a second logger"),
            ],
        )
        logs.flush()
        lines = path.read_text().splitlines()
        assert len(lines) == 3
        expected = [
            "[ERROR] loopwatch.agents/tools: through logging",
            "[ERROR] loopwatch.agents/tools: written directly",
            "[WARNING] loopwatch.diagnostic: a second logger",
        ]
        for line, tail in zip(lines, expected):
            assert line.endswith(tail)
            assert line.startswith("[20") and "] [" in line
        # Another handler listens: every line goes through logging, in order.
        seen: list[str] = []

        class Collect(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record.getMessage())

        extra = Collect()
        logger.addHandler(extra)
        try:
            assert logs.direct_handler(logger) is None
            logs.log_many(
                "loopwatch.",
                [
                    LogLine("error", "agents/tools", "one"),
                    LogLine("error", "diagnostic", "two"),
                    LogLine("error", "agents/tools", "three"),
                ],
            )
            logs.flush()
        finally:
            logger.removeHandler(extra)
        assert seen == ["one", "three"]
        assert [line.rsplit(": ", 1)[1] for line in path.read_text().splitlines()[3:]] == ["one", "two", "three"]
        assert logs.direct_handler(logging.getLogger("elsewhere")) is None
    finally:
        logging.getLogger().setLevel(root_level)
        lw = logging.getLogger("loopwatch")
        for h in list(lw.handlers):
            lw.removeHandler(h)
        lw.propagate = True
        logs._handlers.clear()
