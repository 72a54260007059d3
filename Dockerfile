# syntax=docker/dockerfile:1
# The ftjob operator image: `ftjob operator` with pyproject.toml's base dependencies only (no torch).
#   docker build -t ghcr.io/ftjob/operator:0.1.0 .        (from the repository root)
# tests/chart/test_images.py runs this file's build-stage RUN steps in a fresh virtual environment.

# Python 3.11 matches requirements/operator.txt (resolved for 3.11).
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VENV=/opt/ftjob
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/operator.txt requirements/operator.txt
COPY operator/ftjob_operator operator/ftjob_operator
COPY trainer_image/ftjob_trainer trainer_image/ftjob_trainer
COPY localcluster/ftjob_local localcluster/ftjob_local
# A non-editable install of the base dependencies, pinned by the lock; no extras, so no torch.
RUN python -m venv "$VENV" \
    && "$VENV/bin/python" -m pip install --no-cache-dir --constraint requirements/operator.txt .

FROM python:3.11.11-slim-bookworm
ENV PATH=/opt/ftjob/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/ftjob /opt/ftjob
# A numeric non-root user, so the kubelet can verify runAsNonRoot without a runAsUser.
RUN groupadd --system --gid 10001 ftjob \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin ftjob
USER 10001:10001
EXPOSE 8080
# Exec form: the operator is PID 1 and gets SIGTERM itself (kopf stops gracefully on it).
ENTRYPOINT ["ftjob", "operator"]
