"""The store's migrations (choir/plugins/store/migrate.py) on SQLite and PostgreSQL (`store_url`, tests/databases.py):
a fresh database reaches head and matches the models; a database made before migrations (one table, no version
table) is stamped 0001 and upgraded with its rows kept; processes starting at once migrate once, the others wait."""

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from choir.plugins.store.migrate import VERSION_TABLE, commands, upgrade
from choir.plugins.store.models import StoreBase

# The schema create_all made before migrations (revision 0001), by hand.
OLD_SCHEMA = [
    "CREATE TABLE choir_response (id VARCHAR(300) NOT NULL PRIMARY KEY, owner VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL, expires_at BIGINT, body JSON NOT NULL, input_items JSON NOT NULL,"
    " conversation JSON NOT NULL)",
    "CREATE INDEX ix_choir_response_owner ON choir_response (owner)",
    "CREATE INDEX ix_choir_response_expires_at ON choir_response (expires_at)",
    "INSERT INTO choir_response VALUES ('resp_old', 'owner', 1, NULL, '{\"id\": \"resp_old\"}', '[]',"
    " '[{\"role\": \"user\", \"content\": \"hi\"}]')",
]


def head(engine: AsyncEngine) -> str | None:
    return ScriptDirectory.from_config(commands(engine).config).get_current_head()


def differences(connection: Connection) -> list:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE, "compare_type": True})
    return compare_metadata(context, StoreBase.metadata)


async def versions(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as connection:
        return list((await connection.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())


async def test_a_fresh_database_goes_to_head_and_matches_the_models(store_url):
    engine = create_async_engine(store_url)
    try:
        await upgrade(engine)
        await upgrade(engine)  # at head: nothing to do
        assert await versions(engine) == [head(engine)] == ["0004"]
        async with engine.connect() as connection:
            assert await connection.run_sync(differences) == []
    finally:
        await engine.dispose()


async def test_a_database_from_before_migrations_is_stamped_then_upgraded(store_url):
    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as connection:
            for statement in OLD_SCHEMA:
                await connection.exec_driver_sql(statement)
        await upgrade(engine)
        assert await versions(engine) == ["0004"]
        async with engine.connect() as connection:
            assert await connection.run_sync(differences) == []
            row = (await connection.exec_driver_sql(
                "SELECT id, owner, created_at, status, background, previous_id FROM choir_response")).one()
        assert tuple(row) == ("resp_old", "owner", 1, "completed", False, None)
    finally:
        await engine.dispose()


async def test_processes_starting_at_once_migrate_once(store_url):
    engines = [create_async_engine(store_url) for _ in range(3)]
    try:
        await asyncio.gather(*(upgrade(engine) for engine in engines))
        assert await versions(engines[0]) == ["0004"]
        async with engines[0].connect() as connection:
            assert await connection.run_sync(differences) == []
    finally:
        for engine in engines:
            await engine.dispose()
