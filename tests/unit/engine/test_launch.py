"""A server started from a command template (areal/engine/launch.py): its own temp folder through
``scratch_env`` (vLLM's ``VLLM_RPC_BASE_PATH``: a killed vLLM server otherwise leaves its ZeroMQ
sockets in /tmp), removed when it stops; a command that exits names its status and its log."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from areal.engine.launch import command_launcher, free_port

# A stand-in server: writes a file where ``SCRATCH`` says, then answers /health with 200.
SERVER = """
import http.server, os, sys
open(os.path.join(os.environ["SCRATCH"], "socket-like"), "w").close()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_servers_scratch_folder_is_its_own_and_goes_when_it_stops(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    launch = command_launcher(f"{sys.executable} {script} {{port}}", tmp_path, 30, scratch_env="SCRATCH")
    proc = launch(0, free_port(), tmp_path / "server.log")
    try:
        scratch = Path(proc.scratch_dir or "")
        assert proc.scratch_dir and scratch.name.startswith(f"areal-engine-{os.getpid()}-")
        assert (scratch / "socket-like").is_file()  # the server wrote where the variable pointed
    finally:
        proc.stop()
    assert not scratch.exists()


def test_a_server_command_that_exits_names_its_status_and_log(tmp_path):
    script = tmp_path / "server.py"
    script.write_text("import sys; print('no port for me'); sys.exit(3)")
    launch = command_launcher(f"{sys.executable} {script} {{port}}", tmp_path, 30)
    with pytest.raises(RuntimeError, match=r"exited with 3; log tail:\nno port for me"):
        launch(0, free_port(), tmp_path / "server.log")
