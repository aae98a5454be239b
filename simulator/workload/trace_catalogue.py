"""The public traces fleetsim's scenarios replay (``trace_catalogue.yaml``), and fetching one.

Each entry names the file a scenario reads as ``${traces}/FILE``, its public URL (pinned to the upstream
commit), licence and sha256. ``download`` writes only into the download folder (``trace_sources``), only a
file whose bytes match the sha256, and only by renaming a finished temporary file into place: an
interrupted or corrupted download leaves nothing a scenario could read.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator import yaml_text
from simulator.errors import ConfigError
from simulator.workload.trace_sources import download_dir
from simulator.workload.traces import TraceFormat

CATALOGUE_PATH = Path(__file__).with_name("trace_catalogue.yaml")
CHUNK_BYTES = 1 << 20


class TraceSource(BaseModel):
    """Where one public trace file comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    format: TraceFormat
    """The reader the file needs (azure, mooncake, vidur)."""
    title: str
    """What the trace is, in a line."""
    url: str = Field(pattern=r"^https://")
    """Public URL of the exact file, pinned to an upstream commit."""
    licence: str
    """The licence the file is published under, and whom to cite."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the file's bytes."""
    size_bytes: int = Field(gt=0)
    """The file's size; a download longer than this is refused before it is finished."""


class TraceCatalogue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1]
    traces: dict[str, TraceSource]
    """Entries by the file name scenarios use after ``${traces}/``."""


@functools.lru_cache(maxsize=1)
def load_catalogue() -> dict[str, TraceSource]:
    """The catalogue's entries by file name."""
    try:
        data = yaml_text.safe_load(CATALOGUE_PATH.read_text(encoding="utf-8"))
        return dict(TraceCatalogue.model_validate(data).traces)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read the trace catalogue: {err}", file=CATALOGUE_PATH) from None
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ConfigError(first["msg"], file=CATALOGUE_PATH, field=field) from None


def source_of(name: str) -> TraceSource:
    """The catalogue entry of a trace file name; an unknown name is a ConfigError listing the known ones."""
    catalogue = load_catalogue()
    if name not in catalogue:
        raise ConfigError(f"no public trace named {name[:80]!r}; known: {', '.join(catalogue)}")
    return catalogue[name]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def download_command(name: str, folder: Path | None = None) -> str:
    """A shell command that fetches a trace into ``folder`` and checks its sha256 (curl and sha256sum)."""
    source = source_of(name)
    target = (folder or download_dir()) / name
    return (f"curl -fL --create-dirs -o {shlex.quote(str(target))} {shlex.quote(source.url)} && "
            f"echo '{source.sha256}  {target}' | sha256sum -c -")


UrlOpener = Callable[[str], IO[bytes]]


def _open_url(url: str) -> IO[bytes]:
    response: IO[bytes] = urllib.request.urlopen(url, timeout=60)
    return response


def download(name: str, folder: Path | None = None, *, open_url: UrlOpener | None = None) -> Path:
    """Fetch a public trace into ``folder`` (default: the download folder) and check its sha256.

    A file already there with the right sha256 is kept as it is. Bytes are written to a temporary file in
    the same folder, checked, then renamed into place; any failure removes the temporary file and is one
    ConfigError (a wrong checksum, a file longer than the catalogue says, no network, an unwritable folder).
    """
    source = source_of(name)
    folder = folder or download_dir()
    target = folder / name
    if target.is_file() and file_sha256(target) == source.sha256:
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
    except OSError as err:
        raise ConfigError(f"cannot write the trace: {err.strerror}", file=folder) from None
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(handle, "wb") as out, (open_url or _open_url)(source.url) as response:
            while chunk := response.read(CHUNK_BYTES):
                size += len(chunk)
                if size > source.size_bytes:
                    raise ConfigError(f"{source.url} sends more than the {source.size_bytes:,} bytes the "
                                      "catalogue gives: not the published file", file=target)
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise ConfigError(f"{source.url} sent {size:,} bytes whose sha256 is {digest.hexdigest()[:16]}…, "
                              f"not the catalogue's {source.sha256[:16]}…: not the published file", file=target)
        os.replace(temporary, target)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
        raise ConfigError(f"cannot download {source.url}: {reason}", file=target) from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target
