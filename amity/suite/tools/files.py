"""The tools' view of the Files store, for one caller: read an UPLOADED file of the
caller's team (file:text), save a file a tool made (the interpreter's outputs) as an
UPLOADED file of the team's first project, with a signed download URL."""

import hashlib
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from amity.suite.auth import Caller
from amity.suite.files.objects import ObjectStore, object_key
from amity.suite.store.models import File, Project, new_id
from amity.suite.tools.base import OutputFile, ToolError


class StoreFiles:
    def __init__(self, sessions: sessionmaker[Session], objects: ObjectStore, who: Caller,
                 file_ttl_s: int | None):
        self.sessions, self.objects, self.who, self.file_ttl_s = sessions, objects, who, file_ttl_s

    def read(self, file_id: str, max_bytes: int) -> tuple[str, bytes]:
        with self.sessions() as session:
            file = session.scalar(select(File).join(Project, File.project_id == Project.id).where(
                File.id == file_id, Project.team_id == self.who.team_id))
            if file is None:
                raise ToolError("file_not_found", f"no file {file_id!r} in this team")
            expired = file.expires_at is not None and \
                file.expires_at.replace(tzinfo=file.expires_at.tzinfo or UTC) <= datetime.now(UTC)
            if file.status != "UPLOADED" or expired:
                raise ToolError("file_not_ready", f"the file {file_id!r} is not UPLOADED")
            name, key = file.name, file.object_key
        try:
            return name, self.objects.read(key, max_bytes)
        except ValueError as error:
            raise ToolError("file_too_large", str(error)) from None

    def save(self, name: str, data: bytes) -> OutputFile:
        with self.sessions.begin() as session:
            project = session.scalar(select(Project).where(Project.team_id == self.who.team_id)
                                     .order_by(Project.created_at, Project.id).limit(1))
            if project is None:
                raise ToolError("files_unavailable", "the team has no project to keep files in")
            file_id = new_id("file")
            key = object_key(project.id, file_id)
            self.objects.put(key, data)
            now = datetime.now(UTC)
            session.add(File(
                id=file_id, project_id=project.id, creator_id=self.who.user_id, name=name,
                size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest(),
                status="UPLOADED", object_key=key, created_at=now,
                expires_at=now + timedelta(seconds=self.file_ttl_s) if self.file_ttl_s else None))
        return OutputFile(name, self.objects.download_url(key))
