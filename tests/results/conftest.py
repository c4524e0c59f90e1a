"""A real S3 API for the store and its lock: moto's server on a free loopback port."""

import socket

import pyarrow.fs as pafs
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    def __init__(self):
        self.port = _free_port()
        self.server = None
        self.uri = f"s3://sweeps/store?endpoint_override=127.0.0.1:{self.port}&scheme=http&region=us-east-1"

    def start(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def s3(monkeypatch):
    pytest.importorskip("moto")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    server = S3()
    server.start()
    fs, _ = pafs.FileSystem.from_uri(server.uri + "&allow_bucket_creation=true")
    fs.create_dir("sweeps")  # the bucket
    yield server
    server.stop()
