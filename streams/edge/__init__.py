"""What runs in a runner: the canonical form and hashing a runner applies to a tool call, the
events it publishes (``events``), Gemini CLI's content windows, and broker access.

The engine reads what this package writes, so both import it and it imports neither.  It holds
no Faust: a runner installs loopwatch without the worker's dependencies.  Nothing is imported
here, so that ``streams.edge.hashing`` does not load aiokafka (``streams.edge.broker`` does)."""
