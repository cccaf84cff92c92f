"""deploy/: the Dockerfile and the Kubernetes manifests agree with the code they run: the probed
paths are routes the app serves, ports and config paths match, the config in the ConfigMap loads,
and the stop sequence (preStop, drain, grace period) fits the config's shutdown_timeout."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.api import admin
from gateway.cli import _parser
from gateway.config import load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"


def _manifest(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((K8S / name).read_text())
    assert isinstance(doc, dict)
    return doc


def _dockerfile() -> dict[str, list[str]]:
    """Instructions by keyword, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.setdefault(keyword.upper(), []).append(rest.strip())
    return out


def _container() -> dict[str, Any]:
    containers = _manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _serve_args(args: list[str]) -> Any:
    return _parser().parse_args(["serve", *args])


def _health_paths() -> set[str]:
    return {r.path for r in admin.routes() if r.path == "/health"}  # type: ignore[attr-defined]


@pytest.fixture
def configmap_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ConfigMap's config.yaml, loaded by the real loader (model files made tiny here)."""
    text = _manifest("configmap.yaml")["data"]["config.yaml"]
    for path in set(re.findall(r"/models/[\w.-]+\.gguf", text)):
        write_tiny_llama(tmp_path / Path(path).name, seed=3)
    monkeypatch.setenv("GPU_API_KEY", "sk-test")  # the Deployment sets it from a Secret
    monkeypatch.setenv("MODELYARD_ADMIN_KEY", "admin-test")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text.replace("/models/", f"{tmp_path}/"))
    return load_config(config_file)


def test_the_dockerfile_runs_as_a_non_root_user_and_checks_health() -> None:
    d = _dockerfile()
    user = d["USER"][-1].split(":")[0]
    assert user not in ("root", "0")
    assert d["EXPOSE"] == ["8080"]
    check = d["HEALTHCHECK"][0]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)'", check)
    assert url is not None and url.group(1) == "8080" and url.group(2) in _health_paths()
    [entry] = yaml.safe_load(d["ENTRYPOINT"][0])  # a JSON array: the entrypoint script alone
    copies = {c.split()[-1]: c.split()[0] for c in d["COPY"]}
    assert copies[f"/usr/local/bin/{entry}"] == "deploy/entrypoint.sh"  # on the image's PATH
    assert "CMD" not in d  # no arguments: the script chooses (tests below)


def test_the_image_warms_up_the_default_model_as_its_own_user() -> None:
    """`modelyard warmup` runs at build time after USER, so the kernels and the default model
    land in MODELYARD_CACHE owned by the user that serves (the cache is chowned to it)."""
    text = (DEPLOY / "Dockerfile").read_text()
    runs = _dockerfile()["RUN"]
    assert "modelyard warmup" in runs
    assert text.index("USER 10001") < text.index("RUN modelyard warmup")
    assert any('chown modelyard:modelyard "$MODELYARD_CACHE"' in r for r in runs)
    args = _parser().parse_args(["warmup"])
    assert args.models == [] and args.config is None  # no arguments: the default model


def _entrypoint(tmp_path: Path, *args: str, config: bool = False,
                models: bool = False) -> tuple[list[str], str]:
    """Run deploy/entrypoint.sh with a stand-in `modelyard` that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "modelyard"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    (tmp_path / "models").mkdir(exist_ok=True)
    if models:
        write_tiny_llama(tmp_path / "models" / "tiny.gguf", seed=2)
    if config:
        (tmp_path / "config.yaml").write_text("models: []\n")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               MODELYARD_CONFIG=str(tmp_path / "config.yaml"),
               MODELYARD_MODELS=str(tmp_path / "models"))
    done = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), done.stderr


def test_docker_run_with_a_models_folder_serves_it_with_no_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`docker run -p 8080:8080 -v ~/models:/models IMAGE`: the folder, watched, on 0.0.0.0,
    and that command really starts (the admin routes closed, not a refusal)."""
    argv, _ = _entrypoint(tmp_path, models=True)
    assert argv[0] == "serve"
    args = _serve_args(argv[1:])
    assert (str(args.models_dir), args.host, args.port, args.config) == (
        str(tmp_path / "models"), "0.0.0.0", "8080", None)
    import gateway.cli as cli

    seen: list[Any] = []

    async def fake_serve(config: Any, socks: Any, *rest: Any) -> None:
        for sock in socks:
            sock.close()
        seen.append(config)

    monkeypatch.setattr(cli, "_serve", fake_serve)
    assert cli.main([*argv[:-2], "--port", "0"]) == 0  # the same command, on a free port
    assert [e.model.name for e in seen[0].models] == ["tiny.gguf"]
    assert seen[0].auth.admin_closed


def test_a_mounted_config_wins_and_arguments_replace_the_choice(tmp_path: Path) -> None:
    argv, _ = _entrypoint(tmp_path, config=True, models=True)
    args = _serve_args(argv[1:])
    assert (str(args.config), args.host, args.port) == (str(tmp_path / "config.yaml"),
                                                        "0.0.0.0", "8080")
    k8s = _container()["args"]  # the Deployment passes serve's arguments
    argv, _ = _entrypoint(tmp_path, *k8s, config=True)
    assert argv == ["serve", *k8s]


def test_with_nothing_mounted_it_serves_the_default_model(tmp_path: Path) -> None:
    argv, err = _entrypoint(tmp_path)
    args = _serve_args(argv[1:])
    assert (args.models, args.models_dir, args.config, args.host) == ([], None, None, "0.0.0.0")
    assert "serving the default model" in err


def test_the_deployment_probes_health_on_the_port_the_server_listens_on() -> None:
    c = _container()
    args = _serve_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(args.port)}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in _health_paths() and get["port"] == "http", probe
    assert args.watch, "the ConfigMap reloads only if the config file is watched"
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    pod = _manifest("deployment.yaml")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_config_comes_from_the_configmap_as_a_directory_that_updates(
        configmap_config: Any) -> None:
    c = _container()
    config_path = Path(str(_serve_args(c["args"]).config))
    pod = _manifest("deployment.yaml")["spec"]["template"]["spec"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert "subPath" not in mount  # subPath mounts never see ConfigMap updates
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = _manifest("configmap.yaml")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_path.name in configmap["data"]
    # the config itself: it loads, and listens where the pod's port says
    assert configmap_config.port == int(_serve_args(c["args"]).port)
    assert configmap_config.upstreams and configmap_config.models
    secret_env = {e["name"] for e in c.get("env", []) if "valueFrom" in e}
    text = configmap["data"]["config.yaml"]
    assert set(re.findall(r"\$\{(\w+)", text)) <= secret_env  # every ${VAR} is provided


def test_the_grace_period_covers_the_prestop_sleep_and_the_drain(configmap_config: Any) -> None:
    c = _container()
    pod = _manifest("deployment.yaml")["spec"]["template"]["spec"]
    command = shlex.join(c["lifecycle"]["preStop"]["exec"]["command"])
    sleep = re.search(r"sleep\((\d+(?:\.\d+)?)\)|sleep (\d+)", command)
    assert sleep is not None
    pre_stop = float(sleep.group(1) or sleep.group(2))
    drain = configmap_config.shutdown_timeout
    assert pre_stop >= c["readinessProbe"]["periodSeconds"]  # out of the Service before SIGTERM
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5


def test_the_service_selects_the_pods_and_targets_their_port() -> None:
    service = _manifest("service.yaml")["spec"]
    labels = _manifest("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    names = {p["name"] for p in _container()["ports"]}
    assert all(p["targetPort"] in names for p in service["ports"])
