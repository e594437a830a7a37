import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LOOPWATCH_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "conformance").is_dir():
        pytest.fail(f"the shared conformance vectors are missing at {SHARED} (set LOOPWATCH_SHARED)")
    return SHARED
