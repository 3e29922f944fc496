"""Where an endpoint's model comes from, offline (nothing is downloaded from a hub):

1. the models that ship with amity, under their hub names
   (`HuggingFaceTB/SmolLM2-135M-Instruct`);
2. the model registry directory: the Hugging Face cache layout
   `models--ORG--NAME/snapshots/REV` (REV = `hfModelRepoRevision`, else `refs/main`,
   else the newest snapshot) or a plain `ORG/NAME` directory;
3. a file of the team uploaded through the Files API (`hfModelRepo` = its id), such
   as a GGUF;
4. `wandb:ARTIFACT` (what the W&B create stores), through the artifact resolver.

Anything else cannot be resolved: the endpoint FAILS with
WORKLOAD_INIT_CANNOT_ACCESS_REPO_ERROR.
"""

import re
from pathlib import Path

from sqlalchemy.orm import Session

from amity.models.shipped import shipped_models
from amity.suite.files.objects import ObjectStore
from amity.suite.store.models import File, Project

REPO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
REVISION = re.compile(r"[A-Za-z0-9._-]{1,100}")
WANDB_PREFIX = "wandb:"


class CannotResolve(Exception):
    def __init__(self, msg: str, error_code: str = "WORKLOAD_INIT_CANNOT_ACCESS_REPO_ERROR"):
        super().__init__(msg)
        self.error_code = error_code


def _from_registry(registry: Path, repo: str, revision: str | None) -> Path | None:
    cache = registry / ("models--" + repo.replace("/", "--"))
    if cache.is_dir():
        snapshots = cache / "snapshots"
        if revision is None and (cache / "refs" / "main").is_file():
            revision = (cache / "refs" / "main").read_text().strip()
        if revision is not None:
            if not REVISION.fullmatch(revision) or not (snapshots / revision).is_dir():
                raise CannotResolve(f"{repo} has no revision {revision!r} in the model registry",
                                    "WORKLOAD_INIT_DOWNLOAD_ERROR")
            return snapshots / revision
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
        return found[-1] if found else None
    plain = registry / repo
    return plain if plain.is_dir() and revision is None else None


def _from_files(session: Session, team_id: str, file_id: str, objects: ObjectStore,
                cache: Path) -> Path | None:
    found = session.get(File, file_id)
    if found is None or found.status != "UPLOADED":
        return None
    project = session.get(Project, found.project_id)
    if project is None or project.team_id != team_id:
        return None
    suffix = ".gguf" if found.name.lower().endswith(".gguf") else ""
    path = cache / f"{found.id}{suffix}"  # the file name never becomes a path
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f"{found.id}.partial"
        objects.copy_to(found.object_key, partial)
        partial.rename(path)
    return path


def resolve_model(repo: str, revision: str | None, *, registry: Path, session: Session | None = None,
                  team_id: str | None = None, objects: ObjectStore | None = None,
                  cache: Path | None = None, artifacts=None) -> Path:
    """The local path of `repo` (at `revision`), or CannotResolve saying why."""
    if repo.startswith(WANDB_PREFIX):
        if artifacts is None:
            raise CannotResolve("no W&B artifact resolver", "WORKLOAD_INIT_HF_WANDB_API_ERROR")
        return artifacts.resolve(repo.removeprefix(WANDB_PREFIX))
    if revision is None and repo in (shipped := shipped_models()):
        return shipped[repo]
    if REPO_NAME.fullmatch(repo) and ".." not in repo:
        found = _from_registry(registry, repo, revision)
        if found is not None:
            return found
        if session is not None and "/" not in repo:
            found = _from_files(session, team_id, repo, objects, cache)
            if found is not None:
                return found
    raise CannotResolve(f"cannot access model repository {repo!r}"
                        + (f" at revision {revision!r}" if revision else "")
                        + ": not a shipped model, not in the model registry, not an uploaded file "
                        "of this team (and nothing is downloaded from a hub)")
