"""Framework adapters: loopwatch in front of LangChain/LangGraph, OpenAI Agents SDK and
Pydantic AI agents, one module each behind its own extra (``loopwatch[langchain]``,
``[openai-agents]``, ``[pydantic-ai]``), all on ``guard`` (the part they share) and
``streams.client``.  Import the module of your framework; this package imports none of them.
"""
