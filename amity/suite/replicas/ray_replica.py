"""The Ray actor behind one replica of the `ray` backend: it runs `amity serve` on the
node where Ray placed it, on a free port of that node's address, and answers where.

The process is the actor's child and gets SIGKILL when the actor's process dies, so a
killed or crashed actor takes its replica down at once: the requests in flight break
(as with a killed process replica), and the Suite, which awaits `wait()`, sees the
actor die and replaces it. (The signal follows the thread that started the child; a
threaded actor's threads live as long as the actor.)
"""

import signal
import subprocess
from pathlib import Path

import ray

from amity.suite.replicas.backend import ReplicaSpec
from amity.suite.replicas.serve_command import (die_with_parent, listening_socket, log_tail,
                                                serve_argv, serve_env)


class ServeReplica:
    def __init__(self, log_path: str):
        self.log_path = Path(log_path)  # on the actor's node
        self.proc: subprocess.Popen | None = None

    def start(self, spec: ReplicaSpec) -> str:
        """Start the replica; its base URL, reachable from other nodes."""
        host = ray.util.get_node_ip_address()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with listening_socket(host) as listener, open(self.log_path, "wb") as out:
            port = listener.getsockname()[1]
            argv = serve_argv(spec, listener)
            out.write((" ".join(argv) + "\n").encode())
            out.flush()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=serve_env(),
                                         preexec_fn=die_with_parent(signal.SIGKILL),
                                         pass_fds=(listener.fileno(),))
        return f"http://{host}:{port}"

    def wait(self) -> int:
        """Block until the replica process exits; its exit code."""
        return self.proc.wait()

    def log_tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM (the server drains), then SIGKILL after `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
