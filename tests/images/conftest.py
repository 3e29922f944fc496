"""Real image servers for the tests: `amity serve`'s ApiServer on free ports, in
threads, each serving a tiny random-weight pipeline built here (tiny_pipeline.py); and
a small HTTP server on 127.0.0.2 (a loopback address the image servers are allowed to
fetch from, while 127.0.0.1 stays refused) for the URL inputs."""

import http.server
import io
import threading
import time

import httpx
import pytest
from PIL import Image

from amity.config import EngineConfig, ServerConfig
from amity.server.app import build_app
from amity.server.main import ApiServer, load_image_service
from tests.images.tiny_pipeline import build_controlnet, build_text_to_image
from tests.server.conftest import free_port

ALLOWED_HOST = "127.0.0.2"
FETCH_TIMEOUT_S = 2.0


class ImageServer:
    def __init__(self, model_dir, batch_wait_ms: float = 20.0, max_num_seqs: int = 8):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = ServerConfig(port=self.port, image_batch_wait_ms=batch_wait_ms,
                              image_fetch_allow=f"{ALLOWED_HOST}/32",
                              image_fetch_timeout=FETCH_TIMEOUT_S)
        self.app = build_app(None, config)
        self.state = self.app.state.amity
        self.state.attach_images(load_image_service(
            EngineConfig(model=str(model_dir), max_num_seqs=max_num_seqs), config))
        self.server = ApiServer(self.app, self.state, "127.0.0.1", self.port, 30.0,
                                log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.state.images.shutdown()


def png_bytes(size=(32, 32), color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


class _Files(http.server.BaseHTTPRequestHandler):
    """/cat.png: an image; /text: not an image; /big: 51 MiB without a Content-Length;
    /slow: an image after longer than the fetch timeout; /to-loopback: a redirect to
    127.0.0.1; /to-cat: a redirect to /cat.png."""

    protocol_version = "HTTP/1.0"
    target_port = 0  # set by the fixture: the port the redirect to 127.0.0.1 names

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path in ("/to-loopback", "/to-cat"):
            where = (f"http://127.0.0.1:{self.target_port}/cat.png" if self.path == "/to-loopback"
                     else "/cat.png")
            self.send_response(302)
            self.send_header("Location", where)
            self.end_headers()
            return
        if self.path not in ("/cat.png", "/text", "/big", "/slow"):
            self.send_error(404)
            return
        self.send_response(200)
        self.end_headers()
        if self.path == "/cat.png":
            self.wfile.write(png_bytes((40, 24)))
        elif self.path == "/text":
            self.wfile.write(b"this is not an image")
        elif self.path == "/big":
            chunk = b"\0" * 2**20
            try:
                for _ in range(51):
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path == "/slow":
            time.sleep(FETCH_TIMEOUT_S + 1.5)
            self.wfile.write(png_bytes())


@pytest.fixture(scope="session")
def files():
    """Base URL of the file server on 127.0.0.2; the same files also on 127.0.0.1."""
    servers = [http.server.ThreadingHTTPServer((host, 0), _Files)
               for host in (ALLOWED_HOST, "127.0.0.1")]
    _Files.target_port = servers[1].server_address[1]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield f"http://{ALLOWED_HOST}:{servers[0].server_address[1]}"
    for s in servers:
        s.shutdown()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusers")
    return {"sd": build_text_to_image(root / "sd"),
            "inpaint": build_text_to_image(root / "inpaint", inpainting=True),
            "controlnet": build_controlnet(root / "controlnet")}


@pytest.fixture(scope="session")
def sd_server(model_dirs):
    # A long batch wait, so requests sent together are batched.
    with ImageServer(model_dirs["sd"], batch_wait_ms=300) as running:
        yield running


@pytest.fixture(scope="session")
def sd(sd_server):
    with httpx.Client(base_url=sd_server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def cn(model_dirs):
    with ImageServer(model_dirs["controlnet"]) as running, \
            httpx.Client(base_url=running.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def inpaint(model_dirs):
    with ImageServer(model_dirs["inpaint"]) as running, \
            httpx.Client(base_url=running.url, timeout=120) as client:
        yield client
