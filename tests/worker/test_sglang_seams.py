"""The SGLang seams (zipkv.worker.engines.sglang.seams.SEAMS) against the real SGLang 0.5.17 source.

With sglang importable, signatures come from `inspect`; otherwise from the SGLang source tree named by
ZIPKV_SGLANG_SRC (the folder that holds ``sglang/``, e.g. an unzipped wheel), parsed with `ast`. Without
either the check skips: CI cannot install sglang (its torch pin pulls a multi-GB CUDA build).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
from pathlib import Path

import pytest

from zipkv.worker.engines.sglang import plugin as sglang_plugin
from zipkv.worker.engines.sglang.seams import SEAMS, SGLANG_VERSION, Seam

REPO = Path(__file__).resolve().parents[2]
SRC_ENV = "ZIPKV_SGLANG_SRC"
SGLANG_DIR = REPO / "worker" / "engines" / "sglang"


def _ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    out = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return tuple(out)


def _inspect_params(obj: object) -> tuple[str, ...]:
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function
    out: list[str] = []
    star = False
    for p in inspect.signature(obj).parameters.values():  # type: ignore[arg-type]
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.KEYWORD_ONLY and not star:
            out += ["*", p.name]
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name)
    return tuple(out)


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        hits = [n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        match = [n for n in hits if n.name == part]
        if not match:
            return None
        node = match[-1]  # the last definition wins, as at import
    return node


def _class_fields(cls: ast.ClassDef) -> set[str]:
    """Class-level names (dataclass fields, class attributes) and ``self.<name> = ...`` in its methods."""
    names: set[str] = set()
    for n in cls.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for n in ast.walk(fn):
            targets = (
                n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            )
            names.update(
                t.attr
                for t in targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            )
    return names


def check_seam_ast(seam: Seam, src: Path) -> list[str]:
    """Mismatches of one seam against the source tree (empty when it holds)."""
    path = src / (seam.module.replace(".", "/") + ".py")
    if not path.exists():
        path = src / seam.module.replace(".", "/") / "__init__.py"
    if not path.exists():
        return [f"{seam.module}: module not found under {src}"]
    node = _find(ast.parse(path.read_text()), seam.qualname)
    if node is None:
        return [f"{seam.module}.{seam.qualname}: not defined"]
    problems = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if _ast_params(node) != seam.params:
            problems.append(f"{seam.qualname}: expected {seam.params}, found {_ast_params(node)}")
    elif seam.fields:
        assert isinstance(node, ast.ClassDef)
        missing = set(seam.fields) - _class_fields(node)
        if missing:
            problems.append(f"{seam.qualname}: fields {sorted(missing)} no longer declared")
    return problems


def check_seam_inspect(seam: Seam) -> list[str]:
    module = importlib.import_module(seam.module)
    obj: object = module
    for part in seam.qualname.split("."):
        if not hasattr(obj, part):
            return [f"{seam.module}.{seam.qualname}: not defined"]
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    obj = obj.__func__ if isinstance(obj, staticmethod | classmethod) else obj
    if seam.fields:
        assert isinstance(obj, type)
        declared = {n for c in obj.__mro__ for n in (*getattr(c, "__annotations__", {}), *vars(c))}
        missing = set(seam.fields) - declared
        return [f"{seam.qualname}: fields {sorted(missing)} no longer declared"] if missing else []
    found = _inspect_params(obj)
    return [] if found == seam.params else [f"{seam.qualname}: expected {seam.params}, found {found}"]


def _source() -> Path | None:
    src = os.environ.get(SRC_ENV)
    if not src:
        return None
    path = Path(src)
    if not (path / "sglang").is_dir():
        pytest.fail(
            f"{SRC_ENV}={src} has no sglang/ folder: point it at an unzipped sglang=={SGLANG_VERSION} wheel"
        )
    return path


def _sglang_importable() -> bool:
    return importlib.util.find_spec("sglang") is not None


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.qualname)
def test_seam_matches_sglang(seam: Seam) -> None:
    if _sglang_importable():
        assert check_seam_inspect(seam) == []
        return
    src = _source()
    if src is None:
        pytest.skip(
            f"sglang is not installed and {SRC_ENV} is unset: unzip the sglang=={SGLANG_VERSION} wheel "
            f"(pip download --no-deps sglang=={SGLANG_VERSION}) and set {SRC_ENV} to that folder"
        )
    assert check_seam_ast(seam, src) == []


def test_source_tree_is_the_pinned_version() -> None:
    src = _source()
    if src is None:
        pytest.skip(f"{SRC_ENV} is unset")
    info = list(src.glob("sglang-*.dist-info"))
    if info:
        assert info[0].name == f"sglang-{SGLANG_VERSION}.dist-info"


def test_a_changed_signature_is_caught() -> None:
    src = _source()
    if src is None and not _sglang_importable():
        pytest.skip(f"needs sglang or {SRC_ENV}")
    seam = next(s for s in SEAMS if s.qualname == "KVCacheConfigurator._build_mha_kv_pool")
    moved = Seam(
        seam.module, seam.qualname, ("self", "max_total_num_tokens", "mha_pool_class", "quant_method")
    )
    gone = Seam(seam.module, "KVCacheConfigurator._build_kv_pool_that_never_was", ("self",))
    field = Seam(
        "sglang.srt.model_executor.forward_batch_info", "ForwardBatch", fields=("seq_lens_gpu_only",)
    )
    check = check_seam_inspect if src is None else (lambda s: check_seam_ast(s, src))
    for wrong in (moved, gone, field):
        assert check(wrong), f"{wrong} should not match sglang {SGLANG_VERSION}"


def test_seam_table_parses_every_row() -> None:
    assert len(SEAMS) >= 30
    for seam in SEAMS:
        assert seam.module.startswith("sglang.") and seam.qualname
        assert all(re.fullmatch(r"(\*{0,2})[A-Za-z_]\w*|\*", p) for p in seam.params), seam


# The seams, and the SGLang subclasses that only the seams import (on demand, once SGLang is importable).
SGLANG_IMPORTERS = ("seams.py", "kv_pool.py", "backend.py")


def test_only_the_seams_module_imports_sglang() -> None:
    pattern = re.compile(r"^\s*(import sglang|from sglang)", re.M)
    for path in sorted((REPO / "worker").rglob("*.py")):
        if path.parent == SGLANG_DIR and path.name in SGLANG_IMPORTERS:
            continue
        assert not pattern.search(path.read_text()), f"{path.name} imports sglang: go through the seams"
    subclasses = re.compile(r"zipkv\.worker\.engines\.sglang\.(kv_pool|backend) import")
    importers = {p.name for p in (REPO / "worker").rglob("*.py") if subclasses.search(p.read_text())}
    assert importers == {"seams.py", "backend.py"}  # backend.py builds on kv_pool.py's pool class


def test_plugin_refuses_other_versions() -> None:
    with pytest.raises(
        sglang_plugin.UnsupportedSGLang, match=r"supports sglang==0\.5\.17 only.*found sglang 0\.5\.18"
    ):
        sglang_plugin.check_sglang_version("0.5.18")
    assert sglang_plugin.check_sglang_version("0.5.17") == "0.5.17"


def test_plugin_without_sglang_says_what_to_install() -> None:
    if _sglang_importable():
        pytest.skip("sglang is installed here")
    with pytest.raises(sglang_plugin.UnsupportedSGLang, match=r"pip install 'zipkv\[sglang\]'"):
        sglang_plugin.register()
    assert not sglang_plugin._registered  # a refused register leaves nothing half-installed


def test_entry_point_is_declared() -> None:
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "zipkv"]
    if not eps:
        pytest.skip("zipkv is not installed as a distribution here (pip install -e .)")
    assert eps[0].value == "zipkv.worker.engines.sglang.plugin:register"
    assert eps[0].load() is sglang_plugin.register


def _view_of_required_attrs() -> set[str]:
    """Attributes ``view_of`` reads from a batch as ``fb.X`` (not through ``getattr`` with a default)."""
    tree = ast.parse((SGLANG_DIR / "backend.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "view_of")
    return {
        n.attr
        for n in ast.walk(fn)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "fb"
    }


def test_view_of_reads_only_what_the_graph_replay_view_has() -> None:
    """The decode CUDA graph hands the backend a SimpleNamespace, not a ForwardBatch (seen on the H200:
    ``extend_prefix_lens_cpu`` missing at the first replay). Everything view_of reads must be in it."""
    src = _source()
    if src is None:
        pytest.skip(f"set {SRC_ENV} to an unzipped sglang=={SGLANG_VERSION} wheel")
    path = src / "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
    fn = _find(ast.parse(path.read_text()), "build_replay_fb_view")
    assert isinstance(fn, ast.FunctionDef), "build_replay_fb_view is gone: re-check the replay seam"
    calls = [
        n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "SimpleNamespace"
    ]
    offered = {k.arg for c in calls for k in c.keywords}
    missing = _view_of_required_attrs() - offered
    assert not missing, f"view_of reads {sorted(missing)}, which the replay view lacks"


def test_tensor_parallelism_is_accepted_and_other_parallelism_refused() -> None:
    from types import SimpleNamespace

    from zipkv.worker.engines.sglang.backend_choice import zipkv_backend

    def args(**kw: object) -> SimpleNamespace:
        base: dict[str, object] = dict(page_size=16, tp_size=1, pp_size=1, enable_dp_attention=False,
                                       kv_cache_dtype="auto")  # fmt: skip
        return SimpleNamespace(get_attention_backends=lambda: ("zipkv", "zipkv"), **{**base, **kw})

    assert zipkv_backend(args()) == "zipkv"
    assert zipkv_backend(args(tp_size=2)) == "zipkv"  # each rank its own heads (seams._build_mha_kv_pool)
    for bad in ({"enable_dp_attention": True, "tp_size": 2}, {"pp_size": 2}, {"tp_size": 0}):
        with pytest.raises(ValueError, match="tensor parallelism only"):
            zipkv_backend(args(**bad))
