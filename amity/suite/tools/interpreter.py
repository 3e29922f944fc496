"""`code:python-interpreter`: model-written Python in a bubblewrap sandbox.

The sandbox (`bwrap`, Debian's `bubblewrap`):
- new user, PID, network, IPC, UTS and cgroup namespaces (`--unshare-all`): no
  network at all, not even loopback; it dies with the Suite (`--die-with-parent`);
- the file system is read-only: /usr (the system's Python and its standard library:
  `--interpreter-python`, /usr/bin/python3 by default), a fresh /proc and /dev, and
  two size-capped tmpfs in memory that the code may write, /tmp and its working
  directory /work, the only place whose files outlive the run;
- rlimits set before bwrap starts, inherited by everything inside: CPU seconds,
  address space, processes, open files, file size, no core dumps; run as root, the
  Suite first drops to `nobody` (65534), because the kernel does not count a root
  user's processes against RLIMIT_NPROC;
- a wall-clock timeout that kills the whole process group; stdout and stderr go to
  files (so RLIMIT_FSIZE bounds them too) and the first MAX_OUTPUT_CHARS come back.
Files the code leaves in /work (at most MAX_FILES, regular files only; COLLECTOR
below hands them out) go to the Files store and come back as `files` with download URLs. Without bwrap, or when the
sandbox cannot start, the call is ERRORED: code never runs unsandboxed.
"""

import os
import resource
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput, string_arg

MAX_CODE_CHARS = 50_000
CPU_S = 10
ADDRESS_SPACE_BYTES = 1 << 30
MAX_PROCESSES = 64
MAX_OPEN_FILES = 64
MAX_FILE_BYTES = 10 << 20
MAX_OUTPUT_CHARS = 20_000
MAX_FILES = 10
SCRATCH_BYTES = 64 << 20  # each of /tmp and /work: tmpfs, in memory
NOBODY = 65534


def _limits(as_nobody: bool):
    def apply():
        for limit, value in ((resource.RLIMIT_CPU, CPU_S), (resource.RLIMIT_AS, ADDRESS_SPACE_BYTES),
                             (resource.RLIMIT_NPROC, MAX_PROCESSES),
                             (resource.RLIMIT_NOFILE, MAX_OPEN_FILES),
                             (resource.RLIMIT_FSIZE, MAX_FILE_BYTES), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(limit, (value, value))
        if as_nobody:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
    return apply


# Runs inside the sandbox: the model's program as a child process, then (once it has
# ended, however it ended) the files left in /work as a tar stream on the inherited
# descriptor, whose size RLIMIT_FSIZE bounds. The program itself never holds that
# descriptor, and /work is a size-capped tmpfs, so it cannot fill the Suite's disk.
COLLECTOR = f"""
import os, sys, tarfile
fd = int(os.environ.pop("AMITY_FILES_FD"))
pid = os.fork()
if pid == 0:
    os.close(fd)
    os.execv(sys.executable, [sys.executable, "-I", "/sandbox/main.py"])
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
    count = 0
    for top, dirs, names in os.walk("/work"):
        for name in sorted(names):
            path = os.path.join(top, name)
            if count < {MAX_FILES} and os.path.isfile(path) and not os.path.islink(path):
                tar.add(path, arcname=os.path.relpath(path, "/work"), recursive=False)
                count += 1
sys.exit(status if status >= 0 else 128 - status)
"""


def bwrap_command(python: str, script: Path, collector: Path, files_fd: int) -> list[str]:
    size = str(SCRATCH_BYTES)
    return [
        "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
        "--proc", "/proc", "--dev", "/dev",
        "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work",
        "--ro-bind", str(script), "/sandbox/main.py",
        "--ro-bind", str(collector), "/sandbox/collect.py",
        "--remount-ro", "/", "--chdir", "/work", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
        "--setenv", "TMPDIR", "/tmp", "--setenv", "MPLBACKEND", "Agg",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONIOENCODING", "utf-8",
        "--setenv", "AMITY_FILES_FD", str(files_fd),
        "--", python, "-I", "/sandbox/collect.py",
    ]


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_OUTPUT_CHARS * 4 + 1)
    text = data.decode("utf-8", "replace")
    if len(text) > MAX_OUTPUT_CHARS or path.stat().st_size > len(data):
        return text[:MAX_OUTPUT_CHARS] + "\n[output truncated]"
    return text


def _collected(path: Path, result: dict) -> list[tuple[str, bytes]]:
    files = []
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                if member.isreg() and len(files) < MAX_FILES:
                    files.append((member.name, tar.extractfile(member).read()))
    except (tarfile.TarError, OSError):
        result["files_error"] = f"the files the code wrote pass {MAX_FILE_BYTES} bytes " \
                                f"together: none are returned"
        return []
    return files


def _signal_error(exit_code: int) -> str | None:
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    try:
        return f"killed by signal {signal.Signals(number).name}" if number else None
    except ValueError:
        return None


def run_sandboxed(code: str, python: str, timeout_s: float) -> tuple[dict, list[tuple[str, bytes]]]:
    """(result, files written) of running `code`; ToolError when it cannot run."""
    if shutil.which("bwrap") is None:
        raise ToolError("sandbox_unavailable", "the Python sandbox (bubblewrap, `bwrap`) is not "
                                               "installed, so code is not run")
    if not os.path.isfile(python):
        raise ToolError("sandbox_unavailable", f"the sandbox's Python {python} is missing")
    as_nobody = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="amity-sandbox-") as root:
        root_path = Path(root)
        script, collector = root_path / "main.py", root_path / "collect.py"
        script.write_text(code)
        collector.write_text(COLLECTOR)
        os.chmod(root, 0o755)
        for path in (script, collector):
            path.chmod(0o644)
        with open(root_path / "stdout", "wb") as stdout, open(root_path / "stderr", "wb") as stderr, \
                open(root_path / "files.tar", "wb") as files_out:
            proc = subprocess.Popen(
                bwrap_command(python, script, collector, files_out.fileno()),
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=root,
                pass_fds=(files_out.fileno(),), preexec_fn=_limits(as_nobody),
                start_new_session=True)
            try:
                exit_code, timed_out = proc.wait(timeout=timeout_s), False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                exit_code, timed_out = proc.wait(), True
        stderr_text = _head(root_path / "stderr")
        if exit_code == 1 and stderr_text.startswith("bwrap:"):
            raise ToolError("sandbox_unavailable",
                            f"the sandbox could not start: {stderr_text.strip()}")
        result = {"stdout": _head(root_path / "stdout"), "stderr": stderr_text,
                  "exit_code": exit_code}
        if timed_out:
            result["error"] = f"killed after the {timeout_s:g} s time limit"
        elif error := _signal_error(exit_code):
            result["error"] = error
        return result, [] if timed_out else _collected(root_path / "files.tar", result)


def run(args: dict, context: ToolContext) -> ToolOutput:
    code = string_arg(args, "code", MAX_CODE_CHARS)
    settings = context.settings
    result, files = run_sandboxed(code, settings.interpreter_python, settings.interpreter_timeout_s)
    if files and context.files is None:
        raise ToolError("files_unavailable", "the code wrote files but there is no file store")
    return ToolOutput(result, [context.files.save(name, data) for name, data in files])


TOOL = BuiltinTool(
    type="code:python-interpreter",
    description="Run Python 3 code (standard library only, no network) and return what it "
                "prints. Files it writes in its working directory are returned as links. "
                f"Limits: {CPU_S} s of CPU, {ADDRESS_SPACE_BYTES >> 20} MiB of memory.",
    parameters={"type": "object", "properties": {
        "code": {"type": "string", "description": "The program; print() what you need back."}},
        "required": ["code"]},
    run=run,
)
