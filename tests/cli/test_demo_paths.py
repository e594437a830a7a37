"""``loopwatch demo`` runs from a clone: the repository it starts the broker from (its
``scripts/kafka.sh``) and reads its default config from (``examples/loop-detection.yaml``) is
the clone's root, wherever the demo's module sits inside ``streams``."""

from __future__ import annotations

from harness import REPO
from streams.offline import demo


def test_the_demo_finds_the_broker_script_and_the_example_config_in_the_clone():
    assert demo.REPO == REPO
    assert (demo.REPO / "scripts" / "kafka.sh").is_file()
    assert (demo.REPO / "examples" / "loop-detection.yaml").is_file()
