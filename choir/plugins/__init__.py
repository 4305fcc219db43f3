"""Litestar plugins on Choir's data path: the engine, and (next) fan-out and aggregation around it."""
