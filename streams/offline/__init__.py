"""The offline tools: replay, backtest, evaluate, sharded runs over files, file reading, plots,
scenarios and the demo.  They drive the engine through the same path as the worker
(``streams.engine.drive``) without a broker, except where a tool reads one (backtest's
``KafkaRange``, the demo)."""
