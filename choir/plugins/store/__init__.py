"""What Choir remembers (stored responses, for `previous_response_id` and GET /v1/responses/{id}): tables
through advanced-alchemy (SQLAlchemy 2, async), whose Litestar plugin owns the engine and its sessions."""
