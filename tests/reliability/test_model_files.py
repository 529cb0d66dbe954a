"""Model files from untrusted paths: refused with a clear error, never executed.

The format is .npz of number arrays plus a JSON document, read with allow_pickle=False. These
tests plant pickles that would create a marker file if anything unpickled them, damage valid
files byte by byte, and check the same through the CLI (`serve --model`, `score --model`).
"""

from __future__ import annotations

import ast
import json
import pickle
import random
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import model_from_config
from eacgm_detector.persist import SavedModel, load_model, save_model

REPO = Path(__file__).resolve().parents[2]
CLI = [str(REPO / ".venv/bin/otel-eacgm"), "detector"]


class _Plant:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def valid_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    cfg = DetectorConfig(max_components=2, warmup_windows=10)
    path = tmp_path_factory.mktemp("model") / "good.npz"
    save_model(path, SavedModel(model_from_config(cfg).fit(X), ["a", "b", "c"], 10.0))
    return path


def _pickle_bearing_files(directory: Path, marker: Path, valid: Path) -> dict[str, Path]:
    out = {}
    raw = directory / "raw_pickle.npz"  # a bare pickle with the model's name
    raw.write_bytes(pickle.dumps(_Plant(marker)))
    out["bare pickle"] = raw
    obj = directory / "object_meta.npz"  # meta as a pickled object array
    np.savez(obj, meta=np.array([_Plant(marker)], dtype=object))
    out["object meta"] = obj
    swapped = directory / "object_array.npz"  # a valid model with one array replaced by a pickle
    with np.load(valid) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["center_"] = np.array([_Plant(marker)], dtype=object)
    np.savez(swapped, **arrays)
    out["object array"] = swapped
    npy = directory / "single.npz"  # a .npy (not an archive) holding a pickle
    np.save(npy.with_suffix(".npy"), np.array([_Plant(marker)], dtype=object), allow_pickle=True)
    npy.write_bytes(npy.with_suffix(".npy").read_bytes())
    out["object npy"] = npy
    return out


def test_pickle_bearing_model_files_are_refused_and_never_run(tmp_path: Path, valid_model: Path) -> None:
    marker = tmp_path / "pwned"
    # The plant works: unpickling it does create the marker (so its absence below means something).
    pickle.loads(pickle.dumps(_Plant(marker)))
    assert marker.exists()
    marker.unlink()
    for what, path in _pickle_bearing_files(tmp_path, marker, valid_model).items():
        with pytest.raises(ValueError, match=str(path)):
            load_model(path)
        assert not marker.exists(), f"{what}: code ran while loading"
        for cmd in (["serve", "--listen", "127.0.0.1:0", "--model", str(path)],
                    ["score", "--model", str(path), "--input", str(tmp_path / "x.csv"), "--output", str(tmp_path / "o.csv")]):
            proc = subprocess.run([*CLI, *cmd], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2 and str(path) in proc.stderr, (what, cmd, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr
            assert not marker.exists(), f"{what}: code ran in `detector {cmd[0]}`"


def _rewrite(valid: Path, out: Path, meta_edit=None, arrays_edit=None) -> Path:  # noqa: ANN001
    with np.load(valid) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    meta = meta_edit(meta) if meta_edit else meta
    if arrays_edit:
        arrays_edit(arrays)
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    return out


@pytest.mark.parametrize("name,meta_edit,arrays_edit", [
    ("meta_list", lambda m: [m], None),
    ("meta_number", lambda m: 7, None),
    ("unknown_param", lambda m: {**m, "params": {**m["params"], "evil": 1}}, None),
    ("params_list", lambda m: {**m, "params": [1]}, None),
    ("no_features", lambda m: {**m, "feature_names": []}, None),
    ("feature_types", lambda m: {**m, "feature_names": [1, 2, 3]}, None),
    ("components_text", lambda m: {**m, "n_components": "2"}, None),
    ("threshold_nan", lambda m: {**m, "threshold": float("nan")}, None),
    ("threshold_text", lambda m: {**m, "threshold": "low"}, None),
    ("window_negative", lambda m: {**m, "window_s": -1}, None),
    ("missing_array", None, lambda a: a.pop("mixture.means_")),
    ("wrong_shape", None, lambda a: a.__setitem__("center_", np.zeros(7))),
    ("nan_means", None, lambda a: a.__setitem__("mixture.means_", a["mixture.means_"] * np.nan)),
    ("text_array", None, lambda a: a.__setitem__("scale_", np.array(["x", "y", "z"]))),
])
def test_damaged_model_files_are_refused_with_the_path_named(tmp_path, valid_model, name, meta_edit, arrays_edit) -> None:  # noqa: ANN001
    path = _rewrite(valid_model, tmp_path / f"{name}.npz", meta_edit, arrays_edit)
    with pytest.raises(ValueError, match=str(path)):
        load_model(path)


def test_byte_damaged_model_files_load_or_are_refused(tmp_path: Path, valid_model: Path) -> None:
    """500 random corruptions of a valid file: a model that scores, or ValueError; nothing else."""
    good = valid_model.read_bytes()
    rng = random.Random(7)
    refused = loaded = 0
    for i in range(500):
        buf = bytearray(good)
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(3) if buf else 2
            pos = rng.randrange(len(buf)) if buf else 0
            if op == 0:
                buf[pos] ^= 1 << rng.randrange(8)
            elif op == 1:
                del buf[pos:]
            else:
                buf[pos:pos] = rng.randbytes(rng.randrange(1, 8))
        path = tmp_path / f"damaged{i}.npz"
        path.write_bytes(bytes(buf))
        try:
            model = load_model(path)
        except ValueError:
            refused += 1
            continue
        scores = model.detector.score_samples(np.zeros((2, len(model.feature_names))))
        assert scores.shape == (2,)
        loaded += 1
    print(f"model file damage: {refused} refused, {loaded} loaded and scored")
    assert refused > 250


def test_no_code_path_unpickles() -> None:
    """Every np.load passes allow_pickle=False; no pickle/joblib anywhere in the package code."""
    for src in [*(REPO / "detector").glob("*.py"), *(REPO / "otel_eacgm").rglob("*.py")]:
        tree = ast.parse(src.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "joblib", "dill", "cloudpickle", "shelve"} & {n.split(".")[0] for n in names}, src
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and \
                    getattr(node.func.value, "id", None) in ("np", "numpy"):
                kw = {k.arg: k.value for k in node.keywords}
                assert "allow_pickle" in kw and isinstance(kw["allow_pickle"], ast.Constant) \
                    and kw["allow_pickle"].value is False, f"{src}:{node.lineno}: np.load without allow_pickle=False"


def test_zip_bomb_sized_member_is_not_a_model(tmp_path: Path) -> None:
    """A member that inflates to hundreds of MiB is read as an array of the wrong shape: refused."""
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("meta.npy", "w") as fh:
            np.lib.format.write_array(fh, np.array(json.dumps({"format": "eacgm-detector-model", "version": 1})))
        with z.open("center_.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array(fh, np.zeros(40_000_000))
    assert path.stat().st_size < 2_000_000
    with pytest.raises(ValueError, match=str(path)):
        load_model(path)
