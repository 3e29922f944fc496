"""code:python-interpreter: model-written code runs in bubblewrap, and stays there.
Each escape a model (or a prompt injected into it) might try is attempted for real."""

import shutil
import socket
import threading
from urllib.parse import urlsplit

import pytest

from amity.suite.auth import Caller
from amity.suite.tools import interpreter
from amity.suite.tools.base import ToolContext, ToolError, ToolSettings
from amity.suite.tools.files import StoreFiles

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (Debian: bubblewrap)")
SETTINGS = ToolSettings(interpreter_timeout_s=5)


def run(code: str) -> dict:
    result, files = interpreter.run_sandboxed(code, SETTINGS.interpreter_python,
                                              SETTINGS.interpreter_timeout_s)
    return {**result, "files": dict(files)}


def test_output_exit_code_and_files_come_back_through_the_files_store(suite):
    who = Caller(suite.admin.user_id, suite.admin.team_id)
    files = StoreFiles(suite.sessions, suite.client.app.state.objects, who, None)
    code = ("import os, sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)\n"
            "open('table.csv', 'w').write('a,b\\n1,2\\n')\nos.makedirs('sub')\n"
            "open('sub/notes.txt', 'w').write('hello')\nos.symlink('/usr/bin/python3', 'link')\n")
    out = interpreter.TOOL.run({"code": code}, ToolContext(SETTINGS, files))
    assert out.result == {"stdout": "45\n", "stderr": "warn\n", "exit_code": 0}
    assert sorted(f.name for f in out.files) == ["sub/notes.txt", "table.csv"]  # no symlink
    for f in out.files:
        downloaded = suite.client.get(f.url)
        assert downloaded.status_code == 200
        assert downloaded.content == {"table.csv": b"a,b\n1,2\n", "sub/notes.txt": b"hello"}[f.name]
        file_id = urlsplit(f.url).path.split("/")[-1]
        info = suite.client.get(f"/beta/file/{file_id}", headers=suite.admin.headers).json()
        assert info["status"] == "UPLOADED" and info["name"] == f.name
        # Another team does not see it.
        assert suite.client.get(f"/beta/file/{file_id}",
                                headers=suite.other.headers).status_code == 404


def test_exit_codes_and_exceptions():
    assert run("import sys; sys.exit(3)")["exit_code"] == 3
    failed = run("1/0")
    assert failed["exit_code"] == 1 and "ZeroDivisionError" in failed["stderr"]
    killed = run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed["error"] == "killed by signal SIGKILL"


def test_no_network_not_even_the_hosts_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        accepted = []
        server.settimeout(8)
        threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
        out = run(f"import socket\nfor host in ('127.0.0.1', '1.1.1.1'):\n"
                  f"    try:\n        socket.create_connection((host, {port}), timeout=2)\n"
                  f"        print('connected', host)\n"
                  f"    except OSError as e:\n        print('refused', host, e.errno)\n"
                  f"print(open('/proc/net/dev').read().count(':'))\n")
    assert "connected" not in out["stdout"]
    assert out["stdout"].count("refused") == 2
    assert out["stdout"].strip().endswith("1")  # one interface: its own loopback
    assert accepted in ([], [None])


def _accept(server):
    try:
        server.accept()
        return "connection"
    except OSError:
        return None


def test_file_system_is_read_only_and_private(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    out = run(f"import os\nfor path in ('/usr/evil', '/evil', '/sandbox/main.py', "
              f"'{tmp_path}/planted', '/proc/sys/kernel/hostname'):\n"
              f"    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
              f"    except OSError as e:\n        print('denied', path)\n"
              f"for path in ('{secret}', '/etc/passwd', '/root'):\n"
              f"    print('visible' if os.path.exists(path) else 'absent', path)\n"
              f"print(sorted(os.listdir('/')))\n")
    assert "wrote" not in out["stdout"] and out["stdout"].count("denied") == 5
    assert "visible" not in out["stdout"]
    assert not (tmp_path / "planted").exists()
    assert "['bin', 'dev', 'lib', 'lib64', 'proc', 'sandbox', 'sbin', 'tmp', 'usr', 'work']" \
        in out["stdout"]


def test_processes_are_its_own_and_a_fork_bomb_is_contained():
    ps = run("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert ps["stdout"].strip() in ("[1, 2, 3]", "[1, 2]")  # bwrap's init, collector, program
    bomb = run("import os\nwhile True:\n    os.fork()\n")
    assert "BlockingIOError" in bomb["stderr"] or "error" in bomb


def test_memory_bomb_is_contained():
    out = run("x = bytearray(4 << 30)")
    assert "MemoryError" in out["stderr"]
    grow = run("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))\n")
    assert "MemoryError" in grow["stderr"] or "error" in grow


def test_endless_loop_is_killed_at_the_wall_timeout():
    out = run("while True:\n    pass\n")
    assert out["error"] == "killed after the 5 s time limit"


def test_scratch_space_and_output_are_capped():
    tmp = run("i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (8 << 20)); i += 1\n")
    assert "No space left on device" in tmp["stderr"]
    big = run("open('big.bin', 'wb').write(b'x' * (50 << 20))")
    assert "File too large" in big["stderr"] and big["files"] == {}
    assert "files_error" in big
    flood = run("while True:\n    print('x' * 1000)\n")
    assert flood["stdout"].endswith("[output truncated]")
    assert len(flood["stdout"]) <= interpreter.MAX_OUTPUT_CHARS + 30


def test_without_bubblewrap_the_call_errors_and_nothing_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    marker = tmp_path / "ran"
    with pytest.raises(ToolError) as error:
        interpreter.TOOL.run({"code": f"open('{marker}', 'w')"}, ToolContext(SETTINGS))
    assert error.value.type == "sandbox_unavailable" and not marker.exists()
