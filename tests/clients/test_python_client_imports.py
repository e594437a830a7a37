"""The Python runner client depends on ``schemas`` and the edge hashing only: importing it
loads neither the engine's detection code nor Faust (it runs inside agent runners)."""

import subprocess
import sys


def test_importing_the_client_loads_neither_the_engine_nor_faust():
    code = (
        "import sys, streams.client\n"
        "print(sorted(m for m in sys.modules if m == 'streams.engine' or m.startswith(('streams.engine.', 'faust', 'mode'))))\n"
        "print('streams.edge.hashing' in sys.modules, 'schemas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "True True"]
