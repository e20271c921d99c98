# syntax=docker/dockerfile:1
# Swarm API: one image for every process (serve, worker, migrate, simulator, the client commands).
#
#   docker build -t swarm-api .
#   docker run -p 8000:8000 -e SWARM_API_KEYS=demo:demo-key swarm-api
#
# `serve` refuses to bind 0.0.0.0 without SWARM_API_KEYS (exit code 2) unless SWARM_ALLOW_OPEN=1.
# With no SWARM_DATABASE_URL it uses SQLite at /app/swarm.db and, with no SWARM_GATEWAY_URL, the
# built-in simulator in-process: a self-contained demo. Production: see docs/OPERATIONS.md.
#
# tests/ops/test_image.py emulates this build without a container engine: it installs exactly the
# paths the COPY lines below take into a fresh virtualenv and runs the commands from outside the
# checkout. A path the distribution needs must be COPY'd here, or that test fails.

# ---- build: the distribution (app + swarm_api_client) installed, not editable, into a venv ---
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv

WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY swarm_api_client ./swarm_api_client
# pip's cache lives in a BuildKit cache mount: a code change rebuilds in seconds, and no cache
# reaches a layer. Non-editable: the final image holds no source tree to point back to.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install . \
 && pip check

# ---- runtime: the venv and the Alembic scripts; no compilers, no pip cache, no source ------
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    SWARM_MIGRATIONS_DIR=/app/migrations
# SWARM_MIGRATIONS_DIR (a setting): by default app/db/migrate.py looks for <repo>/migrations next
# to its own source file, which after a non-editable install is in site-packages; the Alembic
# scripts are copied to /app/migrations below instead.

# A numeric user (Kubernetes' runAsNonRoot can check a number, not a name) with no login shell.
RUN groupadd --system --gid 10001 swarm \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin swarm

COPY --from=build /opt/venv /opt/venv

# The working directory: the Alembic scripts (read-only, root's) and, when no database URL is
# set, the embedded SQLite file, for which the directory itself belongs to the service user.
WORKDIR /app
COPY migrations ./migrations
RUN chown 10001:10001 /app

USER 10001:10001
EXPOSE 8000

# No curl in slim: ask /healthz with the standard library (urlopen raises on non-2xx).
# Processes without HTTP (worker, migrate) turn this off in docker-compose.yml.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# Exec form: swarm-api is PID 1 and gets SIGTERM directly (graceful shutdown, see OPERATIONS.md).
CMD ["swarm-api", "serve", "--host", "0.0.0.0", "--port", "8000"]
