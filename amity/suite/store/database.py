"""Opening the database: the URL from the configuration, migrations to the newest
revision, and sessions."""

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from amity.config import StoreConfig

MIGRATIONS = Path(__file__).parent / "migrations"


def data_dir(config: StoreConfig) -> Path:
    path = Path(config.data_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url(config: StoreConfig) -> str:
    return config.database_url or f"sqlite:///{data_dir(config) / 'suite.db'}"


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # SQLite enforces foreign keys (our cascades) only when asked, per connection;
    # WAL and a busy timeout let `amity admin` write while the Suite runs.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def open_engine(url: str) -> Engine:
    sqlite = url.startswith("sqlite")
    # Requests run in a thread pool; a pooled SQLite connection may serve several threads.
    engine = create_engine(url, pool_pre_ping=True,
                           connect_args={"check_same_thread": False} if sqlite else {})
    if sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` in place (a fresh database, or an older one)."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def open_database(config: StoreConfig) -> sessionmaker[Session]:
    engine = open_engine(database_url(config))
    upgrade(engine)
    return sessionmaker(engine, expire_on_commit=False)
