"""`python -m runners.hfjs --install`: install the pinned @huggingface/jinja (npm ci) into the chatgold cache."""
import argparse
import sys

from . import ensure_installed, install_dir

parser = argparse.ArgumentParser(prog="python -m runners.hfjs")
parser.add_argument("--install", action="store_true", help="run npm ci into the cache now (idempotent)")
args = parser.parse_args()
if args.install:
    ensure_installed(quiet=False)
else:
    print(install_dir())
sys.exit(0)
