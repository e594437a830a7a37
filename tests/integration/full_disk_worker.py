"""``streams.app.worker`` whose run-table writes fail as RocksDB's do on a full disk, once the
file named by ``LOOPWATCH_TEST_DISK_FULL`` exists (an injected ENOSPC: a full filesystem needs
a mount, which a test cannot count on).  The error is rocksdict's own, as measured on a 2 MiB
tmpfs: a plain ``Exception("IO error: No space left on device: While appending to file: ...")``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.app import run_store  # noqa: E402
from streams.app.worker import main  # noqa: E402

TRIGGER = Path(os.environ["LOOPWATCH_TEST_DISK_FULL"])
_write = run_store.RunStore.write


async def write(self, writes, on_stored=None, step_aside=None):
    if TRIGGER.exists():
        where = Path(os.environ["LOOPWATCH_DATA_DIR"]) / "runs-0.db" / "000004.log"
        raise Exception(f"IO error: No space left on device: While appending to file: {where}: No space left on device")
    return await _write(self, writes, on_stored, step_aside)


run_store.RunStore.write = write

if __name__ == "__main__":
    main()
