"""tools/offline: the wheelhouse for a TPU VM without network, and its installer (docs/installing.md).

The fast tests check what goes in (every pin from uv.lock, for the VM's Python rather than this machine's;
nothing the VM provides; no CUDA package), torch_tpu's repacking, and an install of titanpod's own wheels with
``--no-index`` into a stand-in VM that provides torch. The slow test builds the whole wheelhouse, installs it
the same way and trains on the xla lane with the VM's JAX.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.markers import Marker

from tests.workspace.offline_vm import OFFLINE_TOOLS, REPO_ROOT, build_wheelhouse, install, make_vm, site_packages

LEFT_OUT = {"jax", "jaxlib", "libtpu", "numpy", "torch"}
CUDA = re.compile(r"^(nvidia-|cuda-|triton$)")


@pytest.fixture
def tools(monkeypatch):
    """The modules of tools/offline, imported as its scripts import each other."""
    monkeypatch.syspath_prepend(str(OFFLINE_TOOLS))
    import build_wheelhouse
    import lock_requirements
    import target_markers
    import torch_tpu_glue

    return build_wheelhouse, lock_requirements, target_markers, torch_tpu_glue


def lock_versions() -> dict[str, set[str]]:
    versions: dict[str, set[str]] = {}
    for package in tomllib.loads((REPO_ROOT / "uv.lock").read_text())["package"]:
        versions.setdefault(package["name"], set()).add(package.get("version"))
    return versions


def test_markers_are_evaluated_for_the_vm_as_packaging_evaluates_them(tools):
    _, _, markers, _ = tools
    locks = [REPO_ROOT / "uv.lock", *sorted(REPO_ROOT.glob("envs/*/uv.lock"))]
    found = {m for lock in locks for m in re.findall(r'marker = "([^"]+)"', lock.read_text()) if "extra" not in m}
    assert len(found) > 20
    for python, machine in [("3.11", "x86_64"), ("3.12", "x86_64"), ("3.13", "aarch64")]:
        target = markers.Target(python, machine)
        environment = {**target.variables(), "platform_release": "", "platform_version": ""}
        for marker in found:
            assert markers.evaluate(marker, target) == Marker(marker).evaluate(environment), (marker, python)
    with pytest.raises(ValueError, match="platform_node"):
        markers.evaluate("platform_node == 'vm'", markers.Target())


def test_the_pins_are_the_locks_for_the_vm_without_what_it_provides(tools):
    builder, requirements, markers, _ = tools
    members = list(requirements.member_extras())
    provided = list(builder.VM_PROVIDES)
    pins = requirements.third_party_pins(members, builder.DEFAULT_EXTRAS, provided, markers.Target("3.11"), False)
    names = {pin.name: pin.version for pin in pins}
    locked = lock_versions()
    assert all(version in locked[name] for name, version in names.items())
    # The xla lane's and the apps' own packages are in; jax and what only jax needs (scipy, opt-einsum) are not.
    assert {"torchax", "tyro", "orbax-checkpoint", "datasets", "safetensors", "ml-dtypes"} <= set(names)
    assert not (LEFT_OUT | {"scipy", "opt-einsum"}) & set(names)
    assert not [name for name in names if CUDA.match(name)]
    assert not [name for name in names if name.startswith("titanpod")]
    # The markers are the VM's: contourpy is locked as 1.3.3 for Python 3.11 and 1.4.0 from 3.12.
    assert names["contourpy"] == "1.3.3"
    on_312 = requirements.third_party_pins(members, builder.DEFAULT_EXTRAS, provided, markers.Target("3.12"), False)
    assert {pin.name: pin.version for pin in on_312}["contourpy"] == "1.4.0"
    # With torch's CPU build in: torch and its own requirements, still no CUDA package.
    with_torch = {pin.name for pin in requirements.third_party_pins(members, [], provided, markers.Target(), True)}
    assert {"torch", "sympy", "networkx"} <= with_torch
    assert not [name for name in with_torch if CUDA.match(name)]


def test_torch_tpu_keeps_one_torch_releases_glue_and_a_record_of_what_is_left(tools, tmp_path):
    _, _, _, glue = tools
    files = {
        "torch_tpu/__init__.py": b"",
        "torch_tpu/glue_2_11_0/lib.so": b"x" * 100,
        "torch_tpu/glue_2_13_0/lib.so": b"y" * 100,
        "torch_tpu/lib/tpu_torch_compile_2_12_0.so": b"z" * 100,
        "torch_tpu/lib/tpu_torch_compile_2_13_0.so": b"w" * 100,
    }
    record = "".join(f"{name},sha256=x,100\n" for name in files) + "torch_tpu-0.2.0.dist-info/RECORD,,\n"
    wheel = tmp_path / "torch_tpu-0.2.0-cp311-cp311-manylinux_2_31_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in {**files, "torch_tpu-0.2.0.dist-info/RECORD": record.encode()}.items():
            archive.writestr(name, data)
    out = tmp_path / "out" / wheel.name
    out.parent.mkdir()
    assert glue.keep_one_release(wheel, out, torch_minor=13) == (4, 2)
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
        kept_record = archive.read("torch_tpu-0.2.0.dist-info/RECORD").decode()
        assert archive.testzip() is None
    assert "torch_tpu/glue_2_13_0/lib.so" in names and "torch_tpu/lib/tpu_torch_compile_2_13_0.so" in names
    assert not [name for name in names if "2_11_0" in name or "2_12_0" in name]
    assert [line.split(",")[0] for line in kept_record.splitlines()] == [
        n for n in names if not n.endswith("RECORD")
    ] + ["torch_tpu-0.2.0.dist-info/RECORD"]
    with pytest.raises(SystemExit, match=r"no glue for torch 2\.14"):
        glue.keep_one_release(wheel, tmp_path / "none.whl", torch_minor=14)


def test_a_vm_has_name_the_lock_does_not_hold_is_refused_before_any_work(tools, tmp_path):
    builder = tools[0]
    out = tmp_path / "wheelhouse"
    refused = r"'tensortore', which titanpod's lock does not hold; did you mean tensorstore"
    with pytest.raises(SystemExit, match=refused):
        builder.main([str(out), "--vm-has", "tensorstore,Tensortore"])
    assert not out.exists()  # nothing built, nothing downloaded
    args = builder.parse_args(["x", "--vm-has", "Orbax_Checkpoint, huggingface.hub"])
    assert args.vm_has == ["orbax-checkpoint", "huggingface-hub"]  # named as the lock names them
    builder.check_vm_has(args.vm_has, builder.locked_for_target(builder.Target("3.11", "x86_64")))


def test_the_installer_names_a_folder_that_is_not_there_before_it_makes_anything(tmp_path):
    def installer(*flags: str) -> subprocess.CompletedProcess[str]:
        command = ["python3", str(OFFLINE_TOOLS / "install_wheelhouse.py"), "--venv", str(tmp_path / "venv"), *flags]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    done = installer("--wheelhouse", str(tmp_path))
    assert done.returncode == 1 and f"{tmp_path} is not a wheelhouse (no manifest.json)" in done.stderr
    (tmp_path / "manifest.json").write_text("{}")
    done = installer("--wheelhouse", str(tmp_path), "--find-links", str(tmp_path / "torch-wheels"))
    assert done.returncode == 1 and f"--find-links {tmp_path / 'torch-wheels'} is not a folder" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_torch_tpu_brings_its_own_small_requirements_pinned_by_the_tpu_lanes_lock(tools):
    builder, _, markers, _ = tools
    have = {"tensorboard", "absl-py"}
    needs = {pin.name: pin.version for pin in builder.torch_tpu_needs(markers.Target(), have)}
    assert {"pyzmq", "portpicker", "immutabledict", "frozendict"} <= set(needs)
    assert not (LEFT_OUT | have | {"torch-tpu"}) & set(needs)
    tpu_lock = tomllib.loads((REPO_ROOT / "envs/tpu/uv.lock").read_text())["package"]
    assert all(any(p["name"] == name and p["version"] == v for p in tpu_lock) for name, v in needs.items())


@pytest.fixture
def installer(monkeypatch):
    """tools/offline/install_wheelhouse.py, imported as a module."""
    monkeypatch.syspath_prepend(str(OFFLINE_TOOLS))
    import install_wheelhouse

    return install_wheelhouse


def fake_torch_tpu_wheelhouse(folder: Path) -> dict:
    """A wheelhouse folder whose torch_tpu wheel holds only metadata asking for libtpu>=0.0.50; its manifest."""
    (folder / "wheels").mkdir(parents=True)
    requires = ["numpy>=2", "libtpu>=0.0.50", "pyzmq>=27", "torch>=2.11.0,<=2.15.0"]
    metadata = "Metadata-Version: 2.1\nName: torch_tpu\nVersion: 0.2.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(folder / "wheels" / "torch_tpu-0.2.0-cp311-cp311-manylinux_2_31_x86_64.whl", "w") as wheel:
        wheel.writestr("torch_tpu-0.2.0.dist-info/METADATA", metadata)
    return {"install": ["titanpod-device[xla]", "torch-tpu"]}


def test_torch_tpu_beside_an_older_libtpu_stays_out_unless_asked_then_goes_in_without_that_requirement(
    installer, tmp_path, capsys
):
    manifest = fake_torch_tpu_wheelhouse(tmp_path)
    plan = installer.torch_tpu_plan
    asked, not_asked = (installer.parse_args(f) for f in (["--torch-tpu-on-older-libtpu"], []))
    # A libtpu as new as torch_tpu asks for (or none to compare): the manifest installs as it is.
    assert plan(manifest, tmp_path, {"libtpu": "0.0.52"}, not_asked) is None
    assert plan(manifest, tmp_path, {"libtpu": "0.0.50"}, not_asked) is None
    assert plan(manifest, tmp_path, {}, not_asked) is None
    assert plan({"install": ["titanpod-device[xla]"]}, tmp_path, {"libtpu": "0.0.42.1"}, not_asked) is None
    # An older one (as on a v5e VM image): left out, saying why and both ways on.
    assert plan(manifest, tmp_path, {"libtpu": "0.0.42.1"}, not_asked) == []
    said = capsys.readouterr().out
    assert "asks for libtpu>=0.0.50; this VM has libtpu 0.0.42.1" in said
    assert "--torch-tpu-on-older-libtpu" in said and "newer libtpu" in said
    # Asked for: its other requirements first, then torch_tpu alone.
    assert plan(manifest, tmp_path, {"libtpu": "0.0.42.1"}, asked) == [
        "numpy>=2",
        "pyzmq>=27",
        "torch>=2.11.0,<=2.15.0",
    ]
    assert "--kernels.attention math" in capsys.readouterr().out


def test_an_environment_with_torch_tpu_beside_an_older_libtpu_reports_its_version_in_three_parts(installer, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(
        installer.run_json(python, "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))")["purelib"]
    )
    for name in ("libtpu", "jaxlib"):
        (site / f"{name}-0.0.42.1.dist-info").mkdir()
        (site / f"{name}-0.0.42.1.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: 0.0.42.1\n")
    read = "import importlib.metadata as m; print(m.version('libtpu'), m.version('jaxlib'))"
    before = subprocess.run([str(python), "-c", read], capture_output=True, text=True, check=False, timeout=60)
    installer.report_libtpu_in_three_parts(python)
    after = subprocess.run([str(python), "-c", read], capture_output=True, text=True, check=True, timeout=60)
    assert before.stdout.split() == ["0.0.42.1", "0.0.42.1"]
    assert after.stdout.split() == ["0.0.42", "0.0.42.1"]  # every other package keeps its own


def test_titanpods_wheels_install_with_no_index_beside_the_vms_torch(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    # titanpod-device and titanpod-models need torch, which the VM provides, and packaging (a small pure-Python
    # wheel, the one third-party download).
    manifest = build_wheelhouse(
        wheelhouse, "--package", "titanpod-device", "--package", "titanpod-models", "--extras", ""
    )
    assert manifest["install"] == ["titanpod-device", "titanpod-models"]
    wheels = {wheel["name"] for wheel in manifest["wheels"]}
    assert wheels == {f"titanpod-{name}" for name in ("device", "models", "parallel", "kernels", "graph", "checkpoint",
                                                      "data", "recipes", "runs", "rl", "pretrain", "diffusion",
                                                      "posttrain")} | {"packaging"}  # fmt: skip
    assert sorted(path.name for path in (wheelhouse / "wheels").iterdir()) == sorted(
        w["file"] for w in manifest["wheels"]
    )
    provided = {package["name"]: package for package in manifest["provided"]}
    assert set(provided) == LEFT_OUT
    assert provided["torch"]["locked"] in lock_versions()["torch"] and "sympy" in provided["torch"]["requires"]
    assert "torch" in (wheelhouse / "MANIFEST.txt").read_text()

    # A VM without torch is told what is missing and how to get it, before pip runs.
    bare = make_vm(tmp_path / "bare", ["numpy"])
    refused = install(bare, wheelhouse, "--allow-missing", "libtpu")
    assert refused.returncode != 0
    assert "torch" in refused.stderr and "--find-links" in refused.stderr and "jax" in refused.stderr

    vm = make_vm(tmp_path, ["jax", "torch"])
    done = install(vm, wheelhouse, "--allow-missing", "libtpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "titanpod-pretrain --device.lane xla" in done.stdout
    probe = (
        "import json, titanpod.device, titanpod.models, torch; "
        "print(json.dumps([titanpod.device.__file__, titanpod.models.__file__, torch.__file__]))"
    )
    result = subprocess.run([str(vm), "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    device, models, torch = (Path(path) for path in json.loads(result.stdout.splitlines()[-1]))
    own = site_packages(vm.parent.parent)
    assert device.is_relative_to(own) and models.is_relative_to(own)
    # torch is the VM's: pip installed none of what the VM provides into the environment.
    assert not torch.is_relative_to(own)
    assert not [path.name for path in own.iterdir() if path.name.split("-")[0] in {"torch", "jax", "numpy"}]


@pytest.mark.slow
def test_the_whole_wheelhouse_installs_offline_and_trains_on_the_xla_lane(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    manifest = build_wheelhouse(wheelhouse)
    names = {wheel["name"]: wheel["version"] for wheel in manifest["wheels"]}
    assert not LEFT_OUT & set(names) and not [name for name in names if CUDA.match(name)]
    locked = lock_versions()
    assert all(version in locked[name] for name, version in names.items() if not name.startswith("titanpod"))
    total = sum(path.stat().st_size for path in (wheelhouse / "wheels").iterdir())
    assert total == manifest["total_bytes"]
    assert 50e6 < total < 300e6, f"{total / 1e6:.1f} MB"

    vm = make_vm(tmp_path, ["jax", "torch"])
    done = install(vm, wheelhouse, "--allow-missing", "libtpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = tmp_path / "runs"
    train = subprocess.run(
        [str(vm.parent / "titanpod-pretrain"), "--device.lane", "xla", "--train.steps", "2", "--output.runs-dir",
         str(runs), "--output.run-name", "offline", "--output.no-tensorboard"],
        capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu",
             "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (runs / "offline" / "model" / "model.safetensors").is_file()
    assert json.loads((runs / "offline" / "recipe.json").read_text())["device"]["lane"] == "xla"
    assert "jax.jit" in train.stdout
