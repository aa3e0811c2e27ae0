"""End an engine process and everything it started, including descendants that left its session.

Engines (harnesses, llama-server) start in a session of their own, so one killpg ends the process group. That
is not enough: a descendant that calls setsid() (or setpgid) leaves the group, and when its parent dies it is
re-parented away and nothing would ever end it. So every engine process is started with an environment
variable naming its tree (TAG_VARIABLE=<unique tag>), which every descendant inherits, and ending a tree
means, on Linux, SIGKILL to the union of

  - the root and its descendants by parent pid (/proc/<pid>/stat), whatever their session;
  - every process in the root's process group or session;
  - every process whose environment (/proc/<pid>/environ) carries the tag: this finds the setsid'd
    grandchild even after its parent died and it was re-parented to init;

repeated until a scan finds nothing left (a process forking while the kill runs is found in the next round).

Why not PR_SET_CHILD_SUBREAPER: it makes orphans our children, but says nothing about which engine they came
from, and a chatgold process also has children that are not engines (a test's service, a build); why not a
cgroup: it needs a writable, delegated cgroup v2 hierarchy, which containers and CI runners rarely give.
Limits, documented: a descendant that both replaced its environment (execve with a clean environment) and lost
its parent before the kill escapes; other users' processes cannot be read or killed; off Linux (no /proc) only
the process group is ended. Processes still alive when the interpreter exits are ended by an atexit hook.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import uuid
from typing import Optional

TAG_VARIABLE = "CHATGOLD_PROCESS_TREE"
_ROUNDS = 8

_live: dict = {}  # tag -> Popen, for the atexit hook
_live_lock = threading.Lock()


def tagged_env(env: Optional[dict] = None) -> tuple[dict, str]:
    """(environment for a new engine process, its tree tag)."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex}"
    env = dict(os.environ if env is None else env)
    env[TAG_VARIABLE] = tag
    return env, tag


def track(proc, tag: str) -> None:
    """Remember a started tree so that it is ended at interpreter exit if nobody ended it before."""
    with _live_lock:
        _live[tag] = proc


def _proc_stat() -> dict:
    """pid -> (ppid, pgid, sid) of every visible process; {} without /proc."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: fields resume after its last ')'.
        fields = raw[raw.rfind(b")") + 2:].split()
        try:
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
        except (IndexError, ValueError):
            continue
    return table


def _has_tag(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


def tree_members(root: Optional[int], tag: Optional[str]) -> set:
    """Every live process of the tree rooted at `root` (see the module docstring); without `root` (its pid was
    already reaped and may belong to another process by now), the processes carrying `tag`."""
    table = _proc_stat()
    members = set()
    if root is not None:
        members = {pid for pid, (_, pgid, sid) in table.items() if pgid == root or sid == root}
        if root in table:
            members.add(root)
    children: dict = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = list(members)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    if tag:
        marker = f"{TAG_VARIABLE}={tag}".encode()
        me = os.getpid()
        for pid in table:
            if pid not in members and pid != me and _has_tag(pid, marker):
                members.add(pid)
    members.discard(os.getpid())
    return members


def kill_tree(proc, tag: Optional[str] = None) -> None:
    """SIGKILL `proc` (started with start_new_session=True) and its whole tree, then reap `proc`."""
    # Once reaped, proc's pid is free for reuse: only the tag then says what belongs to the tree.
    root = proc.pid if proc.returncode is None else None
    for _ in range(_ROUNDS):
        members = tree_members(root, tag)
        if root is not None and proc.poll() is None:
            members.add(root)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if root is not None:
            try:
                os.killpg(root, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if proc.poll() is None:
            proc.wait()
        root = None  # reaped now: what is left of the tree is found by its tag
        # Killed processes linger as zombies until their parent reaps them: those are done, not alive.
        if all(_is_zombie(pid) for pid in tree_members(root, tag)):
            break
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if tag:
        with _live_lock:
            _live.pop(tag, None)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2:raw.rfind(b")") + 3] in (b"Z", b"X")


@atexit.register
def _end_all() -> None:
    with _live_lock:
        live = list(_live.items())
    for tag, proc in live:
        try:
            kill_tree(proc, tag)
        except Exception:  # exiting anyway: never turn an exit into a traceback
            pass
