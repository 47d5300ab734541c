"""A local S3 server for tests: moto's server mode in its own process, on 127.0.0.1.

The tests talk to it through the real client stack (fsspec, s3fs, botocore, HTTP), exactly as
they would to a bucket in the cloud; nothing of the client is mocked. The environment points
the client at it (`AWS_ENDPOINT_URL`) with throw-away credentials, and turns off every other
place botocore looks for credentials (files, the instance metadata service), so a test never
reaches the network.

    with LocalS3() as s3:
        s3.environment()          # AWS_* variables for a client of this server
        s3.put("bucket/key", b"...")
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class LocalS3:
    """moto's S3 server on a free loopback port, started and stopped by the tests."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> LocalS3:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's S3 server exited at start (code {self.process.returncode})")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto's S3 server did not answer on {self.endpoint} within {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def environment(self, *, credentials: bool = True) -> dict[str, str | None]:
        """AWS_* variables for a client of this server (None: unset), nothing looked up elsewhere."""
        env: dict[str, str | None] = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_PROFILE": None,
            "AWS_SESSION_TOKEN": None,
        }
        for name, value in CREDENTIALS.items():
            env[name] = value if credentials else None
        return env

    def reset(self) -> None:
        """Forget every bucket and object."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()


def upload_tree(filesystem, local: Path, url_path: str) -> None:
    """Copy the files under `local` to `url_path` (bucket/prefix), keeping relative paths."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            filesystem.pipe_file(f"{url_path}/{path.relative_to(local).as_posix()}", path.read_bytes())
