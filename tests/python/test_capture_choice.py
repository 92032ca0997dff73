"""Which capture library a process loads, and the build on first use, against the torch of the
Python running the tests (2.6, 2.11 and 2.15 in CI): the installed package carries a library
built for this torch's minor version; a torch it has none for gets one built from `_src/` into
a cache that survives cut files and concurrent first runs; a failing compiler is reported with
its last lines; a torch older than every supported release is refused."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from memory_tracer import _build, _shim

TORCH = _shim.installed_torch()


def test_the_package_carries_a_library_for_this_torch():
    version, _, _ = TORCH
    major, minor, _ = _shim.parse_version(version)
    carried = _shim.carried()
    assert f"{major}.{minor}" in carried, f"no library for torch {version} in {carried}"
    assert carried[f"{major}.{minor}"].split(".")[:2] == [str(major), str(minor)]
    choice = _shim.choose(*TORCH)
    assert choice.path == os.path.join(_shim.LIB_DIR, f"{major}.{minor}", "libmt_shim.so"), choice.how
    # Built with the C++ ABI this torch was built with, as torch itself says.
    import torch

    assert _build.cxx11_abi(TORCH[2]) == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert _build.library_abi(choice.path) == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # Every supported release is carried (the wheel is built with all of them).
    assert sorted(carried.values()) == sorted(_shim.supported()), (carried, _shim.supported())


@pytest.mark.parametrize(
    "version, release",
    [
        ("2.11.0", True),
        ("2.15.0+cu132", True),
        ("2.6.0+cpu", True),
        ("2.16.0.dev20261101+cu130", False),
        ("2.12.0a0+git3f2a1b7", False),
        ("2.13.0rc2", False),
        ("unknown", False),
    ],
)
def test_only_releases_load_a_prebuilt_library(version, release):
    assert _shim.is_release(version) is release


def test_a_torch_older_than_every_supported_release_is_refused(tmp_path):
    choice = _shim.choose("2.5.1+cu124", None, str(tmp_path))
    assert choice.path is None and choice.refused
    assert "2.5.1+cu124" in choice.refused and f"{_shim.supported()[0]} to {_shim.supported()[-1]}" in choice.refused
    assert _shim.check_torch_version("1.13.1") is not None
    assert _shim.check_torch_version(TORCH[0]) is None


@pytest.fixture(scope="module")
def first_build(tmp_path_factory):
    """One build on first use into a fresh cache, timed by the progress line it prints."""
    root = str(tmp_path_factory.mktemp("capture-cache"))
    said = []
    version, git, folder = TORCH
    lib = _build.cached_build(folder, version + ".test", git, _shim.SRC_DIR, progress=said.append, root=root)
    return root, lib, said


def test_a_torch_without_a_library_gets_one_built_on_first_use_and_cached(first_build):
    root, lib, said = first_build
    version, git, folder = TORCH
    assert len(said) == 1 and said[0].startswith(f"building the capture for torch {version}.test, once")
    assert os.path.isfile(lib) and os.path.getsize(lib) > 10_000
    info = json.load(open(os.path.join(os.path.dirname(lib), "build.json")))
    assert info["torch_version"] == version + ".test" and info["sha256"] == _build.file_hash(lib)
    again = []
    assert _build.cached_build(folder, version + ".test", git, _shim.SRC_DIR, progress=again.append, root=root) == lib
    assert again == [], "a valid cached library is not built again"
    # It loads into this torch and records: load it in a child with the shim's own binding.
    code = f"import torch, ctypes, sys; sys.path.insert(0, {os.path.dirname(os.path.dirname(_shim.__file__))!r}); from memory_tracer import _shim; lib = _shim.load({lib!r}); print(lib.mt_reset(100, 100, 0, 0), lib.mt_now_ns() > 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["0", "True"], out.stderr


def test_a_cut_cached_library_is_rebuilt_never_loaded(first_build):
    root, lib, _ = first_build
    version, git, folder = TORCH
    data = open(lib, "rb").read()
    with open(lib, "wb") as f:
        f.write(data[: len(data) // 2])
    said = []
    assert _build.cached_build(folder, version + ".test", git, _shim.SRC_DIR, progress=said.append, root=root) == lib
    assert len(said) == 1, "the cut file was rebuilt"
    assert open(lib, "rb").read() != data[: len(data) // 2] and _build._valid(lib, os.path.join(os.path.dirname(lib), "build.json"))


def test_concurrent_first_runs_build_once(tmp_path):
    """Two processes (two ranks starting together) ask for the same missing library: one
    builds, the other waits on the lock and loads the same file."""
    version, git, folder = TORCH
    pkg = os.path.dirname(os.path.dirname(_shim.__file__))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {pkg!r})
        from memory_tracer import _build, _shim
        said = []
        lib = _build.cached_build({folder!r}, {version!r} + ".race", {git!r}, _shim.SRC_DIR, progress=said.append, root={str(tmp_path)!r})
        print(len(said), lib)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    built = sorted(int(o[0].split()[0]) for o in outs)
    assert built == [0, 1], f"exactly one of the two built: {outs}"
    assert outs[0][0].split()[1] == outs[1][0].split()[1]


def test_a_failing_compiler_is_reported_with_its_last_lines(tmp_path, monkeypatch):
    fake = tmp_path / "fake-c++"
    fake.write_text("#!/bin/sh\nfor i in $(seq 1 40); do echo \"line $i\"; done\necho 'mt_shim.cpp:1: error: this compiler is broken on purpose' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    version, git, folder = TORCH
    with pytest.raises(_build.BuildError) as e:
        _build.cached_build(folder, version + ".broken", git, _shim.SRC_DIR, root=str(tmp_path / "cache"))
    msg = str(e.value)
    assert "fake-c++ failed (exit 1)" in msg and "broken on purpose" in msg and "line 40" in msg
    assert "line 1\n" not in msg, "only the last lines"
    # Nothing half-built is left to load.
    entry = os.listdir(tmp_path / "cache")[0]
    assert not os.path.exists(tmp_path / "cache" / entry / "libmt_shim.so")
    # choose() turns it into the recorder fallback's reason.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    pkg = os.path.dirname(os.path.dirname(_shim.__file__))
    code = f"import sys; sys.path.insert(0, {pkg!r}); from memory_tracer import _shim; c = _shim.choose('9.9.0', None, {folder!r}); print(c.path, '|', c.fallback)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path, reason = out.stdout.split("|", 1)
    assert path.strip() == "None" and "no capture library for torch 9.9.0, and building one failed" in reason and "broken on purpose" in reason


def test_packaging_builds_are_kept_and_reused_by_what_decides_their_bytes(tmp_path, monkeypatch):
    """`record/build.rs` builds every release's library through `--cache-dir`: a second build
    with the same sources, compiler and torch copies the kept library (no compiler run), a
    cut kept library is compiled again, and other sources are another entry."""
    calls = tmp_path / "calls"
    wrapper = tmp_path / "counting-c++"
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = --version ] || echo x >> {calls}\nexec {_build.find_compiler()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    _, _, folder = TORCH
    cache = tmp_path / "cache"
    compiled = lambda: len(calls.read_text().splitlines()) if calls.exists() else 0  # noqa: E731
    first, second = str(tmp_path / "a" / "libmt_shim.so"), str(tmp_path / "b" / "libmt_shim.so")
    _build.build_cached(folder, _shim.SRC_DIR, first, str(cache))
    assert compiled() == 1 and len(os.listdir(cache)) == 1
    _build.build_cached(folder, _shim.SRC_DIR, second, str(cache))
    assert compiled() == 1, "the kept library was compiled again"
    assert open(first, "rb").read() == open(second, "rb").read() and os.access(second, os.X_OK)
    kept = cache / os.listdir(cache)[0] / "libmt_shim.so"
    kept.write_bytes(kept.read_bytes()[:1000])
    _build.build_cached(folder, _shim.SRC_DIR, second, str(cache))
    assert compiled() == 2, "a cut kept library is never copied"
    assert open(second, "rb").read() == open(first, "rb").read()
    # Other sources: another key.
    src = tmp_path / "src"
    src.mkdir()
    for name in _build.SOURCES:
        (src / name).write_bytes(open(os.path.join(_shim.SRC_DIR, name), "rb").read() + b"\n// changed\n")
    compiler = _build.find_compiler()
    assert _build.build_key(folder, str(src), compiler) != _build.build_key(folder, _shim.SRC_DIR, compiler)
