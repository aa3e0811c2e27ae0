"""GGUF header read: runners.gguf_header.read_header vs gguf.GGUFReader on llama.cpp's vocab GGUF files."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(limit: int) -> dict:
    import gguf

    from conformance.corpus.sources import llamacpp, source_root
    from runners.gguf_header import read_header

    files = sorted(Path(source_root(llamacpp.SOURCE)).rglob("*.gguf"))[:limit]
    rows = []
    for path in files:
        t0 = time.perf_counter()
        header = read_header(path)
        ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader = gguf.GGUFReader(str(path))
        theirs = time.perf_counter() - t0
        agree = header.get("tokenizer.chat_template") == (
            bytes(reader.fields["tokenizer.chat_template"].parts[-1]).decode() if "tokenizer.chat_template" in reader.fields else None)
        rows.append({"file": path.name, "bytes": path.stat().st_size, "read_header_ms": round(1000 * ours, 2),
                     "gguf_reader_ms": round(1000 * theirs, 2), "speedup": round(theirs / ours, 1) if ours else None,
                     "templates_agree": agree})
        print(json.dumps(rows[-1]), file=sys.stderr)
    total_ours = sum(r["read_header_ms"] for r in rows)
    total_theirs = sum(r["gguf_reader_ms"] for r in rows)
    return {"files": len(rows), "read_header_ms": round(total_ours, 1), "gguf_reader_ms": round(total_theirs, 1),
            "speedup": round(total_theirs / total_ours, 1) if total_ours else None, "per_file": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100, help="at most this many files (GGUFReader takes seconds per vocab file)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    text = json.dumps(run(args.files), indent=1)
    Path(args.out).write_text(text) if args.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
