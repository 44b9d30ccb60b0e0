# responses-proxy: OpenAI Responses API in front of SGLang / vLLM.
#   docker build -t responses-proxy:0.2.0 .
#   docker run --rm -p 8080:8080 responses-proxy:0.2.0 --upstream http://host.docker.internal:30000
# The default config (configs/proxy.yaml, SGLang at 127.0.0.1:30000) is baked in at
# /etc/responses-proxy/proxy.yaml; Kubernetes mounts a ConfigMap over that directory.
# The image installs the wheel, built as `make wheel` builds it, never the source tree: what runs
# here is what `pip install responses-proxy` runs (tests/installed/test_image.py mirrors it).
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=wheel /dist /dist
COPY configs/proxy.yaml /etc/responses-proxy/proxy.yaml
RUN pip install --no-cache-dir /dist/*.whl \
    && rm -r /dist \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin proxy \
    && install -d -o 10001 -g 10001 /var/lib/responses-proxy

USER 10001:10001
# The default store (sqlite:state/responses.db) is relative to the working directory: it lands
# in this volume. Mount one that outlives the container to keep responses across restarts.
WORKDIR /var/lib/responses-proxy
VOLUME /var/lib/responses-proxy
EXPOSE 8080

# No curl in slim images: probe /health with the interpreter that runs the proxy.
HEALTHCHECK --interval=15s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]

ENTRYPOINT ["responses-proxy"]
CMD ["--config", "/etc/responses-proxy/proxy.yaml"]
