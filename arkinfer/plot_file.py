"""Write a matplotlib figure exactly where the user named, or refuse before any work.

`savefig("/dev/full")` wrote `/dev/full.png` (matplotlib appends the default extension to a name
without one), `--plot .` wrote `./.png`, and a FIFO named `x.png` would block the write. So:
the extension is checked up front against the formats written here (`check_plot_path`), an
existing path that is not a regular file (a folder, FIFO, device, socket) is refused, and the
figure is written to a temporary file in the same folder and renamed over the path
(`save_figure`): the path holds the old plot or the whole new one, never a partial file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError

#: extension -> matplotlib format
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def check_plot_path(path: Path, flag: str = "--plot") -> Path:
    """`path` when a plot can be written there: a name ending in one of PLOT_FORMATS that is
    not an existing folder, FIFO, device or socket (a regular file or a symlink is replaced);
    ArkError naming `flag`, the path and what it is otherwise."""
    path = Path(path)
    allowed = ", ".join(PLOT_FORMATS)
    if path.suffix.lower() not in PLOT_FORMATS or path.name in PLOT_FORMATS:
        raise ArkError(f"{flag} {path}: the file name must end in {allowed}",
                       hint=f"name the plot file, e.g. {flag} bench.png")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise ArkError(f"{flag} {path} cannot be written: {exc.strerror or exc}",
                       hint="choose another path") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if \
            stat.S_ISFIFO(mode) else "a device or socket"
        raise ArkError(f"{flag} {path} is {kind}, not a file a plot can replace",
                       hint=f"name a new file, e.g. {flag} bench.png")
    return path


def save_figure(fig: Any, path: Path, flag: str = "--plot", **savefig_kw: Any) -> Path:
    """Write matplotlib `fig` to `path` (checked by `check_plot_path`) through a temporary file
    in the same folder renamed over it; ArkError for a write that fails (disk full, no
    permission). Returns the path written, which is `path` itself."""
    from arkinfer.frontend.shard_writer import honour_umask

    path = check_plot_path(path, flag)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format=PLOT_FORMATS[path.suffix.lower()], **savefig_kw)
            fh.flush()
            os.fsync(fh.fileno())
        honour_umask(Path(tmp))  # mkstemp's 0600 -> what a plain open would give
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise ArkError(f"cannot write the plot {path}: {exc.strerror or exc}",
                       hint="free disk space or choose a folder you can write to") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path

