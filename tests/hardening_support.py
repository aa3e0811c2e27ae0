"""Measuring what a command costs: peak memory (RSS) and wall time of the processes that did the work."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conformance import repo_root


def measured(code: str) -> dict:
    """Run `code` in a wrapper process; it prints one JSON line; the wrapper adds its children's peak RSS."""
    wrapper = textwrap.dedent("""
        import json, resource, sys
        result = {}
        exec(sys.argv[1], {"result": result})
        result["children_peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
        # VmHWM, not RUSAGE_SELF: Linux carries the pre-exec peak of the forking parent (pytest) into the latter.
        with open("/proc/self/status") as status:
            result["self_peak_mb"] = next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) // 1024
        print(json.dumps(result))
    """)
    done = subprocess.run([sys.executable, "-c", wrapper, textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=repo_root(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
