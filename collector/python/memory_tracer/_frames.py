"""The line of the program's own code each thread is at, for allocations outside every module
(`train.py:40 in train_step`): the shim's builtins (`mt_py_user_frames`) called by
sys.monitoring (Python 3.12+). Allocations are made with the GIL released, where no frame can
be read, so each thread's line is kept as it runs: LINE events in the program's own code only
(every other code object disables its events at its first call), a return from it restores the
caller's line, and leaving a module scope the line it was entered from. Files of torch, this
package and the standard library are never named; those of other installed packages only
when no frame of the program's own is on the stack."""

import getpass
import os
import re
import site
import sys
import sysconfig
import tempfile

from . import _shim


def _dirs(paths):
    out = set()
    for p in paths:
        if not p:
            continue
        for q in (p, os.path.realpath(p)):
            out.add(q.rstrip(os.sep) + os.sep)
    return out


def user_frame_prefixes(torch):
    """The shim's list: `s<prefix>` lines (never named) and `l<prefix>` lines (libraries,
    named only when no frame of the program's own is on the stack); the longest prefix a
    file starts with decides."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = sysconfig.get_paths()
    skip = _dirs([os.path.dirname(os.path.abspath(torch.__file__)), here, paths.get("stdlib"), paths.get("platstdlib")])
    # Inductor's generated code (torch.compile) is torch's, wherever its cache lies.
    skip |= _dirs(inductor_cache_dirs())
    for name in ("triton", "functorch"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            skip |= _dirs([os.path.dirname(os.path.abspath(mod.__file__))])
    libs = [paths.get("purelib"), paths.get("platlib")]
    try:
        libs += list(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    libs.append(user_site if isinstance(user_site, str) else None)
    lines = [f"s{p}" for p in sorted(skip)]
    # Code made at run time by torch.fx and dynamo, and frozen modules.
    lines += ["s<eval_with_key>", "s<frozen "]
    lines += [f"l{p}" for p in sorted(_dirs(libs))]
    return "\n".join(lines)


def inductor_cache_dirs():
    """Where Inductor writes the code it generates, found as torch finds it
    (`torch._inductor.runtime.cache_dir_utils`): TORCHINDUCTOR_CACHE_DIR, else
    `torchinductor_<user>` in the temporary directory, the user as `getpass` names it (a
    container's root often has neither USER nor LOGNAME: the password database names it), and
    Inductor's own default where it is loaded already (it is not imported for this)."""
    dirs = [os.environ.get("TORCHINDUCTOR_CACHE_DIR")]
    try:
        user = getpass.getuser()
    except Exception:  # no variable and no entry in the password database
        user = None
    if user:
        dirs.append(os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)))
    loaded = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if loaded is not None:
        try:  # never its cache_dir(), which sets TORCHINDUCTOR_CACHE_DIR and makes the folder
            dirs.append(loaded.default_cache_dir())
        except Exception:
            pass
    return [d for d in dirs if d]


# The program's own code objects given their events, kept across captures: PY_START, which
# found them, stays disabled for them once they have been seen (sys.monitoring.DISABLE outlives
# a tool id freed and taken again), so a later capture gives them their events again itself.
_OWN_CODES = set()


class UserLines:
    """sys.monitoring's events for the program's own code, on a free tool id, while tracing;
    `why` says why not where they cannot be (an older Python or shim, every tool id taken)."""

    def __init__(self, lib, torch):
        self.mon = None
        self.why = None
        fns = _shim.user_frame_functions(lib)
        mon = getattr(sys, "monitoring", None)
        if fns is None:
            self.why = "this capture library cannot name them"
            return
        if mon is None:
            self.why = f"Python {sys.version_info[0]}.{sys.version_info[1]} has no sys.monitoring (3.12 and later do)"
            return
        tool = next((i for i in (4, 3, 2, 1, 0, 5) if mon.get_tool(i) is None), None)
        if tool is None:
            self.why = "every sys.monitoring tool id is taken"
            return
        setup, self.off, start, line, ret = fns
        events = mon.events
        wanted = events.LINE | events.PY_RETURN

        def enable(code):
            _OWN_CODES.add(code)
            mon.set_local_events(tool, code, wanted)

        mon.use_tool_id(tool, "memory-tracer")
        self.mon, self.tool = mon, tool
        setup(user_frame_prefixes(torch), enable, mon.DISABLE)
        for code in _OWN_CODES:
            mon.set_local_events(tool, code, wanted)
        # Frames already running never start again: the program's own among them now.
        f = sys._getframe(1)
        seen = set()
        while f is not None:
            seen.add(f.f_code)
            f = f.f_back
        for code in seen:
            start(code, 0)
        mon.register_callback(tool, events.PY_START, start)
        mon.register_callback(tool, events.LINE, line)
        mon.register_callback(tool, events.PY_RETURN, ret)
        mon.set_events(tool, events.PY_START)

    def close(self):
        mon = self.mon
        if mon is None:
            return
        self.mon = None
        self.off()
        events = mon.events
        mon.set_events(self.tool, 0)
        for code in _OWN_CODES:
            mon.set_local_events(self.tool, code, 0)
        for e in (events.PY_START, events.LINE, events.PY_RETURN):
            mon.register_callback(self.tool, e, None)
        mon.free_tool_id(self.tool)
