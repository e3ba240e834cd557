"""A new sqlite MLflow store made by copying an empty one, not by migrating it.

MLflow builds every new sqlite file by running its whole chain of schema migrations (alembic): 3-6 s, mostly
waiting on the disk, at the first run in each folder and in every test that runs ``agentrl fit``. Here those
migrations run once per schema revision, into an empty *template* in agentrl's cache folder, and each new store
starts as a copy of it. The copy is exactly what the migrations leave (MLflow's own `_initialize_tables` makes
the template); MLflow adds its default experiment when it opens the copy, with this store's artifact root, as it
does on a file it migrated itself.

Nothing here may cost a run: a template or a copy that fails its check (`check_empty_store`: sound, at the
installed MLflow's schema head, no experiment) is removed and the store left empty, for MLflow to migrate; a cache
folder that cannot be made, or that another user could write to, is not used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)


def cache_folder() -> Path:
    """``$AGENTRL_CACHE``, else ``$XDG_CACHE_HOME/agentrl``, else ``~/.cache/agentrl``."""
    if os.environ.get("AGENTRL_CACHE"):
        return Path(os.environ["AGENTRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl"


_warned: set[Path] = set()


def _check_private(path: Path) -> None:
    """Raise unless ``path`` itself (no symlink followed) belongs to this user and no one else can write it: a
    template another user could plant would become every new store of this one. Says so once per process in a
    warning (the cache is then unused, and each new store costs MLflow's migrations again)."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        if path not in _warned:
            _warned.add(path)
            log.warning("agentrl's cache %s is a link, another user's, or writable by others: not used (make it "
                        "your own with 'chmod go-w', or set AGENTRL_CACHE to a private folder)", path)
        raise PermissionError(f"{path} is a link, another user's, or writable by others")


def check_empty_store(db: Path, head: str) -> None:
    """Raise unless ``db`` is a sound sqlite file whose schema is at revision ``head`` and which holds no
    experiment."""
    con = sqlite3.connect(Path(db).absolute().as_uri() + "?mode=ro", uri=True)  # '#', '?', '%' in the path quoted
    try:
        sound = con.execute("PRAGMA quick_check").fetchone()[0]
        revisions = [r for (r,) in con.execute("SELECT version_num FROM alembic_version")]
        experiments = con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    finally:
        con.close()
    if sound != "ok" or revisions != [head] or experiments:
        raise ValueError(f"{db}: integrity {sound!r}, schema {revisions} (want [{head!r}]), {experiments} experiments")


def empty_store_template() -> tuple[Path, str]:
    """The template for the installed MLflow's schema head, made (by MLflow's migrations) and checked; with the
    head revision."""
    from mlflow.store.db.utils import _get_latest_schema_revision, _initialize_tables, create_sqlalchemy_engine

    head = _get_latest_schema_revision()
    folder = cache_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(folder)
    template = folder / f"mlflow-{head}-empty.db"
    if template.exists():
        try:
            _check_private(template)
            check_empty_store(template, head)
            return template, head
        except (OSError, ValueError, sqlite3.Error) as exc:  # truncated, stale, planted: made again
            log.info("MLflow store template %s is not usable (%s): making it again", template, exc)
            template.unlink(missing_ok=True)  # another run may have removed it first
    for stale in folder.glob("*.partial"):  # builds killed before their `finally` (SIGKILL, out of memory)
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()
    fd, name = tempfile.mkstemp(dir=folder, prefix=f"{template.name}.", suffix=".partial")
    os.close(fd)
    try:
        engine = create_sqlalchemy_engine(f"sqlite:///{name}")  # the engine MLflow's store makes
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        check_empty_store(Path(name), head)
        os.replace(name, template)  # whole or absent: runs making it at once each put a good file there
    finally:
        Path(name).unlink(missing_ok=True)
    return template, head


def seed_new_store(path: str) -> bool:
    """Make the new sqlite store ``path`` (no file yet, or the empty file a write check leaves) a checked copy of
    `empty_store_template`; False, the file left empty for MLflow to migrate, when that cannot be done. Call it
    only while holding the store's lock (`agentrl.tracking.store.store_lock`): a copy made beside another run's
    use of the file would overwrite that run's experiment."""
    target = Path(path)
    if target.exists() and target.stat().st_size > 0:
        return False
    try:
        template, head = empty_store_template()
        shutil.copyfile(template, target)
        check_empty_store(target, head)
    except Exception as exc:  # an unwritable cache folder, a bad copy, another MLflow's API: MLflow migrates
        log.info("MLflow store %s: no template copy (%s: %s); MLflow creates its tables", path, type(exc).__name__,
                 " ".join(str(exc).split())[:200])
        with contextlib.suppress(OSError):
            if target.exists() and target.stat().st_size > 0:  # never leave a bad copy standing as a store
                target.write_bytes(b"")
        return False
    return True
