"""The ``adaptune`` command line: a thin layer over the library API.

Bad input gets one line on stderr and exit code 2, before anything is written; an interrupted run
keeps every measured record and says how to resume.
"""
from __future__ import annotations

import argparse
import logging

from . import looptune as cli_looptune
from . import models as cli_models
from . import ops
from .common import Parser, UsageError, fail, positive_int, tuning_args


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="adaptune", description="Autotune deep-learning operators on Apache TVM.")
    p.add_argument("-v", "--verbose", action="store_true", help="show debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    t = sub.add_parser("tune-op", help="tune one operator workload")
    t.add_argument("workload", nargs="?", default=None,
                   help="L1..L8, resnet18-8, tiny-conv, tiny-dense, or kind:dims e.g. conv2d:1,64,56,56,64,3,3,1,1, "
                        "conv2d_nhwc:... (as models run it), linear:M,N,K (default: L8, a ResNet-18 3x3 conv)")
    t.add_argument("--target", default="host", help='"host" (default: this CPU with its mcpu), "llvm", "cuda" (the visible '
                   'NVIDIA GPU), or a JSON dict such as {"kind": "cuda", "arch": "sm_80"}')
    tuning_args(t, 64, "workload")
    t.add_argument("--json", default=None, metavar="FILE",
                   help="write {best_latency_ms, gflops, onednn_latency_ms, trials} to FILE")
    t.set_defaults(func=ops.cmd_tune_op)
    sub.add_parser("workloads", help="list the built-in workloads").set_defaults(func=ops.cmd_workloads)

    model_help = "zoo name (demo-cnn, alexnet, vgg16, resnet18, resnet50, mobilenetv2), an .onnx file, or module:attr of a PyTorch model"

    def model_args(q, default=None):
        q.add_argument("model", nargs="?" if default else None, default=default, help=model_help)
        q.add_argument("--input-shape", default=None, help="input shape, e.g. 1,3,224,224 (for ONNX files "
                       "with dynamic dims and PyTorch models without example_input_shape)")
        q.add_argument("--input", action="append", default=None, metavar="NAME:SHAPE:DTYPE[:LOW:HIGH]",
                       help="an input by name, e.g. input_ids:1,128:int64 (repeatable; keyword inputs of a "
                            "PyTorch model); LOW:HIGH draws its example values in [LOW, HIGH) (default: "
                            "embedding ids in [0, vocab), masks all ones, other integers in [0, 2), floats normal)")
        q.add_argument("--target", default="host", help='"host" (default: this CPU with its mcpu), or a JSON dict')
        q.add_argument("--no-library", action="store_true",
                       help="all generated kernels: run no conv/dense chain as a fused oneDNN call "
                            "(default: per chain, whichever measures faster, kept only if the model gets faster)")

    t = sub.add_parser("tune", help="tune every operator of a model, then compile, check and time it")
    model_args(t, default="demo-cnn")
    tuning_args(t, 256, "model")
    t.set_defaults(func=cli_models.cmd_tune)
    c = sub.add_parser("compile", help="build a model with a tuning log into a shared library")
    model_args(c)
    c.add_argument("--db", required=True, help="work dir of `adaptune tune`")
    c.add_argument("-o", "--output", required=True, help="library file to write (.so)")
    c.add_argument("--rounds", type=positive_int, default=3,
                   help="timing rounds of the race between the builds (5 alternated samples each, then a "
                        "run-off of the fastest two and the all-generated build twice as long; default 3)")
    c.set_defaults(func=cli_models.cmd_compile)
    b = sub.add_parser("bench", help="latency of untuned TVM, adaptune, PyTorch eager, torch.compile and ONNX Runtime")
    model_args(b)
    b.add_argument("--db", default=None, help="work dir of `adaptune tune` (omit to time untuned TVM only)")
    b.add_argument("--json", default=None, metavar="FILE", help="write the table as JSON")
    b.add_argument("--profile", action="store_true", help="time per kernel of adaptune's model, grouped")
    b.add_argument("--rounds", type=positive_int, default=5, help="timing rounds of five interleaved samples per contender (default 5; "
                   "fewer than 3 also shorten the race between the builds)")
    b.set_defaults(func=cli_models.cmd_bench)
    r = sub.add_parser("report", help="PNG plots and an HTML page for a model work dir")
    r.add_argument("work_dir")
    r.add_argument("-o", "--output", default=None, help="folder for the report (default: WORK_DIR/report)")
    r.set_defaults(func=cli_models.cmd_report)
    sub.add_parser("models", help="list the built-in models").set_defaults(func=cli_models.cmd_models)
    cli_looptune.add_parser(sub)
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        return fail(str(e))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="adaptune: %(levelname)s: %(message)s")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    return args.func(args)
