"""Patches Horovod 0.28.1's horovodrun (Gloo) in the environment of the Python that runs this file, so
that two signals in quick succession (Ctrl-C twice, `timeout` then Ctrl-C) cannot hang it:

    .venv/bin/python setup-utils/patch_horovod.py

horovod/runner/gloo_run.py's register_shutdown_event() installs a SIGINT and SIGTERM handler that calls
threading.Event.set(). A second signal arriving while that handler holds the Event's (non-reentrant) lock
runs the handler again in the main thread, which then waits forever on the lock it holds: the launcher
ignores every later signal, and the ranks (in their own sessions, out of the terminal's reach) train on.
The patched handler only writes the signal's number to a pipe; a thread reads it. The first signal sets
the event as before (the ranks get SIGTERM through their middlemen, horovodrun exits non-zero); a second
one sends SIGTERM to the ranks' process groups at once and SIGKILL 5 s later (a third: SIGKILL at once).
And a run stopped by a signal ends with one line (`horovodrun: interrupted (SIGINT) ...`, exit 128 +
signal) instead of the traceback of "one or more processes exited with non-zero status", which blamed a
rank for the user's Ctrl-C; a run that a rank failed ends with one line too, below the ranks' own messages
(`horovodrun: rank 0 failed first (exit code 1), so the job stopped; see the ranks' messages above`,
exit 1). See docs/failures.md.

Idempotent and cheap (a read when already patched): setup-utils/install.sh runs it on every `make setup`.
Fails loudly when the installed Horovod is not 0.28.1 or its gloo_run.py is not the text this patch was
written against. The original is kept as gloo_run.py.mxnet-pfc-orig, from which a later revision of this
patch (MARKER) re-patches; `pip install --force-reinstall` undoes it.
"""
import importlib.util
import os
import py_compile
import re
import sys
import tempfile

# The revision of this patch: a file patched by another one is re-patched from the original, which the
# first patch keeps next to it (gloo_run.py.mxnet-pfc-orig).
MARKER = "mxnet-pfc patch r3: signal handling that cannot deadlock; a failed run ends in one line"
HOROVOD_VERSION = "0.28.1"      # the only version whose text the replacements below match

OLD_IMPORT = "from typing import Optional, Any\n"
NEW_IMPORT = "from typing import Optional, Any\n\nimport psutil  # mxnet-pfc patch (a dependency of horovod)\n"

OLD_HANDLER = '''def register_shutdown_event():
    # Create a event for communication between threads
    event = threading.Event()

    def set_event_on_signal(signum, frame):
        event.set()

    signal.signal(signal.SIGINT, set_event_on_signal)
    signal.signal(signal.SIGTERM, set_event_on_signal)
    return event
'''

NEW_HANDLER = '''# --- MARKER (setup-utils/patch_horovod.py) ---
# Horovod 0.28.1 called threading.Event.set() in the SIGINT/SIGTERM handler. A second signal arriving
# while that handler held the Event's (non-reentrant) lock ran the handler again in the main thread,
# which then waited forever on the lock it held: horovodrun hung, ignoring later signals, and the
# workers ran on. Here the handler only writes the signal's number to a pipe (no lock); a thread
# reads it. First signal: the event is set and the workers are terminated through their middlemen,
# as before. Second: the workers' process groups, and every process below the middlemen, get SIGTERM
# at once and SIGKILL after SHUTDOWN_GRACE_S; a third signal sends the SIGKILL at once.
SHUTDOWN_GRACE_S = 5


def _find_workers(groups, procs):
    """Adds to groups the middlemen of safe_shell_exec (this process's children leading their own
    session and process group) and to procs (pid: psutil.Process) them and every process below."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        try:
            if os.getsid(child.pid) != child.pid:
                continue            # not a middleman (e.g. multiprocessing's resource tracker)
            groups.add(child.pid)
            for proc in [child] + child.children(recursive=True):
                procs.setdefault(proc.pid, proc)
        except (OSError, psutil.Error):
            continue


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
        if sig == signal.SIGTERM:
            os.killpg(pgid, signal.SIGCONT)     # a stopped process acts on SIGTERM only once continued
    except OSError:
        pass


def _signal_process(proc, sig):
    try:
        proc.send_signal(sig)
        if sig == signal.SIGTERM:
            proc.send_signal(signal.SIGCONT)
    except psutil.Error:
        pass


def _pgid(proc):
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


def _running(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _ShutdownOnSignal(object):
    def __init__(self):
        self.event = threading.Event()
        self.first_signal = None
        self._kill_now = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        threading.Thread(target=self._watch, name='horovodrun-signals', daemon=True).start()

    def handler(self, signum, frame):
        # Runs in the main thread between any two of its bytecodes, inside this very handler too:
        # lock-free work only.
        try:
            os.write(self._write_fd, bytes([signum]))
        except OSError:
            pass

    def close(self):
        os.close(self._write_fd)    # the watching thread reads EOF and ends

    def _watch(self):
        count = 0
        while True:
            data = os.read(self._read_fd, 64)
            if not data:
                os.close(self._read_fd)
                return
            for signum in data:
                count += 1
                if count == 1:
                    self.first_signal = signum
                    self.event.set()
                elif count == 2:
                    try:    # not a daemon: horovodrun exits only once the workers are gone
                        threading.Thread(target=self._terminate_workers, args=(signum,),
                                         name='horovodrun-terminate', daemon=False).start()
                    except RuntimeError:    # interpreter shutting down
                        self._terminate_workers(signum)
                else:
                    self._kill_now.set()

    def _terminate_workers(self, signum):
        self.event.set()
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = 'signal {}'.format(signum)
        try:
            sys.stderr.write('horovodrun: {} again: terminating the workers now, SIGKILL in {} s '
                             '(at once on one more signal)\\n'.format(name, SHUTDOWN_GRACE_S))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        deadline = time.time() + SHUTDOWN_GRACE_S
        groups, procs = set(), {}
        groups_done, procs_done = set(), set()     # SIGTERM once each: twice may read as two requests
        sig = signal.SIGTERM
        while True:
            _find_workers(groups, procs)
            if sig == signal.SIGKILL:   # only groups still holding one of ours (a pgid may be reused)
                groups &= {_pgid(proc) for proc in procs.values() if _running(proc)}
            for pgid in list(groups):
                if sig == signal.SIGKILL or pgid not in groups_done:
                    groups_done.add(pgid)
                    _signal_group(pgid, sig)
            for pid, proc in list(procs.items()):
                if sig == signal.SIGKILL or pid not in procs_done:
                    procs_done.add(pid)
                    if sig == signal.SIGKILL or _pgid(proc) not in groups_done:
                        _signal_process(proc, sig)
            if sig == signal.SIGKILL or not any(_running(proc) for proc in procs.values()):
                return
            if self._kill_now.wait(0.1) or time.time() >= deadline:
                sig = signal.SIGKILL


_shutdown_on_signal = None


def register_shutdown_event():
    # Create a event for communication between threads
    global _shutdown_on_signal
    previous, _shutdown_on_signal = _shutdown_on_signal, _ShutdownOnSignal()
    signal.signal(signal.SIGINT, _shutdown_on_signal.handler)
    signal.signal(signal.SIGTERM, _shutdown_on_signal.handler)
    if previous is not None:
        previous.close()
    return _shutdown_on_signal.event
# --- end of the mxnet-pfc patch ---
'''.replace("MARKER", MARKER)

OLD_REPORT = """    for name, value in sorted(res.items(), key=lambda item: item[1][1]):
        exit_code, timestamp = value
        if exit_code != 0:
            raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
                               'status, thus causing the job to be terminated. The first process '
                               'to do so was:\\nProcess name: {name}\\nExit code: {code}\\n'
                               .format(name=name, code=exit_code))
"""
NEW_REPORT = """    if event.is_set():   # mxnet-pfc patch: stopped by a signal (Ctrl-C), not by a rank's failure
        signum = _shutdown_on_signal.first_signal or signal.SIGINT
        sys.stderr.write('horovodrun: interrupted ({}): every rank was stopped and says so above\\n'
                         .format(signal.Signals(signum).name))
        sys.exit(128 + signum)
    # mxnet-pfc patch: a failed rank ends the run with one line, not a traceback of horovodrun's own
    failed = sorted((timestamp, name, code) for name, (code, timestamp) in res.items() if code != 0)
    if failed:
        _, first, code = failed[0]
        sys.stderr.write('horovodrun: rank {} failed first (exit code {}), so the job stopped; see the ranks\\' '
                         'messages above\\n'.format(first, code))
        sys.exit(1)
"""


class PatchError(Exception):
    """The installed Horovod is not the one this patch was written for; nothing was changed."""


def horovod_dir() -> str:
    """The folder of the horovod package this interpreter would import, found without importing it."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.origin or not os.path.isfile(os.path.join(os.path.dirname(spec.origin),
                                                                          "runner", "gloo_run.py")):
        raise PatchError(f"horovod is not installed for {sys.executable}")
    return os.path.dirname(spec.origin)


def patched(source: str) -> str:
    """Horovod 0.28.1's gloo_run.py with the three replacements."""
    for text, what in ((OLD_HANDLER, "register_shutdown_event()"), (OLD_IMPORT, "import of typing"),
                       (OLD_REPORT, "report of launch_gloo()")):
        if source.count(text) != 1:
            raise PatchError(f"the original {what} of Horovod {HOROVOD_VERSION} is not there "
                             f"(modified or another version?)")
    return source.replace(OLD_IMPORT, NEW_IMPORT).replace(OLD_HANDLER, NEW_HANDLER).replace(OLD_REPORT, NEW_REPORT)


def write_compiled(target: str, text: str) -> None:
    """Writes text next to target, checks that it compiles, then replaces target in one step."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".gloo_run.", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        py_compile.compile(tmp, cfile=tmp + "c", doraise=True)
        os.remove(tmp + "c")
        os.chmod(tmp, os.stat(target).st_mode & 0o777)
        os.replace(tmp, target)
    except BaseException:
        for path in (tmp, tmp + "c"):
            if os.path.exists(path):
                os.remove(path)
        raise


def apply(hvd_dir: str) -> bool:
    """Patches hvd_dir/runner/gloo_run.py unless this revision is there; True when it patched now."""
    target = os.path.join(hvd_dir, "runner", "gloo_run.py")
    with open(target) as f:
        source = f.read()
    if MARKER in source:
        return False
    with open(os.path.join(hvd_dir, "__init__.py")) as f:
        version = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    if not version or version.group(1) != HOROVOD_VERSION:
        raise PatchError(f"Horovod {version.group(1) if version else '(unknown version)'} is installed, "
                         f"not {HOROVOD_VERSION}")
    backup = target + ".mxnet-pfc-orig"     # the original, kept by the first patch
    if "mxnet-pfc patch" in source:         # another revision of this patch: start again from the original
        if not os.path.exists(backup):
            raise PatchError(f"it holds another revision of this patch and the original ({backup}) is gone; "
                             f"reinstall Horovod")
        with open(backup) as f:
            source = f.read()
    text = patched(source)
    if not os.path.exists(backup):
        with open(backup + ".tmp", "w") as f:
            f.write(source)
        os.replace(backup + ".tmp", backup)
    write_compiled(target, text)
    return True


def main() -> int:
    try:
        hvd_dir = horovod_dir()
        if apply(hvd_dir):
            print(f"[setup] patched {os.path.join(hvd_dir, 'runner', 'gloo_run.py')}: horovodrun's SIGINT/SIGTERM "
                  f"handler can no longer deadlock; a failed run ends in one line")
    except PatchError as e:
        print(f"patch_horovod: {e}; nothing was changed. This patch is for Horovod {HOROVOD_VERSION} "
              f"(see setup-utils/patch_horovod.py).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
