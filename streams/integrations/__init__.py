"""Adapters that put loopwatch in front of agents that are not OpenClaw.

Each adapter is thin: it turns one framework's or protocol's tool calls into loopwatch's edge
events (through ``streams.client``) and loopwatch's verdicts back into that framework's own way
of refusing a call or ending a run. Each sits behind its own optional extra, and the worker
never imports this package (``tests/meta`` checks that).
"""
