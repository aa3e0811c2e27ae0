"""`chatgold engines ...`: build and inspect the engines that are compiled from source (cached, not in the repo)."""
from __future__ import annotations

import json
import sys

# engine name on the command line -> (build function, lookup function), imported lazily
BUILDABLE = {
    "llama.cpp": ("runners.llamacpp.build", "build_llama_server", "find_llama_server"),
    "llama-cpp-python": ("runners.llama_cpp_python.build", "build", "find"),
    # the in-process llama.cpp harness that reductions render candidates with (docs/llamacpp.md)
    "llama.cpp-harness": ("runners.llamacpp.harness_build", "ensure_harness", "find_harness"),
}


def _functions(engine: str):
    import importlib

    module_name, build_name, find_name = BUILDABLE[engine]
    module = importlib.import_module(module_name)
    return getattr(module, build_name), getattr(module, find_name)


def cmd_engines_build(args) -> int:
    from runners.base import RunnerUnavailable
    from runners.llamacpp.build import LlamaCppBuildError

    build, _ = _functions(args.engine)
    try:
        path = build(force=args.force, build=args.version) if args.version else build(force=args.force)
    except (LlamaCppBuildError, RunnerUnavailable) as exc:
        print(f"chatgold: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_engines_status(args) -> int:
    status = {}
    for engine in BUILDABLE:
        _, find = _functions(engine)
        found = find()
        status[engine] = str(found) if found else None
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        for engine, path in status.items():
            print(f"{engine}: {path or 'not built (chatgold engines build ' + engine + ')'}")
    return 0


def cmd_engines_list(args) -> int:
    from runners import REFERENCE_RUNNER, runner_names, runner_summary

    rows = [{"name": name, "reference": name == REFERENCE_RUNNER, "about": runner_summary(name)}
            for name in runner_names()]
    if args.json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return 0
    for row in rows:
        print(f"{row['name']:16} {row['about']}")
    print("command:'<argv>'  any program speaking the harness protocol (runners/protocol/PROTOCOL.md)")
    return 0


def register(subparsers) -> None:
    engines = subparsers.add_parser("engines", help="the runners, and engines built from source (llama.cpp, llama-cpp-python)").add_subparsers(
        dest="engines_command", metavar="ENGINES_COMMAND", required=True)
    p = engines.add_parser("list", help="every runner name --runner accepts, with what it is")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_engines_list)
    p = engines.add_parser("build", help="build an engine into ~/.cache/chatgold (or $CHATGOLD_CACHE) if missing")
    p.add_argument("engine", choices=sorted(BUILDABLE))
    p.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    p.add_argument("--version", metavar="V", help="a version other than the pinned one (llama.cpp: a build "
                                                  "number such as b10054; llama-cpp-python: a PyPI version)")
    p.set_defaults(func=cmd_engines_build)
    p = engines.add_parser("status", help="where each buildable engine's binary is, if built")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_engines_status)
