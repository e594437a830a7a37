# loopwatch worker image (ghcr.io/loopwatch/loopwatch), used by helm/loopwatch.
#   docker build -t ghcr.io/loopwatch/loopwatch:0.1.0 .
#   docker run --rm -e LOOPWATCH_BOOTSTRAP=kafka:9092 ghcr.io/loopwatch/loopwatch:0.1.0
FROM python:3.11-slim

LABEL org.opencontainers.image.title="loopwatch" \
      org.opencontainers.image.description="Central tool-loop detection for fleets of AI agent runners" \
      org.opencontainers.image.source="https://github.com/loopwatch/loopwatch" \
      org.opencontainers.image.licenses="MIT"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs: no tests, venvs or caches end up in the image.  The image runs the
# worker, so it installs the worker extra (the base install is what a runner needs).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas/ schemas/
COPY streams/ streams/
RUN pip install '.[worker]' \
 && rm -rf /src \
 && groupadd --system --gid 10001 loopwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/loopwatch \
        --shell /usr/sbin/nologin loopwatch \
 && mkdir -p /var/lib/loopwatch /etc/loopwatch \
 && chown loopwatch:loopwatch /var/lib/loopwatch

WORKDIR /var/lib/loopwatch
# RocksDB state lives in a volume; web (/healthz, /readyz only) and metrics (/metrics only) listen on
# all interfaces inside the container.
ENV LOOPWATCH_DATA_DIR=/var/lib/loopwatch \
    LOOPWATCH_WEB_HOST=0.0.0.0
VOLUME ["/var/lib/loopwatch"]
EXPOSE 6066 9108

USER 10001:10001
ENTRYPOINT ["loopwatch"]
CMD ["worker"]
