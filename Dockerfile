# syntax=docker/dockerfile:1
# One image for every agent group: `docker run IMAGE worker <group>` (default: worker code).
#   docker build -t avcc:latest .
#   docker run --rm -e AVCC_KAFKA_URL=kafka://broker:9092 \
#       -e AVCC_WEB_ADVERTISED_URL='http://<this container's address>:{port}' -p 6067:6067 avcc:latest worker code
# The image listens on every interface (AVCC_WEB_HOST=0.0.0.0), so each worker must announce an
# address its peers can reach (AVCC_WEB_ADVERTISED_URL); it refuses to start with a wildcard.
# Kubernetes manifests: deploy/k8s (rendered by deploy/render.py).

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: `pip install .` into a virtualenv (compilers only live in this stage) ----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/avcc
ENV PATH=/opt/avcc/bin:$PATH
WORKDIR /src
# Dependencies first (cached while only the sources change).
COPY pyproject.toml setup.cfg README.m[d] ./
RUN mkdir -p app agents tables schemas \
    && touch app/__init__.py agents/__init__.py tables/__init__.py schemas/__init__.py \
    && pip install . \
    && pip uninstall -y avcc-pipeline
COPY app ./app
COPY agents ./agents
COPY tables ./tables
COPY schemas ./schemas
RUN pip install --no-deps . && python -m compileall -q /opt/avcc/lib

# ---- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="avcc-pipeline" \
      org.opencontainers.image.description="AIGC-Hub AVCC event pipeline workers (faust agent groups)"
ENV PATH=/opt/avcc/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AVCC_DATA_DIR=/var/lib/avcc \
    AVCC_WEB_HOST=0.0.0.0
RUN groupadd --system --gid 10001 avcc \
    && useradd --system --uid 10001 --gid avcc --home-dir /var/lib/avcc --no-create-home \
       --shell /usr/sbin/nologin avcc \
    && mkdir -p /var/lib/avcc \
    && chown avcc:avcc /var/lib/avcc
COPY --from=build /opt/avcc /opt/avcc
USER 10001:10001
WORKDIR /var/lib/avcc
# Worker web ports: AVCC_WEB_PORT (6066, ops console) + the group's offset (app/groups.py).
EXPOSE 6066-6074
STOPSIGNAL SIGTERM
ENTRYPOINT ["avcc"]
CMD ["worker", "code"]
