"""The fast per-call hook command in Python: what ``loopwatch hook install`` writes for command
hooks when no C compiler builds the native relay (``relay.c``, which speaks this protocol and falls
back to this module's behaviour, byte for byte),

    /path/to/python -I -S /path/to/streams/integrations/hooks/relay.py claude-code [--socket PATH] [--timeout S] [--fail-closed]

It takes ``call``'s arguments and gives the same answers, at a fraction of the start-up: an
interpreter started with ``-I -S`` has loaded only ``sys``, ``posix`` and ``io``, and this module
adds ``_socket`` and nothing else (``socket`` brings ``selectors``, ``enum`` and ``collections``,
``json`` brings ``re``: together most of ``call``'s start).  It does not read the hook's JSON: it
sends stdin as it is to ``loopwatch hook --serve`` over the Unix socket and writes back the hook
output the serve process made.

Only when the serve process gives no decision (away, too slow, or refusing the input) does it load
``call`` and do exactly what ``call`` does then: one line on stderr, and then nothing (fail open:
the call runs) or, with ``--fail-closed``, the CLI's deny.  An input that is not a JSON object is
refused the same way too (exit 1).

The protocol, beside ``call``'s JSON lines on the same socket: the request is ``MAGIC``, the CLI's
name and a newline, then the hook input up to the end of the stream; the answer is one byte and a
body: ``O`` and the hook output's JSON (empty: no output), ``E`` and a one-line error, or ``X`` and
a one-line error about the input itself.
"""

import _socket
import posix
import sys
from types import ModuleType

MAGIC = b"LWR1 "
CLIS = (b"claude-code", b"codex", b"gemini")
MAX_INPUT = 4 * 1024 * 1024  # call.MAX_LINE
MAX_ANSWER = MAX_INPUT + 1024


def _socket_path() -> bytes:
    """call.default_socket, without os: ``$LOOPWATCH_HOOK_SOCKET``, else per user."""
    env = posix.environ
    explicit = env.get(b"LOOPWATCH_HOOK_SOCKET")
    if explicit:
        return explicit
    base = env.get(b"XDG_RUNTIME_DIR") or env.get(b"TMPDIR") or b"/tmp"
    return base.rstrip(b"/") + b"/loopwatch-hook-%d.sock" % posix.getuid()


def _call() -> ModuleType:
    """``call``, loaded by path: the fallback, where start-up time no longer matters."""
    import importlib.util

    here = __file__.rpartition("/")[0]
    spec = importlib.util.spec_from_file_location("loopwatch_hook_call", here + "/call.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    argv = sys.argv[1:]
    path, timeout, closed = _socket_path(), 5.0, False
    if not argv or argv[0].encode() not in CLIS:
        return int(_call().main(argv))  # call's usage error, word for word
    cli = argv[0]
    rest = argv[1:]
    while rest:
        flag = rest.pop(0)
        if flag == "--fail-closed":
            closed = True
        elif flag == "--socket" and rest:
            path = rest.pop(0).encode()
        elif flag == "--timeout" and rest:
            try:
                timeout = float(rest[0])
            except ValueError:
                timeout = 0.0
            rest.pop(0)
            if not 0 < timeout <= 600:
                return int(_call().main(argv))  # the same one-line refusal as call
        else:
            return int(_call().main(argv))
    raw = sys.stdin.buffer.read(MAX_INPUT + 1)
    try:
        if len(raw) > MAX_INPUT:
            raise ValueError(f"longer than {MAX_INPUT} bytes")  # call refuses it as the input's fault
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(MAGIC + cli.encode() + b"\n" + raw)
            s.shutdown(_socket.SHUT_WR)
            chunks, size = [], 0
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER:
                    raise ValueError("answer too long")
        finally:
            s.close()
        answer = b"".join(chunks)
        kind, body = answer[:1], answer[1:]
        if kind != b"O":
            # The serve process's refusal (E, X) or no answer: call's own failure path, as a
            # ValueError (no class of its own here: loopwatch's error root costs the import).
            raise ValueError(body.decode("utf-8", "replace").strip()[:300] or "no answer")
    except (OSError, ValueError) as exc:
        return int(_call().unanswered(cli, raw, path.decode("utf-8", "replace"), exc, closed))
    if body:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
