"""Operations tooling for loopwatch: Grafana dashboards as code (``python -m streams.ops.dashboards``)."""
