import logging

from streams.app import logs


def test_direct_lines_match_the_formatter_and_fall_back_when_the_tree_changes(tmp_path):
    path = tmp_path / "worker.log"
    root_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        logs.configure(str(path))
        logger = logging.getLogger("loopwatch.agents/tools")
        logger.error("through logging")
        write = logs.direct_writer(logger)
        assert write is not None
        write(logging.ERROR, "written directly")
        logs.flush()
        lines = path.read_text().splitlines()
        assert len(lines) == 2
        for line, message in zip(lines, ["through logging", "written directly"]):
            assert line.endswith(f"[ERROR] loopwatch.agents/tools: {message}")
            assert line.startswith("[20") and "] [" in line
        extra = logging.NullHandler()
        logger.addHandler(extra)
        try:
            assert logs.direct_writer(logger) is None  # someone else listens: use logging
        finally:
            logger.removeHandler(extra)
        assert logs.direct_writer(logging.getLogger("elsewhere")) is None
    finally:
        logging.getLogger().setLevel(root_level)
        lw = logging.getLogger("loopwatch")
        for h in list(lw.handlers):
            lw.removeHandler(h)
        lw.propagate = True
        logs._handlers.clear()
