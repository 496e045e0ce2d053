"""``torch.compile(model, backend="adaptune", options={...})``: a Dynamo backend that tunes and compiles.

Dynamo hands each graph it captures to ``adaptune_backend`` as an FX GraphModule whose parameters
and buffers arrive as inputs.  The backend folds those into constants (so the library path sees
constant weights), imports the graph with the PyTorch frontend, tunes it into its own folder of
``work_dir`` (keyed by the graph's code and input signature), builds the fastest checked build
(``compile.build_best``) and returns a callable that runs it on torch tensors through DLPack.
The folder keeps the final build's per-chain choice, so a second call with the same work dir
rebuilds from the records and measures nothing.  A graph adaptune cannot import or compile runs
eagerly, with one warning line; graph breaks are Dynamo's, their pieces run eagerly as always.

torch's own ``tvm`` backend imports Relay, which TVM 0.27 no longer has.  Inference only: the
compiled graph computes no gradients.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

OPTIONS = {"trials": 64, "work_dir": "runs/dynamo", "strategy": "chameleon", "target": None, "library": True,
           "spaces": "auto"}
CHOICE = "compiled.json"        # the final build's per-chain choice, in a graph's folder


def _weight_positions(gm, example_inputs) -> list[int]:
    """The inputs that are the module's parameters and buffers (Dynamo lifts them into inputs)."""
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        if isinstance(value, torch.nn.Parameter) or (source is not None
                                                     and is_from_unspecialized_param_buffer_source(source)):
            out.append(i)
    return out


def _frozen(gm, example_inputs, weights: list[int]) -> torch.fx.GraphModule:
    """``gm`` with its weight inputs turned into constant attributes: it takes the other inputs only."""
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        if i in weights:
            name = f"w{i}"
            root.register_buffer(name, example_inputs[i].detach().clone())
            env[node] = graph.get_attr(name)
        else:
            env[node] = graph.placeholder(node.name)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    for name, mod in gm.named_children():
        root.add_module(name, mod)
    for node in gm.graph.nodes:         # weights Dynamo left as attributes of the graph module itself
        if node.op == "get_attr" and "." not in node.target and not hasattr(root, node.target):
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                root.register_buffer(node.target, value.detach())
            else:
                setattr(root, node.target, value)
    return torch.fx.GraphModule(root, graph)


def _key(gm, example_inputs) -> str:
    """A graph's folder name: its code and its inputs' shapes and dtypes (weights' values aside:
    kernels depend on shapes only, and every build is checked on the actual weights)."""
    h = hashlib.blake2b(gm.code.encode(), digest_size=6)
    h.update(repr([(tuple(t.shape), str(t.dtype)) for t in example_inputs]).encode())
    return f"graph-{h.hexdigest()}"


def _saved_choice(folder: Path, optimised) -> tuple[dict, bool] | None:
    """The build a former call kept: its per-chain choice ``{LibraryOp: impl}`` and whether its glue
    ran serially; None when there is none."""
    path = folder / CHOICE
    if not path.is_file():
        return None
    from .model.library import find_ops
    saved = json.loads(path.read_text())
    return ({op: saved["library"][repr(op)] for op in find_ops(optimised) if repr(op) in saved["library"]},
            bool(saved.get("serial")))


def _remedy(folder: Path) -> str:
    """What tunes a graph's kernels that have no record, for the warning naming them: its folder
    removed, and a larger budget where the trials left them untuned."""
    return f"removing {folder} tunes them afresh, with a larger `trials` option if the budget left them"


def _compile(model, folder: Path, opts: dict):
    """Tune ``model`` into ``folder`` (unless a former call did) and build it: (executable, summary)."""
    from .model import compile as C
    from .model.graph import fuse, optimise
    from .measure.target import parse_target
    from .measure.workdir import WorkDir, write_json
    from .scheduler import tune_model
    target = parse_target(opts["target"])
    optimised = optimise(model.mod)
    saved = _saved_choice(folder, optimised)
    if saved is not None:                                   # a former call's build: measure nothing
        database = C.open_database(folder)
        C.warn_untuned(fuse(optimised, target), database, target, _remedy(folder))
        ex = C.build_tuned(model, database, target, *saved)
        error = C.check(ex, model)
        return ex, f"rebuilt from {folder} (nothing measured), max error {error:.1e}"
    resume = WorkDir(folder).is_model()
    result = tune_model(model, target, trials=opts["trials"], strategy=opts["strategy"], work_dir=folder,
                        resume=resume, library=opts["library"], spaces=opts["spaces"])
    best = C.build_best(model, C.open_database(folder), target, library=opts["library"],
                        library_times=result.library_times, remedy=_remedy(folder))
    write_json(folder / CHOICE, {"build": best.best.name, "seconds": best.best.seconds, "serial": best.best.serial,
                                  "library": {repr(op): impl for op, impl in best.best.library.items()}})
    return best.best.executable, (f"{result.new_trials} trials measured, {best.best.name} build "
                                  f"{best.best.seconds * 1e3:.3f} ms, max error {best.best.error:.1e}")


def _runner(executable, weights: list[int], spec, tensor_slots: list[int], constants: list):
    """The callable Dynamo calls: the graph's non-weight inputs in, its output structure out."""
    import tvm
    from torch.utils._pytree import tree_unflatten

    from .model.compile import virtual_machine, vm_leaves
    vm, _ = virtual_machine(executable)
    skip = set(weights)

    def run(*args):
        inputs = [tvm.runtime.from_dlpack(a.detach().contiguous()) for i, a in enumerate(args) if i not in skip]
        got = (torch.from_dlpack(t) for t in vm_leaves(vm["main"](*inputs)))
        leaves = list(constants)
        for slot in tensor_slots:
            leaves[slot] = next(got)
        return tree_unflatten(leaves, spec)
    return run


def adaptune_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    """The Dynamo backend (see the module doc); ``options``: trials, work_dir, strategy, target, library, spaces."""
    from torch.utils._pytree import tree_flatten

    from .model.frontends import ModelError
    from .model.frontends.pytorch import from_torch
    unknown = set(options or {}) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown adaptune backend option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
    opts = {**OPTIONS, **(options or {})}
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        print("adaptune: warning: a graph with non-tensor inputs runs eagerly", file=sys.stderr)
        return gm.forward
    key = _key(gm, example_inputs)
    weights = _weight_positions(gm, example_inputs)
    frozen = _frozen(gm, example_inputs, weights)
    args = tuple(t.detach() for i, t in enumerate(example_inputs) if i not in weights)
    with torch.no_grad():
        out = gm(*example_inputs)
    leaves, spec = tree_flatten(out)
    slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    try:
        model = from_torch(frozen, args, {}, key, "torch", f"dynamo:{key}", given=True)
        folder = Path(opts["work_dir"]) / key
        executable, summary = _compile(model, folder, opts)
    except (ModelError, RuntimeError, ValueError) as e:
        print(f"adaptune: warning: {key} runs eagerly: {' '.join(str(e).split())[:200]}", file=sys.stderr)
        return gm.forward
    print(f"adaptune: {key}: {summary}", file=sys.stderr)
    return _runner(executable, weights, spec, slots, [None if i in slots else v for i, v in enumerate(leaves)])
