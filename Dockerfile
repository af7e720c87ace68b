# locstatus: one image for the sidecar (`serve`), the CLI and jobs (`check`, `locations sync`)
# and the demo workers (`python -m locstatus.demo.worker`). See docs/deploy.md.
#
#   docker build -t locstatus:local .
#   docker run --rm locstatus:local --help
#   docker run --rm -e LOCSTATUS_API_TOKEN=s3cret -p 127.0.0.1:8080:8080 \
#       locstatus:local --backend zk://zk1:2181/locstatus serve --host 0.0.0.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package build needs (pyproject's readme is README.md); the sources are removed
# once installed, so the image holds the installed package and nothing else of the repository.
COPY pyproject.toml README.md /tmp/src/
COPY locstatus /tmp/src/locstatus
RUN pip install "/tmp/src[zk,mongo,server]" \
    && rm -rf /tmp/src \
    && groupadd --system --gid 10001 locstatus \
    && useradd --system --uid 10001 --gid locstatus --create-home --home-dir /home/locstatus \
        --shell /usr/sbin/nologin locstatus \
    && locstatus --version

# Non-root; numeric so that orchestrators can check runAsNonRoot. The home directory is the
# working directory, so the embedded default store (sqlite:///./locstatus.db) is writable.
USER 10001:10001
WORKDIR /home/locstatus

# The sidecar's port (`serve --port`, default 8080). Healthchecks live in docker-compose.yml:
# the same image also runs workers and jobs, which serve no HTTP.
EXPOSE 8080

ENTRYPOINT ["locstatus"]
CMD ["--help"]
