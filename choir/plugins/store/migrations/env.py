"""Alembic's environment for the store's tables (choir/plugins/store/migrate.py runs it).

The connection comes in `config.attributes["connection"]`, already inside the transaction and the lock
choir/plugins/store/migrate.py migrates under: its transaction is the migration's (Alembic sees an external one and
leaves the commit to the caller). Without one (a command run from synchronous code), the async engine that
advanced-alchemy's AlembicCommandConfig carries is used; `--sql` (offline) renders the SQL from its URL."""

import asyncio
from typing import Any, cast

from advanced_alchemy.alembic.commands import AlembicCommandConfig
from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from choir.plugins.store.models import StoreBase

config = cast(AlembicCommandConfig, context.config)
options: dict[str, Any] = {"target_metadata": StoreBase.metadata, "version_table": config.version_table_name,
           "version_table_schema": config.version_table_schema, "render_as_batch": config.render_as_batch,
           "user_module_prefix": config.user_module_prefix}


def run(connection: Connection) -> None:
    context.configure(connection=connection, **options)
    with context.begin_transaction():
        context.run_migrations()


async def run_on_engine(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        await connection.run_sync(run)
        await connection.commit()


if context.is_offline_mode():
    context.configure(url=config.db_url, literal_binds=True, **options)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    run(connection)
else:
    asyncio.run(run_on_engine(cast(AsyncEngine, config.engine)))
