"""``loopwatch hook``: loopwatch behind an agent CLI's own hooks (Claude Code, Codex CLI,
Gemini CLI).

Three parts, apart from one another so that the per-call side stays cheap:

* ``call``: the command the CLI runs for every tool call.  It imports only the standard
  library (socket, json): it forwards the hook's JSON to the serve process over a Unix socket
  and prints the CLI's hook output, failing open or closed when the serve process is away;
* ``relay`` and ``relay.c``: what ``hook install`` writes in ``call``'s place, the same answers
  with less start-up: the Python relay loads only ``_socket``; the native one, compiled at
  install when a C compiler is found, starts no interpreter unless the serve process gives no
  decision;
* ``serve``: the long-lived process that holds one ``LoopwatchClient`` (one Kafka
  connection) and turns hook payloads into edge events and loopwatch's verdicts into the
  CLI's deny / context / stop outputs (one module per protocol: ``claude_code``, ``codex``,
  ``gemini``; ``sessions`` holds what they share);
* ``install``: writes the hooks into the CLI's settings file.

Nothing here is imported at package import: ``call`` must not pay for the client's imports.
"""
