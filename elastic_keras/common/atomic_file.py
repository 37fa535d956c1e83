"""Writing a file so that readers see either its old content or all of its new content."""

import contextlib
import os
import tempfile

# The process's umask, read once at import (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_write(path, mode="wb", private=False):
    """Opens a temporary file beside `path` and moves it onto `path` when the block succeeds.

    The temporary file is hidden (its name starts with a dot) and lives in the same directory,
    so the final `os.replace` is atomic. Its content is flushed and fsynced before the rename;
    concurrent writers of the same path each write their own temporary file and the last
    rename wins, so nobody ever sees a partial file. If the block raises, the temporary file
    is removed and `path` is left as it was.

    Args:
        path: the file to create or replace.
        mode: `"wb"` for bytes or `"w"` for text (UTF-8, `"\\n"` line endings).
        private: only the owner may read the file (mode 0600), as for credentials.

    Raises:
        OSError: the directory cannot be written.

    Example:

        >>> with atomic_write("/tmp/example.bin") as f:
        ...     _ = f.write(b"payload")
    """
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        if not private:  # mkstemp makes 0o600; give the usual permissions.
            os.fchmod(fd, 0o666 & ~_UMASK)
        text = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
        with os.fdopen(fd, mode, **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    """Makes the rename durable where the platform allows opening a directory."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
