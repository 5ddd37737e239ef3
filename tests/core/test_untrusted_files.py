"""gigatron.core.untrusted_files: regular files only, bounded sizes, confined paths."""

import os
import threading

import pytest

from gigatron.core.untrusted_files import (
    UntrustedFileError,
    confined_path,
    read_bytes,
    read_text,
)


def test_symlink_to_dev_zero_is_refused_before_reading(tmp_path):
    link = tmp_path / "latest_checkpointed_iteration.txt"
    os.symlink("/dev/zero", link)
    with pytest.raises(UntrustedFileError, match="character device; only a regular file"):
        read_bytes(link, what="tracker", max_bytes="tracker")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / ".metadata"
    os.mkfifo(fifo)
    out: list = []

    def _read():
        try:
            read_bytes(fifo, what="checkpoint metadata", max_bytes=1024)
        except UntrustedFileError as e:
            out.append(str(e))

    t = threading.Thread(target=_read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert out and "a FIFO" in out[0] and str(fifo) in out[0]


def test_directory_is_refused(tmp_path):
    with pytest.raises(UntrustedFileError, match="is a directory"):
        read_bytes(tmp_path, what="config", max_bytes=10)


def test_size_limit_names_size_and_limit(tmp_path):
    f = tmp_path / "config.json"
    f.write_bytes(b"x" * 100)
    assert read_bytes(f, what="config", max_bytes=100) == b"x" * 100
    with pytest.raises(UntrustedFileError, match="100 bytes, over the 99-byte limit"):
        read_bytes(f, what="config", max_bytes=99)


def test_bad_utf8_names_file_and_offset(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(
        UntrustedFileError, match=r"vocab.txt is not valid UTF-8 \(byte 0xff at offset 3"
    ):
        read_text(f, what="vocabulary", max_bytes=1024)
    f.write_bytes("\ufeffhé".encode())
    assert read_text(f, what="vocabulary", max_bytes=1024) == "hé"


@pytest.mark.parametrize("name", ["/etc/passwd", "../other/__0_0.distcp", "a/../../x"])
def test_paths_leaving_the_directory_are_refused(tmp_path, name):
    root = tmp_path / "ckpt"
    root.mkdir()
    with pytest.raises(UntrustedFileError, match="only a path inside"):
        confined_path(root, name, what="storage file", source=".metadata")


def test_symlink_escaping_the_directory_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (tmp_path / "outside.distcp").write_bytes(b"")
    os.symlink(tmp_path / "outside.distcp", root / "__0_0.distcp")
    with pytest.raises(UntrustedFileError, match="outside"):
        confined_path(root, "__0_0.distcp", what="storage file", source=".metadata")
    (root / "sub").mkdir()
    got = confined_path(root, "sub/./x.distcp", what="f", source="s")
    assert got == os.path.join(root, "sub/./x.distcp")


def test_nul_in_a_named_path_gets_its_own_message(tmp_path):
    with pytest.raises(UntrustedFileError, match="NUL byte") as err:
        confined_path(tmp_path, "x\x00", what="data file", source="index.json")
    assert "absolute" not in str(err.value)
