"""OpenAI wire types as msgspec Structs, one module per endpoint."""
