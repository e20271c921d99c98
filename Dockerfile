# Swarm API: one image for every process of docker-compose.yml (serve, worker, migrate, simulator).
#
#   docker build -t swarm-api .
#   docker run -p 8000:8000 -e SWARM_API_KEYS=demo:demo-key swarm-api
#
# `serve` refuses to bind 0.0.0.0 without SWARM_API_KEYS (exit code 2) unless SWARM_ALLOW_OPEN=1.
# With no SWARM_DATABASE_URL it uses SQLite at /app/swarm.db and, with no SWARM_GATEWAY_URL, the
# built-in simulator in-process: a self-contained demo. Production: see docs/OPERATIONS.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    SWARM_MIGRATIONS_DIR=/app/migrations
# SWARM_MIGRATIONS_DIR (a setting): by default app/db/migrate.py looks for <repo>/migrations next to its own source
# file, which after a (non-editable) install is in site-packages; the Alembic scripts are copied
# to /app/migrations below instead.

RUN groupadd --system --gid 10001 swarm \
 && useradd --system --uid 10001 --gid swarm --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin swarm

WORKDIR /src
# Dependencies in their own layer: install the project once from a stub package to pull every
# dependency, then drop the stub; a code change below does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir app && touch app/__init__.py \
 && pip install --no-cache-dir . \
 && pip uninstall --yes swarm-api \
 && rm -rf app build ./*.egg-info

COPY app ./app
RUN pip install --no-cache-dir --no-deps . \
 && cd / && rm -rf /src

# The runtime directory: Alembic scripts (read-only) and, when no database URL is set, the
# embedded SQLite file; the directory itself is writable by the service user for that.
WORKDIR /app
COPY migrations ./migrations
RUN chown swarm:swarm /app

USER swarm
EXPOSE 8000

# No curl in slim: ask /healthz with the standard library (urlopen raises on non-2xx).
# Processes without HTTP (worker, migrate) turn this off in docker-compose.yml.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# Exec form: swarm-api is PID 1 and gets SIGTERM directly (graceful shutdown, see OPERATIONS.md).
CMD ["swarm-api", "serve", "--host", "0.0.0.0", "--port", "8000"]
