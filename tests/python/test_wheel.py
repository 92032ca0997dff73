"""The memory_tracer wheel as pip and its users meet it: a manylinux tag, torch required as a
lower bound only, the capture libraries (as built, never repaired) and the collector inside,
and a real install, dependencies resolved, into an environment that already has torch: that
torch stays as it was, and the installed `memory-tracer` traces a program with it.

The wheel is $MEMORY_TRACER_WHEEL (`cargo xtask test` sets it), else the newest in
target/wheels/ (`cargo xtask wheel`)."""

import glob
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One step of a small model (allocations in named modules, an optimizer step), saying where
# the memory_tracer package it was given comes from.
PROGRAM = """
import memory_tracer, torch
print("package", memory_tracer.__file__)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(32, 64)).square().mean().backward()
opt.step()
print("stepped", torch.__version__)
"""


@pytest.fixture(scope="module")
def wheel():
    path = os.environ.get("MEMORY_TRACER_WHEEL")
    if not path:
        found = sorted(glob.glob(os.path.join(ROOT, "target", "wheels", "memory_tracer-*.whl")), key=os.path.getmtime)
        assert found, "no wheel: set MEMORY_TRACER_WHEEL or run `cargo xtask wheel` (target/wheels/)"
        path = found[-1]
    with zipfile.ZipFile(path) as z:
        yield path, z


def dist_info(z, name):
    (found,) = [n for n in z.namelist() if re.fullmatch(r"memory_tracer-[^/]+\.dist-info/" + name, n)]
    return z.read(found).decode()


def clean_env():
    """The environment of a user's shell: none of the test run's package paths or overrides."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "MEMORY_TRACER_PYTHONPATH", "MEMORY_TRACER_COLLECTOR", "VIRTUAL_ENV", "PIP_FIND_LINKS"):
        env.pop(key, None)
    return env


def test_the_wheel_is_tagged_manylinux(wheel):
    path, z = wheel
    tags = [line.split(":", 1)[1].strip() for line in dist_info(z, "WHEEL").splitlines() if line.startswith("Tag:")]
    assert tags, "WHEEL names no tag"
    for tag in tags:
        py, abi, platform = tag.split("-")
        assert (py, abi) == ("py3", "none"), f"{tag}: the package is for any Python 3 (a binary, no extension module)"
        assert re.fullmatch(r"manylinux(_2_\d+|2014)_x86_64", platform), f"{tag}: expected a manylinux platform, which pip accepts on ordinary Linux"
    # The file name carries the same platforms (what pip reads before it opens the wheel).
    name_platforms = os.path.basename(path)[: -len(".whl")].split("-")[-1].split(".")
    assert sorted(name_platforms) == sorted(t.split("-")[2] for t in tags)


def test_torch_is_a_lower_bound_never_a_pin(wheel):
    _, z = wheel
    requires = [line.split(":", 1)[1].strip() for line in dist_info(z, "METADATA").splitlines() if line.startswith("Requires-Dist:")]
    assert "torch>=2.6" in requires, requires
    specifiers = [r.split(";", 1)[0] for r in requires]
    assert not [r for r in specifiers if "==" in r], f"a pinned requirement would make pip replace the user's torch: {requires}"
    # Everything else is optional: an extra (notebook, tensorboard, pandas, polars, mcp).
    assert [r for r in requires if r != "torch>=2.6" and "extra ==" not in r] == [], requires
    extras = sorted({r.rsplit("extra ==", 1)[1].strip(" '\"") for r in requires if "extra ==" in r})
    assert extras == ["mcp", "notebook", "pandas", "polars", "tensorboard"], extras


def test_the_wheel_holds_the_captures_the_sources_and_the_collector(wheel):
    _, z = wheel
    names = z.namelist()
    captures = [n for n in names if re.fullmatch(r"memory_tracer/_lib/\d+\.\d+/libmt_shim\.so", n)]
    minor = ".".join(torch.__version__.split(".")[:2])
    assert f"memory_tracer/_lib/{minor}/libmt_shim.so" in captures, f"no capture for torch {minor} (the one these tests run): {captures}"
    for name in ("memory_tracer/_lib/SUPPORTED", "memory_tracer/_src/mt_shim.cpp", "memory_tracer/_src/mt_shim.h", "memory_tracer/__init__.py"):
        assert name in names
    # Data files, not repaired: nothing bundled, and each capture still asks for the libtorch of
    # the torch it is loaded into (a repaired one would name a renamed copy).
    assert not [n for n in names if ".libs/" in n], "maturin bundled libraries into the wheel"
    for n in captures:
        data = z.read(n)
        assert data[:4] == b"\x7fELF" and b"\0libtorch_cpu.so\0" in data and b"\0libc10.so\0" in data, n
    scripts = {n.rsplit("/", 1)[1]: n for n in names if re.fullmatch(r"memory_tracer-[^/]+\.data/scripts/[^/]+", n)}
    assert sorted(scripts) == ["collector"]
    assert z.read(scripts["collector"])[:4] == b"\x7fELF"
    assert (z.getinfo(scripts["collector"]).external_attr >> 16) & 0o111, "the collector is not executable"
    # `memory-tracer`, the launcher pip writes (maturin takes no console script beside a binary).
    assert "memory-tracer=memory_tracer.__main__:main" in dist_info(z, "entry_points.txt").replace(" ", "")


def test_pip_install_keeps_the_torch_and_memory_tracer_traces_with_it(wheel, tmp_path):
    path, _ = wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = clean_env()
    # This venv has the test run's torch installed, as a user's would (a .pth line: no copy).
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True, env=env).strip()
    torch_site = os.path.dirname(os.path.dirname(torch.__file__))
    with open(os.path.join(purelib, "users-torch.pth"), "w") as f:
        f.write(torch_site + "\n")
    which_torch = [python, "-c", "import torch; print(torch.__version__, torch.__file__)"]
    before = subprocess.check_output(which_torch, text=True, env=env).strip()
    assert before == f"{torch.__version__} {torch.__file__}"

    # Dependencies resolved (no --no-deps) and no index: a torch requirement the installed torch
    # does not meet fails here instead of downloading another torch.
    report = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--report", str(report), path],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    installed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installed == ["memory_tracer"], f"pip installed {installed}; only memory_tracer was expected"
    assert subprocess.check_output(which_torch, text=True, env=env).strip() == before, "installing the wheel changed the torch"
    assert not os.path.exists(os.path.join(purelib, "torch")), "pip put a torch into the venv"

    # The console script runs the wheel's collector, which gives the program the installed
    # package (not the collector's own copy) and its capture for this torch (no build on
    # first use).
    out = tmp_path / "run.mtrace.json"
    r = subprocess.run(
        [str(venv / "bin" / "memory-tracer"), "trace", "-q", "-o", str(out), "--", python, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert f"stepped {torch.__version__}" in r.stdout
    assert f"package {os.path.join(purelib, 'memory_tracer', '__init__.py')}" in r.stdout, r.stdout
    assert "building the capture" not in r.stderr, r.stderr
    stats = subprocess.run([str(venv / "bin" / "collector"), "summary", str(out)], capture_output=True, text=True, env=env)
    assert stats.returncode == 0, stats.stderr
    for layer in ("Sequential.0", "Sequential.2", "optimizer.step"):
        assert re.search(rf"^\s*{re.escape(layer)}\s", stats.stdout, re.M), f"layer {layer} missing from the summary:\n{stats.stdout}"
