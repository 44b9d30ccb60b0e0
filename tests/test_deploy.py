"""The Dockerfile and the Kubernetes manifests agree with the proxy and with each other."""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from proxy import __version__

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "configs" / "kubernetes").glob("*.yaml"))
DEFAULT_PORT, DEFAULT_GRACE = 8080, 30


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def find(items: list[dict], what: str, **match) -> dict:
    """The first item whose keys have these values, or a failure naming what is missing."""
    found = next((i for i in items if all(i.get(k) == v for k, v in match.items())), None)
    assert found is not None, f"no {what} with {match}"
    return found


def port_of(container: dict, port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    return port if isinstance(port, int) else find(container.get("ports", []), "container port", name=port)["containerPort"]


def pre_stop_sleep(container: dict) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


@dataclass
class ProxyPod:
    """A Deployment's pod as the proxy container in it sees it."""

    name: str
    pod: dict
    proxy: dict  # the container run with --config
    others: list[dict]
    config_path: str  # the --config argument
    config_text: str  # that file, from the ConfigMap mounted at its directory
    config: dict
    port: int  # --port, else listen.port, else 8080
    services: list[dict]  # the Services that select the pod
    replicas: int
    docs: list[dict]  # every document of the manifest

    @property
    def drain(self) -> int:
        """Seconds from the pod's deletion until the proxy has exited at the latest."""
        return pre_stop_sleep(self.proxy) + self.config.get("shutdown_grace", DEFAULT_GRACE) + 1  # design.md 5.10: a second past the grace


def proxy_pods(path: Path) -> list[ProxyPod]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    found = []
    for deploy in (d for d in docs if d["kind"] == "Deployment"):
        name, pod = deploy["metadata"]["name"], deploy["spec"]["template"]["spec"]
        proxies = [c for c in pod["containers"] if "--config" in c.get("args", [])]
        if not proxies and not any("responses-proxy" in c.get("image", "") for c in pod["containers"]):
            continue  # a Deployment of something else (the gateway's Redis)
        assert len(proxies) == 1, f"{name}: exactly one container should run the proxy with --config"
        proxy = proxies[0]
        assert proxy.get("command") in (None, ["responses-proxy"]), f"{name}: command replaces the image's ENTRYPOINT"
        config_path = flag(proxy["args"], "--config")
        mount = find(proxy.get("volumeMounts", []), "proxy volume mount", mountPath=posixpath.dirname(config_path))
        volume = find(pod.get("volumes", []), "pod volume", name=mount["name"])
        cm_name, key = volume["configMap"]["name"], posixpath.basename(config_path)
        assert key in configmaps.get(cm_name, {}), f"{name}: no ConfigMap {cm_name} with key {key} (--config {config_path})"
        config = yaml.safe_load(configmaps[cm_name][key])
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        found.append(ProxyPod(
            replicas=deploy["spec"].get("replicas", 1),
            docs=docs,
            name=name, pod=pod, proxy=proxy, others=[c for c in pod["containers"] if c is not proxy],
            config_path=config_path, config_text=configmaps[cm_name][key], config=config,
            port=int(flag(proxy["args"], "--port") or config.get("listen", {}).get("port", DEFAULT_PORT)),
            services=[d for d in docs if d["kind"] == "Service" and d["spec"]["selector"].items() <= labels.items()],
        ))
    assert found, f"{path.name} has no Deployment"
    return found


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_proxy(path: Path, tmp_path: Path) -> None:
    for p in proxy_pods(path):
        assert p.port in [c["containerPort"] for c in p.proxy.get("ports", [])], f"{p.name}: no containerPort {p.port}"
        for probe, want in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
            get = p.proxy[probe]["httpGet"]
            assert (get["path"], port_of(p.proxy, get["port"])) == (want, p.port), f"{p.name}: {probe}"
        assert p.services, f"{p.name}: no Service selects the pod"
        for service in p.services:
            targets = {port_of(p.proxy, s.get("targetPort", s["port"])) for s in service["spec"]["ports"]}
            assert targets == {p.port}, f"Service {service['metadata']['name']} targets {targets}, not only {p.port}"
        grace = p.pod["terminationGracePeriodSeconds"]
        assert grace > p.drain, f"{p.name}: terminationGracePeriodSeconds {grace} <= preStop + shutdown_grace {p.drain}"

        config_file = tmp_path / f"{p.name}.yaml"
        config_file.write_text(p.config_text)
        check = subprocess.run(
            [sys.executable, "-m", "proxy", "--check-config", str(config_file)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert check.returncode == 0, f"{p.name}: --check-config failed:\n{check.stdout}{check.stderr}"


def test_sidecar_reaches_its_backend_over_loopback() -> None:
    (p,) = proxy_pods(ROOT / "configs" / "kubernetes" / "sidecar.yaml")
    (backend,) = p.others
    (backend_port,) = [c["containerPort"] for c in backend["ports"]]
    assert int(flag(backend["args"], "--port")) == backend_port
    assert backend["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert port_of(backend, backend["readinessProbe"]["httpGet"]["port"]) == backend_port
    startup = backend["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model loading needs minutes"
    urls = [url for upstream in p.config["upstreams"] for url in upstream["urls"]]
    assert urls and all(url.rstrip("/") == f"http://127.0.0.1:{backend_port}" for url in urls), urls
    # SGLang must keep serving until the proxy has drained its streams, and exit within the grace period.
    assert p.drain <= pre_stop_sleep(backend) < p.pod["terminationGracePeriodSeconds"]


def test_dockerfile_matches_manifests() -> None:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z]+)\s+(.*)$", text, re.M)}
    assert instructions["EXPOSE"] == str(DEFAULT_PORT)
    assert f"127.0.0.1:{DEFAULT_PORT}/health" in instructions["HEALTHCHECK"]
    assert json.loads(instructions["ENTRYPOINT"]) == ["responses-proxy"]
    assert yaml.safe_load((ROOT / "configs" / "proxy.yaml").read_text()).get("listen", {}).get("port", DEFAULT_PORT) == DEFAULT_PORT
    option, config_path = json.loads(instructions["CMD"])
    assert option == "--config"
    for path in MANIFESTS:
        for p in proxy_pods(path):
            assert p.config_path == config_path, f"{path.name}: --config {p.config_path} != Dockerfile CMD {config_path}"
            # The image tag the manifests run is the version the package says it is (design.md 12.2).
            assert p.proxy["image"].rsplit(":", 1)[1] == __version__, f"{path.name}: {p.proxy['image']}"
    assert set(re.findall(r"responses-proxy:(\S+) ", text)) == {__version__}, "the Dockerfile's docker build and run lines"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_stored_responses_have_a_place_that_every_replica_shares(path: Path) -> None:
    """design.md 9.1: a SQLite store needs a writable volume (the root filesystem is read-only)
    and serves one replica; replicas share a Redis that the manifest serves."""
    for p in proxy_pods(path):
        url = p.config.get("store", {}).get("url", "")
        if url.startswith("sqlite:"):
            assert p.replicas == 1, f"{p.name}: {p.replicas} replicas with a store each cannot chain each other's responses"
            directory = posixpath.dirname(url.removeprefix("sqlite:"))
            mounts = [m["mountPath"] for m in p.proxy.get("volumeMounts", []) if not m.get("readOnly")]
            assert directory in mounts, f"{p.name}: {directory} is not a writable volume"
        elif url.startswith("redis+cluster://"):
            assert_a_cluster_the_manifest_makes(p, url.removeprefix("redis+cluster://").split(","), path.name)
        else:
            match = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", url)
            assert match, f"{p.name}: store.url {url!r} is neither sqlite:PATH, redis://HOST:PORT/DB nor redis+cluster://"
            host, port = match.groups()
            services = [d for d in p.docs if d["kind"] == "Service" and d["metadata"]["name"] == host.split(".")[0]]
            assert services, f"{p.name}: no Service {host} in {path.name}"
            assert int(port) in [s["port"] for s in services[0]["spec"]["ports"]]


def assert_a_cluster_the_manifest_makes(p: ProxyPod, nodes: list[str], manifest: str) -> None:
    """design.md 9.9: `redis+cluster://` names pods of a StatefulSet of cluster-enabled Redis
    by their stable names under its headless Service, three primaries and a replica each, each
    node announcing that name; a Job makes them a cluster, naming every pod."""
    for node in nodes:
        match = re.fullmatch(r"([a-z0-9-]+)-(\d+)\.([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", node)
        assert match, f"{p.name}: {node!r} is not a StatefulSet pod's name under its Service"
        name, _, service, namespace, port = match.groups()
        sets = [d for d in p.docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
        assert sets, f"{p.name}: no StatefulSet {name} in {manifest}"
        spec = sets[0]["spec"]
        assert spec["serviceName"] == service and sets[0]["metadata"]["namespace"] == namespace
        assert spec["replicas"] >= 6, "three primaries and a replica of each"
        (redis,) = spec["template"]["spec"]["containers"]
        assert flag(redis["args"], "--cluster-enabled") == "yes"
        assert flag(redis["args"], "--cluster-announce-hostname") == f"$(POD_NAME).{service}.{namespace}.svc.cluster.local"
        headless = next(d for d in p.docs if d["kind"] == "Service" and d["metadata"]["name"] == service)
        assert headless["spec"]["clusterIP"] == "None" and int(port) in [s["port"] for s in headless["spec"]["ports"]]
        jobs = [d for d in p.docs if d["kind"] == "Job"]
        created = " ".join(" ".join(c["command"]) for job in jobs for c in job["spec"]["template"]["spec"]["containers"])
        assert "--cluster create" in created and "--cluster-replicas 1" in created
        pods = {f"{name}-{i}.{service}.{namespace}.svc.cluster.local:{port}" for i in range(spec["replicas"])}
        assert pods <= set(created.split()), f"the Job makes a cluster of every pod of {name}"


def _sample_names() -> set[str]:
    """Every sample name the proxy's metrics can show, labelled or not yet."""
    from proxy.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for family in Metrics().registry.collect() for suffix in suffixes[family.type]}


def test_the_grafana_dashboard_shows_only_metrics_the_proxy_has() -> None:
    """design.md 12.2: a renamed metric would leave a panel empty without a word."""
    dashboard = json.loads((ROOT / "configs" / "grafana" / "responses-proxy.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(?:proxy|gen_ai)_[a-z_]+", expr)}
    assert used - _sample_names() == set()
    shown = {"proxy_requests_total", "proxy_upstream_errors_total", "gen_ai_server_time_to_first_token_seconds_bucket", "proxy_output_tokens_total", "proxy_streams_in_flight", "proxy_store_errors_total", "proxy_session_routes_total"}
    assert shown <= used  # requests, errors, TTFT, tokens/s, streams, store errors, affinity
